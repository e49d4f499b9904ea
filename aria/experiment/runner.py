"""Does aggregation help? The iterated loop and the comparison of methods (``scripts/run_experiment.py``).

One experiment, as a list of stages run in order (every one resumes; a finished one is skipped):
1. **Warm start** (ArCHer and LMRL-Gym start RL from an SFT checkpoint): the scripted expert
   (:mod:`aria.games.question.expert`, ``warm_start.epsilon``) plays ``warm_start.games`` games; behaviour
   cloning of ``base_model`` on every step (method ``bc``) gives the model ``M0``. Its games also
   go through pipeline steps 1-2, which score the intention labels against the expert's true
   intentions (ARI, NMI per k).
2. **Iteration 0**: ``M0`` plays ``eval.games`` games on the evaluation targets (seed
   ``eval.seed``, the same targets for every arm).
3. For every seed and iteration ``i = 1..iterations``, each step over the methods in turn: the
   model of iteration ``i−1`` collects ``collect.games`` games; pipeline steps 1-4 label them and
   build the training set, and the method's weights (:mod:`aria.trainers.methods`) train a LoRA
   adapter on that model, which is merged into the model of iteration ``i``; it plays the
   evaluation games. Iteration 1 starts from ``M0`` for every method, so its collection and labels
   are shared by the methods of a seed (the methods differ only in how they weigh the same steps,
   as the paper's ablation). Then each new model is compared with the model it started from on
   held-out steps (whole games of the iteration-0 evaluation, never trained on): token KL,
   log-prob change on won and lost steps, and the share of weights changed at the precision it is
   served in (:mod:`aria.experiment.movement`, ``report.movement``), so the table can say whether training moved it.
4. **Gradient variance** on the shared iteration-1 training set of every seed
   (:func:`aria.trainers.gradient_variance`): the reward variance, tr Cov of the per-sample
   REINFORCE gradient and its signal-to-noise ratio for every method, on the same samples.
5. **Results** (:mod:`aria.experiment.report`): ``table.md``, ``results.json``,
   ``success_vs_iteration.png`` in ``results_dir``.

The policy generates through a vLLM server (``engine: vllm``; on CPU the faster engine,
``benchmarks/generation_engines.py``) or in process (``engine: local``). The stages that play run
one after the other, so one server plays them all, its weights reloaded in place for the next
model of the same architecture (:func:`aria.llm.served.reload_weights`; a start costs 25-50 s on 2
CPU cores), and it is stopped before every stage that does not play: training needs the cores, and
an idle CPU server's threads spin. One progress line per stage, with the time it took and the ETA of what is left (from
the times of finished stages, kept in ``run_dir/stage_times.json``).
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from aria.experiment.layout import (COPY_MARK, Layout, games_of, intention_overrides_of, is_stage_folder, iterations_of,
                                    method_of, model_version, recorded_path, seeds_of, train_overrides_of)
from aria.experiment.report import planned_power, preflight_row_name, run_record, write_results
from aria.experiment.run_files import evaluation_ids
from aria.experiment.settings import ExperimentSettings, recorded_over
from aria.games.common.base import structured_output
from aria.games.family import checked_game, family_of
from aria.intention import pipeline
from aria.io import (ConfigError, atomic_folder, atomic_write_json, atomic_write_json_rows, check_writable, differences,
                     file_digest, hold_folder, json_digest, read_json)
from aria.llm.embedded import resolve_model_path
from aria.llm import hardware  # qualified for describe and label: this module has its own
from aria.llm.hardware import cpu_flags, vllm_cpu_dtype
from aria.llm.merge_record import MERGE_FILE
from aria.llm.registry import build_policy
from aria.llm.served import EngineWatch, free_port, reload_weights, start_server, stop_server
from aria.resources import check_overrides, compose_config, config_dir
from aria.secrets import redact
from aria.settings import typed
from aria.trainers.methods import METHODS, trainer_for
from aria.trainers.settings import TrainerSettings
from aria.trajectories import describe, read_producer, read_trajectories
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): accelerate, torch, transformers

# torch, the trainers and the model loaders (3-5 s to import on 2 cores, `python -X importtime`) are
# imported in the stages that train, merge or measure: a bad setting is refused in about a second.

Printer = Callable[[str], None]


PLAYS = ("eval", "collect")  # the stage kinds that play games (through the generator's server)


@dataclass(frozen=True)
class Stage:
    """One resumable unit of work, as data: what it does (``kind``, the work :class:`Stages` runs
    for it, which also groups stages of like cost for the ETA), to which arm, and the line that
    names it (the key of its time in ``stage_times.json``)."""

    name: str
    kind: str
    method: str = ""
    seed: int = 0
    iteration: int = 0


# ---- generation: one model at a time -----------------------------------------------------------------
class Generator:
    """Policies for the experiment's models; with ``engine: vllm`` one server at a time (module doc)."""

    def __init__(self, cfg: ExperimentSettings, echo: Printer):
        self.cfg, self.echo = cfg, echo
        self.engine = cfg.engine  # vllm or local (check_settings)
        self._served: tuple[Path, dict] | None = None

    def describe(self, model_dir: Path, settings: dict, seed: int) -> dict:
        """What a policy of :meth:`policy` records as its producer: the engine, the model and its
        version (a retrained model is another policy, so its old games are not continued), the sampling."""
        return {"engine": self.engine, "model_path": recorded_path(self.cfg, model_dir), "model_version": model_version(model_dir),
                "dtype": served_dtype(self.cfg), "temperature": settings.temperature, "max_tokens": settings.max_tokens,
                "seed": seed if self.engine == "local" else None}

    def policy(self, model_dir: Path, settings: dict, seed: int):
        """A chat policy playing ``model_dir`` with ``settings`` (temperature, max_tokens, batch_size);
        the in-process sampler starts from ``seed``, so a stage run again samples the same games."""
        if self.engine == "local":
            policy = build_policy({"name": "local", "model_path": str(model_dir), "temperature": settings.temperature,
                                   "max_new_tokens": settings.max_tokens, "seed": seed, "dtype": served_dtype(self.cfg)})
            policy.settings = self.describe(model_dir, settings, seed)
            return policy
        if self._served is not None and self._served[0] != model_dir and same_architecture(self._served[0], model_dir):
            start = time.perf_counter()
            try:  # the next arm's weights into the running server: no restart (about 30 s on 2 CPU cores)
                reload_weights(self._served[1]["BASE_URL"], model_dir)
                self._served = (model_dir, self._served[1])
                self.echo(f"[experiment] vLLM serves {model_dir} (weights reloaded in {time.perf_counter() - start:.0f}s)")
            except RuntimeError as e:
                self.echo(f"[experiment] {e}: starting a server of its own")
                self.stop()
        if self._served is None or self._served[0] != model_dir:
            self.stop()

            start = time.perf_counter()
            # the server's log beside the model it serves, or in the run folder for a model outside it
            root = Path(self.cfg.run_dir).resolve()
            log = model_dir.parent / "vllm.log" if model_dir.resolve().is_relative_to(root) else root / "vllm-base.log"
            info = start_server(model_dir, "policy", free_port(), log, eager=self.cfg.vllm.eager,
                                dtype=self.cfg.policy_dtype, reloadable=True)
            self._served = (model_dir, info)
            self._watch = EngineWatch(info["PID"])
            self.echo(f"[experiment] vLLM serves {model_dir} (started in {time.perf_counter() - start:.0f}s)")
        info = self._served[1]
        policy = build_policy({"name": "endpoint", "base_url": info["BASE_URL"], "model": info["MODEL_NAME"],
                               "temperature": settings.temperature, "max_tokens": settings.max_tokens,
                               "concurrency": settings.batch_size, "api_key": "EMPTY", "timeout_s": 300,
                               "gone": self._watch.reason})
        # What made a game is the model and its sampling, not this run's port: a resumed file continues.
        policy.settings = self.describe(model_dir, settings, seed)
        return policy

    def stop(self) -> None:
        if self._served is not None:
            self._watch.stop()
            stop_server(self._served[1]["PID"])
            self._served = None

    def play(self, model_dir: Path, settings: dict, seed: int, games: Callable[[Any], Any]) -> Any:
        """``games(policy)`` with a policy of :meth:`policy`. When games failed because the server
        this generator started ended (killed, out of memory), the server is started again and
        ``games`` runs again, which plays only the failed games, up to ``vllm.restarts`` times:
        an unattended run of many hours goes on instead of stopping at the first lost server."""
        for restart in range(self.cfg.vllm.restarts + 1):
            try:
                return games(self.policy(model_dir, settings, seed))
            except GamesFailed as failed:
                lost = self._watch.reason() if self.engine == "vllm" and self._served is not None else None
                if lost is None or restart == self.cfg.vllm.restarts:
                    raise
                self.echo(f"[experiment] {failed}; the vLLM server had ended ({lost}): starting it again "
                          f"({restart + 1} of vllm.restarts={self.cfg.vllm.restarts})")
                self.stop()


