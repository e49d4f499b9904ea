"""Movement (did training move the policy?) scored in padded rows against whole games in prefix trees.

The experiment's movement stage (:func:`aria.experiment.movement.movement`) compares a trained model with the
one it started from on held-out steps of the starting model's evaluation games. This benchmark
does that work twice on the same steps, in one process, after one warm-up: whole games drawn as
the stage draws them (:func:`aria.experiment.movement.whole_games`, at least ``--steps`` steps), scored

* ``padded``: every step its own right-padded row, 8 rows a batch sorted by length (how the stage
  scored until it took games whole);
* ``prefix_tree``: each game's steps one prefix tree (:func:`aria.packing.collate_tree`), its
  history computed once;

and writes each way's seconds (the two models' forward passes only: loading is the same for both),
the tokens the models computed, and the token KL and log-prob change, which agree up to float rounding.

    python benchmarks/movement_layout.py --run-dir runs/small --arm aria --out benchmarks/results/movement_layout.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from aria.io import atomic_write_json, read_json
from aria.llm.hardware import describe, label

WAYS = ("padded", "prefix_tree")


def render(report: dict) -> str:
    """The Markdown table of docs/benchmarks.md "Movement in whole games", from a report."""
    lines = [f"{label(report['machine'])}; {report['steps']} held-out steps of {report['games']} whole games, "
             f"{report['threads']} threads, float32; the parent and the trained model each score every step:", "",
             "| layout | seconds | tokens computed (each model) | token KL | mean log-prob change |", "|---|---|---|---|---|"]
    for way in WAYS:
        r = report["ways"][way]
        lines.append(f"| {way} | {r['seconds']:.1f} | {r['tokens_computed']:,} | {r['token_kl']:.6f} | {r['logprob_change']:+.6f} |")
    ratio = report["ways"]["padded"]["seconds"] / report["ways"]["prefix_tree"]["seconds"]
    lines += ["", f"Prefix trees: {ratio:.1f}x faster."]
    return "\n".join(lines) + "\n"


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary row of a report."""
    padded, tree = report["ways"]["padded"], report["ways"]["prefix_tree"]
    return [{"compares": f"movement scored on {report['steps']} held-out steps: padded rows against whole games in prefix trees",
             "result": f"trees {padded['seconds'] / tree['seconds']:.1f}x faster, "
                       f"{padded['tokens_computed'] / tree['tokens_computed']:.1f}x fewer tokens; "
                       f"token KL {padded['token_kl']:.6f} and {tree['token_kl']:.6f}"}]


def main() -> None:
    from aria.experiment.layout import Layout
    from aria.experiment.movement import compare_policies, steps_by_game, whole_games
    from aria.experiment.runner import held_out_steps
    from aria.llm.policy import Encoding, load_policy
    from aria.packing import collate_tree, sample_groups

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, help="a finished experiment's run folder (its experiment.json)")
    parser.add_argument("--arm", default="aria", help="the trained arm (seed 0, iteration 1) to compare with the warm start")
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/movement_layout.json"))
    parser.add_argument("--render", type=Path, help="print the docs' table of this report and exit")
    args = parser.parse_args()
    if args.render:
        print(render(read_json(args.render)), end="")
        return
    if args.run_dir is None:
        parser.error("--run-dir is needed (or --render REPORT)")
    cfg = {**read_json(args.run_dir / "experiment.json"), "run_dir": str(args.run_dir)}  # recorded relative to where it ran
    lay = Layout(cfg)
    parent, child = lay.model("", 0, 0), lay.model(args.arm, 0, 1)
    samples = held_out_steps(cfg, lay)
    games = sample_groups(samples)
    chosen = whole_games(games, [s["success"] for s in samples], args.steps, seed=0)
    steps, games = [samples[i] for i in chosen], [games[i] for i in chosen]
    tokenizer, parent_model = load_policy(str(parent))
    _, child_model = load_policy(str(child))
    encoding = Encoding.saved_in(child, Encoding())
    encoded = [encoding.encode(tokenizer, s["observation"], s["action"]) for s in steps]
    won = [s["success"] for s in steps]
    by_game = steps_by_game(games)
    computed = {"padded": sum(len(e.input_ids) for e in encoded),  # a lower bound: padding not counted
                "prefix_tree": sum(int(collate_tree([encoded[i] for i in rows], tokenizer.pad_token_id)["tree_tokens"])
                                   for rows in by_game.values())}
    report = {"command": "python benchmarks/movement_layout.py " + " ".join(sys.argv[1:]), "machine": describe(),
              "threads": torch.get_num_threads(), "parent": str(parent), "child": str(child),
              "steps": len(steps), "games": len(by_game), "ways": {}}
    compare_policies(parent_model.eval(), child_model.eval(), encoded[:2], won[:2], tokenizer.pad_token_id)  # warm-up
    for way in WAYS:
        start = time.perf_counter()
        found = compare_policies(parent_model, child_model, encoded, won, tokenizer.pad_token_id,
                                 games=games if way == "prefix_tree" else None)
        report["ways"][way] = {"seconds": time.perf_counter() - start, "tokens_computed": computed[way],
                               **{k: found[k] for k in ("token_kl", "logprob_change", "logprob_change_won", "logprob_change_lost")}}
        print(way, f"{report['ways'][way]['seconds']:.1f}s", flush=True)
    atomic_write_json(args.out, report)
    print(render(report), end="")


if __name__ == "__main__":
    main()
