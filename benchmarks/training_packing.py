"""Benchmark: training on per-step rows against training in prefix-tree packs, on collected games.

Every agent step is a sample whose prompt repeats its game so far. Two ways of doing the same
training, on the same samples, in one run:

* ``padded`` — a right-padded row per step, length-bucketed micro-batches (``train.packing=padded``;
  ``--padded-micro`` x ``--padded-accumulation``, the presets' layout before packing: 8 x 2);
* ``prefix_tree`` — each game's steps together, a micro-batch one prefix tree in which the
  game's history is computed once (``train.packing=prefix_tree``, the default;
  ``--packed-micro`` x ``--packed-accumulation``: 16 x 1, the same 16 samples per optimizer step).

Trainers, each on a pipeline step-4 training set (``--sets name=train.json``, e.g. the labelled
collections of a warm-started model on twenty_questions_subset, guess_my_city_subset and of the
base model's Bargaining self-play):

* ``reinforce`` — offline REINFORCE (method ``aria``), one epoch;
* ``reward_model`` — the pointwise reward model (LoRA, head in full, no held-out split), one
  epoch, on the sets named by ``--reward-model-sets``;
* ``online`` — one iteration of online ARIA on ``--online-game`` (local rollouts of
  ``--online-rollouts`` games from ``--online-model``, scored by the reward model trained above,
  ``--online-updates`` actor steps): the rollouts are the same in both ways (seeded); the
  scoring and the update are what packing changes, and are timed on their own.
  ``--online-reward-model`` gives it a reward model trained before (a run of the online
  iteration alone: no ``--sets``, ``--reward-model-sets`` with no name).

For each (set, trainer, way), ``--repeats`` runs, each in a fresh process, the ways interleaved:
seconds of the epoch (median), the tokens it computed (padded: real tokens and the cells with
padding; packed: the trees' nodes), the process's peak memory (max RSS), the last logged loss.
Then on the packed run's first ``--check-batches`` micro-batches, in one process, the loss and
gradient norm of each micro-batch in both layouts: the largest difference of each.

Training runs in float32 on the CPU by default (``--mixed-precision no``: what a CPU without
native bfloat16 computes); the CPU is recorded with the figures. ``--device auto`` trains on a GPU
where there is one (with ``--mixed-precision bf16``), and records its name and each run's peak
GPU memory too.

    python benchmarks/training_packing.py --sets tq=RUN/s0/it1-shared/intention/train.json ... \
        --online-model RUN/warm/model      # -> benchmarks/results/training_packing.json

The JSON is written after every run and a re-run with the same settings keeps the runs it holds.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aria.io import atomic_write_json, read_json
from aria.llm.hardware import describe, label

WAYS = ("padded", "prefix_tree")


def layout(args, way: str) -> list[str]:
    micro, accumulation = ((args.padded_micro, args.padded_accumulation) if way == "padded"
                           else (args.packed_micro, args.packed_accumulation))
    return [f"train.packing={way}", f"train.micro_batch_size={micro}", f"train.gradient_accumulation_steps={accumulation}",
            f"train.mixed_precision={args.mixed_precision}", *args.overrides]


def offline_config(trainer: str, train_file: str, model: str, out: Path, overrides: list[str], device: str = "cpu") -> dict:
    from aria.resources import compose_config

    name, extra = {"reinforce": ("reinforce_llm", ["method=aria"]),
                   "reward_model": ("reward_model", ["data.eval_fraction=0", "model.lora.enabled=true", "train.lr=1e-4"])}[trainer]
    return compose_config(name, [f"data.train_file={train_file}", f"model.path={model}", f"output_dir={out}", f"device={device}",
                                 "train.epochs=1", "train.save_freq=100000", "logging.report_to=null", *extra, *overrides])


def tokens_of(trainer) -> dict:
    """Tokens one epoch computes on this process: the trees' nodes (the rows' tokens for a
    micro-batch that is cheaper in rows), or real tokens and padded cells."""
    batches = trainer._epoch_batches(0)
    if trainer.packing == "prefix_tree":
        stats = trainer.packing_stats(batches)
        return {"tokens": stats["computed_tokens"], "cells": stats["tree_cells"], "row_tokens": stats["row_tokens"],
                "tree_tokens": stats["tree_tokens"], "games_floor": stats.get("games_floor"),
                "micro_batches_in_rows": stats["micro_batches_in_rows"],
                "micro_batches": len(batches), "truncated_prompts": stats["truncated_prompts"]}
    rows = [[len(trainer.encoded[i].input_ids) for i in b] for b in batches]
    real = sum(sum(r) for r in rows)
    return {"tokens": real, "cells": sum(max(r) * len(r) for r in rows), "row_tokens": real,
            "truncated_prompts": sum(trainer.encoded[i].truncated for b in batches for i in b)}


def one_offline(args) -> dict:
    """One epoch in this process (``--one``)."""
    from aria.trainers.methods import trainer_for
    from aria.trainers.reward_model import RewardModelTrainer

    out = Path(tempfile.mkdtemp(prefix="training_packing-"))
    cfg = offline_config(args.trainer, args.train_file, args.model, out, layout(args, args.way), args.device)
    trainer = (RewardModelTrainer if args.trainer == "reward_model" else trainer_for(cfg))(cfg)
    from aria.packing import tree_attention_way

    row = {"samples": len(trainer.samples), "steps": trainer.total_steps, **tokens_of(trainer),
           "tree_attention": tree_attention_way()}  # ARIA_TREE_ATTENTION (aria.packing)
    start = time.perf_counter()
    trainer.train()
    row["seconds"] = round(time.perf_counter() - start, 2)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    row["last_loss"] = next(m["loss"] for m in reversed(metrics) if "loss" in m)
    row["final"] = str(out / "final")
    return row


def one_online(args) -> dict:
    """One online iteration in this process (``--one --trainer online``)."""
    from aria.resources import compose_config
    from aria.trainers.online import OnlineTrainer

    out = Path(tempfile.mkdtemp(prefix="training_packing-online-"))
    score = "prefix_tree" if args.way == "prefix_tree" else "padded"
    cfg = compose_config("onlinereinforce_llm", [
        f"model.path={args.model}", f"output_dir={out}", "device=cpu", f"online.games=[{args.online_game}]",
        "online.iterations=1", f"online.rollout_size={args.online_rollouts}", f"online.rollout_batch_size={args.online_rollouts}",
        f"online.actor_updates={args.online_updates}", "online.rm_refresh=0", f"reward_model.init_path={args.reward_model}",
        f"reward_model.score_packing={score}", "reward_model.dtype=float32", "rollout.dtype=null", "logging.progress=false",
        *layout(args, args.way)])
    trainer = OnlineTrainer(cfg)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    [record] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"seconds": round(seconds, 2), "rollout_seconds": record["rollout_seconds"],
            "score_seconds": record["score_seconds"], "update_seconds": record["update_seconds"],
            "score_n": record.get("score_n"), "last_loss": record.get("loss")}


def check(args, trainer_name: str, train_file: str, model: str) -> dict:
    """Loss and gradient norm of the packed run's first micro-batches in both layouts."""
    import torch

    from aria.trainers.methods import trainer_for
    from aria.trainers.reward_model import RewardModelTrainer

    out = Path(tempfile.mkdtemp(prefix="training_packing-check-"))
    cfg = offline_config(trainer_name, train_file, model, out, layout(args, "prefix_tree"), args.device)
    trainer = (RewardModelTrainer if trainer_name == "reward_model" else trainer_for(cfg))(cfg)
    worst = {"loss_abs": 0.0, "loss_rel": 0.0, "grad_norm_rel": 0.0}
    zero = 0  # micro-batches whose loss and gradient are 0 in both layouts (every weight 0): they check nothing
    for indices in trainer._epoch_batches(0)[: args.check_batches]:
        found = []
        for way in WAYS:
            trainer.packing = way
            trainer.model.zero_grad()
            loss = trainer.micro_loss(trainer.make_batch(indices), indices)
            loss.backward()
            norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in trainer.model.parameters() if p.grad is not None))
            found.append((float(loss), float(norm)))
        (loss_a, norm_a), (loss_b, norm_b) = found
        zero += loss_a == loss_b == norm_a == norm_b == 0.0
        worst["loss_abs"] = max(worst["loss_abs"], abs(loss_a - loss_b))
        worst["loss_rel"] = max(worst["loss_rel"], abs(loss_a - loss_b) / max(abs(loss_a), 1e-12))
        worst["grad_norm_rel"] = max(worst["grad_norm_rel"], abs(norm_a - norm_b) / max(norm_a, 1e-12))
    return {"micro_batches": min(args.check_batches, len(trainer._epoch_batches(0))), "zero_micro_batches": zero,
            **{k: float(f"{v:.3g}") for k, v in worst.items()}}