def same_architecture(a: Path, b: Path) -> bool:
    """Whether two model folders hold models of one architecture and shape (their config.json equal
    but for names, versions and dtype), so that one's weights load into a server of the other."""
    def config(folder: Path) -> dict | None:
        path = Path(folder) / "config.json"
        if not path.is_file():
            return None
        return {k: v for k, v in read_json(path).items() if k not in ("_name_or_path", "transformers_version", "torch_dtype", "dtype")}

    first = config(a)
    return first is not None and first == config(b)


class GamesFailed(RuntimeError):
    """Games of a stage failed (their records say why); a re-run plays them again."""

    def __init__(self, failed: int, out: Path):
        super().__init__(f"{failed} game(s) failed in {out}; run again to play them again")


# ---- the stages' work ---------------------------------------------------------------------------------
def play(cfg: ExperimentSettings, policy, out: Path, seed: int, section: dict, echo: Printer, what: str) -> Path:
    """The games of a collection (``section`` = ``collect``, or the warm start's) into ``out``: the
    question game against the oracle, or two-player self-play (the game's family). Resumes game by
    game; games of another policy, e.g. of a model since retrained, are moved aside and played again."""
    summary = family_of(cfg.game).play(cfg, policy, out, seed, section)
    echo(f"[experiment] {what}: {summary.line()}")
    if summary.failed:
        raise GamesFailed(summary.failed, out)
    return out


def evaluate_arm(cfg: ExperimentSettings, policy, out: Path, echo: Printer) -> Path:
    """The evaluation of ``policy`` into ``out`` (:meth:`Layout.evaluation`): the ``eval`` games
    against the oracle, or against ``eval.opponent`` in both seats (two-player games)."""
    failed = family_of(cfg.game).evaluate(cfg, policy, out, echo)
    if failed:
        raise GamesFailed(failed, out)
    return out


def evaluation_done(cfg: ExperimentSettings, out: Path, policy: dict) -> bool:
    """Whether the evaluation at ``out`` (:meth:`Layout.evaluation`) is complete for ``policy``."""
    n = games_of(cfg, cfg.eval)
    return all(games_done(file, n, producer) for file, _, producer in family_of(cfg.game).evaluation_files(cfg, out, policy))


def games_done(path: Path, num_games: int, producer: dict) -> bool:
    """Whether ``path`` holds ``num_games`` finished games made under exactly ``producer``'s
    settings (a family's ``collection_producer``); games of other settings are played again, never counted."""
    if not path.is_file() or read_producer(path) != producer:
        return False
    return sum(r.get("status") != "failed" for r in read_trajectories(path, allow_partial_last_line=True)) >= num_games


# Step 1's outputs; utterances.json, which marks step 1 done, last (a link cut short leaves no marker)
STEP1_FILES = ("embedding_cache", "embeddings.npz", "labels.npz", "utterances.json")


def label(cfg: ExperimentSettings, trajectories: Path, out_dir: Path, seed: int, echo: Printer, steps: int = 4,
          overrides: list[str] | None = None, step1_from: Path | None = None) -> Path:
    """Pipeline steps 1..``steps`` on ``trajectories`` in ``out_dir`` (each step skips itself when up
    to date), under ``intention_overrides`` or the given ``overrides``. ``step1_from``: a folder
    where step 1 already ran on the same games, whose outputs are linked here first (step 1 checks
    its fingerprint, so under other clustering settings it runs again, from the linked embedding cache)."""
    c = compose_config("intention", [f"game={cfg.game['name']}", f"input={trajectories}", f"seed={seed}",
                                     f"run_dir={out_dir}", *(cfg.intention_overrides if overrides is None else overrides)])
    quiet = lambda line: None  # noqa: E731  (the stage line says what happened)
    if step1_from is not None and not (out_dir / "utterances.json").is_file():
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in STEP1_FILES:  # hard links: every write in the pipeline replaces a file whole, never edits one
            source = step1_from / name
            for file in sorted(source.rglob("*")) if source.is_dir() else [source] if source.is_file() else []:
                target = out_dir / file.relative_to(step1_from)
                if file.is_file():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.unlink(missing_ok=True)  # left by a link cut short
                    os.link(file, target)
    pipeline.step1_embed_and_cluster(c, quiet)
    if steps == 1:
        return out_dir / "utterances.json"
    report = pipeline.step2_select_k(c, quiet)
    if steps >= 4:
        pipeline.step3_apply_labels(c, quiet)
        pipeline.step4_build_training_set(c, quiet)
    chosen = report["chosen"]["k"]
    on = " (trains on the behavioural intentions)" if c["labels"] == "behavioural" and steps >= 3 else ""
    echo(f"[experiment] labelled {trajectories.name}: k = {chosen}{on}")
    if steps >= 4:  # said before training: where keys are not shared, ARIA trains as its ablation
        found = pipeline.preflight(c, cfg.report.preflight_ks)
        atomic_write_json(out_dir / "preflight.json", found)
        window = "" if found["window"] is None else f" (keys of the last {found['window']} turns)"
        echo(f"[experiment] pre-flight: steps that share their intention key with another step{window}: "
             + "; ".join(f"{preflight_row_name(r)} {100 * r['shared']:.0f}%" for r in found["rows"]))
    return out_dir / "train.json"


