#!/usr/bin/env python3
"""Convert an original project's game log into schema-v1 trajectories (see aria/importers.py).

    python scripts/import_trajectories.py --format aria_msgs --game twenty_questions IN.jsonl OUT.jsonl

Prints how many games were imported and their success rate. Bad input prints one line naming the
file, line (or sample) and field, and exits with status 2; nothing is written then.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aria.games.base import known_games
from aria.importers import IMPORTERS, TWO_PLAYER_IMPORTERS, import_file
from aria.io import DataError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", required=True, choices=sorted([*IMPORTERS, *TWO_PLAYER_IMPORTERS]), help="format of the input file")
    parser.add_argument("--game", required=True, choices=known_games(), help="game the file's games were played in")
    parser.add_argument("input", type=Path, help="file in the original format")
    parser.add_argument("output", type=Path, help="trajectories JSONL to write (replaced atomically)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        records = import_file(args.input, args.format, args.game, out_path=args.output)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if records and "players" in records[0]:
        print(f"imported {len(records)} two-player games ({args.format}, {args.game}) into {args.output}")
        return 0
    wins = sum(r["success"] for r in records)
    rate = f"{wins / len(records):.1%}" if records else "n/a"
    print(f"imported {len(records)} games ({args.format}, {args.game}) into {args.output}; "
          f"success rate {rate} ({wins}/{len(records)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
