"""Pointwise reward model (``docs/method.md`` §5, online ARIA): (observation, action) -> one
number, trained on the aggregated-reward training set.

The model is a transformers sequence-classification model with one output
(``AutoModelForSequenceClassification``, ``num_labels=1``; the paper used Llama-3.1-8B-Instruct
with a scalar head, the original fully fine-tuned it). A sample is encoded exactly like a policy
sample, chat-templated prompt then action (:func:`aria.llm.policy.encode_sample`), padded on the
right; the head reads the last token that is not padding.

The loss is the original's weighted MSE (:func:`weighted_mse_loss`):

    L = (1/B) Σ_i w_i (s_i − r_i)²,   w_i = 2.0 if r_i < 0.01 or r_i > 0.8,
                                        0.5 if |r_i − 0.5| ≤ 0.05,  1.0 otherwise

(the extreme targets count double, the uninformative middle counts half; every threshold is a
config option). A held-out split (``data.eval_fraction``, whole games kept together so that no
game's steps sit on both sides) gives the evaluation loss and the Pearson and Spearman
correlations of scores with targets, written to ``output_dir/eval.json`` and ``metrics.jsonl``.

Everything else (micro-batches and their layout, ``train.packing``, accumulation, clipping, schedules, LoRA or full fine-tuning,
checkpoints, exact resume, ``accelerate launch``) is the offline trainer's
(:class:`aria.trainers.offline.OfflineTrainer`), of which this is a subclass.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np
import torch

from aria.io import DataError, atomic_write_json
from aria.llm.policy import EncodedSample, cache_keyword, collate, load_model
from aria.packing import (PrefixTreePack, collate_tree, is_tree_batch, prefix_tree_packs,  # noqa: F401  (re-exported)
                          score_position, tree_scores)
from aria.trainers.losses import RM_LOSSES, mse_loss, mse_weights, weighted_mse_loss  # noqa: F401  (re-exported)
from aria.trainers.offline import OfflineTrainer, check_samples
from aria.trainers.settings import RewardModelTrainerSettings
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): scipy


# ---- data -----------------------------------------------------------------------------------------
def held_out_split(samples: Sequence[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held out): a seeded ``fraction`` of the games (by ``game_id``; a sample without one
    is its own game) goes to the held-out side, all of each game's steps together."""
    if not 0 <= fraction < 1:
        raise ValueError(f"eval_fraction must lie in [0, 1), got {fraction}")
    games = list(dict.fromkeys(s.get("game_id", f"#{i}") for i, s in enumerate(samples)))
    n_eval = int(round(fraction * len(games)))
    if fraction > 0 and n_eval == 0 and len(games) > 1:
        n_eval = 1
    held = set(np.random.default_rng(seed).permutation(len(games))[:n_eval].tolist())
    held_games = {games[i] for i in held}
    train, evaluation = [], []
    for i, s in enumerate(samples):
        (evaluation if s.get("game_id", f"#{i}") in held_games else train).append(s)
    return train, evaluation


# ---- the model ------------------------------------------------------------------------------------
def load_reward_model(model_path: str, dtype: str = "float32", lora: dict[str, Any] | None = None,
                      gradient_checkpointing: bool = False, require_head: bool = False, setting: str = "model.path",
                      head_follows: bool = False):
    """:func:`aria.llm.policy.load_model` with the one-output score head."""
    return load_model(model_path, "score", dtype, lora, gradient_checkpointing, require_head, setting, head_follows)