def critic_summary(found: dict) -> str:
    """A critic run's steps and held-out diagnostics (its ``final/critic.json`` or its trainer's result)."""
    return (f"{found['steps']} steps; held out: TD error {found.get('eval_td_mse')}, won above lost "
            f"{found.get('eval_ranking_accuracy')} (same turn {found.get('eval_ranking_accuracy_same_turn')})")


def train_critic(cfg: ExperimentSettings, train_file: Path, out_dir: Path, seed: int, init: Path | None, echo: Printer) -> Path:
    """ArCHer's critic on ``train_file`` (from ``init``, the previous iteration's critic, when
    given), in ``out_dir``; returns the training set with each step's advantage. Resumes itself.

    A finished critic (its ``final/`` and the advantages written after it) is kept as it is: the
    actor's checkpoints and reference log-probs belong to those advantages, and training the critic
    again from its last checkpoint would rewrite them (the caller's marker has already removed a
    critic of other settings)."""
    done = out_dir / "final" / "critic.json"
    if done.is_file() and (out_dir / "train.json").is_file():
        echo(f"[experiment] critic: done ({critic_summary(read_json(done))})")
        return out_dir / "train.json"
    overrides = [f"data.train_file={train_file}", f"output_dir={out_dir}", f"seed={seed}",
                 f"critic.init={init if init else 'null'}", *cfg.archer.critic_overrides]
    if cfg.launcher:
        command = [*shlex.split(cfg.launcher), "-m", "aria.trainers.launch_critic", "--config-dir", str(config_dir()),
                   "--config-name", "critic", *overrides]
        if subprocess.run(command).returncode != 0:
            raise RuntimeError(f"critic training failed: {' '.join(command)} (run the experiment again to resume it)")
        out = out_dir / "train.json"
    else:
        from accelerate.state import AcceleratorState

        from aria.trainers.archer import CriticTrainer

        try:
            result = CriticTrainer(compose_config("critic", overrides)).train()
        finally:
            AcceleratorState._reset_state(reset_partial_state=True)
        out = Path(result["train_file"])
        echo(f"[experiment] critic: {critic_summary(result)}")
    return out


def trained_on_record(cfg: ExperimentSettings, method: str, train_file: Path, start_model: Path, seed: int,
                      overrides: list[str], critic_init: Path | None, actor: bool) -> dict:
    """What a model was trained from, as its ``trained_on.json`` marker holds it (secrets redacted)."""
    trained_on = {"train_json_sha256": file_digest(train_file, length=None), "method": method,
                  "start_model": recorded_path(cfg, start_model), "start_model_version": model_version(start_model), "seed": seed,
                  "overrides": list(overrides)}
    if method == "archer":
        trained_on.update(critic_overrides=list(cfg.archer.critic_overrides), actor=actor,
                          critic_init=str(critic_init) if critic_init else None)
    return json.loads(json.dumps(redact(trained_on)))  # as the marker is written: a key is never on disk


def run_trainer(cfg: ExperimentSettings, overrides: list[str], launched_final: Path) -> Path:
    """The offline trainer run on ``overrides`` of ``reinforce_llm``; its final checkpoint's folder.
    With ``cfg.launcher`` (several GPUs) it runs under accelerate in processes of its own and
    writes ``launched_final``; otherwise in this process."""
    if cfg.launcher:
        command = [*shlex.split(cfg.launcher), "-m", "aria.trainers.launch", "--config-dir", str(config_dir()),
                   "--config-name", "reinforce_llm", *overrides]
        if subprocess.run(command).returncode != 0:
            raise RuntimeError(f"training failed: {' '.join(command)} (run the experiment again to resume it)")
        return launched_final
    from accelerate.state import AcceleratorState

    config = compose_config("reinforce_llm", overrides)
    try:
        return Path(trainer_for(config)(config).train()["final"])
    finally:  # accelerate keeps one state per process: the next training may set other precision
        AcceleratorState._reset_state(reset_partial_state=True)


def train(cfg: ExperimentSettings, method: str, train_file: Path, start_model: Path, out_dir: Path, seed: int, overrides: list[str],
          echo: Printer, critic_init: Path | None = None, actor: bool = True,
          model_unread: Callable[[], bool] = lambda: False) -> Path:
    """Train ``method`` on ``train_file`` from ``start_model``; merge the adapter into ``out_dir/model``.

    ``archer`` trains its critic first (:func:`train_critic`, from ``critic_init``), then the actor on
    the critic's advantages; ``actor=False`` (ArCHer's warm-up iterations) trains the critic only
    and the iteration's model is its start model.

    A model whose training marker matches but whose folder is gone (a run folder copied without its
    models, :mod:`scripts.copy_run`) is not trained again when ``model_unread()`` says nothing
    left to do reads it; the stages after it are then found done by the marker's version."""
    from aria.llm.policy import merge_lora

    model = out_dir / "model"
    trained_on = trained_on_record(cfg, method, train_file, start_model, seed, overrides, critic_init, actor)
    marker = out_dir / "trained_on.json"
    if marker.is_file() and read_json(marker) == trained_on:
        if (model / "model.safetensors").is_file():
            return model
        if model_unread():
            echo(f"[experiment] {recorded_path(cfg, out_dir)}: its model is not in the run folder, and nothing left reads it "
                 f"(evaluated, movement measured, the arm's last iteration): not trained again")
            return model
    if marker.is_file() and read_json(marker) != trained_on:  # another run's work: never continued
        changed = differences(read_json(marker), trained_on)
        echo(f"[experiment] {recorded_path(cfg, out_dir)}: trained under other settings ({'; '.join(changed[:4])}"
             f"{'; ...' if len(changed) > 4 else ''}): its model and checkpoints are removed and it trains again")
        shutil.rmtree(out_dir / "train", ignore_errors=True)
        shutil.rmtree(out_dir / "critic", ignore_errors=True)  # ArCHer's critic, trained under the old settings
        shutil.rmtree(model, ignore_errors=True)
    atomic_write_json(marker, trained_on)
    if method == "archer":
        train_file = train_critic(cfg, train_file, out_dir / "critic", seed, critic_init, echo)
        if not actor:  # ArCHer's warm-up: the critic learns, the policy stays
            with atomic_folder(model) as tmp:
                for file in start_model.iterdir():
                    if file.is_file():
                        os.link(file, tmp / file.name)
            echo(f"[experiment] archer warm-up: critic only; the policy stays {start_model.name}")
            return model
    overrides = [f"data.train_file={train_file}", f"output_dir={out_dir / 'train'}", f"seed={seed}",
                 f"model.path={start_model}", f"method={method}", "logging.report_to=null", *overrides]
    final = run_trainer(cfg, overrides, out_dir / "train" / "final")
    if model.is_dir() and not (model / MERGE_FILE).is_file():
        shutil.rmtree(model)  # the run's own folder (an ArCHer warm-up's policy), which merge_lora would refuse to replace
    merge_lora(final, model)
    echo(f"[experiment] trained {method} from {start_model.name} -> {model}")
    return model


