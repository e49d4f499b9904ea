"""The pure losses and advantage estimators of every trainer, by name (``docs/method.md`` §5).

Nothing here touches a model, a file or a process group: each function maps tensors (or arrays)
of one batch to a loss (or advantages), so each is tested against values computed by hand
(``tests/test_losses.py``) and is a target of the mutation run (docs/testing.md, "Mutation testing").
The trainers look their function up by config name in one of the three registries below:

* :data:`LOSSES` — policy losses on action log-probs (``loss.name`` of the offline and online
  actors; those in :data:`TOKEN_LOSSES` read each action token against the collecting policy),
  and :func:`dpo_loss` on pairs of summed log-probs (``traj_dpo``);
* :data:`RM_LOSSES` — reward-model losses on scores (``loss.name`` of the reward model);
* :data:`ADVANTAGES` — online advantages from reward-model scores (``online.advantage``).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch


# ---- policy losses (offline and online actors; §5) ------------------------------------------------
def reinforce_loss(logp: torch.Tensor, reward: torch.Tensor, sft_reward: float | None = -1.0,
                   sft_weight: float = 0.5) -> torch.Tensor:
    """−mean_i(r_i · logp_i), with the SFT term ``sft_weight · logp_i`` where ``r_i == sft_reward``.

    ``logp`` [B]: summed action log-probs; ``reward`` [B]. ``sft_reward=None`` turns the SFT
    branch off (every sample is weighted by its reward).
    """
    return -(_weights(reward.to(logp.dtype), sft_reward, sft_weight) * logp).mean()


def _weights(reward: torch.Tensor, sft_reward: float | None, sft_weight: float) -> torch.Tensor:
    if sft_reward is None:
        return reward
    return torch.where(reward == sft_reward, torch.full_like(reward, sft_weight), reward)


def clipped_reinforce_loss(logp: torch.Tensor, reward: torch.Tensor, reference: torch.Tensor, sample: torch.Tensor,
                           epsilon: float = 0.2, kl_coef: float = 0.0, sft_reward: float | None = -1.0,
                           sft_weight: float = 0.5) -> torch.Tensor:
    """REINFORCE on fixed actions, bounded: PPO's clipped surrogate (Schulman et al. 2017) with the
    collecting policy as the old policy, per action token, summed over a sample's tokens:

        L = −(1/B) Σ_i Σ_t [min(ρ_it · w_i, clip(ρ_it, 1 − ε, 1 + ε) · w_i) − β · (ρ_it − 1 − log ρ_it)],
        ρ_it = exp(logp_it − reference_it)

    ``logp`` and ``reference`` [M]: the log-prob of each action token of the micro-batch under the
    policy being trained and under the policy that collected the data; ``sample`` [M]: which of the B
    samples each token belongs to (0 .. B−1); ``reward`` [B]: the weights, with ``sft_reward`` /
    ``sft_weight`` as in :func:`reinforce_loss`.

    Why: on fixed utterances −w·log π(a | s) with w < 0 falls without bound as log π(a | s) → −∞
    (nothing re-samples a), which is how the powered run's ArCHer arm collapsed. Here a token whose
    ratio has left [1 − ε, 1 + ε] in the direction its weight pushes gives no gradient, so each token
    moves at most log(1 ± ε) from the collecting policy by its own sample's push. That alone does
    not bound the policy: the other samples' pushes move the same weights (and Adam takes
    full-size steps on whatever gradient is left), and nothing pulls a clipped token back. The
    second term, ``kl_coef`` β times the k3 estimate of KL(collecting ‖ policy) on the collected
    tokens (unbiased because they were sampled from the collecting policy; GRPO's penalty,
    Shao et al. 2024), does: its gradient (ρ − 1)·∇logp pulls every token toward the collecting
    policy, the harder the further it went. At ρ = 1 (the first step from the collecting policy)
    both are exactly :func:`reinforce_loss`'s gradient: Σ_t ∇ρ_it = Σ_t ∇logp_it, and the penalty's is 0.
    """
    weight = _weights(reward.to(logp.dtype), sft_reward, sft_weight)[sample]
    ratio = torch.exp(logp - reference.to(logp.dtype))
    surrogate = torch.minimum(ratio * weight, ratio.clamp(1 - epsilon, 1 + epsilon) * weight)
    if kl_coef:
        surrogate = surrogate - kl_coef * (ratio - 1 - (logp - reference.to(logp.dtype)))
    per_sample = torch.zeros(len(reward), dtype=logp.dtype, device=logp.device).index_add(0, sample, surrogate)
    return -per_sample.mean()


#: Policy losses by name (config ``loss.name``).
LOSSES: dict[str, Callable[..., torch.Tensor]] = {"reinforce": reinforce_loss, "clipped_reinforce": clipped_reinforce_loss}
#: Losses that take per-token log-probs (``logp``, ``sample``) and the collecting policy's log-prob of
#: each token (``reference``, computed once before training by the offline trainer), not summed ones.
TOKEN_LOSSES = frozenset({"clipped_reinforce"})


def dpo_loss(chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor,
             beta: float = 0.1) -> torch.Tensor:
    """The DPO loss (Rafailov et al. 2023), TRL's ``sigmoid`` loss type: mean over pairs of
    −log σ(β·Δ), Δ = (log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l)).

    All four arguments are [P] summed log-probs of the chosen (won) and rejected (lost)
    trajectories under the policy and the reference. β = 0.1 is TRL's default. This is the line
    of TRL's ``DPOTrainer._compute_loss`` (sigmoid branch, reverse-KL scores); the trainer around
    it does not fit here (its completion mask covers every completion token, with no mask for
    the agent's own turns in a multi-turn game), so the log-probs come from our trainer.
    """
    delta = (chosen - ref_chosen) - (rejected - ref_rejected)
    return -torch.nn.functional.logsigmoid(beta * delta).mean()


# ---- reward-model losses (online ARIA's reward model; §5) -----------------------------------------
def mse_weights(target: torch.Tensor, extreme_weight: float = 2.0, low: float = 0.01, high: float = 0.8,
                middle_weight: float = 0.5, middle: float = 0.5, middle_halfwidth: float = 0.05) -> torch.Tensor:
    """Per-sample weights of the original's weighted MSE (module doc); extremes win over the middle."""
    w = torch.ones_like(target)
    w = torch.where((target - middle).abs() <= middle_halfwidth, torch.full_like(target, middle_weight), w)
    return torch.where((target < low) | (target > high), torch.full_like(target, extreme_weight), w)


def weighted_mse_loss(score: torch.Tensor, target: torch.Tensor, **weights: float) -> torch.Tensor:
    """mean_i w_i (s_i − r_i)²; ``score`` and ``target`` are [B]; ``weights`` go to :func:`mse_weights`."""
    target = target.to(score.dtype)
    return (mse_weights(target, **weights) * (score - target) ** 2).mean()


def mse_loss(score: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((score - target.to(score.dtype)) ** 2).mean()


#: Reward-model losses by name (config ``loss.name``).
RM_LOSSES: dict[str, Callable[..., torch.Tensor]] = {"weighted_mse": weighted_mse_loss, "mse": mse_loss}


def _weighted_mse_problem(options: dict) -> str | None:
    for key in ("low", "high", "middle"):
        if options.get(key) is not None and not np.isfinite(options[key]):
            return f"{key} is {options[key]}: expected a finite number"
    # low > high would weigh every target as an extreme: the loss is the plain MSE doubled, silently
    if options.get("low") is not None and options.get("high") is not None and options["low"] > options["high"]:
        return f"low ({options['low']}) is above high ({options['high']}): the extremes are below low and above high"
    return None


#: What a loss's own options (the config section named like the loss) must also satisfy, beyond
#: the ranges of their types: the problem in words, or None.
LOSS_OPTION_CHECKS: dict[str, Callable[[dict], str | None]] = {"weighted_mse": _weighted_mse_problem}


# ---- online advantages (§5) -----------------------------------------------------------------------
def rm_score(scores: np.ndarray) -> np.ndarray:
    """The reward model's score itself (the paper: the score is the advantage)."""
    return scores


def rm_score_centered(scores: np.ndarray) -> np.ndarray:
    """The score minus the mean score of the iteration's steps (a batch baseline)."""
    return scores - scores.mean() if len(scores) else scores


#: Advantage estimators by name (config ``online.advantage``): scores [N] -> advantages [N].
ADVANTAGES: dict[str, Callable[[np.ndarray], np.ndarray]] = {"rm_score": rm_score, "rm_score_centered": rm_score_centered}
