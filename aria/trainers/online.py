"""Online ARIA: REINFORCE with a pointwise reward model as the advantage (``docs/method.md``
§5; paper §5.3 and App. I.2; single-agent games only).

One story per iteration ``i`` (``config/onlinereinforce_llm.yaml`` names every setting):

1. **Roll out** ``online.rollout_size`` games of every game in ``online.games`` with the current
   policy, many at once (:func:`aria.games.question.play.play_games`, the policy's live weights through
   :meth:`LocalChatModel.from_model`), into ``rollouts/iter-<i>/<game>.rank<r>.jsonl``. These
   files are the rollout buffer: a refresh reads them, and an interrupted rollout resumes game by
   game.
   With ``structured_output: regex`` in a game's config the replies are sampled under the
   question format, but the loss below scores them with the unconstrained model's
   log-probabilities: the gradient is then not the masked policy's, and also pushes the model
   towards the format (off by default).
2. **Score** every agent step (observation = the exact prompt the policy saw, action = its reply)
   with the reward model; the score, through ``online.advantage`` (:data:`ADVANTAGES`), is the
   step's advantage A.
3. **Update** the actor: ``online.actor_updates`` optimizer steps, each on
   ``micro_batch_size × gradient_accumulation_steps`` of the iteration's steps (a seeded order,
   cycled when the iteration has fewer; with ``train.packing: prefix_tree`` whole games in a
   seeded order, each micro-batch in prefix trees), with the REINFORCE loss of the offline trainer
   (``L = −mean(A · Σ_t log π(a_t | observation))``, :func:`aria.trainers.losses.reinforce_loss`).
4. **Refresh** the reward model every ``online.rm_refresh`` actor steps (paper: 50): pipeline
   steps 1-4 (:mod:`aria.intention.pipeline`) on the rollouts since the last refresh give an
   aggregated-reward training set, on which ``scripts/train_rm.py`` retrains the reward model
   (from the current one, or from the base model, ``reward_model.refresh_from``). Its held-out
   loss and Pearson/Spearman correlation are logged.

Where the first reward model comes from: ``reward_model.init_path`` (a model trained with
``scripts/train_rm.sh``), else one trained first on ``reward_model.train_file`` (an offline
aggregated-reward set), else one trained on iteration 0's own rollouts, aggregated, before they
are scored.

Checkpoints (every ``online.save_freq`` iterations, ``checkpoints/step-<actor step>/``, written
under a temporary name and renamed): the policy's trainable tensors and its Hugging Face adapter
or model, the optimizer, the scheduler, every process's RNG state, and ``trainer_state.json``
(iterations done, actor steps, the reward model in use and the rollout window of the next
refresh). The reward models live in ``rm_refresh/step-<n>/``, the rollouts in ``rollouts/``.
Re-running the same command resumes after the last checkpointed iteration; an interruption at
an iteration boundary resumes to the same weights as an uninterrupted run (tested).

Several processes (``accelerate launch``): each plays its share of the games with its own copy
of the policy, scores and trains on its own steps (gradients are averaged by DDP); the main
process runs the refresh's pipeline steps and the reward-model training, the others wait.
DeepSpeed ZeRO-3 is not wired into this trainer.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import torch

from aria.games.common.base import load_game_config
from aria.games.family import checked_game, family_of
from aria.games.question.game import build_game
from aria.games.question.oracle import build_oracle
from aria.games.question.play import play_games, reply_format
from aria.intention import pipeline
from aria.io import ConfigError, ResumeMismatch, atomic_write_json, read_json
from aria.llm.embedded import resolve_model_path
from aria.llm.policy import Encoding, action_logprobs, collate_as, load_policy, model_folder
from aria.packing import attention_break_even, sample_groups
from aria.resources import compose_config, config_dir
from aria.settings import typed
from aria.trainers.checkpoint import (begin_checkpoint, check_output_dir_early, check_resume_settings,
                                      finish_checkpoint, latest_checkpoint, load_plain_state, load_rng_state,
                                      resume_settings, run_record, save_plain_state, set_rng_state, start_fresh,
                                      trim_metrics)
from aria.trainers.engine import (accumulate_step, build_optimizer, check_train_settings, make_accelerator,
                                  save_final_model)
from aria.trainers.losses import (ADVANTAGES, LOSSES, TOKEN_LOSSES, rm_score,  # noqa: F401  (re-exported)
                                  rm_score_centered)
from aria.trainers.reward_service import SCORERS, build_scorer, merge_if_adapter
from aria.trainers.settings import OnlineTrainerSettings
from aria.trajectories import read_trajectories
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): accelerate, peft, transformers

#: Variables through which torchrun and accelerate tell a process it belongs to a launched group.
_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                       "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT")


def standalone_env() -> dict[str, str]:
    """This process's environment without what makes a child join the launched process group: a
    reward-model training started from the main process of a multi-process run would otherwise
    wait for ranks that never come."""
    return {k: v for k, v in os.environ.items()
            if k not in _LAUNCHER_VARIABLES and not k.startswith(("TORCHELASTIC_", "ACCELERATE_"))}


# ---- the actor's batches ------------------------------------------------------------------------
def update_batches(n: int, updates: int, batch_size: int, micro_batch_size: int, seed: int | list[int],
                   lengths: list[int] | None = None, groups: list | None = None) -> list[list[list[int]]]:
    """Sample indices for ``updates`` optimizer steps of ``batch_size`` samples each, split into
    micro-batches of ``micro_batch_size``: a seeded permutation of ``0..n-1``, cycled (a fresh
    permutation each pass) when ``n < updates · batch_size``. Within a step, samples are sorted by
    ``lengths`` before the split, so a micro-batch holds similar lengths (little padding).
    With ``groups`` (each sample's game; prefix-tree packing) the permutation is over the games
    and each game's samples follow in order, so a micro-batch holds consecutive steps of a game
    (they share its history in the micro-batch's tree); ``lengths`` is then not used.
    Returns ``[update][micro-batch][sample index]``."""
    if n == 0:
        return []
    rng = np.random.default_rng(seed)
    members: dict = {}
    for i, g in enumerate(groups if groups is not None else range(n)):
        members.setdefault(g, []).append(i)
    games = list(members)
    order: list[int] = []
    while len(order) < updates * batch_size:
        order += [i for g in rng.permutation(len(games)).tolist() for i in members[games[g]]]
    steps = []
    for u in range(updates):
        chunk = order[u * batch_size : (u + 1) * batch_size]
        if lengths is not None and groups is None:
            chunk = sorted(chunk, key=lambda i: (-lengths[i], i))
        steps.append([chunk[j : j + micro_batch_size] for j in range(0, batch_size, micro_batch_size)])
    return steps


@torch.no_grad()
def sync_weights(policy, copy) -> None:
    """Set the inference ``copy`` (a plain causal LM, any dtype) to the live ``policy``'s weights:
    for a peft LoRA policy, each adapted layer's ``W + ΔW`` (computed aside: the policy's own
    weights are never merged and unmerged, which would round them); every other parameter as it
    is. Names follow the base model's."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    base = policy.get_base_model() if isinstance(policy, PeftModel) else policy
    targets = dict(copy.named_parameters())
    adapted = set()
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            weight = module.get_base_layer().weight
            for adapter in module.active_adapters:
                weight = weight + module.get_delta_weight(adapter)
            targets[f"{name}.weight"].copy_(weight)
            adapted.add(f"{name}.weight")
    for name, param in base.named_parameters():
        plain = name.replace(".base_layer.", ".")
        if "lora_" in name or plain in adapted:
            continue
        targets[plain].copy_(param)


@dataclass
class OnlineState:
    iteration: int = 0          # iterations finished
    step: int = 0               # actor optimizer steps done
    rm_path: str | None = None  # the reward model in use
    window_start: int = 0       # first iteration whose rollouts the next refresh aggregates


class OnlineTrainer:
    """Online ARIA (module doc); ``cfg`` is the resolved config ``config/onlinereinforce_llm.yaml``.

    ``on_iteration(i)`` is called after iteration ``i`` is checkpointed (tests use it to interrupt).
    """

    def __init__(self, cfg: Mapping | OnlineTrainerSettings, on_iteration: Callable[[int], None] | None = None):
        from accelerate.utils import set_seed

        cfg = typed(OnlineTrainerSettings, cfg, "online trainer settings")
        if cfg.reward_model.serve.name not in SCORERS:  # before the policy loads
            raise ConfigError(f"reward_model.serve.name: unknown {cfg.reward_model.serve.name!r} "
                              f"(known: {', '.join(sorted(SCORERS))})")
        if cfg.loss.name in TOKEN_LOSSES:  # its reference is computed once on a fixed training set
            raise ConfigError(f"loss.name: {cfg.loss.name!r} is a loss of the offline trainer (its reference "
                              "log-probs are those of a fixed training set); online, use reinforce")
        check_train_settings(cfg, LOSSES)
        if cfg.online.advantage not in ADVANTAGES:
            raise ConfigError(f"online.advantage: unknown {cfg.online.advantage!r} (known: {sorted(ADVANTAGES)})")
        self.cfg, self.on_iteration = cfg, on_iteration
        t, o = cfg.train, cfg.online
        self.output_dir = Path(cfg.output_dir)
        self.accelerator = make_accelerator(cfg, output_dir=self.output_dir)
        check_output_dir_early(self.output_dir, resume_settings(cfg))  # another run's final/: before the model loads
        set_seed(cfg.seed)
        self.advantage = ADVANTAGES[o.advantage]
        self.loss_fn = LOSSES[cfg.loss.name]
        self.loss_options = cfg.loss.options(cfg.loss.name)

        # The games and their oracle (single-agent games only: online ARIA is not defined for two players).
        self.games = {}
        for name in o.games:
            game_cfg = load_game_config(name)
            if o.max_turns is not None:  # as the evaluation's max_turns: the game's rules, shortened
                game_cfg["max_turns"] = o.max_turns
            game_cfg = checked_game(game_cfg)
            if not family_of(game_cfg).online:
                raise ConfigError(f"online.games: online ARIA plays single-agent games; {name!r} is a "
                                  f"{family_of(game_cfg).title} game")
            self.games[name] = (game_cfg, build_game(game_cfg), build_oracle(cfg.oracle, game_cfg))
            pipeline.check_overrides_of(name, o.intention_overrides, "online.intention_overrides")

        m = cfg.model
        if cfg.reward_model.init_path:  # named before the policy loads, not after
            model_folder(cfg.reward_model.init_path, "reward_model.init_path")
        self.tokenizer, model = load_policy(m.path, m.dtype, asdict(m.lora) if m.lora.enabled else None,
                                            m.gradient_checkpointing)
        # The actor trains on the prompts its rollouts were played with: the policy cuts a prompt
        # longer than rollout.max_prompt_tokens on the left, so training cuts it there too.
        self.encoding = replace(Encoding.of(cfg.data), max_prompt_tokens=cfg.rollout.max_prompt_tokens, over_long="cut_left")
        self.total_steps = o.iterations * o.actor_updates
        optimizer, self.scheduler = build_optimizer(model, t, self.total_steps)
        self.break_even = attention_break_even(model)  # which micro-batches are cheaper in rows (aria.packing)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.scorer = build_scorer(asdict(cfg.reward_model), str(self.accelerator.device))
        self.state = OnlineState()
        self._rng_to_restore: dict | None = None  # set by resume()
        self._rollout_copy = None  # the inference copy of the policy (rollout.dtype), made on first use

    # ---- 1. rollouts --------------------------------------------------------------------------
    def rollout_file(self, iteration: int, game: str, rank: int) -> Path:
        return self.output_dir / "rollouts" / f"iter-{iteration:05d}" / f"{game}.rank{rank}.jsonl"

    def rollout_model(self):
        """The model the rollouts generate with: the live policy itself (``rollout.dtype: null``), or
        an inference copy in ``rollout.dtype`` whose weights are set from the live policy now
        (:func:`sync_weights`). A bfloat16 copy decodes much faster on hardware with native
        bfloat16 than the float32 master weights under autocast."""
        policy = self.accelerator.unwrap_model(self.model)
        dtype = self.cfg.rollout.dtype
        if not dtype:
            return policy
        if self._rollout_copy is None:
            from transformers import AutoModelForCausalLM

            from aria.llm.local import resolve_dtype

            device = str(self.accelerator.device)
            self._rollout_copy = AutoModelForCausalLM.from_pretrained(
                resolve_model_path(self.cfg.model.path), dtype=resolve_dtype(dtype, device)).to(device).eval()
            self._rollout_copy.requires_grad_(False)
        sync_weights(policy, self._rollout_copy)
        return self._rollout_copy

    def rollout(self, iteration: int) -> list[dict]:
        """Play this process's share of the iteration's games with the current weights; returns the
        finished records (failed games are kept in the file, not trained on)."""
        from aria.llm.local import LocalChatModel

        acc, o, r = self.accelerator, self.cfg.online, self.cfg.rollout
        per_process = math.ceil(o.rollout_size / acc.num_processes)
        model = self.rollout_model()
        policy = LocalChatModel.from_model(model, self.tokenizer, name=f"online-iter{iteration}",
                                           max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                                           top_p=r.top_p, max_prompt_tokens=r.max_prompt_tokens,
                                           reuse_cache=r.reuse_cache, device=acc.device)
        records = []
        model.eval()
        try:
            with acc.autocast():
                for name, (game_cfg, game, oracle) in self.games.items():
                    path = self.rollout_file(iteration, name, acc.process_index)
                    # seed + iteration · processes + rank: distinct targets and game ids everywhere
                    seed = self.cfg.seed + iteration * acc.num_processes + acc.process_index
                    summary = play_games(game, policy, oracle, path, per_process, seed=seed,
                                         batch_size=o.rollout_batch_size, system_prompt=r.system_prompt,
                                         progress=self.cfg.logging.progress and acc.is_local_main_process,
                                         reply_format=reply_format(game_cfg))
                    if summary.failed:
                        print(f"[online] iteration {iteration}: {summary.failed} {name} game(s) failed; see {path}",
                              file=sys.stderr)
                    records += [rec for rec in read_trajectories(path) if rec["status"] == "finished"]
        finally:
            policy.release_all()
            model.train()
        return records

    def step_samples(self, records: list[dict]) -> list[dict]:
        """Every agent step of the records as ``{observation, action, game, game_id, turn}``; the
        observation is the prompt the policy saw (the same text a training set holds)."""
        samples = []
        for record in records:
            game = self.games[record["game"]][1]
            for i, turn in enumerate(record["turns"]):
                samples.append({"observation": game.prompt_before_turn(record["turns"], i), "action": turn["action"],
                                "game": record["game"], "game_id": record["game_id"], "turn": i})
        return samples

    # ---- 3. the actor update ------------------------------------------------------------------
    def actor_update(self, samples: list[dict], advantages: np.ndarray, iteration: int) -> dict:
        """``online.actor_updates`` REINFORCE steps on this iteration's steps (module doc)."""
        acc, t = self.accelerator, self.cfg.train
        updates = self.cfg.online.actor_updates
        batch_size = t.micro_batch_size * t.gradient_accumulation_steps
        encoded = [self.encoding.encode(self.tokenizer, s["observation"], s["action"]) for s in samples]
        adv = torch.tensor(advantages, dtype=torch.float32)
        packed = t.packing == "prefix_tree"
        plan = update_batches(len(encoded), updates, batch_size, t.micro_batch_size,
                              seed=[self.cfg.seed, iteration, acc.process_index],
                              lengths=[len(e.input_ids) for e in encoded],
                              groups=sample_groups(samples) if packed else None)
        losses, grad_norms = [], []
        self.model.train()
        for micro_batches in plan:
            step_loss = 0.0
            for indices in micro_batches:
                batch = {k: v.to(acc.device) for k, v in
                         collate_as([encoded[i] for i in indices], self.tokenizer.pad_token_id, t.packing,
                                    self.break_even).items()}
                def compute_loss():
                    logp = action_logprobs(self.model, batch)
                    return self.loss_fn(logp, adv[indices].to(logp.device), **self.loss_options)

                loss, grad_norm = accumulate_step(acc, self.model, self.optimizer, self.scheduler, compute_loss,
                                                  t.max_grad_norm)
                if grad_norm is not None:
                    grad_norms.append(grad_norm)
                step_loss += float(loss.detach()) / len(micro_batches)
            losses.append(step_loss)
            self.state.step += 1
        if not plan:  # no steps this iteration (every game failed): keep the step count and schedule in line
            for _ in range(updates):
                self.scheduler.step()
            self.state.step += updates
        out = {"loss": float(np.mean(losses)) if losses else None, "lr": self.scheduler.get_last_lr()[0]}
        if grad_norms:
            out["grad_norm"] = float(np.mean(grad_norms))
        return out

    # ---- 4. the reward model ---------------------------------------------------------------------
    def aggregate_rollouts(self, iterations: range, run_dir: Path) -> Path:
        """Pipeline steps 1-4 on the rollouts of ``iterations``, per game; the games' samples
        together in ``run_dir/train.json`` (main process only)."""
        samples = []
        quiet = (lambda line: None) if not self.cfg.logging.progress else print
        for name in self.games:
            files = [str(f) for i in iterations for f in sorted(self.rollout_file(i, name, 0).parent.glob(f"{name}.rank*.jsonl"))]
            c = compose_config("intention", [f"game={name}", f"input=[{','.join(files)}]", f"run_dir={run_dir / name}",
                                             f"seed={self.cfg.seed}", *self.cfg.online.intention_overrides])
            pipeline.step1_embed_and_cluster(c, quiet)
            pipeline.step2_select_k(c, quiet)
            pipeline.step3_apply_labels(c, quiet)
            samples += read_json(pipeline.step4_build_training_set(c, quiet))
        atomic_write_json(run_dir / "train.json", samples, indent=1)
        return run_dir / "train.json"

    def train_reward_model(self, train_file: Path, out_dir: Path) -> dict:
        """Train the reward model on ``train_file`` with :mod:`aria.trainers.launch_reward_model` in a child process
        (its own accelerate state and memory; ``reward_model.train_command`` may launch it on other
        devices), starting from the current reward model or the base; returns its ``eval.json``."""
        rm = self.cfg.reward_model
        start = self.state.rm_path if (rm.refresh_from == "current" and self.state.rm_path) else rm.base_path
        command = list(rm.train_command or [sys.executable, "-m", "aria.trainers.launch_reward_model",
                                                "--config-dir", str(config_dir()), "--config-name", "reward_model"])
        command += [f"data.train_file={Path(train_file).resolve()}", f"model.path={start}",
                    f"output_dir={Path(out_dir).resolve()}", f"seed={self.cfg.seed}",
                    f"data.max_prompt_tokens={rm.max_prompt_tokens}", "data.over_long=cut_left",  # as the rollouts were played
                    *rm.train_overrides]
        log_path = out_dir.parent / "train_rm.log"
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w", encoding="utf-8") as log_file:
            done = subprocess.run(command, stdout=log_file, stderr=subprocess.STDOUT, env=standalone_env())
        if done.returncode != 0:
            tail = log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"reward-model training failed (exit {done.returncode}); log {log_path}:\n{tail}")
        eval_path = out_dir / "eval.json"
        return read_json(eval_path) if eval_path.is_file() else {}

    def refresh_reward_model(self, upto: int | None = None, train_file: str | None = None) -> dict:
        """Retrain the reward model: on ``train_file`` as given, or on the aggregated rollouts of
        iterations ``window_start..upto`` (skipped when there are none: the last refresh already
        used them); then every process loads it. Returns what is logged."""
        acc = self.accelerator
        if train_file is None and upto < self.state.window_start:
            return {"skipped": f"no rollouts since the last refresh (iterations {self.state.window_start}..{upto})"}
        run_dir = self.output_dir / "rm_refresh" / f"step-{self.state.step:06d}"
        final = run_dir / "reward_model" / "final"
        info: dict = {}
        if acc.is_main_process:
            shutil.rmtree(run_dir, ignore_errors=True)  # a refresh cut short before the checkpoint is redone whole
            start = time.perf_counter()
            if train_file is None:
                window = self.cfg.online.refresh_window
                first = self.state.window_start if not window else max(self.state.window_start, upto - window + 1)
                train_file = self.aggregate_rollouts(range(first, upto + 1), run_dir)
                info["rm_window"] = [first, upto]
            evaluation = self.train_reward_model(Path(train_file), run_dir / "reward_model")
            info.update({k: v for k, v in evaluation.items() if k != "step"})
            info["rm_train_samples"] = len(read_json(train_file))
            info["rm_seconds"] = round(time.perf_counter() - start, 1)
            merge_if_adapter(final)
            atomic_write_json(run_dir / "refresh.json", info)
        acc.wait_for_everyone()
        self.state.rm_path = str(final)
        self.state.window_start = (upto + 1) if upto is not None else self.state.window_start
        self.scorer.load(final)
        return read_json(run_dir / "refresh.json") if not info else info

    def _due_for_refresh(self, steps_before: int) -> bool:
        every = self.cfg.online.rm_refresh
        return bool(every) and self.state.step // every > steps_before // every

    # ---- the loop ------------------------------------------------------------------------------
    def train(self) -> dict:
        acc, o, rm = self.accelerator, self.cfg.online, self.cfg.reward_model
        resumed = self.resume()
        if self.state.rm_path is None and rm.init_path:
            self.state.rm_path = str(rm.init_path)
        if self.state.rm_path is not None:
            self.scorer.load(self.state.rm_path)
        elif rm.train_file:
            self.refresh_reward_model(train_file=rm.train_file)
        if self._rng_to_restore is not None:
            set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None
        metrics_path = self.output_dir / "metrics.jsonl"
        last: dict = {}
        while self.state.iteration < o.iterations:
            i = self.state.iteration
            record = {"iteration": i}
            start = time.perf_counter()
            records = self.rollout(i)
            record.update(self._rollout_stats(records))
            record["rollout_seconds"] = round(time.perf_counter() - start, 1)
            if self.state.rm_path is None:  # no reward model yet: the first one learns from these rollouts
                record["rm_refresh"] = self.refresh_reward_model(upto=i)

            start = time.perf_counter()
            samples = self.step_samples(records)
            scores = self.scorer.score(samples)
            advantages = self.advantage(scores)
            record["score_seconds"] = round(time.perf_counter() - start, 1)
            record.update(_stats("score", scores))

            start = time.perf_counter()
            steps_before = self.state.step
            record.update(self.actor_update(samples, advantages, i))
            record["update_seconds"] = round(time.perf_counter() - start, 1)
            record["step"] = self.state.step
            if self._due_for_refresh(steps_before):
                record["rm_refresh"] = self.refresh_reward_model(upto=i)

            self.state.iteration += 1
            if acc.is_main_process:
                metrics_path.parent.mkdir(parents=True, exist_ok=True)
                with open(metrics_path, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(record) + "\n")
                print(_summary_line(record), flush=True)
            if self.state.iteration % o.save_freq == 0 or self.state.iteration == o.iterations:
                self.save_checkpoint()
            last = record
            if self.on_iteration:
                self.on_iteration(i)
        final = self.save_final()
        return {"iterations": self.state.iteration, "steps": self.state.step, "final": str(final),
                "reward_model": self.state.rm_path, "resumed_from": str(resumed) if resumed else None, "last": last}

    def _rollout_stats(self, records: list[dict]) -> dict:
        """Success and turns per game, summed over processes."""
        acc = self.accelerator
        out = {}
        for name in self.games:
            mine = [r for r in records if r["game"] == name]
            counts = torch.tensor([len(mine), sum(r["success"] for r in mine), sum(r["num_turns"] for r in mine)],
                                  dtype=torch.float64, device=acc.device)
            games, wins, turns = acc.reduce(counts, reduction="sum").tolist()
            out[f"{name}/games"] = int(games)
            out[f"{name}/success_rate"] = round(wins / games, 4) if games else None
            out[f"{name}/mean_turns"] = round(turns / games, 2) if games else None
        return out

    # ---- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        acc = self.accelerator
        tmp, final = begin_checkpoint(acc, self.output_dir, self.state.step)
        if acc.is_main_process:
            save_plain_state(tmp, acc.unwrap_model(self.model), self.tokenizer, self.optimizer, self.scheduler)
        return finish_checkpoint(acc, tmp, final, {**asdict(self.state), "world_size": acc.num_processes,
                                                   "total_steps": self.total_steps, "settings": resume_settings(self.cfg)},
                                 self.cfg.train.keep_checkpoints)

    def resume(self) -> Path | None:
        checkpoint = latest_checkpoint(self.output_dir)
        if checkpoint is None:  # the online loop's data is its own rollouts: the settings say what made it
            start_fresh(self.output_dir, self.accelerator, resume_settings(self.cfg), "")
            return None
        saved = read_json(checkpoint / "trainer_state.json")
        if saved["world_size"] != self.accelerator.num_processes or saved["total_steps"] != self.total_steps:
            raise ResumeMismatch(f"{checkpoint} was written by {saved['world_size']} process(es) for {saved['total_steps']} "
                                 f"actor steps; this run has {self.accelerator.num_processes} and {self.total_steps}: "
                                 f"use a new output_dir, or delete {checkpoint.parent} to start over")
        check_resume_settings(checkpoint, saved, resume_settings(self.cfg))
        load_plain_state(checkpoint, self.accelerator.unwrap_model(self.model), self.optimizer, self.scheduler)
        # Restored in train(), after the reward model is loaded, so that loading it draws nothing
        # from the generators the rollouts sample with.
        self._rng_to_restore = load_rng_state(checkpoint, self.accelerator.process_index)
        self.state = OnlineState(**{k: saved[k] for k in asdict(OnlineState())})
        if self.accelerator.is_main_process:  # iterations after the checkpoint are redone, and so are
            # their rollouts, which were played with weights the resumed run does not have
            trim_metrics(self.output_dir / "metrics.jsonl", lambda line: line["iteration"] < self.state.iteration)
            for folder in (self.output_dir / "rollouts").glob("iter-*"):
                if int(folder.name.split("-")[1]) >= self.state.iteration:
                    shutil.rmtree(folder, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            print(f"[online] resumed from {checkpoint} (iteration {self.state.iteration}, step {self.state.step})")
        return checkpoint

    def save_final(self) -> Path:
        return save_final_model(self.accelerator, self.model, self.tokenizer, self.output_dir / "final", self.encoding,
                                {"iterations": self.state.iteration, "steps": self.state.step,
                                 "reward_model": self.state.rm_path, "config": asdict(self.cfg)},
                                run=run_record(resume_settings(self.cfg), ""))


def _stats(prefix: str, values: np.ndarray) -> dict:
    if len(values) == 0:
        return {f"{prefix}_n": 0}
    return {f"{prefix}_n": int(len(values)), f"{prefix}_mean": round(float(values.mean()), 6),
            f"{prefix}_std": round(float(values.std()), 6), f"{prefix}_min": round(float(values.min()), 6),
            f"{prefix}_max": round(float(values.max()), 6)}


def _summary_line(record: dict) -> str:
    parts = [f"[online] iteration {record['iteration']} (step {record['step']})"]
    parts += [f"{k.split('/')[0]} success {v:.3f}" for k, v in record.items() if k.endswith("/success_rate") and v is not None]
    if "score_mean" in record:
        parts.append(f"RM score {record['score_mean']:.4f}±{record['score_std']:.4f} over {record['score_n']} steps")
    if record.get("loss") is not None:
        parts.append(f"loss {record['loss']:.4f}")
    refresh = record.get("rm_refresh")
    if refresh:
        parts.append(f"RM refreshed on {refresh.get('rm_train_samples')} samples "
                     f"(held-out Pearson {refresh.get('eval_pearson')}, Spearman {refresh.get('eval_spearman')})")
    return "; ".join(parts)