def bc_training_set(cfg: ExperimentSettings, trajectories: Path, out: Path) -> Path:
    """Every step of the expert's games as a sample (behaviour cloning needs no rewards)."""
    render = family_of(cfg.game).observation_renderer(cfg.game)
    samples = [{"observation": render(r, i), "action": t["action"], "reward": 1.0, "game_id": r["game_id"], "turn": i}
               for r in read_trajectories(trajectories) for i, t in enumerate(r["turns"])]
    if not out.is_file() or read_json(out) != samples:
        atomic_write_json_rows(out, samples)
    return out


def served_dtype(cfg: ExperimentSettings) -> str:
    """The precision this run's policy plays in (``policy_dtype``, else what the engine chooses):
    an update smaller than its step is rounded away before the model plays."""
    chosen = cfg.policy_dtype
    if chosen is not None:
        return chosen
    import torch

    if cfg.engine == "local":  # the local policy's "auto"
        from aria.llm.local import resolve_dtype

        return str(resolve_dtype("auto", "cuda" if torch.cuda.is_available() else "cpu")).removeprefix("torch.")
    if torch.cuda.is_available():  # vLLM's "auto" serves a float32 checkpoint in 16 bits on a GPU
        return "bfloat16"

    return vllm_cpu_dtype(cpu_flags())


def held_out_steps(cfg: ExperimentSettings, lay: Layout) -> list[dict]:
    """The policy's steps in the starting model's iteration-0 evaluation games, as step samples
    (``observation``, ``action``, ``success`` of the game): held out from every training set, the
    same for every arm."""
    family = family_of(cfg.game)
    render, expected, where = family.observation_renderer(cfg.game), evaluation_ids(cfg), lay.evaluation("", 0, 0)
    steps = []
    for file, role in family.evaluation_seats(where):
        for r in read_trajectories(file):
            if r.get("status") == "failed" or r["game_id"] not in expected:
                continue
            won = r["meta"]["winner"] == role if role else bool(r["success"])
            steps += [{"observation": render(r, i), "action": t["action"], "success": won, "game_id": r["game_id"], "role": role}
                      for i, t in enumerate(r["turns"]) if role is None or t["role"] == role]
    return steps


def movement_key(cfg: ExperimentSettings, parent: Path, child: Path, steps: list[dict]) -> dict:
    """What a movement file was measured on: both models' versions, the precision, the held-out steps."""
    return {"parent": recorded_path(cfg, parent), "parent_version": model_version(parent),
            "child_version": model_version(child), "served_dtype": served_dtype(cfg), "steps": cfg.report.movement.steps,
            "held_out_sha256": json_digest(steps, length=None)}


def movement_done(cfg: ExperimentSettings, lay: Layout, parent: Path, child: Path, out: Path) -> bool:
    return out.is_file() and read_json(out).get("key") == movement_key(cfg, parent, child, held_out_steps(cfg, lay))


def movement_stage(cfg: ExperimentSettings, lay: Layout, parent: Path, child: Path, out: Path, echo: Printer) -> Path:
    """How far ``child`` moved from ``parent`` on the held-out steps (:func:`aria.experiment.movement.movement`),
    written to ``out`` under a key of both models' versions and the settings."""
    from aria.experiment.movement import movement

    m, steps = cfg.report.movement, held_out_steps(cfg, lay)
    key = movement_key(cfg, parent, child, steps)
    if out.is_file() and read_json(out).get("key") == key:
        return out
    start = time.perf_counter()
    result = movement(parent, child, steps, key["served_dtype"], max_steps=m.steps, seed=0, source=str(lay.evaluation("", 0, 0)))
    atomic_write_json(out, {"key": key, **result, "seconds": time.perf_counter() - start})
    w = result["weights"]
    echo(f"[experiment] {recorded_path(cfg, child)} against {recorded_path(cfg, parent)}: token KL {result['token_kl']:.4g}, "
         f"{100 * w['share']:.2f}% of weights changed at {w['dtype']}")
    return out


# ---- the plan -------------------------------------------------------------------------------------------
def plan(cfg: ExperimentSettings) -> list[Stage]:
    """Every stage of the experiment, in the order they run (module doc): the warm start, the
    iteration-0 evaluation, then each seed's iterations, an iteration's stages kind by kind over
    its arms (their games are played one after the other through one server, its weights reloaded
    between them, and every training and movement runs with no server on the cores)."""
    stages: list[Stage] = []
    if cfg.warm_start.enabled:
        stages += [Stage("warm start: expert games", "expert"),
                   Stage("warm start: intention recovery on the expert games", "label"),
                   # a kind of its own: the expert's ~45 optimizer steps timed the powered preset's
                   # arms (~840 steps each) at 10 minutes apiece, an ETA 20 times too short
                   Stage("warm start: behaviour cloning", "warm start training")]
    stages.append(Stage(f"iteration 0: evaluate the {'warm start' if cfg.warm_start.enabled else 'base model'}", "eval"))
    for seed in cfg.seeds:
        arms = [m for m in cfg.methods if seed in seeds_of(cfg, m)]
        for it in range(1, max((iterations_of(cfg, m) for m in arms), default=0) + 1):
            running = [m for m in arms if it <= iterations_of(cfg, m)]
            steps = [("collect", "collect"), ("train", "label and train"), ("eval", "evaluate")]
            if cfg.report.movement.enabled:
                steps.append(("movement", "how far the policy moved"))
            stages += [Stage(f"seed {seed} · {method} · iteration {it}: {what}", kind, method, seed, it)
                       for kind, what in steps for method in running]
        if cfg.grad_variance.enabled and cfg.methods:
            stages.append(Stage(f"seed {seed}: gradient variance of the methods on the iteration-1 samples", "variance",
                                seed=seed))
    return stages


