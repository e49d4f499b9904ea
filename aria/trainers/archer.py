"""ArCHer's critic trained by temporal differences on a fixed collection, then every step's advantage.

One story, top to bottom: read the training set (pipeline step 4's file: every agent step with its
game, role, turn, history and utterance, and the game's final reward) -> link each step to its
player's next step and give each step its turn reward (these games pay once, at the end: the
final reward on a player's last step, 0 before) -> hold out a seeded share of the games ->
epochs of micro-batches, each the four heads' TD loss of :mod:`aria.trainers.critic`, one
accumulated optimizer step on the training engine (:mod:`aria.trainers.engine`) and the Polyak
update of the target copy -> checkpoints and exact resume -> the critic's diagnostics on the
held-out games -> every step's advantage ``A(s, a) = min(Q_1, Q_2) − min(V_1, V_2)`` written into a
copy of the training set. The actor then trains on that file with ``method=archer``: the same
REINFORCE as every other method, with the advantage as the step's weight
(:mod:`aria.trainers.methods`), so ArCHer's low level gets the whole-game packing, LoRA and
checkpoints of the other methods.

Where this departs from the release (``docs/method.md``, ArCHer):

* V's target uses the collected utterance as the policy's action ``a_π``. The release samples a
  fresh utterance from the current actor at every critic update. The two agree in distribution
  when the collection was made by the policy being trained, which is how the experiment runner
  and the online loop use it (one sample per history instead of one per update); a collection of
  another policy (the scripted expert, an imported file) makes V the value of that policy.
* The encoder is any Hugging Face encoder with mean pooling (default: the embedded
  all-MiniLM-L6-v2, so that it runs on a laptop) instead of RoBERTa-base's pooler.
"""
from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from aria.data import read_training_set
from aria.io import DataError, atomic_folder, atomic_write_json, atomic_write_json_rows, json_digest
from aria.settings import typed
from aria.trainers.checkpoint import (RUN_RECORD, check_output_dir_early, load_state, resume_settings,
                                      resume_step_trainer, run_record, save_state, save_step_checkpoint)
from aria.trainers.critic import DoubleCritic, advantages, critic_loss, polyak_update, q_targets, transitions, v_targets
from aria.trainers.engine import (TrainState, accumulate_step, build_optimizer, check_train_settings, fit_accumulation,
                                  make_accelerator, run_epochs)
from aria.trainers.methods import FIELD_TYPES
from aria.trainers.offline import _plain_batches, batches_for_process
from aria.trainers.reward_model import held_out_split
from aria.trainers.settings import CriticTrainerSettings

# Imported in the functions that use them (slow to import: benchmarks/import_time.py): accelerate

#: The fields of a step the critic reads (pipeline step 4 writes them all).
STEP_FIELDS = ("game_id", "turn", "observation", "action", "final_reward")


# ---- the data -------------------------------------------------------------------------------------
def turn_rewards(steps: Sequence[dict], done: torch.Tensor) -> torch.Tensor:
    """The reward of each step's turn: the player's final reward on its last step, 0 before."""
    final = torch.tensor([float(s["final_reward"]) for s in steps], dtype=torch.float32)
    return torch.where(done > 0, final, torch.zeros_like(final))


def check_steps(steps: Sequence[dict], path: str) -> None:
    """Every field the critic reads, of the right type, named by file, sample and field."""
    if not steps:
        raise DataError(path, None, None, "the training set is empty")
    for i, step in enumerate(steps):
        for field in STEP_FIELDS:
            if field not in step:
                raise DataError(path, None, f"sample {i}.{field}", "missing (re-run pipeline step 4, which writes it)")
            test, expected = FIELD_TYPES[field]
            if not test(step[field]):
                raise DataError(path, None, f"sample {i}.{field}", f"expected {expected}, got {step[field]!r:.80}")


def ranking_accuracy(scores: Sequence[float], won: Sequence[bool], strata: Sequence | None = None) -> float | None:
    """The share of (won, lost) pairs in which the won step scores higher (a tie counts half): the
    area under the ROC curve. With ``strata``, only pairs in the same stratum count (the same
    turn: a later turn is not better for being later). None where no pair exists."""
    scores, won = np.asarray(scores, dtype=float), np.asarray(won, dtype=bool)
    strata = np.zeros(len(scores)) if strata is None else np.asarray(strata)
    better = pairs = 0.0
    for stratum in np.unique(strata):
        inside = strata == stratum
        w, lost = scores[inside & won], scores[inside & ~won]
        if len(w) and len(lost):
            diff = w[:, None] - lost[None, :]
            better += float((diff > 0).sum() + 0.5 * (diff == 0).sum())
            pairs += diff.size
    return better / pairs if pairs else None


