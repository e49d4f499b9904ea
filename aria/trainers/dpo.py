"""Trajectory-wise DPO (``method=traj_dpo``): the paper's DPO baseline (Tables 1–2), as in ETO.

One story, on the offline trainer's loop (:class:`aria.trainers.offline.OfflineTrainer`), which
owns the data order, accumulation, logging, checkpoints and resume; only the data and the loss
are this module's:

* **Data.** :func:`aria.trainers.methods.traj_dpo` pairs a won (chosen) and a lost (rejected)
  game with the same target. One unit of data is one pair; ``train.micro_batch_size`` counts
  pairs and ``data.max_samples`` takes a seeded subset of pairs.
* **Log-probs on the agent's tokens only.** A trajectory's log-prob is
  log π(τ) = Σ_t Σ_{tokens of a_t} log π(token | h_t, a_t,<token): the sum over the agent's
  turns of its action tokens given the history the agent saw at that turn (the step's
  ``observation``). The game's answers, the opponent's turns and the prompts are never scored:
  that is the multi-turn mask, exact because every turn is played from its rendered history.
* **Reference.** π_ref is the model before training: with LoRA the same model with the adapter
  disabled (the base), in full fine-tuning the initial weights. Its log-probs are computed once,
  before the first step (TRL's ``precompute_ref_log_probs``), by every process on all pairs, so a
  resumed run uses the same reference.
* **Loss.** :func:`aria.trainers.losses.dpo_loss` with ``loss.dpo.beta`` (TRL's sigmoid loss).

Memory: a micro-batch holds every step of both games of its pairs in one forward pass (a
20-turn game pair is 40 rows; with ``train.packing: prefix_tree`` one tree, each game's history
computed once), so long games want ``train.micro_batch_size=1`` and, padded, gradient checkpointing.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from aria.io import DataError
from aria.llm.policy import action_logprobs, collate_as
from aria.packing import packing_stats
from aria.trainers.losses import dpo_loss
from aria.trainers.methods import method_pairs
from aria.trainers.offline import OfflineTrainer


class TrajectoryDPOTrainer(OfflineTrainer):
    losses = {"dpo": dpo_loss}
    loss_name = "dpo"
    unit = "pairs"
    name = "trajectory dpo"

    def __init__(self, cfg, on_step=None):
        super().__init__(cfg, on_step)
        self.reference = self.reference_logprobs()  # [n_trajectories]

    # ---- data: pairs of trajectories ----
    def select_samples(self, samples: list[dict]) -> list[dict]:
        """The steps of the paired games, each with ``weight`` +1 (chosen) or −1 (rejected);
        sets :attr:`trajectories` (step indices into the kept samples) and :attr:`pairs`
        (chosen, rejected) trajectory indices."""
        pairs = self.apply_method(samples, method_pairs)
        if not pairs:
            raise DataError(self.train_path, None, None, f"method {self.cfg.method!r} finds no pair of a won and a "
                            "lost game with the same target")
        pairs = self.subset(pairs)
        trajectories = list(dict.fromkeys(t for pair in pairs for t in pair))
        used = sorted({i for t in trajectories for i in t})
        renumber = {old: new for new, old in enumerate(used)}
        self.trajectories = [[renumber[i] for i in t] for t in trajectories]
        index = {t: k for k, t in enumerate(trajectories)}
        self.pairs = torch.tensor([[index[c], index[r]] for c, r in pairs], dtype=torch.long)  # [P, 2]
        chosen = {i for c, _ in pairs for i in c}
        return [dict(samples[i], weight=1.0 if i in chosen else -1.0) for i in used]

    def unit_lengths(self) -> list[int]:
        tokens = [sum(len(self.encoded[i].input_ids) for i in t) for t in self.trajectories]
        return [tokens[c] + tokens[r] for c, r in self.pairs.tolist()]

    def fingerprint(self) -> list:
        return super().fingerprint() + [self.trajectories, self.pairs.tolist()]

    def unit_groups(self) -> list:
        """Every pair is its own unit: a packed micro-batch holds whole pairs, each one's steps in one tree."""
        return list(range(len(self.pairs)))

    def _rows(self, indices: list[int]) -> list[tuple[int, int]]:
        """(trajectory slot, step) of every row of pairs ``indices``: the chosen trajectories first."""
        order = self.pairs[indices].T.reshape(-1).tolist()  # chosen of every pair, then rejected
        return [(slot, step) for slot, t in enumerate(order) for step in self.trajectories[t]]

    def make_batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """Every step of the chosen trajectories of pairs ``indices``, then of the rejected ones;
        ``trajectory`` [rows] says which of the 2·P trajectories (chosen first) a row belongs to."""
        rows = self._rows(indices)
        batch = collate_as([self.encoded[step] for _, step in rows], self.tokenizer.pad_token_id, self.packing,
                           self.break_even)
        batch["trajectory"] = torch.tensor([slot for slot, _ in rows])
        return {k: v.to(self.accelerator.device) for k, v in batch.items()}

    def packing_stats(self, batches: list[list[int]]) -> dict:
        return packing_stats(self.encoded, [[step for _, step in self._rows(b)] for b in batches], self.break_even)

    # ---- the loss ----
    def trajectory_logprobs(self, batch: dict[str, torch.Tensor], n: int) -> torch.Tensor:
        """Σ of the action log-probs of each trajectory's rows: [n]."""
        logp = action_logprobs(self.model, batch)
        return torch.zeros(n, dtype=logp.dtype, device=logp.device).index_add(0, batch["trajectory"], logp)

    def micro_loss(self, batch: dict[str, torch.Tensor], indices: list[int]) -> torch.Tensor:
        chosen, rejected = self.trajectory_logprobs(batch, 2 * len(indices)).chunk(2)
        reference = self.reference.to(chosen.device)[self.pairs[indices]]  # [P, 2]
        return self.loss_fn(chosen, rejected, reference[:, 0], reference[:, 1], **self.loss_options)

    # ---- the reference, and the trained policy's view of the pairs ----
    def pair_logprobs(self) -> torch.Tensor:
        """Summed log-probs of every pair's (chosen, rejected) trajectories, [P, 2], no gradients,
        in ``train.micro_batch_size`` pairs per forward pass, the model in eval mode."""
        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()
        per_pair = self.cfg.train.micro_batch_size
        out = []
        with torch.no_grad():
            for start in range(0, len(self.pairs), per_pair):
                indices = list(range(start, min(start + per_pair, len(self.pairs))))
                chosen, rejected = self.trajectory_logprobs(self.make_batch(indices), 2 * len(indices)).double().cpu().chunk(2)
                out.append(torch.stack([chosen, rejected], dim=1))
        model.train(was_training)
        return torch.cat(out)

    def reference_logprobs(self) -> torch.Tensor:
        """log π_ref of every trajectory, [n_trajectories]: the model as loaded, the adapter off."""
        model = self.accelerator.unwrap_model(self.model)
        disabled = model.disable_adapter() if hasattr(model, "disable_adapter") else nullcontext()
        with disabled:
            by_pair = self.pair_logprobs()
        reference = torch.zeros(len(self.trajectories), dtype=torch.float64)
        reference[self.pairs.reshape(-1)] = by_pair.reshape(-1)  # a trajectory in two pairs: the same value
        return reference.to(torch.float32)

    def after_training(self) -> dict:
        """The share of pairs whose chosen game the trained policy prefers over the reference's
        margin (DPO's reward accuracy), on all pairs."""
        policy = self.pair_logprobs().float()
        reference = self.reference[self.pairs]
        margins = (policy[:, 0] - reference[:, 0]) - (policy[:, 1] - reference[:, 1])
        return {"pairs": len(self.pairs), "reward_accuracy": float((margins > 0).double().mean())}
