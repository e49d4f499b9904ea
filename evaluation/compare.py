#!/usr/bin/env python3
"""Print several evaluation result folders side by side (the paper's Table 2 layout).

    python evaluation/compare.py results/eval/base results/eval/aria
"""
import sys

from aria.evaluate import compare_table
from aria.io import DataError

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: compare.py RESULT_DIR [RESULT_DIR ...]")
    try:
        print(compare_table(sys.argv[1:]), end="")
    except (DataError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