# ---- the trainer -----------------------------------------------------------------------------------
class CriticTrainer:
    """TD learning of :class:`~aria.trainers.critic.DoubleCritic` on a training set; ``cfg`` is the
    resolved config (``config/critic.yaml``)."""

    def __init__(self, cfg: Mapping | CriticTrainerSettings, on_step: Callable[[int], None] | None = None):
        from accelerate.utils import set_seed

        cfg = typed(CriticTrainerSettings, cfg, "critic settings")
        check_train_settings(cfg, {}, loss_name="td")
        c = cfg.critic
        self.cfg, t = cfg, cfg.train
        self.train_path = cfg.data.train_file
        self._read_steps()  # data first: a bad file is one line before the encoder loads

        self.output_dir = Path(cfg.output_dir)
        self.accelerator = make_accelerator(cfg, self.output_dir, output_dir=self.output_dir)
        check_output_dir_early(self.output_dir, resume_settings(cfg))  # another run's final/: before the models load
        self.on_step = on_step  # called after every optimizer step (tests use it to interrupt a run)
        set_seed(cfg.seed)
        critic = DoubleCritic(c.encoder, c.hidden, c.max_tokens)
        if c.init:  # go on from an earlier critic (the online loop's previous iteration)
            load_critic(c.init, critic)
        # θ̄ starts equal to θ; it computes targets only, without dropout (a target is not a draw)
        self.target = copy.deepcopy(critic).requires_grad_(False).eval()
        if not c.train_encoder:  # heads only: one encoding of each text, shared with the target copy
            self.target.freeze_encoder(critic.freeze_encoder())
        fit_accumulation(self.accelerator, t, -(-len(self.train_index) // t.micro_batch_size), "critic")
        world, accumulation = self.accelerator.num_processes, t.gradient_accumulation_steps
        self.micro_per_epoch = len(self._epoch_batches(0))
        self.steps_per_epoch = self.micro_per_epoch // accumulation
        if self.steps_per_epoch == 0:
            raise DataError(self.train_path, None, None, f"{len(self.train_index)} training steps make no full optimizer "
                            f"step with micro_batch_size={t.micro_batch_size}, accumulation={accumulation}, "
                            f"processes={world}")
        self.total_steps = self.steps_per_epoch * t.epochs
        # What a checkpoint was trained on: resuming on other data or settings would mix two runs.
        self.data_digest = json_digest([[s["game_id"], s.get("role"), s["turn"], s["observation"], s["action"]]
                                        for s in self.steps] + self.rewards.tolist() + [asdict(c), t.micro_batch_size],
                                       sort_keys=False)
        optimizer, self.scheduler = build_optimizer(critic, t, self.total_steps)
        self.model, self.optimizer = self.accelerator.prepare(critic, optimizer)
        self.target.to(self.accelerator.device)
        self.state = TrainState()

    def _read_steps(self) -> None:
        """The training set's steps, linked to their next steps, with their turn rewards, split into
        the steps trained on and the held-out games' (``data.eval_fraction``), and at most
        ``data.max_samples`` of the former."""
        data, seed = self.cfg.data, self.cfg.seed
        self.steps = read_training_set(self.train_path)
        check_steps(self.steps, self.train_path)
        try:
            linked = transitions(self.steps)
        except ValueError as error:
            raise DataError(self.train_path, None, None, str(error)) from None
        self.next_index, self.done = linked.next_index, linked.done
        self.rewards = turn_rewards(self.steps, self.done)
        _, held_games = held_out_split([{"game_id": s["game_id"]} for s in self.steps], data.eval_fraction, seed)
        held = {g["game_id"] for g in held_games}
        self.train_index = [i for i, s in enumerate(self.steps) if s["game_id"] not in held]
        self.eval_index = [i for i, s in enumerate(self.steps) if s["game_id"] in held]
        if not self.train_index:
            raise DataError(self.train_path, None, None, "no steps left for training after the held-out split")
        if data.max_samples and data.max_samples < len(self.train_index):  # a seeded subset of the transitions, in file
            # order; each still bootstraps from its own next history, which is encoded whether it is trained on or not
            keep = np.sort(np.random.default_rng(seed).choice(len(self.train_index), size=data.max_samples, replace=False))
            self.train_index = [self.train_index[i] for i in keep]

    # ---- one micro-batch ----
    def _texts(self, indices: Sequence[int]) -> tuple[list[str], list[str]]:
        return [self.steps[i]["observation"] for i in indices], [self.steps[i]["action"] for i in indices]

    def targets(self, indices: Sequence[int]) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """The TD targets of the steps ``indices`` from the target copy: (Q targets, V targets)."""
        c, device = self.cfg.critic, self.accelerator.device
        index = torch.tensor(list(indices))
        reward, done, nxt = self.rewards[index].to(device), self.done[index].to(device), self.next_index[index]
        histories, utterances = self._texts(indices)
        with torch.no_grad():
            tq1, tq2, _, _ = self.target(histories, utterances)  # Q̄ at the policy's (the collected) utterance
            next_v1, next_v2 = torch.zeros(len(index), device=device), torch.zeros(len(index), device=device)
            going_on = (nxt >= 0).nonzero().flatten()
            if len(going_on):
                v1, v2 = self.target.values([self.steps[int(j)]["observation"] for j in nxt[going_on]])
                next_v1[going_on.to(device)], next_v2[going_on.to(device)] = v1, v2
        q_target = (q_targets(reward, done, next_v1, c.gamma), q_targets(reward, done, next_v2, c.gamma))
        return q_target, v_targets(tq1, tq2, c.v_target)

    def micro_loss(self, indices: Sequence[int]) -> torch.Tensor:
        q_target, v_target = self.targets(indices)
        q1, q2, v1, v2 = self.model(*self._texts(indices))
        return critic_loss((q1, q2), (v1, v2), q_target, v_target)

    # ---- the data order ----
    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        t = self.cfg.train
        batches = [[self.train_index[i] for i in batch]
                   for batch in _plain_batches(len(self.train_index), t.micro_batch_size, self.cfg.seed, epoch)]
        return batches_for_process(batches, self.accelerator.process_index, self.accelerator.num_processes,
                                   t.gradient_accumulation_steps)

    # ---- the loop ----
    def train(self) -> dict:
        acc, t = self.accelerator, self.cfg.train
        resumed = self.resume()
        metrics_path = self.output_dir / "metrics.jsonl"
        bar = tqdm(total=self.total_steps, initial=self.state.step, disable=not acc.is_local_main_process,
                   desc="critic", dynamic_ncols=True)
        self.model.train()
        window, start = [], time.perf_counter()

        def micro_step(indices: list[int]) -> None:
            loss, _ = accumulate_step(acc, self.model, self.optimizer, self.scheduler, lambda: self.micro_loss(indices),
                                      t.max_grad_norm)
            window.append(float(loss.detach()))

        def after_step() -> None:
            nonlocal window, start
            polyak_update(self.target, acc.unwrap_model(self.model), self.cfg.critic.tau)
            if self.state.step % self.cfg.logging.log_every == 0 or self.state.step == self.total_steps:
                loss = acc.reduce(torch.tensor(np.mean(window), device=acc.device), reduction="mean").item()
                record = {"step": self.state.step, "epoch": self.state.epoch, "loss": round(loss, 6),
                          "lr": self.scheduler.get_last_lr()[0], "seconds": round(time.perf_counter() - start, 2)}
                if acc.is_main_process:
                    metrics_path.parent.mkdir(parents=True, exist_ok=True)
                    with open(metrics_path, "a", encoding="utf-8") as handle:
                        handle.write(json.dumps(record) + "\n")
                bar.set_postfix(loss=f"{loss:.4f}")
                window, start = [], time.perf_counter()
            if self.state.step % t.save_freq == 0:
                self.save_checkpoint()
            if self.on_step:
                self.on_step(self.state.step)

        run_epochs(acc, self.state, t.epochs, self._epoch_batches, micro_step, after_step, bar)
        diagnostics = self.diagnostics()
        final = self.save_final(diagnostics)
        out = self.write_advantages()
        return {"steps": self.state.step, "resumed_from": str(resumed) if resumed else None, "final": str(final),
                "train_file": str(out), **diagnostics}

    # ---- what the critic learnt ----
    @torch.no_grad()
    def heads(self, indices: Sequence[int]) -> tuple[torch.Tensor, ...]:
        """``(Q_1, Q_2, V_1, V_2)`` of the steps ``indices``, in evaluation mode, on the CPU."""
        model = self.accelerator.unwrap_model(self.model)
        model.eval()
        out, size = [], self.cfg.train.micro_batch_size
        for start in range(0, len(indices), size):
            out.append([h.float().cpu() for h in model(*self._texts(indices[start: start + size]))])
        model.train()
        return tuple(torch.cat(column) for column in zip(*out))

    @torch.no_grad()
    def diagnostics(self) -> dict:
        """On the held-out games: the TD error of the Q heads against the target copy's targets and
        how well Q ranks the steps of won games above those of lost ones (all pairs, and pairs at
        the same turn). Written to ``output_dir/eval.json``."""
        if not self.eval_index:
            return {}
        q1, q2, _, _ = self.heads(self.eval_index)
        size = self.cfg.train.micro_batch_size
        held_targets = [self.targets(self.eval_index[start: start + size])[0] for start in range(0, len(self.eval_index), size)]
        errors = torch.cat([q1 - torch.cat([t[0].float().cpu() for t in held_targets]),
                            q2 - torch.cat([t[1].float().cpu() for t in held_targets])])
        q = torch.minimum(q1, q2).numpy()
        won = [bool(self.steps[i].get("success", self.steps[i]["final_reward"] > 0)) for i in self.eval_index]
        turns = [self.steps[i]["turn"] for i in self.eval_index]
        result = {"eval_steps": len(self.eval_index), "eval_td_mse": round(float(errors.square().mean()), 6),
                  "eval_ranking_accuracy": _rounded(ranking_accuracy(q, won)),
                  "eval_ranking_accuracy_same_turn": _rounded(ranking_accuracy(q, won, turns))}
        if self.accelerator.is_main_process:
            atomic_write_json(self.output_dir / "eval.json", {"step": self.state.step, **result})
        return result

    def write_advantages(self) -> Path:
        """A copy of the training set, each step with ``advantage``, ``critic_q`` and ``critic_v``:
        what ``method=archer`` trains the actor on."""
        out = Path(self.cfg.out)
        if self.accelerator.is_main_process:
            q1, q2, v1, v2 = self.heads(list(range(len(self.steps))))
            a, q, v = advantages(q1, q2, v1, v2), torch.minimum(q1, q2), torch.minimum(v1, v2)
            rows = [dict(s, advantage=float(ai), critic_q=float(qi), critic_v=float(vi))
                    for s, ai, qi, vi in zip(self.steps, a.tolist(), q.tolist(), v.tolist())]
            atomic_write_json_rows(out, rows)
        self.accelerator.wait_for_everyone()
        return out

    # ---- checkpoints ----
    def _critic_state(self) -> dict:
        return {"online": self.accelerator.unwrap_model(self.model).state_dict(), "target": self.target.state_dict()}

    def save_checkpoint(self) -> Path:
        return save_step_checkpoint(self, self._save_state)

    def _save_state(self, folder: Path) -> None:
        if self.accelerator.is_main_process:
            save_state(folder / "critic.safetensors", self._critic_state())
            save_state(folder / "optimizer.safetensors", self.optimizer.state_dict())
            save_state(folder / "scheduler.safetensors", self.scheduler.state_dict())

    def resume(self) -> Path | None:
        return resume_step_trainer(self, self._load_state, "critic")

    def _load_state(self, checkpoint: Path) -> None:
        saved = load_state(checkpoint / "critic.safetensors")
        self.accelerator.unwrap_model(self.model).load_state_dict(saved["online"])
        self.target.load_state_dict(saved["target"])
        self.optimizer.load_state_dict(load_state(checkpoint / "optimizer.safetensors"))
        self.scheduler.load_state_dict(load_state(checkpoint / "scheduler.safetensors"))

    def save_final(self, diagnostics: dict) -> Path:
        """``output_dir/final/``: the critic and its target copy (``critic.safetensors``) and what
        rebuilds it (``critic.json``), whole or not at all."""
        acc, out = self.accelerator, self.output_dir / "final"
        acc.wait_for_everyone()
        if acc.is_main_process:
            c = self.cfg.critic
            with atomic_folder(out) as tmp:
                save_state(tmp / "critic.safetensors", self._critic_state())
                atomic_write_json(tmp / "critic.json", {"encoder": c.encoder, "hidden": c.hidden,
                                                        "max_tokens": c.max_tokens, "steps": self.state.step,
                                                        "train_file": str(self.train_path), **diagnostics})
                atomic_write_json(tmp / RUN_RECORD, run_record(resume_settings(self.cfg, self.micro_per_epoch),
                                                               self.data_digest))
        acc.wait_for_everyone()
        return out


def load_critic(folder: str | Path, critic: DoubleCritic) -> DoubleCritic:
    """Load a trained critic's online weights (``final/`` of a :class:`CriticTrainer` run) into
    ``critic``, which must have the same encoder and width."""
    path = Path(folder) / "critic.safetensors"
    if not path.is_file():
        raise DataError(path, None, None, "not found: expected the final/ folder of a critic run")
    critic.load_state_dict(load_state(path)["online"])
    return critic


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
