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
import sys
from pathlib import Path

from aria.cli import command, protect_terminal
from aria.llm.policy import merge_lora


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("adapter_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--base", default=None, help="base model folder (default: the adapter's base_model_name_or_path)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args(argv)
    with command():  # a missing adapter, a base that is no model, an unusable out_dir: one line, exit 2
        out = merge_lora(args.adapter_dir, args.out_dir, args.base, args.dtype)
    print(f"[merge] wrote a full model to {out}")
    return 0


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    sys.exit(main())
