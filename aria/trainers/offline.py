"""Offline REINFORCE on the intention-aggregated training set (``docs/method.md`` §5).

One story, top to bottom: read and check the samples -> tokenise (prompt, then action) ->
micro-batches, split across processes -> for each micro-batch the per-sample action log-prob, the
loss of :data:`aria.trainers.losses.LOSSES` -> accumulate, clip, step, schedule -> log, checkpoint,
resume.

How a micro-batch is laid out (``train.packing``): ``prefix_tree`` (default) puts each game
whole in one micro-batch (:func:`aria.packing.game_ordered_batches`: ``micro_batch_size``
samples on average, each micro-batch's loss scaled to that size) and merges its samples into
prefix trees, so a game's history is computed once an epoch (:mod:`aria.packing`; the same
log-probs, loss and gradient as padded rows, to float rounding, tested); ``padded`` puts every
sample on its own right-padded row, in length-bucketed batches. A micro-batch's memory grows
with its trees' tokens (about its games' own lengths), not with the samples times the prompt.

The loss (the original's ``reinforce`` objective, paper §3.5):

    L = −(1/B) Σ_i w_i,   w_i = r_i · Σ_t log π(a_i,t | prompt_i, a_i,<t)

except that a sample whose reward is exactly ``sft_reward`` (−1 in the original, where it marks
demonstrations) gets the plain SFT term ``w_i = sft_weight · Σ_t log π`` (0.5 in the original).
No KL term and no clipping of the ratio: this is plain REINFORCE on fixed data. With
``loss.name=clipped_reinforce`` each action token's ratio to the model training starts from is
clipped instead (PPO's surrogate, :func:`aria.trainers.losses.clipped_reinforce_loss`), which keeps
negative weights (ArCHer's, GiGPO's and StarPO's advantages) from driving the fixed actions'
log-probs to −∞: those reference log-probs are computed once, before the first step, and kept in
``output_dir/reference_logprobs.safetensors`` for a resumed run.

Checkpoints (every ``save_freq`` optimizer steps, in ``output_dir/checkpoints/step-<n>/``):
``model/`` in Hugging Face format (the LoRA adapter, or the full model), ``trainable.safetensors``
(the exact trainable tensors, for resuming), ``optimizer.safetensors``, ``scheduler.safetensors``,
``rng_state_<rank>.safetensors`` (no pickle: :mod:`aria.trainers.checkpoint`) and
``trainer_state.json`` (step, epoch, position in the epoch). Under
DeepSpeed ZeRO-3 the sharded model and optimizer go through ``accelerator.save_state`` instead
(``accelerate_state/``); that path follows accelerate's documentation and is not exercised by the
CPU tests. A
checkpoint folder appears only once complete (written under a temporary name, then renamed).
Running the same command again resumes from the newest one and ends with the same weights as an
uninterrupted run.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch
from tqdm.auto import tqdm

from aria.data import read_training_set
from aria.io import ConfigError, DataError, atomic_write_json, json_digest
from aria.llm.policy import (EncodedSample, Encoding, PromptTooLong, action_logprobs, action_token_logprobs, collate_as,
                             load_model)
from aria.packing import (attention_break_even, game_ordered_batches, games_floor, nominal_scale, packing_stats,
                          sample_groups)
from aria.secrets import redact
from aria.settings import typed
from aria.trainers.checkpoint import (check_output_dir_early, latest_checkpoint, load_plain_state, load_state,
                                      resume_settings, resume_step_trainer, run_record, save_plain_state, save_state,
                                      save_step_checkpoint)
from aria.trainers.engine import (OPTIMIZERS, TrainState, accumulate_step, build_optimizer,  # noqa: F401
                                  check_lr_scheduler, check_train_settings, fit_accumulation, make_accelerator,
                                  resolve_mixed_precision, run_epochs, save_final_model)
from aria.trainers.losses import LOSSES, TOKEN_LOSSES, reinforce_loss  # noqa: F401  (re-exported)
from aria.trainers.methods import METHODS, get_method, method_weights
from aria.trainers.settings import TrainerSettings

# Imported in the functions that use them (slow to import: benchmarks/import_time.py): accelerate


# ---- data ------------------------------------------------------------------------------------------
def check_samples(samples: list[dict], path: str, empty_actions: bool = False) -> None:
    """Reject what cannot be trained on, before any training starts (file and sample index named).

    An empty reply is a step the policy played (it ended its turn at once; the game went on),
    and the pipeline keeps it. With ``empty_actions`` (the policy trainer when the end-of-turn
    token is appended, so the action is that token; the reward model, which reads the score at
    the sequence's last token) it is trained on as played; otherwise it has no token to train
    and is refused."""
    if not samples:
        raise DataError(path, None, None, "the training set is empty")
    for i, sample in enumerate(samples):
        if not empty_actions and not sample["action"].strip():
            raise DataError(path, None, f"sample {i}.action", "empty action: with data.append_eos=false it has no "
                            "token to train (append_eos=true trains the end-of-turn token the policy ended it with)")


def length_bucketed_batches(lengths: list[int], batch_size: int, seed: int, epoch: int,
                            bucket_batches: int = 50) -> list[list[int]]:
    """Micro-batches of sample indices with similar lengths (little padding), in a seeded order.

    The epoch's samples are shuffled, cut into chunks of ``bucket_batches`` batches, each chunk
    sorted by length and split into batches; the batches are then shuffled. Deterministic in
    (seed, epoch), so a resumed run sees the same batches in the same order.
    """
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    batches: list[list[int]] = []
    chunk = batch_size * max(1, bucket_batches)
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk].tolist(), key=lambda i: (-lengths[i], i))
        batches += [part[j : j + batch_size] for j in range(0, len(part), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def batches_for_process(batches: list[list[int]], rank: int, world: int, accumulation: int) -> list[list[int]]:
    """This process's micro-batches: every ``world``-th one, trimmed so all processes take the same
    number of whole optimizer steps (data-parallel processes must step together)."""
    per_process = (len(batches) // world) // accumulation * accumulation
    return batches[rank::world][:per_process]


# ---- the trainer --------------------------------------------------------------------------------------
class OfflineTrainer:
    """Offline REINFORCE; ``cfg`` is the resolved Hydra config (see ``config/default.yaml``).

    What is specific to the policy is a few attributes and methods, which the reward-model
    trainer (:mod:`aria.trainers.reward_model`) and the trajectory-DPO trainer
    (:mod:`aria.trainers.dpo`) override: :attr:`head`, :attr:`target_field`, :attr:`loss_name`,
    :meth:`select_samples` and :meth:`micro_loss`; a trainer whose unit of data is not one sample
    (DPO: a pair of games) also overrides :meth:`unit_lengths`, :meth:`make_batch` and
    :meth:`fingerprint`. :meth:`after_training` runs before the final save. The loop,
    accumulation, logging, checkpoints and resume are shared, and the step itself is the
    engine's (:mod:`aria.trainers.engine`).
    """

    #: losses by name (config ``loss.name``)
    losses: dict[str, Callable[..., torch.Tensor]] = LOSSES
    #: the model's head (:data:`aria.llm.policy.HEADS`)
    head = "causal_lm"
    #: the sample field the loss weighs by (the method's weight) or regresses on
    target_field = "weight"
    #: the trainer's own loss; None: the config's ``loss.name``
    loss_name: str | None = None
    #: the shape of its config (:mod:`aria.settings`)
    settings: type = TrainerSettings
    #: what one unit of data (an entry of a micro-batch) is called in messages
    unit = "samples"
    #: the progress bar's name
    name = "reinforce"

    def __init__(self, cfg: Mapping | TrainerSettings, on_step: Callable[[int], None] | None = None):
        from accelerate.utils import set_seed

        cfg = typed(self.settings, cfg, "trainer settings")
        check_train_settings(cfg, self.losses, self.loss_name, check_scheduler=False)
        self.cfg = cfg
        t = cfg.train
        # Data: read and check everything before the scheduler's name (its check imports peft,
        # about 5 s on 2 cores), the accelerator and the model; a bad file is one line in seconds.
        self.train_path = cfg.data.train_file
        self.file_samples = read_training_set(self.train_path)
        self.samples = self.select_samples(self.file_samples)
        check_lr_scheduler(t)

        self.output_dir = Path(cfg.output_dir)
        self.accelerator = make_accelerator(cfg, self.output_dir, cfg.logging.report_to, output_dir=self.output_dir)
        check_output_dir_early(self.output_dir, resume_settings(cfg))  # another run's final/: before the model loads
        self.on_step = on_step  # called after every optimizer step (tests use it to interrupt a run)
        set_seed(cfg.seed)

        m = cfg.model
        self.tokenizer, model = load_model(m.path, self.head, m.dtype,
                                           asdict(m.lora) if m.lora.enabled else None, m.gradient_checkpointing)
        self.encoding = Encoding.of(cfg.data).for_model(model)  # the cutoff capped at the model's context
        self.encoded: list[EncodedSample] = self.encode_all(self.samples)
        self.rewards = torch.tensor([float(s[self.target_field]) for s in self.samples])
        self.packing = t.packing
        self.break_even = attention_break_even(model)  # which micro-batches are cheaper in rows (aria.packing)
        loss_name = self.loss_name or cfg.loss.name
        self.loss_fn = self.losses[loss_name]
        self.loss_options = cfg.loss.options(loss_name)  # the section named like the loss
        self.token_loss = loss_name in TOKEN_LOSSES  # reads each action token against the start model
        self.data_digest = self._data_digest(loss_name)
        self._prepare(model)
        self._sft_marker_rules()
        self.state = TrainState()
        self.token_stats: dict[str, float] = {}  # the clipped loss's per-micro-batch diagnostics
        if self.accelerator.is_main_process:
            self._announce()

    def _data_digest(self, loss_name: str) -> str:
        """What a checkpoint was trained on: resuming on other data (or in another order, or under a
        loss with a reference) would silently mix two runs. (Whole games a micro-batch since the
        cutoff became the paper's: a checkpoint of micro-batches cut every micro_batch_size samples
        is not continued under the new ones.)"""
        fingerprint = self.fingerprint() + ([["packing", self.packing, "whole_games"]] if self.packing != "padded" else []) \
            + ([["loss", loss_name, self.loss_options]] if self.token_loss else [])
        return json_digest(fingerprint, sort_keys=False)

    def _prepare(self, model) -> None:
        """The epoch's micro-batches and optimizer steps, the optimizer and its schedule, and the
        model and optimizer handed to accelerate."""
        t = self.cfg.train
        fit_accumulation(self.accelerator, t, len(self._all_batches(0)), "train")
        world, accumulation = self.accelerator.num_processes, t.gradient_accumulation_steps
        self.micro_per_epoch = len(self._epoch_batches(0))
        self.steps_per_epoch = self.micro_per_epoch // accumulation
        if self.steps_per_epoch == 0:
            raise DataError(self.train_path, None, None, f"{len(self.unit_lengths())} {self.unit} make no full optimizer step with "
                            f"micro_batch_size={t.micro_batch_size}, accumulation={accumulation}, processes={world}")
        self.total_steps = self.steps_per_epoch * t.epochs

        optimizer, scheduler = build_optimizer(model, t, self.total_steps)
        if self._deepspeed:  # no dataloader goes through prepare(), so DeepSpeed is told the sizes here
            ds = self.accelerator.state.deepspeed_plugin.deepspeed_config
            ds["train_micro_batch_size_per_gpu"] = t.micro_batch_size
            ds["gradient_clipping"] = t.max_grad_norm or 0.0
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.scheduler = scheduler

    def _sft_marker_rules(self) -> None:
        """Where a reward of exactly ``loss.reinforce.sft_reward`` may not mark a demonstration."""
        if self.target_field == "weight" and not get_method(self.cfg.method).sft_marker \
                and "sft_reward" in self.loss_options:
            # A reward of exactly −1 marks a demonstration only in the release's ARIA files; a
            # normalised advantage (StarPO, GiGPO) can be exactly −1 and must stay an advantage.
            self.loss_options["sft_reward"] = None
        if self.loss_options.get("sft_reward") is not None and any("step_return" in s for s in self.samples):
            # Nor in a file of pipeline step 4 (its samples carry step_return): there a step whose
            # R~ is exactly -1 (a two-player role that lost all) is a reward, and must not become
            # an imitation weight with the opposite sign.
            self.loss_options["sft_reward"] = None

    def _announce(self) -> None:
        """Negative weights, and what prefix-tree packing saves on this data, said once before training."""
        if self.loss_fn is reinforce_loss:
            self.warn_negative_weights()
        if self.packing == "prefix_tree":
            stats = self.packing_stats(self._epoch_batches(0))
            print(f"[train] prefix-tree packing: {stats['row_tokens']} tokens in rows -> {stats['tree_tokens']} in trees per "
                  f"epoch on this process ({stats['saving']}x fewer" + (f"; the games' own length, each history once: "
                  f"{stats['games_floor']}" if "games_floor" in stats else "") + f"); {stats['truncated_prompts']} left-truncated prompts (a tree of their own "
                  f"each); {stats['micro_batches_in_rows']} micro-batches cheaper in rows, {stats['computed_tokens']} tokens computed")

    def warn_negative_weights(self) -> None:
        """One line when some samples would be trained with a negative weight (an SFT-marked −1
        counts as the SFT weight it becomes). On fixed actions −w·log π(a | s) with w < 0 falls
        without bound as log π(a | s) → −∞: nothing re-samples the action, so a few epochs can
        push the policy off the data altogether (the powered run's ArCHer arm did;
        docs/pipeline.md, ArCHer, "actor update")."""
        weights = self.rewards
        sft = self.loss_options.get("sft_reward")
        if sft is not None:
            weights = torch.where(weights == sft, torch.ones_like(weights), weights)
        negative = float((weights < 0).float().mean()) if len(weights) else 0.0
        if negative > 0:
            print(f"[train] warning: {negative:.0%} of the {self.unit} have a negative weight (method "
                  f"{self.cfg.method}): REINFORCE on fixed actions is unbounded below for them, so their "
                  "log-probabilities can be driven to -inf over epochs (docs/pipeline.md, ArCHer); watch the "
                  "loss and the policy's movement")

    # ---- what is specific to the model being trained ----
    def select_samples(self, samples: list[dict]) -> list[dict]:
        """The samples the method (config ``method``, :mod:`aria.trainers.methods`) trains on, each
        with its ``weight``; the weights are computed on the whole file (StarPO and GiGPO compare
        games with each other), then ``data.max_samples`` may take a seeded subset."""
        weights = self.apply_method(samples, method_weights)
        samples = [dict(s, weight=float(w)) for s, w in zip(samples, weights) if np.isfinite(w)]
        if not samples:
            raise DataError(self.train_path, None, None, f"method {self.cfg.method!r} trains on none "
                            "of the samples")
        return self.subset(samples)

    def apply_method(self, samples: list[dict], apply: Callable[[str, list[dict]], Any]) -> Any:
        """``apply(method name, samples)`` (:func:`~aria.trainers.methods.method_weights` or
        ``method_pairs``) after checking the samples; an unknown method is a config error and a
        missing field names the file."""
        check_samples(samples, self.train_path, empty_actions=self.cfg.data.append_eos)
        name = self.cfg.method
        if name not in METHODS:
            raise ConfigError(f"method: unknown {name!r} (known: {', '.join(sorted(METHODS))})")
        try:
            return apply(name, samples)
        except KeyError as error:
            raise DataError(self.train_path, None, None, error.args[0]) from None

    def subset(self, samples: list[dict]) -> list[dict]:
        """All of ``samples``, or a seeded subset of ``data.max_samples`` of them in file order."""
        limit = self.cfg.data.max_samples
        if limit and limit < len(samples):  # a seeded subset, in file order (small CPU runs)
            keep = np.sort(np.random.default_rng(self.cfg.seed).choice(len(samples), size=limit, replace=False))
            samples = [samples[i] for i in keep]
        return samples

    def encode(self, sample: dict) -> EncodedSample:
        return self.encoding.encode(self.tokenizer, sample["observation"], sample["action"])

    def encode_all(self, samples: list[dict]) -> list[EncodedSample]:
        """Every sample encoded as the policy played it, before the first step: a prompt over the
        cutoff is named with its file, its place in the file and its length (``data.over_long``),
        and the longest prompt is said in one line, beside the cutoff."""
        encoded = []
        for sample in samples:
            try:
                encoded.append(self.encode(sample))
            except PromptTooLong as too_long:
                e = self.encoding
                where = next((i for i, s in enumerate(self.file_samples) if s["observation"] == sample["observation"]
                              and s["action"] == sample["action"]), None)
                raise DataError(self.train_path, None, f"sample {where}.observation", f"{too_long}: the policy played it "
                                f"whole, so it is not cut (data.max_prompt_tokens={self.cfg.data.max_prompt_tokens}, "
                                f"the model's context {e.context}); raise data.max_prompt_tokens up to the context, or set "
                                "data.over_long=cut_left to cut it on the left as the release did") from None
        if self.accelerator.is_main_process and encoded:
            cut = sum(e.truncated for e in encoded)
            print(f"[train] prompts: the longest {max(e.prompt_len for e in encoded)} tokens, cutoff "
                  f"{self.encoding.max_prompt_tokens} ({self.encoding.over_long}" + (f": {cut} cut on the left)" if cut else ")"))
        return encoded

    def unit_lengths(self) -> list[int]:
        """Tokens of each unit of data (here a sample): batches group similar lengths."""
        return [len(e.input_ids) for e in self.encoded]

    def unit_groups(self) -> list:
        """The game of each unit of data (here a sample): packed batches keep a game's units together."""
        return sample_groups(self.samples)

    def make_batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """The tensors of the units ``indices``, on this process's device, laid out as ``train.packing`` says."""
        items = [self.encoded[i] for i in indices]
        return {k: v.to(self.accelerator.device) for k, v in collate_as(items, self.tokenizer.pad_token_id, self.packing,
                                                                          self.break_even).items()}

    def packing_stats(self, batches: list[list[int]]) -> dict:
        """Tokens in rows against tokens in trees for ``batches`` of units (:func:`aria.packing.packing_stats`),
        and the floor: the samples' games, each one tree (:func:`aria.packing.games_floor`)."""
        mine = sorted({i for b in batches for i in b})
        groups = sample_groups(self.samples)
        floor = games_floor([self.encoded[i].input_ids for i in mine], [groups[i] for i in mine])
        return {**packing_stats(self.encoded, batches, self.break_even), "games_floor": floor}

    def fingerprint(self) -> list:
        """What the data digest is taken of: a checkpoint resumes only on the same data."""
        return [[e.input_ids, e.prompt_len] for e in self.encoded] + self.rewards.tolist()

    def micro_loss(self, batch: dict[str, torch.Tensor], indices: list[int]) -> torch.Tensor:
        """The loss of one micro-batch: REINFORCE on the summed action log-probs (or, for a loss
        of :data:`~aria.trainers.losses.TOKEN_LOSSES`, on each token's against the reference)."""
        if self.token_loss:
            logp, sample = action_token_logprobs(self.model, batch)
            reference = torch.cat([self.reference[i] for i in indices]).to(logp.device)
            with torch.no_grad():  # how far from the start model, logged per step as PPO's trainers do
                log_ratio = logp.detach().float() - reference.float()
                ratio = log_ratio.exp()
                self.token_stats = {"clip_fraction": float((ratio - 1).abs().gt(self.loss_options["epsilon"]).float().mean()),
                                    "kl_start": float((ratio - 1 - log_ratio).mean())}
            return self.loss_fn(logp, self.rewards[indices].to(logp.device), reference, sample, **self.loss_options)
        logp = action_logprobs(self.model, batch)
        return self.loss_fn(logp, self.rewards[indices].to(logp.device), **self.loss_options)

    def reference_logprobs(self) -> list[torch.Tensor]:
        """Each sample's action-token log-probs under the model training starts from (the
        collecting policy, when the data is that model's own collection), [action tokens] each.

        Computed once, before the first step, in file order (a game's steps share their trees),
        split across processes, every process running as many forward passes as the others
        (ZeRO-3 gathers weights in each), and written to ``reference_logprobs.safetensors``: a
        resumed run reads them back, since the model it resumes from is no longer the start."""
        from accelerate.utils import gather_object

        acc, path = self.accelerator, self.output_dir / "reference_logprobs.safetensors"
        lengths = [e.action_len for e in self.encoded]
        if path.is_file():
            stored = load_state(path)
            if stored["data_digest"] == self.data_digest:
                return list(torch.split(stored["logp"], lengths))
        if latest_checkpoint(self.output_dir) is not None:
            raise DataError(str(path), None, None, "checkpoints in this output_dir have no reference log-probs of "
                            "their start model; remove the output_dir's checkpoints/ to start again")
        size, world = self.cfg.train.micro_batch_size, acc.num_processes
        mine = np.array_split(np.arange(len(self.encoded)), world)[acc.process_index].tolist()
        rounds = -(-((len(self.encoded) + world - 1) // world) // size)  # the most batches any process has
        found: list[tuple[int, torch.Tensor]] = []
        self.model.eval()
        with torch.no_grad():
            for r in tqdm(range(rounds), desc="reference log-probs", disable=not acc.is_local_main_process, dynamic_ncols=True):
                indices = mine[r * size:(r + 1) * size]
                logp, sample = action_token_logprobs(self.model, self.make_batch(indices or mine[:1] or [0]))
                found += [(i, logp[sample == j].float().cpu()) for j, i in enumerate(indices)]
        self.model.train()
        by_sample = dict(gather_object(found) if world > 1 else found)
        reference = [by_sample[i] for i in range(len(self.encoded))]
        if acc.is_main_process:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            save_state(tmp, {"data_digest": self.data_digest, "logp": torch.cat(reference)})
            tmp.replace(path)
        acc.wait_for_everyone()
        return reference

    def after_training(self) -> dict:
        """Runs after the last step, before the final save; its result joins :meth:`train`'s."""
        return {}

    # ---- the data order ----
    def _all_batches(self, epoch: int) -> list[list[int]]:
        """Every micro-batch of ``epoch``, before the processes split them."""
        t = self.cfg.train
        lengths = self.unit_lengths()
        if t.packing == "prefix_tree":
            return game_ordered_batches(self.unit_groups(), t.micro_batch_size, self.cfg.seed, epoch)
        if t.length_bucketing:
            return length_bucketed_batches(lengths, t.micro_batch_size, self.cfg.seed, epoch, t.bucket_batches)
        return _plain_batches(len(lengths), t.micro_batch_size, self.cfg.seed, epoch)

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        """This process's micro-batches of ``epoch``."""
        return batches_for_process(self._all_batches(epoch), self.accelerator.process_index, self.accelerator.num_processes,
                                   self.cfg.train.gradient_accumulation_steps)

    # ---- the loop ----
    def train(self) -> dict:
        acc, t, log_cfg = self.accelerator, self.cfg.train, self.cfg.logging
        if self.token_loss:  # from the start model, so before a resume replaces it
            self.reference = self.reference_logprobs()
        resumed = self.resume()
        if acc.is_main_process and log_cfg.report_to:
            acc.init_trackers(log_cfg.run_name or "aria_offline", config=_flat(redact(asdict(self.cfg))))
        metrics_path = self.output_dir / "metrics.jsonl"
        bar = tqdm(total=self.total_steps, initial=self.state.step, disable=not acc.is_local_main_process,
                   desc=self.name, dynamic_ncols=True)
        self.model.train()
        window, last = _new_window(), {}

        def epoch_batches(epoch: int) -> list[list[int]]:
            batches = self._epoch_batches(epoch)
            if log_cfg.write_data_order:  # which samples this process trains on (to check the split)
                atomic_write_json(self.output_dir / f"data_order_epoch{epoch}_rank{acc.process_index}.json", batches)
            return batches

        def micro_step(indices: list[int]) -> None:
            batch = self.make_batch(indices)
            # whole games make micro-batches of varying sizes: each counts as its share of a nominal one
            scale = nominal_scale(indices, t.micro_batch_size) if self.packing == "prefix_tree" else 1.0
            loss, grad_norm = accumulate_step(acc, self.model, self.optimizer, self.scheduler,
                                              lambda: self.micro_loss(batch, indices) * scale, t.max_grad_norm)
            if grad_norm is not None:
                window["grad_norm"] = grad_norm
            window["loss"] += float(loss.detach()) / scale  # the micro-batch's mean loss, as logged before
            window["micro"] += 1
            for key, value in self.token_stats.items():
                window[key] = window.get(key, 0.0) + value
            _count_tokens(window, batch)

        def after_step() -> None:
            nonlocal window, last
            if self.state.step % log_cfg.log_every == 0 or self.state.step == self.total_steps:
                last = self._log(window, metrics_path, bar)
                window = _new_window()
            if self.state.step % t.save_freq == 0:
                self.save_checkpoint()
            if self.on_step:
                self.on_step(self.state.step)

        run_epochs(acc, self.state, t.epochs, epoch_batches, micro_step, after_step, bar)
        extra = self.after_training()
        final = self.save_final()
        if log_cfg.report_to:
            acc.end_training()
        return {"steps": self.state.step, "resumed_from": str(resumed) if resumed else None, "final": str(final), **last, **extra}

    def _log(self, window: dict, metrics_path: Path, bar) -> dict:
        acc = self.accelerator
        seconds = time.perf_counter() - window["start"]
        tokens, cells, row_tokens = acc.reduce(torch.tensor([window["tokens"], window["cells"], window["row_tokens"]],
                                                            device=acc.device), reduction="sum").tolist()
        loss = acc.reduce(torch.tensor(window["loss"] / max(window["micro"], 1), device=acc.device), reduction="mean").item()
        record = {"step": self.state.step, "epoch": self.state.epoch, "loss": round(loss, 6),
                  "lr": self.scheduler.get_last_lr()[0], "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
                  "padded_fraction": round(1 - tokens / max(cells, 1), 4),
                  # tokens the samples' own rows hold per token computed (prefix trees share histories)
                  "sharing": round(row_tokens / max(tokens, 1), 3),
                  # the window's wall time and the threads it ended on (train.threads=auto gives way: aria/threads.py)
                  "seconds": round(seconds, 3), "threads": torch.get_num_threads()}
        if "grad_norm" in window:
            record["grad_norm"] = round(window["grad_norm"], 4)
        for key in ("clip_fraction", "kl_start"):  # the clipped loss: tokens outside the band; k3 KL from the start model
            if key in window:
                record[key] = round(acc.reduce(torch.tensor(window[key] / max(window["micro"], 1), device=acc.device),
                                               reduction="mean").item(), 6)
        if acc.is_main_process:
            metrics_path.parent.mkdir(parents=True, exist_ok=True)
            with open(metrics_path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
            if self.cfg.logging.report_to:
                acc.log({k: v for k, v in record.items() if k != "step"}, step=self.state.step)
        bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{record['tokens_per_s']:.0f}", pad=f"{record['padded_fraction']:.2f}")
        return record

    # ---- checkpoints ----
    @property
    def _deepspeed(self) -> bool:
        from accelerate.utils import DistributedType

        return self.accelerator.distributed_type == DistributedType.DEEPSPEED

    def save_checkpoint(self) -> Path:
        return save_step_checkpoint(self, self._save_state)

    def _save_state(self, folder: Path) -> None:
        acc = self.accelerator
        if self._deepspeed:
            # ZeRO-3 shards parameters and optimizer state: accelerate gathers and saves them.
            # (Written from accelerate's documentation; not exercised on the CPU test machines.)
            acc.save_state(str(folder / "accelerate_state"))
            state_dict = acc.get_state_dict(self.model)
            if acc.is_main_process:
                acc.unwrap_model(self.model).save_pretrained(folder / "model", state_dict=state_dict, safe_serialization=True)
                self.tokenizer.save_pretrained(folder / "model")
                save_state(folder / "scheduler.safetensors", self.scheduler.state_dict())
        elif acc.is_main_process:
            save_plain_state(folder, acc.unwrap_model(self.model), self.tokenizer, self.optimizer, self.scheduler)

    def resume(self) -> Path | None:
        return resume_step_trainer(self, self._load_state, "train")

    def _load_state(self, checkpoint: Path) -> None:
        if self._deepspeed:
            self.accelerator.load_state(str(checkpoint / "accelerate_state"))
            self.scheduler.load_state_dict(load_state(checkpoint / "scheduler.safetensors"))
        else:
            load_plain_state(checkpoint, self.accelerator.unwrap_model(self.model), self.optimizer, self.scheduler)

    def save_final(self) -> Path:
        acc = self.accelerator
        acc.wait_for_everyone()
        state_dict = acc.get_state_dict(self.model) if self._deepspeed else None  # every rank takes part in gathering
        return save_final_model(acc, self.model, self.tokenizer, self.output_dir / "final", self.encoding,
                                {"steps": self.state.step, "train_file": str(self.train_path), "config": asdict(self.cfg)}, state_dict,
                                run_record(resume_settings(self.cfg, self.micro_per_epoch), self.data_digest))


def _new_window() -> dict:
    return {"loss": 0.0, "tokens": 0, "cells": 0, "row_tokens": 0, "micro": 0, "start": time.perf_counter()}


def _count_tokens(window: dict, batch: dict[str, torch.Tensor]) -> None:
    """Tokens computed (the trees' nodes, or a padded batch's real tokens), cells (with padding)
    and the tokens the samples' own rows hold."""
    if "sample_tokens" in batch:  # prefix trees: every node is computed once
        window["tokens"] += int(batch["tree_tokens"])
        window["cells"] += batch["input_ids"].numel()
        window["row_tokens"] += int(batch["sample_tokens"])
    else:
        real = int(batch["attention_mask"].sum())
        window["tokens"] += real
        window["cells"] += batch["attention_mask"].numel()
        window["row_tokens"] += real


def _plain_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    order = np.random.default_rng([seed, epoch]).permutation(n).tolist()
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def _flat(cfg: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, name + "."))
        else:
            out[name] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return out
