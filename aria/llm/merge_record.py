"""Which adapter a merged model folder was made from, and whether it still is that adapter's merge.

``scripts/merge_lora.py`` writes ``aria_merge.json`` into the merged folder: the adapter's folder
and a digest of its weights (:func:`aria.io.model_digest`). When a later training writes a new
adapter into that folder, the merge beside it no longer is the trained model; the trainer says so
when it saves, and ``scripts/serve_vllm.sh`` refuses to serve it (``ARIA_SERVE_STALE=1`` serves
it anyway).

    python -m aria.llm.merge_record check MERGED_DIR   # prints why it is stale, exit 1; nothing, exit 0
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from aria.io import atomic_write_json, model_digest

MERGE_FILE = "aria_merge.json"


def write_merge_record(merged_tmp: Path, adapter_dir: Path, base: Path, dtype: str) -> None:
    """Record in a merged folder (being written) what it was merged from."""
    atomic_write_json(merged_tmp / MERGE_FILE, {"adapter": str(Path(adapter_dir).resolve()),
                                                "adapter_weights": model_digest(adapter_dir),
                                                "base": str(base), "dtype": dtype})


def stale_merge(merged_dir: Path) -> str | None:
    """Why ``merged_dir`` is no longer the merge of its adapter (the adapter was trained again or
    removed), or None when it is, or when the folder records no adapter (not made by merge_lora)."""
    record_path = Path(merged_dir) / MERGE_FILE
    if not record_path.is_file():
        return None
    record = json.loads(record_path.read_text(encoding="utf-8"))
    adapter = Path(record["adapter"])
    if not (adapter / "adapter_config.json").is_file():
        return f"{merged_dir} was merged from {adapter}, which holds no adapter any more"
    if model_digest(adapter) != record["adapter_weights"]:
        return (f"{merged_dir} was merged from an earlier adapter in {adapter} (trained again since): "
                f"re-run python scripts/merge_lora.py {adapter} {merged_dir}")
    return None


def stale_merges_of(adapter_dir: Path) -> list[str]:
    """What :func:`stale_merge` says of the merges beside ``adapter_dir`` (its sibling folders)
    that were made from it: a trainer that has just replaced the adapter names them."""
    adapter = Path(adapter_dir).resolve()
    found = []
    for sibling in sorted(adapter.parent.iterdir()) if adapter.parent.is_dir() else []:
        record = sibling / MERGE_FILE
        if record.is_file() and Path(json.loads(record.read_text(encoding="utf-8"))["adapter"]) == adapter:
            if why := stale_merge(sibling):
                found.append(why)
    return found


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "check":
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        sys.exit(2)
    why = stale_merge(Path(sys.argv[2]))
    if why:
        print(why)
    sys.exit(1 if why else 0)