class Stages:
    """The work of each kind of :class:`Stage`, on one run folder: :meth:`run` does a stage, or
    finds it done (every stage resumes; a finished one is skipped)."""

    def __init__(self, cfg: ExperimentSettings, generator: Generator, echo: Printer):
        self.cfg, self.generator, self.echo, self.lay = cfg, generator, echo, Layout(cfg)
        self.base = resolve_model_path(cfg.base_model)
        self.warm_model = self.lay.model("", 0, 0) if cfg.warm_start.enabled else self.base
        self.expert_games = self.lay.warm / "expert.jsonl"
        self.work: dict[str, Callable[[Stage], Any]] = {
            "expert": self.expert, "label": self.recover, "warm start training": self.clone, "eval": self.evaluate,
            "collect": self.collect, "train": self.train, "movement": self.movement, "variance": self.variance}

    def run(self, stage: Stage) -> Any:
        return self.work[stage.kind](stage)

    def model_of(self, method: str, seed: int, iteration: int) -> Path:
        return self.warm_model if iteration == 0 else self.lay.model(method, seed, iteration)

    # -- the warm start: the expert's games, the intentions recovered on them, behaviour cloning
    def expert(self, stage: Stage) -> None:
        cfg, w = self.cfg, self.cfg.warm_start
        expert = build_policy({"name": "scripted", "game": cfg.game, "epsilon": w.epsilon, "seed": w.seed})
        section = replace(cfg.collect, games=w.games, batch_size=64)  # played as a collection, 64 at a time (no server)
        if not games_done(self.expert_games, w.games, family_of(cfg.game).collection_producer(cfg, section, w.seed, describe(expert))):
            play(cfg, expert, self.expert_games, w.seed, section, self.echo, "expert games")

    def recover(self, stage: Stage) -> None:
        label(self.cfg, self.expert_games, self.lay.warm / "intention", self.cfg.warm_start.seed, self.echo, steps=2)

    def clone(self, stage: Stage) -> None:
        w = self.cfg.warm_start
        train_file = bc_training_set(self.cfg, self.expert_games, self.lay.warm / "train.json")
        train(self.cfg, "bc", train_file, self.base, self.lay.warm, w.seed, w.train_overrides, self.echo)

    # -- an arm's iteration: collect, label and train, evaluate, how far it moved
    def evaluate(self, stage: Stage) -> None:
        e = self.cfg.eval
        out, model = self.lay.evaluation(stage.method, stage.seed, stage.iteration), self.model_of(stage.method, stage.seed, stage.iteration)
        if not evaluation_done(self.cfg, out, self.generator.describe(model, e, e.seed)):
            self.generator.play(model, e, e.seed, lambda policy: evaluate_arm(self.cfg, policy, out, self.echo))

    def collect(self, stage: Stage) -> None:
        cfg, c, method, seed, it = self.cfg, self.cfg.collect, stage.method, stage.seed, stage.iteration
        where = self.lay.collection_dir(method, seed, it)
        games = where / "games.jsonl"
        # the collection seed differs per seed and iteration; evaluation keeps its own
        model, game_seed = self.model_of(method, seed, it - 1), 1000 * seed + it
        made_by = self.generator.describe(model, c, game_seed)
        if not games_done(games, games_of(cfg, c), family_of(cfg.game).collection_producer(cfg, c, game_seed, made_by)):
            self.generator.play(model, c, game_seed, lambda policy: play(
                cfg, policy, games, game_seed, c, self.echo, f"collection {where.name}"))

    def train(self, stage: Stage) -> None:
        cfg, lay, method, seed, it = self.cfg, self.lay, stage.method, stage.seed, stage.iteration
        games = lay.collection_dir(method, seed, it) / "games.jsonl"
        shared, own = lay.intention("", seed, it), lay.intention(method, seed, it)
        if own != shared:  # a variant: the shared games' embeddings and clusterings, its own labels
            label(cfg, games, shared, seed, self.echo, steps=1)
        train_file = label(cfg, games, own, seed, self.echo, overrides=intention_overrides_of(cfg, method),
                           step1_from=shared if own != shared else None)
        previous_critic = lay.arm(method, seed, it - 1) / "critic" / "final" if it > 1 else None
        train(cfg, method_of(cfg, method), train_file, self.model_of(method, seed, it - 1), lay.arm(method, seed, it),
              seed, train_overrides_of(cfg, method), self.echo, critic_init=previous_critic,
              actor=it > cfg.archer.actor_warmup_iterations, model_unread=lambda: self.model_unread(method, seed, it))

    def model_unread(self, method: str, seed: int, iteration: int) -> bool:
        """Whether no stage left reads this arm's model: its evaluation and movement are done and no
        later iteration starts from it. (An earlier iteration's model is always kept or trained
        again, though its successor may be done: one simple rule, and the presets that run for days
        have one iteration.)"""
        cfg, e, model = self.cfg, self.cfg.eval, self.lay.model(method, seed, iteration)
        if iteration < iterations_of(cfg, method) or not evaluation_done(cfg, self.lay.evaluation(method, seed, iteration),
                                                                          self.generator.describe(model, e, e.seed)):
            return False
        return not cfg.report.movement.enabled or movement_done(
            cfg, self.lay, self.model_of(method, seed, iteration - 1), model, self.lay.movement(method, seed, iteration))

    def movement(self, stage: Stage) -> None:
        m, s, i = stage.method, stage.seed, stage.iteration
        movement_stage(self.cfg, self.lay, self.model_of(m, s, i - 1), self.model_of(m, s, i), self.lay.movement(m, s, i), self.echo)

    def variance(self, stage: Stage) -> None:
        gradient_variance_stage(self.cfg, self.lay, stage.seed, self.warm_model, self.echo)


def gradient_variance_stage(cfg: ExperimentSettings, lay: Layout, seed: int, model: Path, echo: Printer) -> Path:
    from aria.trainers.grad_variance import gradient_variance

    out = lay.shared(seed) / "grad_variance.json"
    train_file = lay.shared(seed) / "intention" / "train.json"
    methods = list(dict.fromkeys(method_of(cfg, m) for m in cfg.methods))  # on the shared labels: one row per method
    if "archer" in methods:  # its weights are its critic's advantages, on the same steps (iteration 1's critic)
        arm = next(m for m in cfg.methods if method_of(cfg, m) == "archer")
        critic_file = lay.arm(arm, seed, 1) / "critic" / "train.json"
        if critic_file.is_file():
            train_file = critic_file
        else:
            methods.remove("archer")
    g = cfg.grad_variance
    key = {"train_json_sha256": file_digest(train_file, length=None), "model": str(model),
           "methods": cfg.methods, "max_samples": g.max_samples, "seed": seed}
    if out.is_file() and read_json(out).get("key") == key:
        return out
    config = compose_config("reinforce_llm", [f"data.train_file={train_file}", f"model.path={model}", *cfg.train_overrides])
    result = gradient_variance(config, g.max_samples, seed, [m for m in methods if m != "traj_dpo"])
    atomic_write_json(out, {"key": key, **result})
    echo(f"[experiment] gradient variance, seed {seed}: {result['samples']} samples in {result['seconds']:.0f}s")
    return out


