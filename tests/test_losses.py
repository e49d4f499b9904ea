"""The pure losses and advantages of ``aria/trainers/losses.py``, against values computed by hand."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from aria.trainers.losses import (ADVANTAGES, LOSSES, RM_LOSSES, dpo_loss, mse_loss, mse_weights, reinforce_loss,
                                  weighted_mse_loss)


def test_loss_by_hand():
    logp = torch.tensor([-2.0, -3.0, -1.0, -4.0])
    reward = torch.tensor([0.5, -1.0, 0.0, -0.25])
    # weights: 0.5, SFT 0.5 (reward exactly −1), 0, −0.25 -> −mean(−1, −1.5, 0, 1)
    assert reinforce_loss(logp, reward).item() == pytest.approx(-(-1 - 1.5 + 0 + 1) / 4)
    assert reinforce_loss(logp, reward, sft_reward=None).item() == pytest.approx(-(-1 + 3 + 0 + 1) / 4)
    assert reinforce_loss(logp, reward, sft_weight=1.0).item() == pytest.approx(-(-1 - 3 + 0 + 1) / 4)


def test_dpo_loss_by_hand():
    import math

    # Pair 1: Δ = (−1 − −2) − (−3 − −2) = 2; pair 2: a tie, Δ = 0.  β = 0.5.
    chosen = torch.tensor([-1.0, -5.0], requires_grad=True)
    rejected = torch.tensor([-3.0, -4.0], requires_grad=True)
    ref_chosen, ref_rejected = torch.tensor([-2.0, -5.0]), torch.tensor([-2.0, -4.0])
    loss = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.5)
    # −log σ(1) = log(1 + e^−1) = 0.313262; a tie gives log 2 = 0.693147
    assert loss.item() == pytest.approx((math.log1p(math.exp(-1)) + math.log(2)) / 2)
    loss.backward()
    # ∂/∂chosen_i = −β·σ(−βΔ_i)/P: −.5·.268941/2 and −.5·.5/2; rejected: the opposite
    assert chosen.grad.tolist() == pytest.approx([-0.5 * 0.2689414 / 2, -0.125])
    assert rejected.grad.tolist() == pytest.approx([0.5 * 0.2689414 / 2, 0.125])
    # β defaults to TRL's 0.1; the reference matters only through the margins
    assert dpo_loss(chosen, rejected, ref_chosen, ref_rejected).item() == pytest.approx(
        (math.log1p(math.exp(-0.2)) + math.log(2)) / 2)


def test_weighted_mse_by_hand():
    target = torch.tensor([0.0, 0.5, 0.9, 0.3, 0.53, 0.8, 0.01])
    score = torch.tensor([0.2, 0.4, 0.9, 0.1, 0.5, 0.6, 0.11])
    # weights: <0.01 -> 2, middle -> 0.5, >0.8 -> 2, 1, middle -> 0.5, 0.8 is not above 0.8 -> 1, 0.01 is not below -> 1
    assert mse_weights(target).tolist() == [2.0, 0.5, 2.0, 1.0, 0.5, 1.0, 1.0]
    squared = [0.04, 0.01, 0.0, 0.04, 0.0009, 0.04, 0.01]
    expected = (2 * 0.04 + 0.5 * 0.01 + 0 + 0.04 + 0.5 * 0.0009 + 0.04 + 0.01) / 7  # 0.025064...
    assert weighted_mse_loss(score, target).item() == pytest.approx(expected)
    assert mse_loss(score, target).item() == pytest.approx(sum(squared) / 7)
    # thresholds are options
    assert mse_weights(target, extreme_weight=3.0, high=0.85, middle_halfwidth=0.0).tolist() == [3.0, 0.5, 3.0, 1, 1, 1, 1]


def test_advantages_by_hand():
    scores = np.array([0.2, 0.6, 1.0])
    assert ADVANTAGES["rm_score"](scores).tolist() == [0.2, 0.6, 1.0]
    assert ADVANTAGES["rm_score_centered"](scores) == pytest.approx([-0.4, 0.0, 0.4])
    assert ADVANTAGES["rm_score_centered"](np.zeros(0)).shape == (0,)


def test_registries_name_their_functions():
    assert LOSSES == {"reinforce": reinforce_loss}
    assert RM_LOSSES == {"weighted_mse": weighted_mse_loss, "mse": mse_loss}
    assert sorted(ADVANTAGES) == ["rm_score", "rm_score_centered"]


def test_the_reinforce_gradient_is_minus_the_reward_over_the_batch():
    """d L / d logp_i = −w_i / B: a positive reward pushes its log-prob up, a negative one down."""
    logp = torch.tensor([-2.0, -3.0, -1.0], requires_grad=True)
    reinforce_loss(logp, torch.tensor([0.6, -0.3, -1.0])).backward()
    assert logp.grad.tolist() == pytest.approx([-0.2, 0.1, -0.5 / 3])


def test_losses_keep_the_dtype_of_what_they_differentiate():
    """Under mixed precision log-probs and scores arrive in bf16 while rewards are float32: the
    loss is computed in the dtype of the differentiated tensor, not promoted by the target's."""
    logp, score = torch.tensor([-1.0, -2.0], dtype=torch.bfloat16), torch.tensor([0.5, 0.25], dtype=torch.bfloat16)
    reward = torch.tensor([0.5, 1.0], dtype=torch.float64)
    assert reinforce_loss(logp, reward).dtype == torch.bfloat16
    assert weighted_mse_loss(score, reward).dtype == torch.bfloat16
    assert mse_loss(score, reward).dtype == torch.bfloat16


def test_weighted_mse_passes_its_thresholds_on():
    target, score = torch.tensor([0.9, 0.3]), torch.tensor([0.7, 0.2])
    # weights 2 and 1 by default; extreme_weight=4 -> 4 and 1
    assert weighted_mse_loss(score, target).item() == pytest.approx((2 * 0.04 + 0.01) / 2)
    assert weighted_mse_loss(score, target, extreme_weight=4.0).item() == pytest.approx((4 * 0.04 + 0.01) / 2)
