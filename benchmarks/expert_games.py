"""The scripted expert on the four single-agent games: wins, turns and surface forms per ε.

    python benchmarks/expert_games.py --games 100 --epsilons 0 0.3 --out benchmarks/results/expert_games.json

Each (game, ε) plays ``--games`` games of seed 0 against the knowledge-base oracle and records the
win rate, the mean number of turns, the number of distinct intentions and of distinct questions,
and the seconds it took.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from aria.games.common.base import load_game_config
from aria.games.question.expert import ScriptedExpertPolicy
from aria.games.question.game import build_game
from aria.games.question.oracle import build_oracle
from aria.games.question.play import play_games
from aria.io import atomic_write_json
from aria.trajectories import read_trajectories

GAMES = ["twenty_questions_subset", "guess_my_city_subset", "twenty_questions", "guess_my_city"]


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary row of the report: greedy against the lowest other ε, per game."""
    epsilons = sorted({r["epsilon"] for r in report["rows"]})
    by = {(r["game"], r["epsilon"]): r for r in report["rows"]}
    low, high = epsilons[0], epsilons[-1]
    turns = "; ".join(f"{by[(game, low)]['mean_turns']:.1f} → {by[(game, high)]['mean_turns']:.1f} ({game})"
                      for game in GAMES if (game, low) in by and (game, high) in by)
    won = min(r["win_rate"] for r in report["rows"])
    return [{"compares": f"the scripted expert at ε = {low:g} against ε = {high:g} (the chance of a random question "
                         f"or guess), {report['rows'][0]['games']} games a game",
             "result": ("every game won" if won == 1 else f"at least {won:.0%} won") + f"; mean turns {turns}"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=100)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.0, 0.3])
    parser.add_argument("--out", default="benchmarks/results/expert_games.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in GAMES:
            cfg = load_game_config(name)
            for eps in args.epsilons:
                out = Path(tmp) / f"{name}-{eps}.jsonl"
                start = time.perf_counter()
                play_games(build_game(cfg), ScriptedExpertPolicy(cfg, epsilon=eps), build_oracle({"name": "knowledge_base"}, cfg),
                           out, num_games=args.games, progress=False)
                seconds = time.perf_counter() - start
                records = list(read_trajectories(out))
                turns = [t for r in records for t in r["turns"]]
                rows.append({"game": name, "epsilon": eps, "games": len(records),
                             "win_rate": sum(r["success"] for r in records) / len(records),
                             "mean_turns": len(turns) / len(records),
                             "intentions": len({t["intention"] for t in turns}),
                             "distinct_questions": len({t["question"] for t in turns}), "seconds": round(seconds, 2)})
                print(json.dumps(rows[-1]))
    atomic_write_json(args.out, {"command": "python benchmarks/expert_games.py " + " ".join(
        ["--games", str(args.games), "--epsilons", *map(str, args.epsilons)]), "rows": rows})


if __name__ == "__main__":
    main()