# ---- running it ------------------------------------------------------------------------------------------
def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def check_settings(cfg: Mapping) -> ExperimentSettings:
    """Every setting the stages will read, checked before any work starts: a bad one is a
    :class:`~aria.io.ConfigError` naming it, not a traceback minutes into the run. Returns the
    settings as an :class:`aria.experiment.settings.ExperimentSettings` (its types check the keys,
    the types and the ranges; what is checked here is what refers to other settings or registries),
    which every stage reads as attributes."""
    cfg = typed(ExperimentSettings, cfg, "experiment")
    cfg.game = checked_game(cfg.game)
    run_dir, results_dir = Path(cfg.run_dir).resolve(), Path(cfg.results_dir).resolve()
    if results_dir == run_dir or run_dir in results_dir.parents and is_stage_folder(results_dir.relative_to(run_dir).parts[0]):
        raise ConfigError(f"results_dir: {cfg.results_dir} is the run folder or one of its stages' folders: its table "
                          "would mix with the run's files (give a folder outside run_dir, or run_dir/results)")
    # what failed only when first used: the model after the expert's games, the launcher at the
    # first training (a report of finished stages needs neither)
    if not cfg.report_only:  # a whole model: the stages merge adapters onto it and serve it
        from aria.llm.policy import model_folder  # (torch: not at the runner's start, which checks settings first)

        model_folder(cfg.base_model, "base_model", adapter=False)
    if not cfg.report_only and cfg.launcher and shutil.which((shlex.split(cfg.launcher) or [""])[0]) is None:
        raise ConfigError(f"launcher: {cfg.launcher!r} does not start with a command on PATH "
                          "(e.g. accelerate launch --config_file config/accelerate/gpu_8.yaml; null: train in this process)")
    if cfg.warm_start.enabled and cfg.warm_start.games < 1:
        raise ConfigError(f"warm_start.games: expected an integer >= 1 (or warm_start.enabled=false), got {cfg.warm_start.games}")
    check_variants(cfg.variants, METHODS)
    unknown = [m for m in cfg.methods if m not in METHODS and m not in cfg.variants]
    if unknown:
        raise ConfigError(f"methods: unknown {unknown} (known: {', '.join(sorted(METHODS))}, or a name of variants)")
    if len(set(cfg.methods)) != len(cfg.methods):
        raise ConfigError(f"methods: each arm once, got {cfg.methods}")
    unknown = [m for m in cfg.train_overrides_by_method if m not in METHODS]
    if unknown:
        raise ConfigError(f"train_overrides_by_method: unknown method {unknown} (known: {', '.join(sorted(METHODS))}; "
                          "a variant trains with its method's)")
    paired = cfg.report.paired
    if paired is not None and (len(paired) != 2 or len(set(paired)) != 2):
        raise ConfigError(f"report.paired: expected two arms (or null: no paired test), got {paired!r}")
    known = set(METHODS) | set(cfg.variants)
    if paired is not None and not set(paired) <= known:  # an arm not run this time is fine, an arm no one can run is not
        raise ConfigError(f"report.paired: unknown {sorted(set(paired) - known)} (known: {', '.join(sorted(known))})")
    for i, pair in enumerate(cfg.report.more_pairs):
        if len(pair) != 2 or len(set(pair)) != 2 or not set(pair) <= set(cfg.methods):
            raise ConfigError(f"report.more_pairs[{i}]: expected two different arms of methods {cfg.methods}, got {pair!r}")
    for method in [*cfg.methods, *cfg.iterations_by_method, *cfg.seeds_by_method]:
        iterations_of(cfg, method)
        seeds_of(cfg, method)
    if not cfg.methods:
        iterations_of(cfg, "")
    family = family_of(cfg.game)
    structured_output(cfg.game, family.kind)
    family.check_experiment(cfg)
    check_override_lists(cfg)  # last: each composition is a Hydra start
    return cfg


def check_override_lists(cfg: ExperimentSettings) -> None:
    """The trainer's and the labelling's override lists, composed as their stages will compose them."""
    from aria.trainers.engine import check_train_settings
    from aria.trainers.losses import LOSSES

    def check_trainer(overrides: list[str], setting: str) -> None:  # keys and types, then values (a loss's name)
        composed = check_overrides("reinforce_llm", [f"model.path={cfg.base_model}", "data.train_file=train.json",
                                                     *overrides], setting)
        try:
            check_train_settings(typed(TrainerSettings, composed), LOSSES)
        except ConfigError as err:
            raise ConfigError(f"{setting}: {err}") from None

    check_trainer(cfg.train_overrides, "train_overrides")
    for method, overrides in cfg.train_overrides_by_method.items():
        check_trainer([*cfg.train_overrides, *overrides], f"train_overrides_by_method.{method}")
    if any(method_of(cfg, m) == "archer" for m in cfg.methods):
        check_overrides("critic", ["data.train_file=train.json", *cfg.archer.critic_overrides],
                        "archer.critic_overrides")
    if cfg.warm_start.enabled:
        check_trainer(cfg.warm_start.train_overrides, "warm_start.train_overrides")
    labelling = {"intention_overrides": cfg.intention_overrides}
    for name, variant in cfg.variants.items():
        labelling[f"variants.{name}.intention_overrides"] = [*cfg.intention_overrides, *variant.intention_overrides]

    for setting, overrides in labelling.items():
        pipeline.check_overrides_of(cfg.game["name"], overrides, setting)


def check_variants(variants: dict, methods: dict) -> None:
    """``variants``: ``{name: {method: M, intention_overrides: [...]}}``, a method under other labelling."""
    for name, v in variants.items():
        if name in methods:
            raise ConfigError(f"variants.{name}: the name of a method; give the variant a name of its own")
        if v.method not in methods:
            raise ConfigError(f"variants.{name}.method: expected one of {', '.join(sorted(methods))}, got {v.method!r}")
        if not all("=" in o for o in v.intention_overrides):
            raise ConfigError(f"variants.{name}.intention_overrides: expected a list of key=value overrides, "
                              f"got {v.intention_overrides!r}")


