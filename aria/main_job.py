"""The whole ARIA loop in one command (issue: the main job), every step reusing finished work.

collect games with the base policy -> pipeline steps 1-4 per game -> offline REINFORCE with LoRA
on both games' samples -> merge the adapter -> serve the base and the trained model with vLLM ->
evaluation/eval.sh on both -> ``run_dir/report/report.md`` with the plots.

A second run skips what is done: collection and evaluation resume game by game, the pipeline
steps compare fingerprints, training resumes from its newest checkpoint (or is skipped when its
final model exists), merging is skipped when the merged folder exists, and a model whose
evaluation summary is complete is not served again.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from aria.io import atomic_write_json, read_json
from aria.resources import REPO_ROOT, compose_config

Printer = Callable[[str], None]


class Timer:
    def __init__(self):
        self.steps: list[tuple[str, float]] = []

    def run(self, name: str, fn, echo: Printer):
        echo(f"[main] === {name} ===")
        start = time.perf_counter()
        result = fn()
        self.steps.append((name, time.perf_counter() - start))
        echo(f"[main] {name}: {self.steps[-1][1]:.0f}s")
        return result


def collect(cfg: dict, game: str, echo: Printer) -> Path:
    from aria.rollout import collect_from_config

    out = Path(cfg["run_dir"]) / "trajectories" / f"{game}.jsonl"
    c = compose_config("collect", [f"game={game}", f"num_games={cfg['collect']['num_games']}", f"seed={cfg['seed']}",
                             f"out={out}", f"policy.model_path={cfg['base_model']}", *cfg["collect"]["overrides"]])
    summary = collect_from_config(c)
    echo(f"[main] collect {game}: {summary.line()}")
    if summary.failed:
        raise RuntimeError(f"{summary.failed} game(s) failed during collection; see {out}")
    return out


def intention(cfg: dict, game: str, trajectories: Path, echo: Printer) -> dict:
    from aria.intention import pipeline

    c = compose_config("intention", [f"game={game}", f"input={trajectories}", f"seed={cfg['seed']}",
                               f"run_dir={Path(cfg['run_dir']) / 'intention' / game}", *cfg["intention_overrides"]])
    pipeline.step1_embed_and_cluster(c, echo)
    report = pipeline.step2_select_k(c, echo)
    pipeline.step3_apply_labels(c, echo)
    pipeline.step4_build_training_set(c, echo)
    return report


def train(cfg: dict, echo: Printer) -> Path:
    from aria.trainers.offline import trainer_for

    run_dir = Path(cfg["run_dir"])
    samples = []
    for game in cfg["games"]:
        samples += json.loads((run_dir / "intention" / game / "train.json").read_text())
    train_file = run_dir / "train" / "train.json"
    atomic_write_json(train_file, samples)
    out = run_dir / "offline"
    overrides = [f"data.train_file={train_file}", f"output_dir={out}", f"seed={cfg['seed']}",
                 f"model.path={cfg['base_model']}", *cfg["train_overrides"]]
    trained_on = {"train_json_sha256": hashlib.sha256(train_file.read_bytes()).hexdigest(), "overrides": overrides}
    marker = out / "trained_on.json"
    if (out / "final").is_dir() and marker.is_file() and read_json(marker) == trained_on:
        echo(f"[main] training done before on the same samples: {out / 'final'}")
        return out / "final"
    config = compose_config("reinforce_llm", overrides)
    result = trainer_for(config)(config).train()
    atomic_write_json(marker, trained_on)
    echo(f"[main] trained {result['steps']} steps -> {result['final']}")
    return Path(result["final"])


def merge(final: Path, run_dir: Path, echo: Printer) -> Path:
    from aria.policy import merge_lora

    out = run_dir / "merged"
    adapter = final / "adapter_model.safetensors"
    if (out / "model.safetensors").is_file() and adapter.is_file() and \
            (out / "model.safetensors").stat().st_mtime >= adapter.stat().st_mtime:
        echo(f"[main] merged model exists: {out}")
        return out
    merge_lora(final, out)
    echo(f"[main] merged the adapter into {out}")
    return out


def evaluate(cfg: dict, model_dir: Path, name: str, echo: Printer) -> Path:
    """Serve ``model_dir`` as ``name`` with vLLM, run eval.sh, stop the server."""
    out = Path(cfg["run_dir"]) / "eval" / name
    e = cfg["eval"]
    summary = out / "summary.json"
    weights = model_dir / "model.safetensors"
    evaluated = {"model_dir": str(model_dir), "weights_mtime": weights.stat().st_mtime if weights.is_file() else None}
    marker = out / "evaluated_model.json"
    if marker.is_file() and read_json(marker) != evaluated:  # the model changed: its old games do not count
        shutil.rmtree(out)
    if summary.is_file():
        s = read_json(summary)
        if all(env in s["environments"] and s["environments"][env]["finished"] == e["num_games"] for env in cfg["games"]):
            echo(f"[main] evaluation of {name} done before: {summary}")
            return out
    atomic_write_json(marker, evaluated)
    env = {**os.environ, "SERVED_MODEL_NAME": name, "VLLM_LOG": str(out.parent / f"vllm-{name}.log")}
    out.parent.mkdir(parents=True, exist_ok=True)
    started = subprocess.run(["bash", str(REPO_ROOT / "scripts/serve_vllm.sh"), str(model_dir), str(e["port"])],
                             env=env, capture_output=True, text=True)
    if started.returncode != 0:
        raise RuntimeError(f"vLLM did not start for {model_dir}:\n{started.stderr[-2000:]}")
    info = dict(line.split("=", 1) for line in started.stdout.split())
    echo(f"[main] vLLM serves {name} at {info['BASE_URL']} (pid {info['PID']})")
    try:
        eval_env = {**os.environ, "BASE_URL": info["BASE_URL"], "MODEL_NAME": name, "ENVS": " ".join(cfg["games"]),
                    "N": str(e["num_games"]), "CONCURRENCY": str(e["concurrency"]), "MAX_TOKENS": str(e["max_tokens"]),
                    "TEMPERATURE": str(e["temperature"]), "SEED": str(cfg["seed"]), "OUT": str(out)}
        done = subprocess.run(["bash", str(REPO_ROOT / "evaluation/eval.sh"), "progress=false"], env=eval_env)
        if done.returncode != 0:
            raise RuntimeError(f"eval.sh failed for {name} (exit {done.returncode}); re-run to continue")
    finally:
        subprocess.run(["bash", str(REPO_ROOT / "scripts/serve_vllm.sh"), "stop", info["PID"]], capture_output=True)
    return out


def run(cfg: dict, echo: Printer = print) -> Path:
    from aria.llm.embedded import resolve_model_path

    run_dir = Path(cfg["run_dir"])
    timer = Timer()
    selections = {}
    for game in cfg["games"]:
        trajectories = timer.run(f"collect {game}", lambda: collect(cfg, game, echo), echo)
        selections[game] = timer.run(f"intention steps 1-4 {game}", lambda: intention(cfg, game, trajectories, echo), echo)
    final = timer.run("offline REINFORCE", lambda: train(cfg, echo), echo)
    merged = timer.run("merge LoRA", lambda: merge(final, run_dir, echo), echo)
    base = timer.run("evaluate base", lambda: evaluate(cfg, resolve_model_path(cfg["base_model"]), "base", echo), echo)
    trained = timer.run("evaluate ARIA", lambda: evaluate(cfg, merged, "aria", echo), echo)
    from aria.main_report import write_report

    # A re-run skips finished steps in about no time; the report keeps, per step, the time of the
    # run that did its work (the longest one recorded).
    timings_path = run_dir / "timings.json"
    previous = read_json(timings_path) if timings_path.is_file() else {}
    timings = {name: max(seconds, previous.get(name, 0.0)) for name, seconds in timer.steps}
    atomic_write_json(timings_path, timings)
    report = write_report(cfg, selections, [base, trained], list(timings.items()))
    echo(f"[main] report: {report}")
    return report
