"""ArCHer's utterance-level critic (aria/trainers/critic.py): transitions, TD targets, the Polyak
update and the advantage by hand on a 3-step toy game; the double critic on a tiny encoder learns
a planted value."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from aria.trainers.critic import (DoubleCritic, advantages, critic_loss, polyak_update, q_targets, transitions,
                                  v_targets)


def test_transitions_link_each_players_next_turn_in_any_order():
    steps = [{"game_id": "g1", "turn": 2}, {"game_id": "g2", "role": "alice", "turn": 0},
             {"game_id": "g1", "turn": 0}, {"game_id": "g2", "role": "bob", "turn": 1},
             {"game_id": "g1", "turn": 1}, {"game_id": "g2", "role": "alice", "turn": 2}]
    found = transitions(steps)
    # g1: turn 0 (index 2) -> turn 1 (index 4) -> turn 2 (index 0), the end; g2: alice 0 -> alice 2; bob alone
    assert found.next_index.tolist() == [-1, 5, 4, -1, 0, -1]
    assert found.done.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="game 'g1': two steps at turn 0"):
        transitions([{"game_id": "g1", "turn": 0}, {"game_id": "g1", "turn": 0}])


def test_td_targets_of_a_three_step_game_by_hand():
    # Twenty Questions' rewards: -1 a turn, 0 on the winning third turn; gamma 0.9
    reward = torch.tensor([-1.0, -1.0, 0.0])
    done = torch.tensor([0.0, 0.0, 1.0])
    next_v = torch.tensor([2.0, 5.0, float("nan")])  # V-bar(s') of the next histories; none after the last
    # -1 + 0.9 * 2 = 0.8;  -1 + 0.9 * 5 = 3.5;  0 (done: no bootstrap, whatever the tensor holds there)
    assert q_targets(reward, done, next_v, 0.9).tolist() == pytest.approx([0.8, 3.5, 0.0])
    tq1, tq2 = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 3.0])
    assert [t.tolist() for t in v_targets(tq1, tq2, "paired")] == [[1.0, -2.0], [0.5, 3.0]]  # the release: head i to head i
    assert [t.tolist() for t in v_targets(tq1, tq2, "min")] == [[0.5, -2.0], [0.5, -2.0]]
    with pytest.raises(ValueError, match="v_target: unknown 'max'"):
        v_targets(tq1, tq2, "max")


def test_advantage_and_loss_by_hand():
    q1, q2 = torch.tensor([1.0, 3.0]), torch.tensor([2.0, 0.0])
    v1, v2 = torch.tensor([0.5, 1.0]), torch.tensor([1.0, -1.0])
    # min Q = [1, 0], min V = [0.5, -1]
    assert advantages(q1, q2, v1, v2).tolist() == [0.5, 1.0]
    pred = [torch.tensor([1.0, 2.0], requires_grad=True) for _ in range(4)]
    targets = [torch.tensor([0.0, 0.0], requires_grad=True), torch.tensor([1.0, 2.0]), torch.tensor([2.0, 2.0]),
               torch.tensor([1.0, 0.0])]
    loss = critic_loss((pred[0], pred[1]), (pred[2], pred[3]), (targets[0], targets[1]), (targets[2], targets[3]))
    # MSEs: (1 + 4) / 2 = 2.5;  0;  (1 + 0) / 2 = 0.5;  (0 + 4) / 2 = 2  ->  5
    assert float(loss.detach()) == pytest.approx(5.0)
    loss.backward()
    assert targets[0].grad is None  # targets are constants of the update
    assert pred[0].grad.tolist() == [1.0, 2.0]  # d/dp mean((p - 0)^2) = p


def test_polyak_update_by_hand():
    online, target = torch.nn.Linear(1, 1, bias=False), torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        online.weight.fill_(1.0)
        target.weight.fill_(0.0)
    polyak_update(target, online, 0.1)
    assert float(target.weight) == pytest.approx(0.1)  # 0.9 * 0 + 0.1 * 1
    polyak_update(target, online, 0.1)
    assert float(target.weight) == pytest.approx(0.19)  # 0.9 * 0.1 + 0.1 * 1
    polyak_update(target, online, 1.0)
    assert float(target.weight) == 1.0
    with pytest.raises(ValueError, match="tau"):
        polyak_update(target, online, 0.0)


def test_the_critic_learns_a_planted_value(tiny_sentence_model_dir):
    """Histories end in a question; the utterance "Question: win" ends the game with reward 1,
    "Question: lose" with reward 0. After TD updates (terminal steps: the targets are the rewards)
    the critic ranks the winning utterance above the losing one on histories it never saw, its
    advantage says so too, and its target copy trails it."""
    torch.manual_seed(0)
    critic = DoubleCritic(str(tiny_sentence_model_dir), hidden=32, max_tokens=64)
    target = copy.deepcopy(critic)
    objects = ["cat", "dog", "fox", "owl", "red", "big", "small", "round", "food", "fruit", "city", "animal"]
    train = [f"Is it a {o}? Yes." for o in objects[:8]]
    held_out = [f"Is it a {o}? No." for o in objects[8:]]
    histories = [h for h in train for _ in (0, 1)]
    utterances = ["Question: win", "Question: lose"] * len(train)
    reward = torch.tensor([1.0, 0.0] * len(train))
    done = torch.ones(len(histories))
    optimizer = torch.optim.Adam(critic.parameters(), lr=3e-3)
    for _ in range(60):
        q1, q2, v1, v2 = critic(histories, utterances)
        with torch.no_grad():
            next_v = torch.zeros_like(reward)  # every step is terminal here
            tq1, tq2, _, _ = target(histories, ["Question: win"] * len(histories))  # the policy's utterance: win
        loss = critic_loss((q1, q2), (v1, v2), (q_targets(reward, done, next_v, 0.9),) * 2, v_targets(tq1, tq2, "paired"))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        polyak_update(target, critic, 0.1)
    with torch.no_grad():
        win = critic(held_out, ["Question: win"] * len(held_out))
        lose = critic(held_out, ["Question: lose"] * len(held_out))
    accuracy = float((torch.minimum(win[0], win[1]) > torch.minimum(lose[0], lose[1])).float().mean())
    assert accuracy == 1.0, accuracy  # floor: every held-out history
    assert float(torch.minimum(win[0], win[1]).mean()) == pytest.approx(1.0, abs=0.2)
    assert float(torch.minimum(lose[0], lose[1]).mean()) == pytest.approx(0.0, abs=0.2)
    assert (advantages(*win) > advantages(*lose)).all()
    assert not math.isclose(float(target.q1[-1].weight.sum()), float(critic.q1[-1].weight.sum()))


def test_a_frozen_encoder_keeps_each_text_encoded_once_without_dropout(tiny_sentence_model_dir):
    """With the encoder frozen, a text is encoded once, in evaluation mode, even while the critic
    trains (its dropout must not be kept in the cache), and the cache is what the heads read."""
    torch.manual_seed(0)
    critic = DoubleCritic(str(tiny_sentence_model_dir), hidden=8, max_tokens=32)
    cache = critic.freeze_encoder()
    critic.train()
    assert critic.encoder.config.hidden_dropout_prob > 0  # otherwise this test would prove nothing
    kept = critic.encode(["Is it a cat?", "Is it a cat?", "Is it red?"])
    assert set(cache) == {"Is it a cat?", "Is it red?"} and critic.encoder.training  # mode given back
    critic.eval()
    with torch.no_grad():
        torch.testing.assert_close(kept, critic._encode(["Is it a cat?", "Is it a cat?", "Is it red?"]))
    assert not any(p.requires_grad for p in critic.encoder.parameters())


def test_a_kept_encoding_does_not_depend_on_the_texts_beside_it(tiny_sentence_model_dir):
    """A text padded beside longer ones encodes to other numbers than alone (the embedded
    all-MiniLM-L6-v2 in float32: up to 6e-7; this tiny encoder under bfloat16 autocast, as
    ``mixed_precision: auto`` gives on a CPU with AVX512-BF16: 6e-6). So a text kept from the batch
    that first needed it encodes one way in a run and another in the same run resumed from a
    checkpoint (the powered run's critic: held-out TD error 0.010731, resumed 0.010729, and its
    advantages rewritten under a half-trained actor). Each text is kept as encoded alone.
    Whether padding changes the numbers depends on the CPU's kernels (on a 2-core AVX2 EPYC this
    tiny encoder gave equal numbers either way), so the encoder's batches are also recorded: a
    text to be kept is encoded in a batch of its own on any machine."""
    torch.manual_seed(0)
    short, long = "Is it a cat?", "Here is the game history: " + "Question: Is it an animal? Answer: No. " * 6
    encodings, batches = [], []
    for company in ([short], [short, long], [long, short]):
        critic = DoubleCritic(str(tiny_sentence_model_dir), hidden=8, max_tokens=128)
        critic.freeze_encoder()
        encode_batch = critic._encode
        critic._encode = lambda texts, encode_batch=encode_batch: batches.append(list(texts)) or encode_batch(texts)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            encodings.append(critic.encode(company)[company.index(short)])
    assert all(torch.equal(encodings[0], e) for e in encodings[1:]), [float((encodings[0] - e).abs().max()) for e in encodings]
    assert batches == [[short], [short], [long], [long], [short]], batches


def test_a_cut_longer_than_the_encoder_reads_is_refused_in_one_line(tiny_sentence_model_dir):
    """The tiny encoder has 256 positions: 512 would fail as a shape error in the first batch."""
    from aria.io import ConfigError

    with pytest.raises(ConfigError, match="critic.max_tokens: 512 is more than the encoder's 256 positions"):
        DoubleCritic(str(tiny_sentence_model_dir), hidden=8, max_tokens=512)
