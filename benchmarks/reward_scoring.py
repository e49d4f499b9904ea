"""Benchmark: scoring an online iteration's steps with the reward model, padded rows against prefix trees.

Online ARIA scores every step of every rollout with the reward model before each actor update
(:class:`aria.trainers.reward_service.InProcessScorer`). A step's prompt repeats its game's history, so
the steps of one game are long sequences that share most of their tokens. Two ways of doing the
same work, on the same samples, in one run:

* ``padded`` — every step on its own row of a right-padded batch (``--batch-size`` rows, sorted by
  length): the scorer as it was, and ``reward_model.score_packing=padded`` now;
* ``prefix_tree`` — the steps merged along their shared prefixes, so a game's history is computed
  once (:func:`aria.trainers.reward_model.score_prefix_trees`, ``--pack-tokens`` per pass): the
  default now.

Each in float32 and, where the CPU computes bfloat16 natively (:mod:`aria.llm.hardware`), in
bfloat16 (``--dtypes`` forces a list). The samples are the steps of ``--games`` Guess My City
games rendered by ``realistic_games.py`` (up to 20 turns, the prompts the policy saw), or of the
games in ``--games-file`` (a schema-v1 JSONL, e.g. a collection's ``games.jsonl``). The model is
the embedded SmolLM2-135M-Instruct with a seeded random score head (speed does not depend on
training). For each way: steps/s (median of ``--repeats``, the ways interleaved), the token
positions computed, and the largest difference of its scores from float32 ``padded``.

    python benchmarks/reward_scoring.py     # -> benchmarks/results/reward_scoring.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from aria.io import atomic_write_json
from aria.llm.hardware import describe
from aria.resources import REPO_ROOT

sys.path.insert(0, str(Path(__file__).resolve().parent))


def step_samples(records: list[dict]) -> list[dict]:
    """Every agent step as ``{observation, action}``: the online trainer's ``step_samples``."""
    from aria.games.question.game import load_game

    games: dict = {}
    samples = []
    for record in records:
        game = games.setdefault(record["game"], load_game(record["game"]))
        for i, turn in enumerate(record["turns"]):
            samples.append({"observation": game.prompt_before_turn(record["turns"], i), "action": turn["action"]})
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=24, help="realistic Guess My City games to render")
    parser.add_argument("--games-file", default=None, help="score the steps of these games instead")
    parser.add_argument("--dtypes", nargs="+", default=None, help="default: float32, and bfloat16 where native")
    parser.add_argument("--batch-size", type=int, default=16, help="rows per padded pass (the config's default)")
    parser.add_argument("--pack-tokens", type=int, nargs="+", default=[2048], help="tokens per prefix-tree pass")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks" / "results" / "reward_scoring.json"))
    args = parser.parse_args()

    from aria.llm.embedded import embedded_model_dir
    from aria.llm.local import resolve_dtype
    from aria.llm.policy import Encoding
    from aria.trainers.reward_model import (
        load_reward_model, prefix_tree_packs, score_encoded, score_prefix_trees,
    )

    if args.games_file:
        from aria.trajectories import read_trajectories

        records = list(read_trajectories(args.games_file))
    else:
        from realistic_games import realistic_games

        records = realistic_games(args.games, max_turns=20, seed=args.seed)
    samples = step_samples(records)
    native = str(resolve_dtype("auto", "cpu")).removeprefix("torch.")
    dtypes = args.dtypes or sorted({"float32", native}, reverse=True)
    encoding = Encoding(2048, append_eos=False)  # the online config's prompt budget, the RM's encoding
    models = {}
    for dtype in dtypes:
        torch.manual_seed(args.seed)  # the same random score head in every dtype
        tokenizer, model = load_reward_model(str(embedded_model_dir()), dtype)
        models[dtype] = model.eval()
    encoded = [encoding.encode(tokenizer, s["observation"], s["action"]) for s in samples]
    lengths = [len(e.input_ids) for e in encoded]
    print(f"[bench] {len(records)} games, {len(samples)} steps, {sum(lengths)} tokens "
          f"(mean {np.mean(lengths):.0f}, max {max(lengths)}); dtypes {dtypes}", flush=True)

    ways = {}
    for dtype in dtypes:
        ways[f"padded_{dtype}"] = (dtype, lambda m: score_encoded(m, encoded, tokenizer.pad_token_id, args.batch_size),
                                   sum(max(lengths[i] for i in chunk) * len(chunk) for chunk in _padded_chunks(lengths, args.batch_size)))
        for budget in args.pack_tokens:
            ways[f"prefix_tree_{budget}_{dtype}"] = (
                dtype, lambda m, b=budget: score_prefix_trees(m, encoded, b),
                sum(len(p.input_ids) for p in prefix_tree_packs([e.input_ids for e in encoded], budget)))
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    scores: dict[str, np.ndarray] = {}
    for repeat in range(args.repeats):
        for name, (dtype, run, _) in ways.items():
            start = time.perf_counter()
            scores[name] = run(models[dtype])
            seconds[name].append(time.perf_counter() - start)
            print(f"[bench] repeat {repeat}: {name} {seconds[name][-1]:.1f} s", flush=True)

    reference = scores["padded_float32"] if "padded_float32" in scores else None
    base = statistics.median(seconds[next(iter(ways))])
    rows = []
    for name, (dtype, _, positions) in ways.items():
        median = statistics.median(seconds[name])
        rows.append({"way": name, "dtype": dtype, "seconds": [round(s, 2) for s in seconds[name]],
                     "median_seconds": round(median, 2), "steps_per_s": round(len(samples) / median, 2),
                     "speedup": round(base / median, 2), "token_positions": int(positions),
                     "max_abs_diff_from_padded_float32":
                         None if reference is None else float(np.abs(scores[name] - reference).max())})
    result = {"machine": {**describe(), "torch": torch.__version__, "threads": torch.get_num_threads()},
              "settings": {"games": len(records), "games_file": args.games_file, "steps": len(samples),
                           "tokens": int(sum(lengths)), "batch_size": args.batch_size,
                           "pack_tokens": args.pack_tokens, "repeats": args.repeats, "seed": args.seed},
              "baseline": next(iter(ways)), "rows": rows}
    atomic_write_json(args.out, result)
    for row in rows:
        print(f"[bench] {row['way']:28s} {row['steps_per_s']:7.2f} steps/s  x{row['speedup']:.2f}  "
              f"{row['token_positions']} positions  max diff {row['max_abs_diff_from_padded_float32']}")
    print(f"[bench] wrote {args.out}")


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary row of a report: the fastest prefix-tree way against the baseline."""
    rows = {r["way"]: r for r in report["rows"]}
    base = rows[report["baseline"]]
    best = min((r for r in report["rows"] if r["way"].startswith("prefix_tree")), key=lambda r: r["median_seconds"])
    pack = best["way"].split("_")[2]  # prefix_tree_<tokens>_<dtype>
    return [{"compares": f"reward-model scores of {report['settings']['steps']} Guess My City steps: padded rows "
                         f"against prefix trees, {best['dtype']}",
             "result": f"trees {base['median_seconds'] / best['median_seconds']:.2f}x faster at {int(pack):,} tokens a pass "
                       f"(the fastest tried), {base['token_positions'] / best['token_positions']:.1f}x fewer token "
                       f"positions; scores within {best['max_abs_diff_from_padded_float32']:.1e}"}]


def _padded_chunks(lengths: list[int], batch_size: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


if __name__ == "__main__":
    main()