def run(cfg: Mapping, echo: Printer = print, command: str | None = None) -> Path:
    """Run (or resume) every stage, then write the results (module doc); with ``report_only``,
    only the results of what is finished (:func:`report`). ``command``: the command line that
    started this run, its secrets redacted (:func:`aria.cli.command_line`), kept with its machine
    and wall time in the run folder's ``invocations.json``."""
    cfg = check_settings(cfg)
    root = Path(cfg.run_dir)
    if cfg.report_only and not (root / "experiment.json").is_file():  # before results_dir is made
        raise ConfigError(f"run_dir: {root} holds no run (no experiment.json): report_only reports a run started before")
    if cfg.report_only:
        return report(cfg, root, echo)  # results_dir checked once the run's record is read
    check_writable(cfg.results_dir)
    with hold_folder(root):  # a second run into this run_dir is refused, naming this one
        return _run(cfg, root, echo, command)


def recorded_settings(root: Path) -> dict:
    """The settings the run in ``root`` recorded at its last start (its ``experiment.json``): a JSON
    object, else one error naming the file (a run folder edited or damaged by hand)."""
    path = root / "experiment.json"
    recorded = read_json(path)
    if not isinstance(recorded, dict):
        raise ConfigError(f"{path}: expected the run's settings as a JSON object, got a {type(recorded).__name__}")
    return recorded


def _check_run_dir(cfg: ExperimentSettings, root: Path) -> None:
    if (root / "experiment.json").is_file() and (name := recorded_settings(root).get("name")) != cfg.name:
        raise ConfigError(f"run_dir: {root} holds the experiment {name!r}, not {cfg.name!r}: give each experiment its own run_dir")


def report(cfg: ExperimentSettings, root: Path, echo: Printer) -> Path:
    """The table of a run so far, no stage run: a run of several sessions, or one going on in
    another process (its folder is only read), shows the arms whose evaluation is complete and
    names the others; the run's own end writes the whole table over it."""
    if not (root / "experiment.json").is_file():
        raise ConfigError(f"run_dir: {root} holds no run (no experiment.json): report_only reports a run started before")
    _check_run_dir(cfg, root)
    cfg, unrecorded = as_recorded(cfg, root, echo)
    check_writable(cfg.results_dir)
    out = write_results(cfg, unrecorded=unrecorded)
    # the table's rows are the arms whose every evaluation game is played
    tabled = {(r["method"], r["seed"], r["iteration"]) for r in read_json(out / "results.json")["arms"]}
    missing = [f"{m} seed {s} iteration {i}" for m in cfg.methods for s in seeds_of(cfg, m)
               for i in range(1, iterations_of(cfg, m) + 1) if (m, s, i) not in tabled]
    echo(f"[experiment] report only: {out / 'table.md'}; not evaluated yet: {', '.join(missing) or 'none'}")
    return out


#: What a report takes from its command; every other setting comes from the run it reports.
FROM_THE_COMMAND = ("run_dir", "results_dir", "report_only")


def as_recorded(cfg: ExperimentSettings, root: Path, echo: Printer) -> tuple[ExperimentSettings, list[str]]:
    """The settings the run in ``root`` recorded at its last start (its ``experiment.json``), which
    its report describes: a preset that gained arms, seeds or pairs since would table the run's warm
    start as theirs and name stages it never ran. Only :data:`FROM_THE_COMMAND` come from ``cfg``;
    settings the code gained after the run keep ``cfg``'s values and are returned. Both kinds of
    difference are named."""
    current, recorded = asdict(cfg), recorded_settings(root)
    try:  # a value of the record that no run could have written: one error naming the file
        merged, differ, unrecorded = recorded_over(current, recorded)
        merged.update({name: current[name] for name in FROM_THE_COMMAND})
        checked = check_settings(merged)
    except ConfigError as err:
        raise ConfigError(f"{root / 'experiment.json'} (the run's recorded settings): {err}") from None
    differ = [name for name in differ if name not in FROM_THE_COMMAND]
    if differ:
        echo(f"[experiment] report only: the run's own settings (its experiment.json) are reported; "
             f"this command's differ on {', '.join(differ)}")
    if unrecorded:
        echo(f"[experiment] report only: settings added since the run (not in its experiment.json), "
             f"this command's used: {', '.join(unrecorded)}")
    return checked, unrecorded


def _run(cfg: ExperimentSettings, root: Path, echo: Printer, command: str | None) -> Path:
    echo(f"[experiment] {planned_power(cfg)}")
    _check_run_dir(cfg, root)
    (root / COPY_MARK).unlink(missing_ok=True)  # a copy resumed is a run of its own: no later copy may replace it
    atomic_write_json(root / "experiment.json", asdict(cfg))
    times_path = root / "stage_times.json"
    times: dict[str, dict] = read_json(times_path) if times_path.is_file() else {}
    generator, machine = Generator(cfg, echo), hardware.label(hardware.describe())  # a long run's stages may run on several machines
    stages, work = plan(cfg), Stages(cfg, generator, echo)
    continued = any("seconds" in times.get(stage.name, {}) for stage in stages)  # stages an earlier run finished
    invocations, started = start_invocation(root, command, machine), time.perf_counter()
    beat = Heartbeat(root, times, invocations)
    try:
        beat.start()
        for n, stage in enumerate(stages, 1):
            if stage.kind not in PLAYS:
                # Training and movement need the cores and the memory (a GPU's too); an idle CPU server whose
                # threads spun without end (before serve_vllm.sh capped the spin) made a movement stage 3x slower.
                generator.stop()
            seconds = timed_stage(stage, lambda: work.run(stage), times, times_path, machine, beat)
            if seconds > 10:  # a stage that did work (a skipped one freed nothing, and a gc pass costs 0.2 s and more)
                release_freed_memory()
            whole = times[stage.name]["seconds"]
            resumed = f" ({_duration(whole)} over its runs)" if seconds > 1.0 and whole > seconds + 1.0 else ""
            echo(f"[experiment] ({n}/{len(stages)}) {stage.name}: {_duration(seconds)}{resumed}; {eta_text(stages[n:], times)}")
    finally:
        beat.stop()
        generator.stop()
        # an interrupted run's time counts too; a command's own process from its start (imports included)
        end_invocation(root, invocations, process_seconds() if command else time.perf_counter() - started)
    out = write_results(cfg, run_record(cfg, process_seconds(), continued))
    echo(f"[experiment] results: {out / 'table.md'}")
    return out


