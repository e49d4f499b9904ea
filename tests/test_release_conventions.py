"""``aggregation.discount``: the paper's γ^(T−t) and the release's own exponents (docs/method.md §3, §7).

The release (rhyang2021/ARIA, ``reward_aggregation/reward_utils.py``) computes its ``q`` rewards
with dictionaries keyed by "-"-joined label strings. ``release_single_q`` and ``release_multi_q``
below restate that algorithm from its semantics (string keys, ``min_length`` loops, its discount
exponents) as an independent brute force; with ``discount=original`` and
``include_first_action=false`` our corpus -> aggregate path must give the same reward for every
step the release keeps, on the same labels.
"""
from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aria.games.importers import parse_history
from aria.games.question.game import load_game
from aria.intention.aggregate import aggregate, step_returns
from aria.intention.corpus import IntentionSpec, build_corpus
from aria.trajectories import make_record
from conftest import ORIGINAL_SAMPLES

GAMMA = 0.95


# ---- the release's algorithm, restated ------------------------------------------------------
def release_single_q(games: list[tuple[list[int], list[int], float]], gamma: float = GAMMA) -> dict[str, float]:
    """get_single_values(value_type='q'): key a0-o0-a1-...-a(s), value R·γ^(min_length − len(key)//2)."""
    values = defaultdict(list)
    for actions, observations, reward in games:
        length = min(len(actions), len(observations))
        key = [str(actions[0])] if length else []
        for i in range(length - 1):
            key += [str(observations[i]), str(actions[i + 1])]
            values["-".join(key)].append(reward * gamma ** max(length - len(key) // 2, 0))
    return {k: sum(v) / len(v) for k, v in values.items()}


def release_multi_q(games, agent: str, gamma: float = GAMMA) -> dict[str, float]:
    """get_multi_values(value_type='q'): Alice's keys a0-b0-a1.. discounted by m − len(key); Bob's a0-b0-..-bj, no discount."""
    values = defaultdict(list)
    for alice, bob, rewards in games:
        m = min(len(alice), len(bob))
        reward = rewards[agent]
        if agent == "alice":
            key = [str(alice[0])] if m else []
            for i in range(m - 1):
                key += [str(bob[i]), str(alice[i + 1])]
                values["-".join(key)].append(reward * gamma ** max(m - len(key), 0))
        else:
            for j in range(m):
                key = [str(x) for i in range(j + 1) for x in (alice[i], bob[i])]
                values["-".join(key)].append(reward)
    return {k: sum(v) / len(v) for k, v in values.items()}


# ---- our path: records -> corpus -> aggregate, with the labels given per text ----------------
def _aggregate(records, spec, label_of: dict[str, int], discount: str):
    corpus = build_corpus(records, spec, gamma=GAMMA, use_precomputed=False, discount=discount)
    pool_labels = {pool: np.array([label_of[t] for t in texts]) for pool, texts in corpus.pools.items()}
    agg = aggregate(corpus.table, corpus.utterance_labels(pool_labels), mode="q", include_first_action=False)
    return corpus, agg


SINGLE_SPEC = IntentionSpec.from_config({"channels": {"action": {"cluster": "questions"}, "observation": {"cluster": "answers"}},
                                         "trained": ["action"]})
TWO_PLAYER_SPEC = IntentionSpec.from_config({"channels": {"alice": {"cluster": "messages"}, "bob": {"cluster": "messages"}},
                                             "trained": ["alice", "bob"]})


def single_agent_records(games):
    """One record per (action labels, observation labels, R); each text is unique and carries its label."""
    records, label_of = [], {}
    for g, (actions, observations, reward) in enumerate(games):
        turns = []
        for t, (a, o) in enumerate(zip(actions, observations)):
            action, answer = f"Question: g{g} t{t}?", f"answer g{g} t{t}"
            label_of[action], label_of[answer] = a, o
            turns.append({"action": action, "question": action[10:], "observation": answer, "reward": -1.0})
        records.append(make_record(game_id=f"g{g}", game="guess_my_city", target=None, turns=turns, success=reward == 1.0))
    return records, label_of


label_lists = st.lists(st.integers(0, 2), min_size=1, max_size=5)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(label_lists, label_lists, st.sampled_from([0.0, 1.0])), min_size=1, max_size=12))
def test_original_discount_equals_the_release_single_agent(raw_games):
    games = [(a[: len(o)], o[: len(a)], r) for a, o, r in raw_games]  # one answer per question, as collected
    records, label_of = single_agent_records(games)
    corpus, agg = _aggregate(records, SINGLE_SPEC, label_of, "original")
    release = release_single_q(games)
    kept_keys = set()
    for s in range(corpus.table.num_steps):
        g, t = int(corpus.step_game[s]), int(corpus.step_turn[s])
        actions, observations, _ = games[g]
        if t == 0:
            assert not agg.kept[s]  # the release has no sample for a first question
            continue
        key = "-".join(str(x) for i in range(t) for x in (actions[i], observations[i])) + f"-{actions[t]}"
        assert agg.kept[s] and agg.reward[s] == pytest.approx(release[key], abs=1e-12)
        kept_keys.add(key)
    assert kept_keys == set(release)  # the same samples, no more, no fewer


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.booleans(), st.lists(st.integers(0, 2), min_size=10, max_size=10),
                          st.sampled_from([(0.5, 0.5), (1.0, 0.0), (0.2, 0.8)])), min_size=1, max_size=10))