def reward_scores(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's score of every sample in a right-padded batch, or in a prefix tree
    (:func:`aria.packing.collate_tree`, the same scores up to float rounding): shape [B], float32."""
    if is_tree_batch(batch):
        return tree_scores(model, batch)
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0].float()


# ---- scoring many steps of the same games in one pass ---------------------------------------------
def can_score_prefix_trees(model) -> bool:
    """Whether the model has what :func:`score_prefix_trees` drives: a backbone taking a 4D mask,
    position ids and a KV cache (``base_model``) and a score head named ``score`` (transformers'
    decoders)."""
    return hasattr(model, "score") and getattr(model, "base_model", model) is not model


@torch.inference_mode()
def score_prefix_trees(model, encoded: Sequence[EncodedSample], max_tokens: int = 2048,
                       device: torch.device | str = "cpu", pad_id: int | None = None) -> np.ndarray:
    """Scores of encoded samples, in order, with shared prefixes computed once
    (:func:`prefix_tree_packs`): the same scores as :func:`score_encoded` up to float summation
    order (tested), in far fewer token positions when samples are the steps of the same games.

    Per pack, two passes: the trunk as a plain causal sequence (no mask, so attention skips what
    lies ahead), then the branch nodes against the trunk's KV cache with the pack's mask, so only
    the branch rows pay for a dense mask. The head reads each sample where a padded row is read
    (:func:`aria.packing.score_position` with ``pad_id``; None: the last token)."""
    was_training = model.training
    model.eval()
    dtype = next(model.parameters()).dtype
    backbone = model.base_model
    out = np.zeros(len(encoded), dtype=np.float64)
    for pack in prefix_tree_packs([e.input_ids for e in encoded], max_tokens):
        ids, t = torch.from_numpy(pack.input_ids).to(device)[None], pack.trunk
        trunk = backbone(input_ids=ids[:, :t], use_cache=True)
        hidden = trunk.last_hidden_state
        if len(pack.input_ids) > t:
            mask = torch.zeros((len(pack.input_ids) - t, len(pack.input_ids)), dtype=dtype)
            mask.masked_fill_(~torch.from_numpy(pack.attends[t:]), torch.finfo(dtype).min)
            branches = backbone(input_ids=ids[:, t:], position_ids=torch.from_numpy(pack.positions[t:]).to(device)[None],
                                attention_mask=mask[None, None].to(device), use_cache=True,
                                **{cache_keyword(backbone): trunk.past_key_values})
            hidden = torch.cat([hidden, branches.last_hidden_state], dim=1)
        nodes = [path[score_position(encoded[i].input_ids, pad_id)] for i, path in zip(pack.samples.tolist(), pack.paths)]
        out[pack.samples] = model.score(hidden[0, torch.tensor(nodes, device=device)])[:, 0].float().cpu().numpy()
    model.train(was_training)
    return out


@torch.inference_mode()
def score_encoded(model, encoded: Sequence[EncodedSample], pad_id: int, batch_size: int = 16,
                  device: torch.device | str = "cpu", packing: str = "padded") -> np.ndarray:
    """Scores of encoded samples, in order, ``batch_size`` at a time (no gradients): in padded
    rows of similar length, or with ``packing="prefix_tree"`` in prefix trees
    (:func:`aria.packing.collate_tree`; samples sorted by their tokens, so a game's steps meet),
    which give the same scores up to float rounding for any model :func:`reward_scores` drives
    (a training model under peft or DDP included)."""
    trees = packing == "prefix_tree"
    was_training = model.training
    model.eval()
    order = sorted(range(len(encoded)), key=(lambda i: encoded[i].input_ids) if trees else (lambda i: len(encoded[i].input_ids)))
    out = np.zeros(len(encoded), dtype=np.float64)
    for start in range(0, len(order), batch_size):
        chunk = [encoded[i] for i in order[start : start + batch_size]]
        batch = collate_tree(chunk, pad_id) if trees else collate(chunk, pad_id)
        out[order[start : start + batch_size]] = reward_scores(model, {k: v.to(device) for k, v in batch.items()}).cpu().numpy()
    model.train(was_training)
    return out


def correlations(score: Sequence[float], target: Sequence[float]) -> dict[str, float | None]:
    """Pearson and Spearman correlation of scores with targets (None where undefined: constant input)."""
    from scipy.stats import pearsonr, spearmanr

    score, target = np.asarray(score, dtype=float), np.asarray(target, dtype=float)
    if len(score) < 2 or np.ptp(score) == 0 or np.ptp(target) == 0:
        return {"pearson": None, "spearman": None}
    return {"pearson": float(pearsonr(score, target)[0]), "spearman": float(spearmanr(score, target)[0])}


# ---- the trainer -----------------------------------------------------------------------------------
class RewardModelTrainer(OfflineTrainer):
    """Weighted-MSE regression of (observation, action) on the aggregated reward (module doc);
    ``cfg`` is the resolved Hydra config (``config/reward_model.yaml``)."""

    losses = RM_LOSSES
    settings = RewardModelTrainerSettings
    name = "reward model"

    head = "score"
    target_field = "reward"

    def select_samples(self, samples: list[dict]) -> list[dict]:
        """The steps with an aggregated reward (kept by the aggregation), less a held-out split."""
        check_samples(samples, self.train_path, empty_actions=True)
        samples = [s for s in samples if s["reward"] is not None]
        if not samples:
            raise DataError(self.train_path, None, None, "no sample has an aggregated reward (none was kept)")
        d = self.cfg.data
        train, self.eval_samples = held_out_split(samples, d.eval_fraction, self.cfg.seed)
        if not train:
            raise DataError(self.train_path, None, None, "no samples left for training after the held-out split")
        return self.subset(train)

    def encode_all(self, samples: list[dict]) -> list:
        """The training samples and the held-out ones, encoded before the first step (an over-long
        held-out prompt is named now, not after the last step)."""
        encoded = super().encode_all(samples + self.eval_samples)
        self.eval_encoded = encoded[len(samples):]
        return encoded[:len(samples)]

    def micro_loss(self, batch: dict[str, torch.Tensor], indices: list[int]) -> torch.Tensor:
        score = reward_scores(self.model, batch)
        return self.loss_fn(score, self.rewards[indices].to(score.device), **self.loss_options)

    def evaluate(self) -> dict:
        """Loss and correlations on the held-out split (every process scores it; rank 0 writes)."""
        if not self.eval_samples:
            return {}
        encoded = self.eval_encoded
        target = np.array([float(s["reward"]) for s in self.eval_samples])
        score = score_encoded(self.model, encoded, self.tokenizer.pad_token_id, self.cfg.train.micro_batch_size,
                              self.accelerator.device, packing=self.packing)
        loss = float(self.loss_fn(torch.tensor(score), torch.tensor(target), **self.loss_options))
        result = {"eval_samples": len(target), "eval_loss": round(loss, 6),
                  **{f"eval_{k}": (None if v is None else round(v, 4)) for k, v in correlations(score, target).items()}}
        if self.accelerator.is_main_process:
            atomic_write_json(self.output_dir / "eval.json", {"step": self.state.step, **result})
            with open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"step": self.state.step, **result}) + "\n")
        return result

    def after_training(self) -> dict:
        return self.evaluate()
