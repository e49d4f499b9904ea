"""Reward aggregation (docs/method.md §3) and k selection (docs/method.md §4) against hand-computed values."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aria.intention.aggregate import StepTable, aggregate, discounted_returns, prefix_nodes
from aria.intention.select import choose_k_by_split_score, split_score, split_scores


def single_agent_table(games, gamma=0.5):
    """games: list of (labels in speaking order a, o, a, o, ..., R). Channels: 0 action, 1 observation."""
    ug, up, uc, su, sr, final, idx, cnt = [], [], [], [], [], [], [], []
    labels = []
    for g, (seq, reward) in enumerate(games):
        n_actions = (len(seq) + 1) // 2
        for p, label in enumerate(seq):
            ug.append(g), up.append(p), uc.append(p % 2), labels.append(label)
            if p % 2 == 0:
                su.append(len(ug) - 1), sr.append(0), final.append(reward), idx.append(p // 2 + 1), cnt.append(n_actions)
    table = StepTable(np.array(ug), np.array(up), np.array(uc), np.array(su), np.array(sr),
                      discounted_returns(np.array(final, float), np.array(idx), np.array(cnt), gamma))
    return table, np.array(labels)


# Four games, γ = 0.5. Labels: a = question cluster, o = answer label. Steps in order:
#   g0 t1, g0 t2, g1 t1, g1 t2, g2 t1, g3 t1, g3 t2
GAMES = [
    ([0, 0, 1, 1], 1.0),  # won in 2 turns: returns 0.5, 1
    ([0, 0, 1, 0], 0.0),  # lost: 0, 0
    ([0, 1], 1.0),        # won in 1 turn: 1
    ([2, 0, 1, 0], 0.0),  # lost: 0, 0
]


def test_step_returns_are_discounted_from_the_end():
    table, _ = single_agent_table(GAMES)
    np.testing.assert_allclose(table.step_return, [0.5, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(discounted_returns(np.array([1.0, 1.0, 1.0]), np.array([1, 2, 3]), np.array([3, 3, 3]), 0.95),
                               [0.95**2, 0.95, 1.0])


def test_q_mode_by_hand():
    table, labels = single_agent_table(GAMES)
    agg = aggregate(table, labels, mode="q")
    # (a0): g0,g1,g2 first steps -> (0.5+0+1)/3; (a2): g3 -> 0
    # (a0,o0,a1): g0,g1 second steps -> (1+0)/2; (a2,o0,a1): g3 -> 0
    np.testing.assert_allclose(agg.q, [0.5, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0])
    np.testing.assert_allclose(agg.count, [3, 2, 3, 2, 3, 1, 1])
    # V: empty history -> all four first steps (0.5+0+1+0)/4; (a0,o0) -> 0.5; (a2,o0) -> 0
    np.testing.assert_allclose(agg.v, [0.375, 0.5, 0.375, 0.5, 0.375, 0.375, 0.0])
    np.testing.assert_allclose(agg.reward, agg.q)
    assert agg.kept.all()


def test_observation_labels_are_part_of_the_history():
    # Same questions, different answers: the second steps must not share a node.
    table, labels = single_agent_table([([0, 0, 1, 0], 1.0), ([0, 1, 1, 0], 0.0)])
    agg = aggregate(table, labels)
    np.testing.assert_allclose(agg.q, [0.25, 1.0, 0.25, 0.0])


def test_adv_mode_by_hand():
    table, labels = single_agent_table(GAMES)
    agg = aggregate(table, labels, mode="adv")
    # A = Q − V = [.125, 0, .125, 0, .125, −.375, 0]; z-scoring is affine, so min-max of z equals
    # min-max of A: (A + .375) / .5
    np.testing.assert_allclose(agg.reward, [1.0, 0.75, 1.0, 0.75, 1.0, 0.0, 0.75])


def test_adv_mode_edges():
    """One kept step has no spread: 0.5. No kept step: every reward NaN. (The z-score before the
    min-max scaling cannot change the result, min-max being blind to affine maps; the release does both.)"""
    from aria.intention.aggregate import AGGREGATION_MODES

    adv = AGGREGATION_MODES["adv"]
    q, v = np.array([1.0, 0.2, 0.7]), np.array([0.5, 0.5, 0.5])
    np.testing.assert_allclose(adv(q, v, np.array([False, True, False])), [np.nan, 0.5, np.nan])
    assert np.isnan(adv(q, v, np.zeros(3, dtype=bool))).all()
    # A = [.5, −.3, .2]: min-max over the kept steps -> [1, 0, .625]
    np.testing.assert_allclose(adv(q, v, np.ones(3, dtype=bool)), [1.0, 0.0, 0.625])
    assert AGGREGATION_MODES["q"](q, v, np.ones(3, dtype=bool)) is q


def test_adv_mode_constant_advantage_is_one_half():
    table, labels = single_agent_table([([0, 0], 1.0), ([0, 0], 1.0)])
    np.testing.assert_allclose(aggregate(table, labels, mode="adv").reward, [0.5, 0.5])


def test_n_rollout_filter_drops_rare_nodes():
    table, labels = single_agent_table(GAMES)
    agg = aggregate(table, labels, n_rollout=2)
    assert agg.kept.tolist() == [True, True, True, True, True, False, False]
    np.testing.assert_allclose(agg.reward[:5], 0.5)
    assert np.isnan(agg.reward[5:]).all()
    # adv statistics run over the kept steps only: A = [.125, 0, .125, 0, .125] -> [1, 0, 1, 0, 1]
    np.testing.assert_allclose(aggregate(table, labels, mode="adv", n_rollout=2).reward[:5], [1, 0, 1, 0, 1])


def test_first_action_option():
    table, labels = single_agent_table(GAMES)
    agg = aggregate(table, labels, include_first_action=False)
    assert agg.kept.tolist() == [False, True, False, True, False, False, True]
    # the dropped steps still count in every mean
    np.testing.assert_allclose(agg.q[agg.kept], [0.5, 0.5, 0.0])


def test_two_player_roles_interleave_and_stay_apart():
    """Alice (channel 0) and Bob (channel 1) alternate; labels from one pooled clustering."""
    gamma = 0.5
    games = [([0, 0, 1, 1], {0: 1.0, 1: 0.0}), ([0, 1, 1], {0: 0.0, 1: 1.0})]
    ug, up, uc, labels, su, sr, final, idx, cnt = [], [], [], [], [], [], [], [], []
    for g, (seq, reward) in enumerate(games):
        counts = {r: sum(1 for p in range(len(seq)) if p % 2 == r) for r in (0, 1)}
        seen = {0: 0, 1: 0}
        for p, label in enumerate(seq):
            role = p % 2
            ug.append(g), up.append(p), uc.append(role), labels.append(label)
            seen[role] += 1
            su.append(len(ug) - 1), sr.append(role), final.append(reward[role]), idx.append(seen[role]), cnt.append(counts[role])
    table = StepTable(np.array(ug), np.array(up), np.array(uc), np.array(su), np.array(sr),
                      discounted_returns(np.array(final), np.array(idx), np.array(cnt), gamma))
    # steps: g0 A1 B1 A2 B2, g1 A1 B1 A2
    np.testing.assert_allclose(table.step_return, [0.5, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    agg = aggregate(table, np.array(labels))
    # Alice t1 (A0): g0, g1 -> 0.25. Bob t1: (A0,B0) g0 -> 0; (A0,B1) g1 -> 1.
    # Alice t2: (A0,B0,A1) g0 -> 1; (A0,B1,A1) g1 -> 0: Bob's label splits Alice's history.
    # Bob t2: (A0,B0,A1,B1) g0 -> 0.
    np.testing.assert_allclose(agg.q, [0.25, 0.0, 1.0, 0.0, 0.25, 1.0, 0.0])
    # Same label at the same position but a different role never shares a node.
    node, _ = prefix_nodes(StepTable(np.array([0, 1]), np.array([0, 0]), np.array([0, 1]), np.array([0, 1]),
                                     np.array([0, 1]), np.array([1.0, 0.0])), np.array([3, 3]))
    assert node[0] != node[1]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 6), st.integers(0, 2**31 - 1), st.sampled_from([1, 2]))
def test_aggregated_variance_never_exceeds_raw_variance(n_games, n_labels, seed, n_roles):
    """Law of total variance: R~ = E[R | node], so Var(R~) <= Var(R) on the same steps."""
    rng = np.random.default_rng(seed)
    ug, up, uc, su, sr = [], [], [], [], []
    for g in range(n_games):
        for p in range(int(rng.integers(1, 8))):
            ug.append(g), up.append(p), uc.append(p % n_roles)
            su.append(len(ug) - 1), sr.append(p % n_roles)
    returns = rng.random(len(su)) * rng.choice([0.0, 1.0], len(su))
    table = StepTable(np.array(ug), np.array(up), np.array(uc), np.array(su), np.array(sr), returns)
    agg = aggregate(table, rng.integers(0, n_labels, len(ug)))
    assert agg.q.var() <= returns.var() + 1e-12
    assert np.isclose(agg.q.mean(), returns.mean())


def test_aggregation_is_deterministic():
    table, labels = single_agent_table(GAMES)
    a, b = aggregate(table, labels, mode="adv"), aggregate(table, labels, mode="adv")
    assert a.reward.tobytes() == b.reward.tobytes()


def test_unknown_mode_is_rejected():
    table, labels = single_agent_table(GAMES)
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregate(table, labels, mode="median")


# ---- SplitScore -----------------------------------------------------------------------------
def test_split_score_by_hand():
    assert split_score(np.array([0.5, 0.5, 0.0]), np.array([0.25, 0.5, 0.1])) == pytest.approx((0.25 + 0 + 0.1) / 3)
    # steps dropped (NaN) at either k are not in D
    assert split_score(np.array([0.5, np.nan, 0.0]), np.array([0.25, 0.5, np.nan])) == pytest.approx(0.25)
    np.testing.assert_allclose(split_scores([2, 3, 4], np.array([[0, 0], [1, 1], [1, 0]])), [1.0, 0.5])
    with pytest.raises(ValueError, match="consecutive"):
        split_scores([2, 4], np.zeros((2, 2)))


def test_split_score_rule_on_a_constructed_curve():
    ks = list(range(2, 31))  # SplitScore defined for k = 2..29
    scores = np.full(28, 0.05)
    scores[ks.index(8) : ks.index(13)] = 0.001       # below ε on 8..12 only: window too short
    scores[ks.index(14) :] = 0.002                   # below ε from 14 on
    choice = choose_k_by_split_score(ks, scores, epsilon=0.01, tau=10)
    assert (choice.k, choice.rule_satisfied) == (14, True)
    # τ = 4: the first run 8..12 is long enough
    assert choose_k_by_split_score(ks, scores, epsilon=0.01, tau=4).k == 8
    # a NaN inside the window breaks it
    with_gap = scores.copy()
    with_gap[ks.index(20)] = np.nan
    assert choose_k_by_split_score(ks, with_gap, epsilon=0.01, tau=8).k == 21  # 21..29 is the first clean window
    # never below ε long enough: the largest k, flagged
    fallback = choose_k_by_split_score(ks, np.full(28, 0.05), epsilon=0.01, tau=10)
    assert (fallback.k, fallback.rule_satisfied) == (30, False)


def test_split_score_window_is_tau_plus_one_values_strictly_below_epsilon():
    """The rule needs SplitScore(j) < ε for all of j = k..k+τ: τ + 1 values, strictly below."""
    ks = list(range(2, 20))          # SplitScore for k = 2..18 (17 values)
    eps, tau = 0.01, 3
    scores = np.full(17, 0.05)
    scores[ks.index(5) : ks.index(5) + tau] = 0.001          # k = 5..7: τ values, one short
    scores[ks.index(10) : ks.index(10) + tau + 1] = 0.001    # k = 10..13: exactly τ + 1
    assert choose_k_by_split_score(ks, scores, eps, tau).k == 10
    at_epsilon = scores.copy()
    at_epsilon[ks.index(13)] = eps                           # equal to ε is not below it
    choice = choose_k_by_split_score(ks, at_epsilon, eps, tau)
    assert (choice.k, choice.rule_satisfied) == (19, False)
    just_below = scores.copy()
    just_below[ks.index(13)] = np.nextafter(eps, 0)
    assert choose_k_by_split_score(ks, just_below, eps, tau).k == 10
    # The window must fit in the computed range: 16..18 below ε is only τ values at the end.
    tail = np.full(17, 0.05)
    tail[ks.index(16):] = 0.001
    assert choose_k_by_split_score(ks, tail, eps, tau).rule_satisfied is False
    tail[ks.index(15)] = 0.001                               # now 15..18: τ + 1 values
    assert choose_k_by_split_score(ks, tail, eps, tau).k == 15


def test_split_score_edges_and_the_reasons_given():
    assert np.isnan(split_score(np.array([np.nan, 1.0]), np.array([0.5, np.nan])))  # D empty: undefined
    assert np.isnan(split_score(np.zeros(0), np.zeros(0)))
    ks = [2, 3, 4, 5]
    # τ = 0: a window of one value; the first k below ε
    chosen = choose_k_by_split_score(ks, np.array([0.5, 0.001, 0.5]), epsilon=0.01, tau=0)
    assert (chosen.k, chosen.rule_satisfied) == (3, True)
    assert chosen.why == "smallest k with SplitScore < 0.01 for all of [k, k+0]"
    fallback = choose_k_by_split_score(ks, np.full(3, 0.5), epsilon=0.01, tau=1)
    assert fallback.why == "no k in 2..5 has SplitScore < 0.01 on a window of 2; took the largest k"
    with pytest.raises(ValueError, match="tau must be >= 0, got -1"):
        choose_k_by_split_score(ks, np.full(3, 0.5), tau=-1)


def reference_q(games_labels, games_returns):
    """Brute force: key = the tuple of (channel, label) pairs up to the action; mean per key and role."""
    sums, counts, keys = {}, {}, []
    for seq, rets in zip(games_labels, games_returns):
        for p, r in rets.items():
            key = (p % 2, tuple(seq[: p + 1]))
            keys.append(key)
            sums[key] = sums.get(key, 0.0) + r
            counts[key] = counts.get(key, 0) + 1
    return np.array([sums[k] / counts[k] for k in keys])


def random_games(seed: int, n_games: int, n_labels: int):
    """Random games of up to 8 utterances alternating channels 0/1, about 70% of them steps of role
    channel: the table, the labels, and per game its (channel, label) sequence and {position: return}."""
    rng = np.random.default_rng(seed)
    ug, up, uc, labels, su, sr, rets = [], [], [], [], [], [], []
    games_labels, games_returns = [], []
    for g in range(n_games):
        seq = [(p % 2, int(rng.integers(0, n_labels))) for p in range(int(rng.integers(1, 9)))]
        step_returns = {}
        for p, (channel, label) in enumerate(seq):
            ug.append(g), up.append(p), uc.append(channel), labels.append(label)
            if rng.random() < 0.7:  # some utterances are steps of role p % 2
                su.append(len(ug) - 1), sr.append(p % 2), rets.append(float(rng.random()))
                step_returns[p] = rets[-1]
        games_labels.append(seq)
        games_returns.append(step_returns)
    table = StepTable(np.array(ug), np.array(up), np.array(uc), np.array(su, dtype=np.int64),
                      np.array(sr, dtype=np.int64), np.array(rets))
    return table, np.array(labels), games_labels, games_returns


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 30), st.integers(1, 5))
def test_tree_aggregation_equals_brute_force(seed, n_games, n_labels):
    table, labels, games_labels, games_returns = random_games(seed, n_games, n_labels)
    if table.num_steps == 0:
        return
    np.testing.assert_allclose(aggregate(table, labels).q, reference_q(games_labels, games_returns))


def test_key_sharing_by_hand():
    """Two question games; the first questions share a label (one node for both steps), the
    second questions do not. R = [0.5, 1.0] and [0.0, 0.0]: R̃ = [0.25, 1.0, 0.25, 0.0]."""
    from aria.intention.aggregate import key_sharing

    table = StepTable(utterance_game=np.array([0, 0, 0, 0, 1, 1, 1, 1]),
                      utterance_position=np.array([0, 1, 2, 3, 0, 1, 2, 3]),
                      utterance_channel=np.array([0, 1, 0, 1, 0, 1, 0, 1]),
                      step_utterance=np.array([0, 2, 4, 6]), step_role=np.zeros(4, dtype=int),
                      step_return=np.array([0.5, 1.0, 0.0, 0.0]))
    labels = np.array([1, 7, 2, 7, 1, 7, 3, 7])
    out = key_sharing(table, labels, step_turn=np.array([0, 1, 0, 1]))
    assert out["shared"] == 0.5 and out["shared_by_turn"] == {"0": 1.0, "1": 0.0}
    assert out["mean_abs_change"] == pytest.approx((0.25 + 0 + 0.25 + 0) / 4)
    # Var(R) = 0.6875 / 4, Var(R̃) = 0.5625 / 4: ratio 9/11
    assert out["variance_ratio"] == pytest.approx(9 / 11)
    # turns from last_turn on are counted together
    assert key_sharing(table, labels, np.array([0, 7, 0, 9]), last_turn=5)["shared_by_turn"] == {"0": 1.0, "5+": 0.0}
    # every return equal: no ratio
    flat = StepTable(**{**table.__dict__, "step_return": np.ones(4)})
    assert key_sharing(flat, labels, np.array([0, 1, 0, 1]))["variance_ratio"] is None


def test_windowed_key_by_hand():
    """Keys cut to the action alone (window 0) and to the last turn (window 1). GAMES' games are at
    most two turns long, where a window of 1 is still the whole history, so window 1 is shown on two
    three-turn games."""
    table, labels = single_agent_table(GAMES)
    # window >= the longest game: the paper's keys
    np.testing.assert_allclose(aggregate(table, labels, window=5).q, aggregate(table, labels).q)
    # window 0: the action alone. a0 steps: g0 t1 (0.5), g1 t1 (0), g2 t1 (1) -> 0.5; a1 steps: g0 t2 (1),
    # g1 t2 (0), g3 t2 (0) -> 1/3; a2: g3 t1 -> 0
    np.testing.assert_allclose(aggregate(table, labels, window=0).q, [0.5, 1 / 3, 0.5, 1 / 3, 0.5, 0.0, 1 / 3])
    # Three-turn games, γ = 0.5: g0 [a1 o0 a5 o0 a3] R 1 -> 0.25, 0.5, 1; g1 [a2 o1 a5 o0 a3] R 0.
    # window 1: the third steps' key is (a5, o0, a3) in both -> (1 + 0) / 2; the second steps' keys
    # (a1,o0,a5) and (a2,o1,a5) differ; window None keeps the third steps apart too.
    three, labels3 = single_agent_table([([1, 0, 5, 0, 3], 1.0), ([2, 1, 5, 0, 3], 0.0)])
    np.testing.assert_allclose(aggregate(three, labels3, window=1).q, [0.25, 0.5, 0.5, 0.0, 0.0, 0.5])
    np.testing.assert_allclose(aggregate(three, labels3).q, [0.25, 0.5, 1.0, 0.0, 0.0, 0.0])
    # V under window 1: the third steps' history (a5, o0) is shared; the first steps' is empty
    np.testing.assert_allclose(aggregate(three, labels3, window=1).v, [0.125, 0.5, 0.5, 0.125, 0.0, 0.5])
    with pytest.raises(ValueError, match="window must be >= 0"):
        aggregate(three, labels3, window=-1)


def test_outcome_signal_by_hand():
    """How much of the outcome a weighting keeps, on the three-turn games above (g0 won, g1 lost).
    Window 1 gives the won game's winning step (a5, o0, a3) the mean with the lost game's: 0.5, and
    its weights [0.25, 0.5, 0.5, 0, 0, 0.5] correlate with [1, 1, 1, 0, 0, 0] at
    cov 0.0625 / sqrt(0.050347 * 0.25) = 0.5571; the whole history keeps [0.25, 0.5, 1, 0, 0, 0]:
    cov 0.145833 / sqrt(0.133681 * 0.25) = 0.7977, and 1 on the winning step."""
    from aria.experiment.grouping import outcome_signal

    three, labels3 = single_agent_table([([1, 0, 5, 0, 3], 1.0), ([2, 1, 5, 0, 3], 0.0)])
    outcome, won_last = np.array([1, 1, 1, 0, 0, 0]), np.array([0, 0, 1, 0, 0, 0], dtype=bool)
    windowed = outcome_signal(aggregate(three, labels3, window=1).q, outcome, won_last)
    assert windowed["outcome_correlation"] == pytest.approx(0.5571, abs=1e-4) and windowed["won_last_step"] == 0.5
    whole = outcome_signal(aggregate(three, labels3).q, outcome, won_last)
    assert whole["outcome_correlation"] == pytest.approx(0.7977, abs=1e-4) and whole["won_last_step"] == 1.0
    # constant weights (or outcomes) have no correlation; weights not in return units, no winning-step value
    assert outcome_signal(np.ones(6), outcome, None) == {"outcome_correlation": None, "won_last_step": None}


def reference_window_q(games_labels, games_returns, window):
    """Brute force: the key of a step of role r at position p is the (channel, label) pairs from the
    window-th previous step of role r on (the game's start if it has fewer), up to the action."""
    sums, counts, keys = {}, {}, []
    for seq, rets in zip(games_labels, games_returns):
        for p, r in rets.items():
            mine = [q for q in sorted(rets) if q < p and q % 2 == p % 2]
            start = p if window == 0 else (mine[-window] if len(mine) >= window else 0)
            key = (p % 2, tuple(seq[start: p + 1]))
            keys.append(key)
            sums[key] = sums.get(key, 0.0) + r
            counts[key] = counts.get(key, 0) + 1
    return np.array([sums[k] / counts[k] for k in keys])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 30), st.integers(1, 4), st.integers(0, 4))