def test_original_discount_equals_the_release_two_player(raw_games):
    """Alice opens; Bob answers every offer, or all but Alice's last one (unequal turn counts)."""
    games, records, label_of = [], [], {}
    for g, (rounds, alice_has_last_word, labels, (ra, rb)) in enumerate(raw_games):
        alice = labels[:rounds + alice_has_last_word]
        bob = labels[5 : 5 + rounds]
        order = [("alice", alice[i // 2]) if i % 2 == 0 else ("bob", bob[i // 2]) for i in range(len(alice) + len(bob))]
        turns = []
        for p, (role, label) in enumerate(order):
            text = f"{role} g{g} p{p}"
            label_of[text] = label
            turns.append({"role": role, "action": text})
        records.append(make_record(game_id=f"g{g}", game="bargaining", players=["alice", "bob"], turns=turns,
                                   role_rewards={"alice": ra, "bob": rb}))
        games.append((alice, bob, {"alice": ra, "bob": rb}))
    corpus, agg = _aggregate(records, TWO_PLAYER_SPEC, label_of, "original")
    release = {role: release_multi_q(games, role) for role in ("alice", "bob")}
    seen = {"alice": set(), "bob": set()}
    for s in range(corpus.table.num_steps):
        g, p = int(corpus.step_game[s]), int(corpus.step_turn[s])
        alice, bob, _ = games[g]
        role = corpus.roles[int(corpus.table.step_role[s])]
        key = "-".join(str(alice[i // 2] if i % 2 == 0 else bob[i // 2]) for i in range(p + 1))
        if p == 0:
            assert not agg.kept[s]
            continue
        assert agg.kept[s] and agg.reward[s] == pytest.approx(release[role][key], abs=1e-12), (role, key)
        seen[role].add(key)
    # Every key the release trains on is a kept step of ours, and Alice's unanswered last offer is none.
    assert seen == {role: set(values) for role, values in release.items()}
    for g, (alice, bob, _) in enumerate(games):
        assert sum(int(corpus.step_game[s]) == g for s in range(corpus.table.num_steps)) == 2 * min(len(alice), len(bob))


def test_both_conventions_on_a_hand_computed_tree():
    """γ = 0.5; three games (labels a/o), won games R = 1.

    g0: a0 o0 a1 o1 (won, T=2)   paper: 0.5, 1      original: 0.25, 0.5
    g1: a0 o0 a1 o0 (lost)       0, 0
    g2: a0 o1 a1 o1 a2 o0 (won, T=3)  paper: 0.25, 0.5, 1   original: 0.125, 0.25, 0.5
    """
    games = [([0, 1], [0, 1], 1.0), ([0, 1], [0, 0], 0.0), ([0, 1, 2], [1, 1, 0], 1.0)]
    records, label_of = single_agent_records(games)
    paper = build_corpus(records, SINGLE_SPEC, gamma=0.5, use_precomputed=False)
    original = build_corpus(records, SINGLE_SPEC, gamma=0.5, use_precomputed=False, discount="original")
    np.testing.assert_allclose(paper.table.step_return, [0.5, 1.0, 0.0, 0.0, 0.25, 0.5, 1.0])
    np.testing.assert_allclose(original.table.step_return, [0.25, 0.5, 0.0, 0.0, 0.125, 0.25, 0.5])
    labels = paper.utterance_labels({p: np.array([label_of[t] for t in texts]) for p, texts in paper.pools.items()})
    # Nodes: (a0,o0,a1) holds g0 t2 and g1 t2; (a0,o1,a1) holds g2 t2; (a0,o1,a1,o1,a2) holds g2 t3.
    q_paper = aggregate(paper.table, labels, include_first_action=False)
    q_original = aggregate(original.table, labels, include_first_action=False)
    np.testing.assert_allclose(q_paper.reward[[1, 3, 5, 6]], [0.5, 0.5, 0.5, 1.0])
    np.testing.assert_allclose(q_original.reward[[1, 3, 5, 6]], [0.25, 0.25, 0.25, 0.5])
    assert np.isnan(q_original.reward[[0, 2, 4]]).all()


def test_release_exponents_by_seat():
    """Alice's exponent is max(m − 2t + 1, 0) with m rounds; Bob is undiscounted; unknown names fail."""
    t = np.array([1, 2, 3, 1, 2, 3, 1])
    out = step_returns(np.ones(7), t, np.array([3] * 7), 0.5, "original",
                       seat=np.array([0, 0, 0, 1, 1, 1, -1]), rounds=np.array([4, 4, 4, 4, 4, 4, 3]))
    np.testing.assert_allclose(out, [0.5**3, 0.5**1, 0.5**0, 1, 1, 1, 0.5**3])
    with pytest.raises(ValueError, match="unknown discount convention 'halved'"):
        step_returns(np.ones(1), np.ones(1), np.ones(1), 0.5, "halved")


def test_released_training_sample_uses_the_original_convention():
    """In the released single-agent sample, a question that wins is the last step of a won game.

    Its reward there is 0.95 (γ^1), the release's convention; the paper's γ^0 would give 1. Our
    ``original`` convention reproduces the released value on a game rebuilt from the sample's own
    history (each text its own label, so the step's node holds that one step).
    """
    samples = json.loads((ORIGINAL_SAMPLES / "aria_sample_actor_reinforce_llama3-8b_single.json").read_text(encoding="utf-8"))
    games = {"Let's play a game of Twenty Questions.": load_game("twenty_questions"),
             "Let's play a game of Guess My City.": load_game("guess_my_city")}
    winning = []
    for sample in samples:
        game = games[sample["observation"].split("\n", 1)[0]]
        question = game.extract_question(sample["action"])
        named = game.named_targets(question or "")
        if len(named) == 1 and game.is_win(question, named[0]):
            winning.append((game, sample, named[0]))
    assert {named for _, _, named in winning} == {"Sea", "Houston"}
    for game, sample, target in winning:
        history = parse_history(sample["observation"])
        turns = [{"action": f"Question: {q}", "question": q, "observation": a, "reward": -1.0} for q, a in history]
        turns.append({"action": sample["action"], "question": game.extract_question(sample["action"]),
                      "observation": game.win_answer, "reward": 0.0})
        record = make_record(game_id="released", game=game.name, target=target, turns=turns, success=True)
        label_of = {}
        for turn in turns:
            label_of.setdefault(turn["action"], len(label_of))
            label_of.setdefault(turn["observation"], len(label_of))
        rewards = {}
        for discount in ("original", "paper"):
            corpus, agg = _aggregate([record], SINGLE_SPEC, label_of, discount)
            rewards[discount] = agg.reward[-1]
        assert sample["reward"] == 0.95
        assert rewards["original"] == pytest.approx(sample["reward"], abs=1e-12)
        assert rewards["paper"] == pytest.approx(1.0)


def test_two_player_returns_by_hand_unequal_payoffs_and_turns():
    """Alice speaks 3 times and gets R = 0.8, Bob 2 times and gets R = 0.2; γ = 0.5.

    Paper: each role's own R and its own T: Alice 0.8·(γ², γ, 1) = 0.2, 0.4, 0.8; Bob 0.2·(γ, 1) =
    0.1, 0.2. (The other role's reward, or T counted over both roles' 5 turns, gives other numbers.)
    Release: Alice max(m − 2t + 1, 0) with m = 2 rounds: t=1 -> γ^1, t=2 -> γ^0; Alice's third,
    unanswered offer is no step; Bob undiscounted.
    """
    turns = [{"role": r, "action": f"{r} {i}"} for i, r in enumerate(["alice", "bob", "alice", "bob", "alice"])]
    record = make_record(game_id="g", game="bargaining", players=["alice", "bob"], turns=turns,
                         role_rewards={"alice": 0.8, "bob": 0.2})
    paper = build_corpus([record], TWO_PLAYER_SPEC, gamma=0.5, use_precomputed=False)
    assert [paper.roles[r] for r in paper.table.step_role] == ["alice", "bob", "alice", "bob", "alice"]
    np.testing.assert_allclose(paper.table.step_return, [0.2, 0.1, 0.4, 0.2, 0.8])
    original = build_corpus([record], TWO_PLAYER_SPEC, gamma=0.5, use_precomputed=False, discount="original")
    assert original.step_turn.tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(original.table.step_return, [0.8 * 0.5, 0.2, 0.8, 0.2])


def test_first_action_rule_drops_only_the_opening_message():
    """include_first_action=false: Alice's opening (empty history) is no sample, Bob's first reply is."""
    turns = [{"role": r, "action": f"{r} {i}"} for i, r in enumerate(["alice", "bob", "alice", "bob"])]
    record = make_record(game_id="g", game="bargaining", players=["alice", "bob"], turns=turns,
                         role_rewards={"alice": 1.0, "bob": 0.0})
    corpus = build_corpus([record], TWO_PLAYER_SPEC, use_precomputed=False)
    agg = aggregate(corpus.table, np.arange(4), include_first_action=False)
    assert agg.kept.tolist() == [False, True, True, True]
    assert aggregate(corpus.table, np.arange(4)).kept.all()