def sample_of_games(path: str, games: int | None) -> str:
    """``path``, or a copy of it holding the steps of a seeded sample of ``games`` of its games
    (not the first ones: a collection writes short games first)."""
    import numpy as np

    if games is None:
        return path
    samples = read_json(path)
    ids = list(dict.fromkeys(s["game_id"] for s in samples))
    keep = {ids[i] for i in np.random.default_rng(0).choice(len(ids), size=min(games, len(ids)), replace=False)}
    subset = [s for s in samples if s["game_id"] in keep]
    out = Path(tempfile.mkdtemp(prefix="training_packing-set-")) / "train.json"
    atomic_write_json(out, subset)
    return str(out)


def peak_rss_mb() -> float:
    """This process's peak resident memory (``VmHWM``: unlike ``getrusage``'s, it starts afresh at
    ``exec``, so a child does not report its parent's peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def peak_gpu_memory_mb() -> dict:
    """The GPU memory this process's tensors held at most, where it used a GPU."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    return {"peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1)}


def gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


class ChildFailed(RuntimeError):
    """A run in its own process ended with ``returncode`` (-9: killed, on these machines for memory)."""

    def __init__(self, extra: list[str], returncode: int, stderr: str):
        super().__init__(f"run failed (exit {returncode}): {extra}\n{stderr[-3000:]}")
        self.returncode = returncode