def test_windowed_aggregation_equals_brute_force(seed, n_games, n_labels, window):
    table, labels, games_labels, games_returns = random_games(seed, n_games, n_labels)
    if table.num_steps == 0:
        return
    np.testing.assert_allclose(aggregate(table, labels, window=window).q,
                               reference_window_q(games_labels, games_returns, window))


def test_error_against_the_reference_partition_by_hand():
    """GAMES' reference keys (test_q_mode_by_hand): K1 = the three a0 first steps (R̃ 0.5), K2 =
    (a0,o0,a1) of g0 and g1 (0.5), K3 = g3's a2 (0), K4 = g3's (a2,o0,a1) (0)."""
    from aria.intention.aggregate import error_against

    table, labels = single_agent_table(GAMES)
    # Merging: keys of the action alone (window 0) give q = [.5, 1/3, .5, 1/3, .5, 0, 1/3]: constant on
    # each reference key, so no variance within; the mean on K2 is 1/3 against 0.5 and on K4 1/3 against 0:
    # bias² = (2 (1/6)² + (1/3)²) / 7 = 1/42.
    merged = error_against(table, aggregate(table, labels, window=0).q, labels)
    assert merged["bias_squared"] == pytest.approx(1 / 42) and merged["variance_within"] == pytest.approx(0.0)
    # Splitting: every step alone (q = its return). The means on each key are the reference's, so no
    # bias; (q - m)² is 0.25 for g1t1, g2t1, g0t2, g1t2: variance within 1 / 7.
    split = error_against(table, table.step_return, labels)
    assert split["bias_squared"] == pytest.approx(0.0) and split["variance_within"] == pytest.approx(1 / 7)
    for found in (merged, split):
        assert found["mse"] == pytest.approx(found["bias_squared"] + found["variance_within"])
