"""The pure losses and advantages of ``aria/trainers/losses.py``, against values computed by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from aria.trainers.losses import (ADVANTAGES, LOSSES, RM_LOSSES, TOKEN_LOSSES, clipped_reinforce_loss, dpo_loss,
                                  mse_loss, mse_weights, reinforce_loss, weighted_mse_loss)


def test_loss_by_hand():
    logp = torch.tensor([-2.0, -3.0, -1.0, -4.0])
    reward = torch.tensor([0.5, -1.0, 0.0, -0.25])
    # weights: 0.5, SFT 0.5 (reward exactly −1), 0, −0.25 -> −mean(−1, −1.5, 0, 1)
    assert reinforce_loss(logp, reward).item() == pytest.approx(-(-1 - 1.5 + 0 + 1) / 4)
    assert reinforce_loss(logp, reward, sft_reward=None).item() == pytest.approx(-(-1 + 3 + 0 + 1) / 4)
    assert reinforce_loss(logp, reward, sft_weight=1.0).item() == pytest.approx(-(-1 - 3 + 0 + 1) / 4)


def test_clipped_loss_by_hand():
    """Sample 0 (weight 0.5) has two tokens, sample 1 (weight −1) one; ε = 0.2.
    Ratios: e^0 = 1, e^0.5 = 1.64872 (above 1 + ε: its positive weight is clipped at 1.2),
    e^−0.3 = 0.740818 (below 1 − ε: a negative weight is clipped at 0.8).
    Sample 0: 0.5 + min(0.82436, 0.6) = 1.1; sample 1: min(−0.740818, −0.8) = −0.8; L = −(1.1 − 0.8)/2."""
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    reference, sample = torch.tensor([-1.0, -2.5, -0.2]), torch.tensor([0, 0, 1])
    reward = torch.tensor([0.5, -1.0])
    loss = clipped_reinforce_loss(logp, reward, reference, sample, sft_reward=None)
    assert loss.item() == pytest.approx(-0.15)
    loss.backward()
    # d/dlogp of ρ·w is ρ·w where unclipped: only token 0 (ρ = 1) has a gradient, −0.5/2
    assert logp.grad.tolist() == pytest.approx([-0.25, 0.0, 0.0])

    # −1 is the SFT marker by default: weight 0.5, and ρ = 0.740818 is unclipped for a positive
    # weight (min(0.370409, 0.4)): its gradient pulls the token back up
    logp.grad = None
    loss = clipped_reinforce_loss(logp, reward, reference, sample)
    assert loss.item() == pytest.approx(-(1.1 + 0.5 * 0.7408182) / 2)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-0.25, 0.0, -0.5 * 0.7408182 / 2])
    # The KL penalty, β = 0.5: β·(ρ − 1 − log ρ) is 0, 0.5·0.148721 and 0.5·0.040818 on the three
    # tokens; its gradient −β·(ρ − 1)/B pulls tokens 1 and 2 back toward the collecting policy
    logp.grad = None
    loss = clipped_reinforce_loss(logp, reward, reference, sample, kl_coef=0.5, sft_reward=None)
    assert loss.item() == pytest.approx(-((1.1 - 0.5 * 0.1487213) + (-0.8 - 0.5 * 0.0408182)) / 2)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([-0.25, 0.5 * 0.6487213 / 2, 0.5 * (0.7408182 - 1) / 2])
    # ε is an option: with ε = 0.7 nothing here is clipped
    unclipped = clipped_reinforce_loss(logp, reward, reference, sample, epsilon=0.7, sft_reward=None)
    assert unclipped.item() == pytest.approx(-(0.5 + 0.5 * 1.6487213 - 0.7408182) / 2)


def test_clipped_loss_starts_as_reinforce():
    """At the collecting policy (ρ = 1) the clipped loss has REINFORCE's gradient, token by token
    (the KL penalty's gradient is 0 there)."""
    torch.manual_seed(0)
    logp = (-torch.rand(7) * 3).requires_grad_()
    sample = torch.tensor([0, 0, 0, 1, 2, 2, 3])
    reward = torch.tensor([0.7, -0.4, -1.0, 0.1])
    clipped_reinforce_loss(logp, reward, logp.detach().clone(), sample, kl_coef=0.04).backward()
    via_tokens = logp.grad.clone()
    logp.grad = None
    summed = torch.zeros(4).index_add(0, sample, logp)
    reinforce_loss(summed, reward).backward()
    torch.testing.assert_close(via_tokens, logp.grad)


def test_a_negative_weight_stops_at_one_minus_epsilon():
    """The bound the clipped loss exists for: gradient steps on a fixed action with weight −1 drive
    REINFORCE's log-prob without limit, and stop the clipped loss's once the ratio is under 1 − ε
    (plain SGD, so no momentum carries a step past the point where the gradient vanished)."""
    def train(loss_name: str) -> torch.Tensor:
        logits = torch.zeros(3, 5, requires_grad=True)  # three independent tokens over a vocabulary of 5
        action, sample, reward = torch.tensor([1, 3, 0]), torch.zeros(3, dtype=torch.long), torch.tensor([-1.0])
        reference = torch.log_softmax(logits, -1).detach()[torch.arange(3), action]
        optimizer = torch.optim.SGD([logits], lr=0.1)
        for _ in range(300):
            logp = torch.log_softmax(logits, -1)[torch.arange(3), action]
            if loss_name == "clipped_reinforce":
                loss = clipped_reinforce_loss(logp, reward, reference, sample, sft_reward=None)
            else:
                loss = reinforce_loss(logp.sum().unsqueeze(0), reward, sft_reward=None)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return (torch.log_softmax(logits, -1)[torch.arange(3), action] - reference).detach()

    assert (train("reinforce") < -5).all()  # and still falling
    moved = train("clipped_reinforce")
    # each token stops just past log(0.8) = −0.223: the step of lr 0.1 that crosses the line overshoots by less than 0.1, then nothing pulls
    assert (moved < math.log(0.8)).all() and (moved > math.log(0.8) - 0.1).all(), moved


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
    assert LOSSES == {"reinforce": reinforce_loss, "clipped_reinforce": clipped_reinforce_loss}
    assert TOKEN_LOSSES == {"clipped_reinforce"}
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
