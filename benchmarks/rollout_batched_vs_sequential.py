"""Benchmark: the same games played batched (16 at a time) and one at a time.

Plays the same ``--games`` Twenty Questions games (same seed, so the same targets and game ids)
with the embedded default policy against the knowledge-base oracle, once with
``batch_size=16`` and once with ``batch_size=1``, and writes turns/s of each and their ratio to
JSON. Both runs use the same backend and settings (prompt-cache reuse on); only the batching
differs. Sampling is at temperature 1 as in collection, so the two runs play different
questions; turns/s is the comparable figure.

    python benchmarks/rollout_batched_vs_sequential.py --out benchmarks/results/rollout_batched_vs_sequential.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from aria.games.common.base import load_game_config
from aria.games.question.game import build_game
from aria.games.question.oracle import build_oracle
from aria.games.question.play import play_games
from aria.io import atomic_write_json
from aria.llm.local import LocalChatModel
from aria.resources import REPO_ROOT


def run(variant: str, batch_size: int, reuse_cache: bool, games: int, seed: int, max_new_tokens: int) -> dict:
    game_cfg = load_game_config("twenty_questions")
    game = build_game(game_cfg)
    oracle = build_oracle({"name": "knowledge_base"}, game_cfg)
    policy = LocalChatModel("embedded", max_new_tokens=max_new_tokens, temperature=1.0, reuse_cache=reuse_cache, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        summary = play_games(game, policy, oracle, Path(tmp) / "games.jsonl", num_games=games, seed=seed,
                             batch_size=batch_size, progress=True)
    return {
        "variant": variant, "batch_size": batch_size, "reuse_cache": reuse_cache, "dtype": str(policy.model.dtype),
        "games": summary.played,
        "successes": summary.counts["successes"], "turns": summary.turns, "seconds": round(summary.seconds, 2),
        "turns_per_s": round(summary.turns_per_s, 4),
    }


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary row of a report."""
    by = {r["variant"]: r for r in report["runs"]}
    batched, single = by["batched"], by["one_at_a_time"]
    return [{"compares": f"the same {batched['games']} Twenty Questions games played {batched['batch_size']} at a time "
                         "against one at a time",
             "result": f"batched {batched['turns_per_s'] / single['turns_per_s']:.2f}x the turns/s"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=48, help="the collection default (config/policy/local.yaml)")
    parser.add_argument("--also-no-cache", action="store_true", help="also time batched play without prompt-cache reuse")
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks/results/rollout_batched_vs_sequential.json"))
    args = parser.parse_args()

    runs = [run("batched", 16, True, args.games, args.seed, args.max_new_tokens)]
    if args.also_no_cache:
        runs.append(run("batched_no_cache", 16, False, args.games, args.seed, args.max_new_tokens))
    runs.append(run("one_at_a_time", 1, True, args.games, args.seed, args.max_new_tokens))
    by = {r["variant"]: r for r in runs}
    result = {
        "benchmark": "rollout_batched_vs_sequential",
        "game": "twenty_questions", "policy": "SmolLM2-135M-Instruct (embedded)", "oracle": "knowledge_base",
        "seed": args.seed, "max_new_tokens": args.max_new_tokens,
        "machine": {"python": sys.version.split()[0], "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "platform": platform.platform()},
        "runs": runs,
        "speedup_batched_vs_one_at_a_time": round(by["batched"]["turns_per_s"] / by["one_at_a_time"]["turns_per_s"], 3),
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if "batched_no_cache" in by:
        result["speedup_cache_reuse"] = round(by["batched"]["turns_per_s"] / by["batched_no_cache"]["turns_per_s"], 3)
    atomic_write_json(args.out, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