def start_invocation(root: Path, command: str | None, machine: str) -> list[dict]:
    """Add this process to the run folder's ``invocations.json`` (each command that ran stages here:
    its command line, machine and start; its seconds once it ends) and return the list."""
    path = root / "invocations.json"
    invocations = read_json(path) if path.is_file() else []
    invocations.append({"command": command, "cpu": machine, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    atomic_write_json(path, invocations)
    return invocations


def end_invocation(root: Path, invocations: list[dict], seconds: float) -> None:
    """This command's wall time into the last entry of ``invocations.json``."""
    invocations[-1]["seconds"] = round(seconds, 1)
    atomic_write_json(root / "invocations.json", invocations)


def process_seconds() -> float:
    """How long this process has run (Linux: its start in /proc/self/stat against the uptime), so a
    run's wall time includes Python's start and the imports; elsewhere since this module loaded."""
    try:
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return float(Path("/proc/uptime").read_text().split()[0]) - started
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _LOADED


_LOADED = time.perf_counter()


def timed_stage(stage: Stage, do: Callable[[], Any], times: dict[str, dict], times_path: Path, machine: str,
                beat: Heartbeat | None = None) -> float:
    """Run ``stage`` (``do()``); record its time and ``machine`` (the CPU it ran on) in ``times`` (saved
    to ``times_path``) and return this run's seconds. A stage that stops part-way (an interrupt, an
    error) keeps what it ran as ``unfinished``, and its time when it finishes is the sum of its runs,
    its ``cpus`` each machine they ran on: a training resumed across sessions is timed whole, not by
    its last part. A stage killed outright (SIGKILL, a lost machine) left what ``beat`` last wrote
    of it (``running``), which counts as unfinished. A finished stage that is skipped keeps the time
    of the run that did it."""
    beat = beat or Heartbeat(times_path.parent, times, [])  # (never started: no beat, the same locking)
    start = time.perf_counter()
    recorded = times.get(stage.name, {})
    entry = {k: v for k, v in recorded.items() if k != "running"}
    cpus = list(dict.fromkeys([*entry.get("cpus", []), machine]))
    carried = entry.get("unfinished", 0.0) + recorded.get("running", 0.0)
    # the beat's record while it runs: a finished stage (skipped, or run again) keeps its own until it ends
    beat.watch(stage.name, start, entry if "seconds" in entry else {**entry, "kind": stage.kind, "cpus": cpus, "unfinished": carried})
    try:
        do()
    except BaseException:
        with beat.lock:
            beat.watch(None)
            times[stage.name] = {**entry, "kind": stage.kind, "cpus": cpus, "unfinished": carried + time.perf_counter() - start}
            atomic_write_json(times_path, times)
        raise
    seconds = time.perf_counter() - start
    with beat.lock:
        beat.watch(None)
        if seconds > 1.0 or "seconds" not in entry:
            times[stage.name] = {"kind": stage.kind, "seconds": seconds + carried, "cpus": cpus}
        else:
            times[stage.name] = entry  # skipped: the run that did it keeps it (even where a beat fell in the skip)
        atomic_write_json(times_path, times)  # (also over a beat's record of the skip)
    return seconds


#: How often a running experiment writes its command's and its stage's time so far (:class:`Heartbeat`).
HEARTBEAT_SECONDS = 60.0


class Heartbeat:
    """Every :data:`HEARTBEAT_SECONDS` while a run works, its command's time so far into
    ``invocations.json`` (``last_beat_seconds``) and the running stage's into ``stage_times.json``
    (``running``): a run killed outright (SIGKILL, a lost machine, a session's end) keeps its time
    to within a beat. Before, such a command and its stage counted nothing of what they ran (a
    training of 46 min, killed with the session that ran it, was timed by its last 17 min)."""

    def __init__(self, root: Path, times: dict[str, dict], invocations: list[dict], every: float | None = None):
        self.root, self.times, self.invocations = root, times, invocations
        self.every = HEARTBEAT_SECONDS if every is None else every
        self.lock = threading.Lock()  # the stage's own writes of stage_times.json and the beat's never interleave
        self.started = 0.0
        self._stage: tuple[str, float, dict] | None = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="experiment-heartbeat", daemon=True)

    def start(self) -> None:
        self.started = time.perf_counter()
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def watch(self, name: str | None, start: float = 0.0, entry: dict | None = None) -> None:
        """Time the stage ``name`` from ``start``, its record so far ``entry``; None: no stage runs."""
        self._stage = None if name is None else (name, start, entry or {})

    def beat(self) -> None:
        with self.lock:
            now = time.perf_counter()
            if self.invocations:
                self.invocations[-1]["last_beat_seconds"] = round(now - self.started, 1)
                atomic_write_json(self.root / "invocations.json", self.invocations)
            if self._stage is not None:
                name, start, entry = self._stage
                self.times[name] = {**entry, "running": round(now - start, 1)}
                atomic_write_json(self.root / "stage_times.json", self.times)

    def _loop(self) -> None:
        while not self._stopped.wait(self.every):
            try:
                self.beat()
            except OSError:  # a full disk or a folder gone: the run's own writes will say so; the beat only times
                pass


def release_freed_memory() -> None:
    """Give what a stage freed back to the system. glibc keeps freed heap pages in the process:
    after an in-process training stage of the powered preset the runner stayed at 8.1-8.7 GB
    resident, of which 0.5 GB was live (malloc_trim returned the rest), while the next stage's
    vLLM server needed memory of its own. Elsewhere (another C library) nothing is done."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def eta(remaining: list[Stage], times: dict[str, dict]) -> tuple[float, dict[str, int]]:
    """Seconds the ``remaining`` stages should take (each its own recorded time, else the mean of
    the recorded stages of its kind), and how many stages of each kind no stage has timed yet:
    those count 0, so early in a run the figure is a lower bound and says so, rather than timing
    a training stage by the mean of a few seconds' labelling."""
    by_kind: dict[str, list[float]] = {}
    for t in times.values():
        if "seconds" in t:  # finished (an unfinished stage's part says little of the whole)
            by_kind.setdefault(t["kind"], []).append(t["seconds"])
    seconds, untimed = 0.0, {}
    for stage in remaining:
        if "seconds" in times.get(stage.name, {}):
            seconds += times[stage.name]["seconds"]
        elif by_kind.get(stage.kind):
            seconds += sum(by_kind[stage.kind]) / len(by_kind[stage.kind])
        else:
            untimed[stage.kind] = untimed.get(stage.kind, 0) + 1
    return seconds, untimed


def eta_text(remaining: list[Stage], times: dict[str, dict]) -> str:
    seconds, untimed = eta(remaining, times)
    if not untimed:
        return f"ETA {_duration(seconds)}"
    kinds = ", ".join(f"{n} {kind}" for kind, n in untimed.items())
    left = f"not timed yet: {kinds} stage{'s' if sum(untimed.values()) > 1 else ''}"
    return f"ETA at least {_duration(seconds)} ({left})" if seconds > 0 else f"ETA unknown ({left})"