def run_child(args, extra: list[str]) -> dict:
    """One run, or the check (``--check``), in a fresh process: a run's peak memory is its own,
    and the check's two layouts (15 GB on the Guess My City games) are not held by this process
    while the next run starts."""
    done = subprocess.run([sys.executable, __file__, "--one", *extra, "--mixed-precision", args.mixed_precision,
                           "--device", args.device,
                           "--check-batches", str(args.check_batches),
                           "--padded-micro", str(args.padded_micro), "--padded-accumulation", str(args.padded_accumulation),
                           "--packed-micro", str(args.packed_micro), "--packed-accumulation", str(args.packed_accumulation),
                           "--online-game", args.online_game, "--online-rollouts", str(args.online_rollouts),
                           "--online-updates", str(args.online_updates), "--overrides", *args.overrides],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise ChildFailed(extra, done.returncode, done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


#: How each row of the whole-history table names its tree attention (aria.packing.TREE_ATTENTIONS)
ATTENTION_LABELS = {"dense": "every node against every node",
                    "trunk": "the trunk on the causal kernel, the branches against every node",
                    "blocks": "the trunk on the causal kernel, the branches in blocks"}


def render_cutoffs(before: dict, after: dict, *others: dict, key: str = "gmc/reinforce") -> str:
    """The table of docs/benchmarks.md "Whole histories": the preset before (prompts cut on the left at
    512, as the release; rows and trees, micro-batches cut every 16 samples) against whole histories in
    trees of whole games, from the reports (the same samples, the same machine): ``others`` (other
    tree attentions, ``ARIA_TREE_ATTENTION``, or another precision, ``--mixed-precision``), then
    ``after``, the default, each row named from its report."""
    if len({r["machine"]["cpu_model"] for r in (before, after, *others)}) > 1:
        raise ValueError("the reports come from different machines")

    def whole(report: dict) -> str:
        precision = report["settings"]["mixed_precision"]
        return (f"whole prompts, trees of whole games, {ATTENTION_LABELS[report['runs'][key]['prefix_tree'][0]['tree_attention']]}"
                f"{'' if precision == 'no' else f', in {precision}'}")

    rows = [("prompts cut at 512, rows (before)", before, "padded"), ("prompts cut at 512, trees (the preset before)", before, "prefix_tree"),
            *[(whole(r), r, "prefix_tree") for r in others], (whole(after), after, "prefix_tree")]
    bf16 = any(r["settings"]["mixed_precision"] != after["settings"]["mixed_precision"] for r in others)
    lines = [f"{label(after['machine'])}; {after['runs'][key]['prefix_tree'][0]['samples']} steps of the same games, one epoch, "
             f"training in {'float32' if after['settings']['mixed_precision'] == 'no' else after['settings']['mixed_precision']}"
             f"{' unless the row says' if bf16 else ''}, "
             f"{after['settings']['repeats']} runs a way", "",
             "| prompts, layout | prompts cut | tokens computed | seconds an epoch (median) | peak memory |", "|---|---|---|---|---|"]
    for name, report, way in rows:
        runs = report["runs"][key][way]
        first = runs[0]
        lines.append(f"| {name} | {first['truncated_prompts']} | {first['tokens']:,} | "
                     f"{statistics.median(r['seconds'] for r in runs):.1f} | {max(r['peak_rss_mb'] for r in runs) / 1024:.1f} GB |")
    now = statistics.median(r["seconds"] for r in after["runs"][key]["prefix_tree"])
    then = statistics.median(r["seconds"] for r in before["runs"][key]["prefix_tree"])
    tree, check = after["runs"][key]["prefix_tree"][0], after["checks"].get(key)
    lines += ["", f"Whole histories in trees ({ATTENTION_LABELS[tree['tree_attention']]}) against the preset before: "
              f"{then / now:.2f}x less time an epoch; "
              f"{tree['tokens']:,} tokens computed against the games' own length of {tree['games_floor']:,} "
              f"(each game's tree, its history once) and {tree['row_tokens']:,} in rows of whole prompts" +
              (f"; trees against rows on whole prompts, first {check['micro_batches']} micro-batches: loss "
               f"{check['loss_rel']:.1e}, gradient norm {check['grad_norm_rel']:.1e} apart (relative)"
               f"{'; every one of them with loss and gradient 0, so it checked nothing' if check.get('zero_micro_batches') == check['micro_batches'] else ''}."
               if check and "failed" not in check else
               f"; the check of trees against rows ended with exit {check['failed']} (-9: killed for memory; see the text)." if check else
               "; no check of trees against rows in this report (see the text).")]
    return "\n".join(lines) + "\n"


#: How the summary names a set (the name before ``=`` in ``--sets``) and a trainer.
SET_NAMES = {"tq": "Twenty Questions", "gmc": "Guess My City", "barg": "Bargaining self-play", "bargaining": "Bargaining self-play"}
TRAINER_NAMES = {"reinforce": "REINFORCE", "reward_model": "the reward model"}


def median_seconds(runs: list[dict]) -> float:
    return statistics.median(r["seconds"] for r in runs)


def faster(before_s: float, after_s: float) -> str:
    """ "1.71x faster", or "1.28x slower" where ``after_s`` took longer."""
    return f"{before_s / after_s:.2f}x faster" if after_s <= before_s else f"{after_s / before_s:.2f}x slower"


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary rows of a report: per set and trainer timed both ways, trees against rows."""
    precision = report["settings"]["mixed_precision"]
    model = report["settings"]["model"]
    trained = ("" if precision == "no" else f", {precision}") + ("" if model == "embedded" else f", {Path(model).name}")
    rows = []
    for key, runs in report["runs"].items():
        if key == "online" or not all(runs.get(way) for way in WAYS):
            continue
        name, trainer = key.split("/")
        tree = runs["prefix_tree"][0]
        rows.append({"compares": "one epoch on the same samples: per-step rows against prefix trees",
                     "result": f"{TRAINER_NAMES[trainer]} on {SET_NAMES.get(name, name)} ({tree['samples']:,} samples{trained}): "
                               f"trees {faster(median_seconds(runs['padded']), median_seconds(runs['prefix_tree']))}, "
                               f"{tree['row_tokens'] / tree['tokens']:.2f}x fewer tokens"})
    return rows


def headline_cutoffs(before: dict, after: dict, key: str = "gmc/reinforce") -> list[dict]:
    """docs/benchmarks.md's summary row of the whole-history comparison (:func:`render_cutoffs`): the preset
    before (prompts cut, in trees) against whole histories in trees of whole games."""
    then, now = before["runs"][key]["prefix_tree"], after["runs"][key]["prefix_tree"]
    memory = max(r["peak_rss_mb"] for r in then) / max(r["peak_rss_mb"] for r in now)
    return [{"compares": f"one epoch of REINFORCE on {now[0]['samples']} Guess My City steps: prompts cut at 512, in trees "
                         "(the preset before), against whole histories in trees of whole games",
             "result": f"{faster(median_seconds(then), median_seconds(now))}, {then[0]['tokens'] / now[0]['tokens']:.1f}x "
                       f"fewer tokens, {memory:.1f}x less memory"}]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="*", default=[],
                        help="name=train.json (pipeline step 4's output), or name=train.json@N: a seeded sample of N of its games")
    parser.add_argument("--model", default="embedded", help="the model the sets were collected with (the start of training)")
    parser.add_argument("--models", nargs="*", default=[], help="name=model folder, where a set's model differs")
    parser.add_argument("--reward-model-sets", nargs="*", default=None, help="sets the reward model trains on (default: the first)")
    parser.add_argument("--online-model", default=None, help="the policy of the online iteration (default: no online run)")
    parser.add_argument("--online-reward-model", default=None,
                        help="a trained reward model for the online iteration (default: the one this run trains)")
    parser.add_argument("--online-game", default="twenty_questions_subset")
    parser.add_argument("--online-rollouts", type=int, default=16)
    parser.add_argument("--online-updates", type=int, default=16)
    parser.add_argument("--games", type=int, default=None,
                        help="train on the steps of a seeded sample of N games of each set only (an epoch of per-step rows is long)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--check-batches", type=int, default=8)
    parser.add_argument("--mixed-precision", default="no")
    parser.add_argument("--device", default="cpu", help="cpu, or auto: a GPU where there is one (then its name and "
                        "peak memory are recorded too)")
    parser.add_argument("--padded-micro", type=int, default=8)
    parser.add_argument("--padded-accumulation", type=int, default=2)
    parser.add_argument("--packed-micro", type=int, default=16)
    parser.add_argument("--packed-accumulation", type=int, default=1)
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS,
                        help="the layouts timed (the check compares both on the first micro-batches anyway)")
    parser.add_argument("--overrides", nargs="*", default=[],
                        help="settings for every run of both ways, e.g. the release's cut: data.max_prompt_tokens=512 "
                        "data.over_long=cut_left (the default trains whole prompts, as played)")
    parser.add_argument("--out", default="benchmarks/results/training_packing.json")
    # one run in a child process
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trainer", default="reinforce", help=argparse.SUPPRESS)
    parser.add_argument("--train-file", help=argparse.SUPPRESS)
    parser.add_argument("--way", help=argparse.SUPPRESS)
    parser.add_argument("--reward-model", help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.one and args.check:
        print(json.dumps(check(args, args.trainer, args.train_file, args.model)))
        return 0
    if args.one:
        row = one_online(args) if args.trainer == "online" else one_offline(args)
        row["peak_rss_mb"] = peak_rss_mb()
        row.update(peak_gpu_memory_mb())
        print(json.dumps(row))
        return 0

    sets = {}
    for entry in args.sets:  # name=path, or name=path@N: a seeded sample of N of its games
        name, path = entry.split("=", 1)
        path, _, games = path.partition("@")
        sets[name] = sample_of_games(path, int(games) if games else args.games)
    models = dict(m.split("=", 1) for m in args.models)
    settings = {k: v for k, v in vars(args).items()
                if k not in ("out", "one", "check", "trainer", "train_file", "way", "reward_model")}
    result = read_json(args.out) if Path(args.out).is_file() else {}
    if result.get("settings") != settings or result.get("machine", {}).get("cpu_model") != describe()["cpu_model"]:
        result = {"machine": describe(), "settings": settings, "runs": {}, "checks": {}}
    if args.device != "cpu":
        result["machine"]["gpu"] = gpu_name()

    def save() -> None:
        atomic_write_json(args.out, result)

    rm_sets = args.reward_model_sets if args.reward_model_sets is not None else list(sets)[:1]
    plan = [(name, "reinforce") for name in sets] + [(name, "reward_model") for name in rm_sets]
    for name, trainer in plan:
        model = models.get(name, args.model)
        key = f"{name}/{trainer}"
        runs = result["runs"].setdefault(key, {way: [] for way in args.ways})
        for _ in range(args.repeats):
            for way in args.ways:
                if len(runs[way]) < args.repeats:
                    runs[way].append(run_child(args, ["--trainer", trainer, "--train-file", sets[name], "--model", model,
                                                      "--way", way]))
                    print(key, way, json.dumps(runs[way][-1]), flush=True)
                    save()
        if key not in result["checks"]:
            try:
                result["checks"][key] = run_child(args, ["--check", "--trainer", trainer, "--train-file", sets[name],
                                                         "--model", model])
            except ChildFailed as failed:  # the timings stay; the report says the check did not finish
                result["checks"][key] = {"failed": failed.returncode}
            print(key, "check", json.dumps(result["checks"][key]), flush=True)
            save()

    if args.online_model and (rm_sets or args.online_reward_model):
        reward_model = args.online_reward_model or result["runs"][f"{rm_sets[0]}/reward_model"]["prefix_tree"][0]["final"]
        from aria.trainers.reward_service import merge_if_adapter

        merge_if_adapter(Path(reward_model))
        runs = result["runs"].setdefault("online", {way: [] for way in WAYS})
        for _ in range(args.repeats):
            for way in WAYS:
                if len(runs[way]) < args.repeats:
                    runs[way].append(run_child(args, ["--trainer", "online", "--model", args.online_model, "--way", way,
                                                      "--reward-model", reward_model]))
                    print("online", way, json.dumps(runs[way][-1]), flush=True)
                    save()

    summary = {}
    for key, runs in result["runs"].items():
        ways = [w for w in WAYS if runs.get(w)]  # --ways may have timed one layout only
        if not ways:
            continue
        field = "update_seconds" if key == "online" else "seconds"
        median = {w: statistics.median(r[field] for r in runs[w]) for w in ways}
        row = {f"{w}_{field}": round(median[w], 2) for w in ways}
        if len(ways) == len(WAYS):
            row["time_ratio"] = round(median["padded"] / median["prefix_tree"], 2)
        if key == "online":
            scores = {w: statistics.median(r["score_seconds"] for r in runs[w]) for w in ways}
            row.update({f"{w}_score_seconds": round(scores[w], 2) for w in ways})
        else:
            if "padded" in ways:
                row.update({"padded_tokens": runs["padded"][0]["tokens"], "padded_cells": runs["padded"][0]["cells"]})
            if "prefix_tree" in ways:
                tree = runs["prefix_tree"][0]
                row.update({"tree_tokens": tree["tokens"],
                            "games_floor": tree.get("games_floor"),  # each game's tree, its history once
                            "token_ratio": round(tree["row_tokens"] / tree["tokens"], 2),
                            "micro_batches_in_rows": tree.get("micro_batches_in_rows"),
                            "micro_batches": tree.get("micro_batches")})
            some = runs[ways[-1]][0]
            row.update({"row_tokens": some["row_tokens"],  # the same samples, one row each
                        "truncated_prompts": some["truncated_prompts"], "samples": some["samples"]})
        row.update({f"{w}_peak_rss_mb": max(r["peak_rss_mb"] for r in runs[w]) for w in ways})
        if all("peak_gpu_mb" in r for w in ways for r in runs[w]):
            row.update({f"{w}_peak_gpu_mb": max(r["peak_gpu_mb"] for r in runs[w]) for w in ways})
        summary[key] = row
    result["summary"] = summary
    save()
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
