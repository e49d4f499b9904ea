#!/usr/bin/env python3
"""Render the tables of README.md and docs/ that come from committed runs (aria/experiment/tables.py).

    python scripts/render_docs.py           # rewrite every rendered block in place
    python scripts/render_docs.py --check   # exit 1 naming each block whose text is not its rendering
"""
import argparse
import sys
from pathlib import Path

from aria.cli import command, protect_terminal
from aria.io import atomic_write_text
from aria.experiment.tables import DOCUMENTS, REPO, render, stale_blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block is stale")
    parser.add_argument("--root", type=Path, default=REPO, help="the checkout whose documents to render (default: this one)")
    args = parser.parse_args()
    with command():
        if args.check:
            stale = stale_blocks(args.root)
            for block in stale:
                print(f"stale: {block} (python scripts/render_docs.py rewrites it)")
            sys.exit(1 if stale else 0)
        for name in DOCUMENTS:
            text = (args.root / name).read_text(encoding="utf-8")
            fresh = render(text, name)
            if fresh != text:
                atomic_write_text(args.root / name, fresh)
                print(f"rendered {name}")


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    main()
