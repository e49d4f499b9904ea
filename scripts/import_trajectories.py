#!/usr/bin/env python3
"""Convert an original project's game log into schema-v1 trajectories (see aria/games/importers.py).

    python scripts/import_trajectories.py --format aria_msgs --game twenty_questions IN.jsonl OUT.jsonl

Prints one summary line: games, wins by this project's win rule and by the file's own flag, how
many games the two disagree on, and targets outside the game's list. ``--success-from rule``
(default) decides success by the win rule, ``--success-from dataset`` by the file's flag. Bad input
prints one line naming the file, line (or sample) and field, and exits with status 2; nothing is
written then.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aria.cli import command, protect_terminal
from aria.games.common.base import known_games
from aria.games.importers import IMPORTERS, SUCCESS_SOURCES, TWO_PLAYER_IMPORTERS, import_file, import_summary
from aria.io import ConfigError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", required=True, choices=sorted([*IMPORTERS, *TWO_PLAYER_IMPORTERS]), help="format of the input file")
    parser.add_argument("--game", required=True, choices=known_games(), help="game the file's games were played in")
    parser.add_argument("--success-from", choices=SUCCESS_SOURCES, default="rule",
                        help="single-agent games: decide success by this project's win rule on the last question "
                             "(default) or by the file's own flag (correct / done / reward)")
    parser.add_argument("input", type=Path, help="file in the original format")
    parser.add_argument("output", type=Path, help="trajectories JSONL to write (replaced atomically)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # bad input (DataError names file, line and field) and an unwritable output are one line, exit 2
    with command():
        if args.output.resolve() == args.input.resolve():
            raise ConfigError(f"output: {args.output} is the input file; give another path (it is replaced whole)")
        records = import_file(args.input, args.format, args.game, out_path=args.output, success_from=args.success_from)
    if records and "players" in records[0]:
        print(f"imported {len(records)} two-player games ({args.format}, {args.game}) into {args.output}")
        return 0
    print(f"imported {args.format} ({args.game}) into {args.output}: {import_summary(records)}")
    return 0


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    sys.exit(main())
