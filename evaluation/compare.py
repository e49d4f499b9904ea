#!/usr/bin/env python3
"""Print several evaluation result folders side by side (the paper's Table 2 layout).

    python evaluation/compare.py results/eval/base results/eval/aria
    bash evaluation/eval.sh compare results/eval/base results/eval/aria
"""
import argparse
import sys

from aria.cli import protect_terminal
from aria.games.evaluate import compare_table
from aria.io import DataError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="result folders written by eval.sh (each holds summary.json)")
    args = parser.parse_args()
    try:
        print(compare_table(args.results), end="")
    except (DataError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    main()
