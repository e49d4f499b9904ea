"""The pure losses and advantage estimators of every trainer, by name (``docs/method.md`` §5).

Nothing here touches a model, a file or a process group: each function maps tensors (or arrays)
of one batch to a loss (or advantages), so each is tested against values computed by hand
(``tests/test_losses.py``) and is a target of the mutation run (docs/testing.md, "Mutation testing").
The trainers look their function up by config name in one of the three registries below:

* :data:`LOSSES` — policy losses on summed action log-probs (``loss.name`` of the offline and
  online actors), and :func:`dpo_loss` on pairs of them (``traj_dpo``);
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
    reward = reward.to(logp.dtype)
    weight = reward
    if sft_reward is not None:
        weight = torch.where(reward == sft_reward, torch.full_like(reward, sft_weight), reward)
    return -(weight * logp).mean()


#: Policy losses by name (config ``loss.name``).
LOSSES: dict[str, Callable[..., torch.Tensor]] = {"reinforce": reinforce_loss}


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


# ---- online advantages (§5) -----------------------------------------------------------------------
def rm_score(scores: np.ndarray) -> np.ndarray:
    """The reward model's score itself (the paper: the score is the advantage)."""
    return scores


def rm_score_centered(scores: np.ndarray) -> np.ndarray:
    """The score minus the mean score of the iteration's steps (a batch baseline)."""
    return scores - scores.mean() if len(scores) else scores


#: Advantage estimators by name (config ``online.advantage``): scores [N] -> advantages [N].
ADVANTAGES: dict[str, Callable[[np.ndarray], np.ndarray]] = {"rm_score": rm_score, "rm_score_centered": rm_score_centered}
