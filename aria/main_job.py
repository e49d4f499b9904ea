"""The whole ARIA loop in one command (issue: the main job), every step reusing finished work.

serve the base model with vLLM -> collect games with it and evaluate it (evaluation/eval.sh) ->
pipeline steps 1-4 per game -> offline REINFORCE with LoRA on both games' samples -> merge the
adapter -> serve the trained model with vLLM and evaluate it -> ``run_dir/report/report.md``
with the plots.

Collection goes through the same vLLM server as the base model's evaluation
(``collect.engine: vllm``): measured on a 2-core AVX2 CPU, vLLM generated 53 tokens/s against the
in-process policy's 35 at 16 games at once (``benchmarks/results/generation_engines.json``), and
one server start is saved. ``collect.engine: local`` collects with the in-process policy instead.

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


class Server:
    """A vLLM server for one model, started on first use (:meth:`info`) and stopped by :meth:`stop`."""

    def __init__(self, cfg: dict, model_dir: Path, name: str, echo: Printer):
        self.cfg, self.model_dir, self.name, self.echo = cfg, model_dir, name, echo
        self._info: dict | None = None

    def info(self) -> dict:
        from aria.llm.served import start_server

        if self._info is None:
            log = Path(self.cfg["run_dir"]) / "eval" / f"vllm-{self.name}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            self._info = start_server(self.model_dir, self.name, self.cfg["eval"]["port"], log,
                                      eager=self.cfg["eval"]["vllm_eager"])
            self.echo(f"[main] vLLM serves {self.name} at {self._info['BASE_URL']} (pid {self._info['PID']}), "
                      f"started in {time.perf_counter() - start:.0f}s")
        return self._info

    def stop(self) -> None:
        from aria.llm.served import stop_server

        if self._info is not None:
            stop_server(self._info["PID"])
            self._info = None


def collection_file(cfg: dict, game: str) -> Path:
    return Path(cfg["run_dir"]) / "trajectories" / f"{game}.jsonl"


def collection_done(cfg: dict, game: str) -> bool:
    """Whether the game's collection file holds all its games, finished (a re-run plays nothing)."""
    from aria.trajectories import read_trajectories

    path = collection_file(cfg, game)
    if not path.is_file():
        return False
    finished = {r["game_id"] for r in read_trajectories(path, allow_partial_last_line=True) if r.get("status") != "failed"}
    return len(finished) >= cfg["collect"]["num_games"]


def collect(cfg: dict, game: str, server: Server, echo: Printer) -> Path:
    from aria.rollout import collect_from_config

    out = collection_file(cfg, game)
    c = cfg["collect"]
    if c["engine"] == "vllm":
        served = server.info()
        policy = ["policy=endpoint", f"policy.base_url={served['BASE_URL']}", f"policy.model={served['MODEL_NAME']}",
                  f"policy.max_tokens={c['max_tokens']}", f"policy.concurrency={c['batch_size']}",
                  f"policy.temperature={c['temperature']}"]
    elif c["engine"] == "local":
        policy = ["policy=local", f"policy.model_path={cfg['base_model']}", f"policy.max_new_tokens={c['max_tokens']}",
                  f"policy.temperature={c['temperature']}"]
    else:
        raise ValueError(f"collect.engine: expected vllm or local, got {c['engine']!r}")
    c = compose_config("collect", [f"game={game}", f"num_games={c['num_games']}", f"seed={cfg['seed']}", f"out={out}",
                                   f"batch_size={c['batch_size']}", *policy, *c["overrides"]])
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


def evaluation_dir(cfg: dict, name: str) -> Path:
    return Path(cfg["run_dir"]) / "eval" / name


def evaluation_done(cfg: dict, model_dir: Path, name: str) -> bool:
    """Whether ``name``'s evaluation summary is complete for this very model (a changed model's
    old games are removed: they do not count)."""
    out = evaluation_dir(cfg, name)
    weights = model_dir / "model.safetensors"
    evaluated = {"model_dir": str(model_dir), "weights_mtime": weights.stat().st_mtime if weights.is_file() else None}
    marker = out / "evaluated_model.json"
    if marker.is_file() and read_json(marker) != evaluated:
        shutil.rmtree(out)
    if (out / "summary.json").is_file():
        s = read_json(out / "summary.json")
        if all(env in s["environments"] and s["environments"][env]["finished"] == cfg["eval"]["num_games"]
               for env in cfg["games"]):
            return True
    atomic_write_json(marker, evaluated)
    return False


def evaluate(cfg: dict, server: Server, echo: Printer) -> Path:
    """Run eval.sh against ``server``'s model (started if it is not yet)."""
    out, e = evaluation_dir(cfg, server.name), cfg["eval"]
    if evaluation_done(cfg, server.model_dir, server.name):
        echo(f"[main] evaluation of {server.name} done before: {out / 'summary.json'}")
        return out
    info = server.info()
    eval_env = {**os.environ, "BASE_URL": info["BASE_URL"], "MODEL_NAME": info["MODEL_NAME"], "ENVS": " ".join(cfg["games"]),
                "N": str(e["num_games"]), "CONCURRENCY": str(e["concurrency"]), "MAX_TOKENS": str(e["max_tokens"]),
                "TEMPERATURE": str(e["temperature"]), "SEED": str(cfg["seed"]), "OUT": str(out)}
    done = subprocess.run(["bash", str(REPO_ROOT / "evaluation/eval.sh"), "progress=false"], env=eval_env)
    if done.returncode != 0:
        raise RuntimeError(f"eval.sh failed for {server.name} (exit {done.returncode}); re-run to continue")
    return out


def run(cfg: dict, echo: Printer = print) -> Path:
    from aria.llm.embedded import resolve_model_path

    run_dir = Path(cfg["run_dir"])
    timer = Timer()
    selections = {}
    base_model = resolve_model_path(cfg["base_model"])
    # The base model's server collects and is evaluated, then goes before training needs the cores.
    base_server = Server(cfg, base_model, "base", echo)
    try:
        if cfg["collect"]["engine"] == "vllm" and not (evaluation_done(cfg, base_model, "base")
                                                       and all(collection_done(cfg, g) for g in cfg["games"])):
            timer.run("start vLLM (base)", base_server.info, echo)
        trajectories = {game: timer.run(f"collect {game}", lambda: collect(cfg, game, base_server, echo), echo)
                        for game in cfg["games"]}
        base = timer.run("evaluate base", lambda: evaluate(cfg, base_server, echo), echo)
    finally:
        base_server.stop()
    for game in cfg["games"]:
        selections[game] = timer.run(f"intention steps 1-4 {game}",
                                     lambda: intention(cfg, game, trajectories[game], echo), echo)
    final = timer.run("offline REINFORCE", lambda: train(cfg, echo), echo)
    merged = timer.run("merge LoRA", lambda: merge(final, run_dir, echo), echo)
    aria_server = Server(cfg, merged, "aria", echo)
    try:
        if not evaluation_done(cfg, merged, "aria"):
            timer.run("start vLLM (aria)", aria_server.info, echo)
        trained = timer.run("evaluate ARIA", lambda: evaluate(cfg, aria_server, echo), echo)
    finally:
        aria_server.stop()
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
