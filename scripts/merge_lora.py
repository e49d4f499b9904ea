#!/usr/bin/env python3
"""Merge a trained LoRA adapter into its base model and save a full Hugging Face model folder
(what vLLM serves).

    python scripts/merge_lora.py ADAPTER_DIR OUT_DIR [--base BASE_MODEL_DIR] [--dtype bfloat16]

ADAPTER_DIR is a trainer output (``outputs/offline/<run>/final`` or a checkpoint's ``model/``).
The base model is the adapter's ``base_model_name_or_path`` unless ``--base`` is given
(``embedded`` = SmolLM2-135M-Instruct). The tokenizer is copied along. Written to a temporary
folder and renamed, so OUT_DIR is either complete or absent.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch


def merge(adapter_dir: Path, out_dir: Path, base: str | None = None, dtype: str = "float32") -> Path:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aria.llm.embedded import resolve_model_path

    config_path = adapter_dir / "adapter_config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{adapter_dir} has no adapter_config.json (is it a LoRA output?)")
    base_path = resolve_model_path(base or json.loads(config_path.read_text())["base_model_name_or_path"])
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=getattr(torch, dtype))
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else base_path)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("adapter_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--base", default=None, help="base model folder (default: the adapter's base_model_name_or_path)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    try:
        out = merge(args.adapter_dir, args.out_dir, args.base, args.dtype)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"[merge] wrote a full model to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
