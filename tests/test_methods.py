"""Every training method's weights on a small tree of games, computed by hand (aria/trainers/methods.py).

Games (γ = 0.5, R_t = γ^(T−t)·R):
  A  target cat, won  (R = 1), 3 steps: histories h0, h0|a, h0|a|b   returns .25, .5, 1
  B  target cat, lost (R = 0), 2 steps: histories h0, h0|c           returns 0, 0
  C  target dog, won  (R = 1), 2 steps: histories d0, d0|e           returns .5, 1
  D  target fox, lost (R = 0), 1 step:  history  f0                  return 0
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from aria.trainers.methods import METHODS, get_method, method_pairs, method_weights

WEIGHT_METHODS = sorted(name for name, method in METHODS.items() if method.kind == "weights")


def step(game, turn, history, final, ret, target, success, reward=None, q=0.0, v=0.0, kept=True):
    return {"game_id": game, "role": "agent", "turn": turn, "observation": history, "final_reward": final,
            "step_return": ret, "target": target, "success": success, "reward": reward, "q": q, "v": v, "kept": kept,
            "action": "Question: ?", "advantage": q - v}  # ArCHer's: a critic's min Q − min V (here the aggregation's)


STEPS = [
    step("A", 0, "h0", 1.0, 0.25, "cat", True, reward=0.125, q=0.125, v=0.125),
    step("A", 1, "h0|a", 1.0, 0.5, "cat", True, reward=0.5, q=0.5, v=0.125),
    step("A", 2, "h0|a|b", 1.0, 1.0, "cat", True, reward=1.0, q=1.0, v=0.5),
    step("B", 0, "h0", 0.0, 0.0, "cat", False, reward=None, q=0.125, v=0.125, kept=False),
    step("B", 1, "h0|c", 0.0, 0.0, "cat", False, reward=0.0, q=0.0, v=0.125),
    step("C", 0, "d0", 1.0, 0.5, "dog", True, reward=0.5, q=0.5, v=0.5),
    step("C", 1, "d0|e", 1.0, 1.0, "dog", True, reward=1.0, q=1.0, v=0.5),
    step("D", 0, "f0", 0.0, 0.0, "fox", False, reward=0.0, q=0.0, v=0.0),
]
SQRT_HALF = 1 / math.sqrt(2)


def close(got, expected):
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True)


def test_registry_names_and_rejects():
    assert sorted(METHODS) == ["archer", "aria", "aria_adv", "bc", "filtered_bc", "gigpo", "gigpo_similar", "no_aggregation",
                              "starpo", "traj_dpo"]
    assert {name: METHODS[name].kind for name in METHODS if METHODS[name].kind != "weights"} == {"traj_dpo": "pairs"}
    with pytest.raises(KeyError, match="unknown method 'ppo'"):
        get_method("ppo")
    with pytest.raises(KeyError, match="step 0: no 'target'"):
        method_weights("starpo", [{k: v for k, v in STEPS[0].items() if k != "target"}])
    with pytest.raises(KeyError, match="'traj_dpo' trains on pairs, not on weights"):
        method_weights("traj_dpo", STEPS)
    with pytest.raises(KeyError, match="'aria' trains on weights, not on pairs"):
        method_pairs("aria", STEPS)


@pytest.mark.parametrize("method, field, value, expected", [
    ("no_aggregation", "step_return", "1.0", "expected a finite number, got '1.0'"),
    ("no_aggregation", "step_return", float("nan"), "expected a finite number, got nan"),
    ("no_aggregation", "step_return", True, "expected a finite number, got True"),
    ("no_aggregation", "step_return", 10 ** 400, "expected a finite number, got 1000"),
    ("filtered_bc", "success", "false", "expected true or false, got 'false'"),  # truthy: a win before
    ("starpo", "final_reward", None, "expected a finite number, got None"),
    ("starpo", "target", 3, "expected a string or null, got 3"),
    ("aria_adv", "kept", 1, "expected true or false, got 1"),
    ("traj_dpo", "game_id", 7, "expected a string, got 7"),
    ("starpo", "game_id", ["A"], "expected a string, got ['A']"),  # read to group a game's steps
    ("gigpo", "role", ["x"], "expected a string, got ['x']"),  # optional, but read where present
    ("traj_dpo", "role", 1, "expected a string, got 1"),
])
def test_a_field_a_method_reads_is_checked_before_it_is_misread(method, field, value, expected):
    """Files made elsewhere: a string "1.0", a NaN return (dropped the step silently), a "false"
    success (counted as a win by filtered_bc), a bool counted as 1."""
    steps = [dict(s) for s in STEPS]
    steps[3][field] = value
    run = method_pairs if METHODS[method].kind == "pairs" else method_weights
    with pytest.raises(KeyError, match=re.escape(f"step 3: '{field}' {expected}")):
        run(method, steps)


def test_archer_weighs_each_step_by_its_critics_advantage():
    close(method_weights("archer", STEPS), [0.0, 0.375, 0.5, 0.0, -0.125, 0.0, 0.5, 0.0])


def test_aria_no_aggregation_bc_filtered_bc():
    close(method_weights("aria", STEPS), [0.125, 0.5, 1.0, np.nan, 0.0, 0.5, 1.0, 0.0])  # B's first step not kept
    close(method_weights("no_aggregation", STEPS), [0.25, 0.5, 1.0, 0.0, 0.0, 0.5, 1.0, 0.0])
    close(method_weights("bc", STEPS), [1.0] * 8)
    close(method_weights("filtered_bc", STEPS), [1, 1, 1, np.nan, np.nan, 1, 1, np.nan])


def test_aria_adv():
    # A = Q − V on the kept steps: [0, .375, .5, (B0 not kept), −.125, 0, .5, 0]; min-max over kept -> (A + .125)/.625
    close(method_weights("aria_adv", STEPS), [0.2, 0.8, 1.0, np.nan, 0.0, 0.2, 1.0, 0.2])


def test_starpo_refuses_a_game_whose_steps_disagree_on_its_return_or_group():
    """StarPO gives a trajectory one advantage from its R and its target's group: steps of one game
    that disagree (a file made elsewhere) would have one of them chosen silently."""
    steps = [dict(s) for s in STEPS]
    steps[4]["final_reward"] = 1.0
    with pytest.raises(KeyError, match=re.escape("step 4: 'final_reward' is 1.0, but an earlier step of game 'B' has 0.0")):
        method_weights("starpo", steps)
    steps = [dict(s) for s in STEPS]
    steps[2]["target"] = "dog"
    with pytest.raises(KeyError, match=re.escape("step 2: 'target' is 'dog', but an earlier step of game 'A' has 'cat'")):
        method_weights("starpo", steps)


def test_starpo_groups_games_by_target():
    # cat: R = (1, 0) over two games: mean .5, unbiased std √.5 -> ±.5/√.5 = ±√.5, on every step of the game.
    # dog and fox: one game each -> 0.
    a = SQRT_HALF
    close(method_weights("starpo", STEPS), [a, a, a, -a, -a, 0, 0, 0])
    # all won (or all lost) in a group: 0; every group of one game: R itself (RAGEN skips the normalisation)
    twins = [dict(s, game_id=s["game_id"] + "2") for s in STEPS if s["game_id"] == "C"]
    close(method_weights("starpo", STEPS[5:7] + twins), [0, 0, 0, 0])
    close(method_weights("starpo", STEPS[5:]), [1, 1, 0])
    lost_twins = [STEPS[7], dict(STEPS[7], game_id="D2")]  # all lost: 0
    close(method_weights("starpo", STEPS[:3] + lost_twins), [0, 0, 0, 0, 0])


def test_two_player_tie():
    """A no-deal is a tie (0.5 each): nobody won, so filtered BC drops both players' steps;
    StarPO groups each role's games apart (Alice's with Alice's)."""
    tie = [dict(step("T", 0, "t0", 0.5, 0.5, "cfg1", False), role="alice"),
           dict(step("T", 1, "t0|x", 0.5, 0.5, "cfg1", False), role="bob")]
    won = [dict(step("W", 0, "t0", 1.0, 1.0, "cfg1", True), role="alice"),
           dict(step("W", 1, "t0|y", 0.0, 0.0, "cfg1", False), role="bob")]
    close(method_weights("filtered_bc", tie + won), [np.nan, np.nan, 1.0, np.nan])
    # Alice: R = (.5, 1) -> ∓√.5; Bob: R = (.5, 0) -> ±√.5 (each role's own reward, never the game's other one)
    close(method_weights("starpo", tie + won), [-SQRT_HALF, SQRT_HALF, SQRT_HALF, -SQRT_HALF])


def test_gigpo_by_hand():
    # Episode level, over the steps of a target group (verl-agent normalises over step rows):
    #   cat: scores (1, 1, 1, 0, 0): mean .6, unbiased std √.3 -> A: .4/√.3, B: −.6/√.3
    #   dog: (1, 1): equal -> 0;  fox: one step -> its raw score, 0
    # Step level, anchors = equal histories within a target group: only h0 is shared (A0: .25, B0: 0):
    #   mean .125, std .125·√2 -> ±√.5; every other step is alone -> 0.
    ea, eb = 0.4 / math.sqrt(0.3), -0.6 / math.sqrt(0.3)
    close(method_weights("gigpo", STEPS), [ea + SQRT_HALF, ea, ea, eb - SQRT_HALF, eb, 0, 0, 0])
    # a group of one step keeps its raw score at the episode level
    lone_win = [dict(STEPS[7], final_reward=1.0, step_return=1.0)]
    close(method_weights("gigpo", lone_win), [1.0])


def test_gigpo_step_groups_stay_within_a_target():
    """The same opening text in games of two targets is two states (GiGPO's anchors live inside an
    episode group): each step is alone at both levels -> its raw score, + 0."""
    same_text = [step("P", 0, "h0", 1.0, 0.5, "cat", True), step("Q", 0, "h0", 0.0, 0.0, "dog", False)]
    close(method_weights("gigpo", same_text), [1.0, 0.0])


def test_gigpo_similarity_groups_by_hand():
    """verl-agent's greedy grouping after the shared prefix "P|": "abcdefghiX" against the first
    text "abcdefghij" has 9 matching characters of 20, ratio 2 * 9 / 20 = 0.9, so it joins at 0.9
    and not at 0.95; "zzzzzzzzzz" matches nothing."""
    from aria.trainers.methods import similarity_groups

    texts = ["P|abcdefghij", "P|abcdefghiX", "P|zzzzzzzzzz"]
    assert similarity_groups(texts, 0.9).tolist() == [0, 0, 1]
    assert similarity_groups(texts, 0.95).tolist() == [0, 1, 2]
    # a long shared prompt does not make different histories similar: it is cut first
    prompt = "The rules of the game. " * 40
    assert similarity_groups([prompt + "Q: alive? A: yes", prompt + "Q: metal? A: no"], 0.9).tolist() == [0, 1]
    with pytest.raises(ValueError, match=r"must be in \(0, 1\)"):
        similarity_groups(texts, 1.0)
    # The weights: one target, R = (1, 0, 1) on one step each. Episode level: mean 2/3, unbiased std
    # √(1/3): wins (1/3)/√(1/3) = 1/√3, the loss −2/√3. Step level at 0.9: the first two share an anchor,
    # returns (1, 0) -> ±√.5; the third is alone -> 0. Exact anchors (gigpo) leave all three alone.
    steps = [step(g, 0, t, r, r, "cat", bool(r)) for g, t, r in zip("XYZ", texts, (1.0, 0.0, 1.0))]
    win, loss = 1 / math.sqrt(3), -2 / math.sqrt(3)
    close(method_weights("gigpo_similar", steps), [win + SQRT_HALF, loss - SQRT_HALF, win])
    close(method_weights("gigpo", steps), [win, loss, win])


def test_traj_dpo_pairs():
    # cat: A won, B lost -> one pair; dog: C won alone, fox: D lost alone -> none (groups of one).
    assert method_pairs("traj_dpo", STEPS) == [((0, 1, 2), (3, 4))]
    # Another won and two more lost cat games: pair j = (W[j mod 2], L[j mod 3]) for j < 3.
    more = [step("E", 0, "h0", 1.0, 1.0, "cat", True), step("F", 0, "h0", 0.0, 0.0, "cat", False),
            step("G", 0, "h0", 0.0, 0.0, "cat", False), step("G", 1, "h0|g", 0.0, 0.0, "cat", False)]
    assert method_pairs("traj_dpo", STEPS + more) == [((0, 1, 2), (3, 4)), ((8,), (9,)), ((0, 1, 2), (10, 11))]
    # All won or all lost in a group: no pair; equal rewards do not matter, success does.
    assert method_pairs("traj_dpo", STEPS[:3] + [step("E", 0, "h0", 1.0, 1.0, "cat", True)]) == []
    assert method_pairs("traj_dpo", STEPS[3:5] + [step("F", 0, "h0", 0.0, 0.0, "cat", False)]) == []
    # Two-player: a game holds two trajectories, grouped by (target, role); the winner of each seat is chosen.
    seats = [dict(step("g1", 0, "o", 1.0, 1.0, "cfg", True), role="alice"),
             dict(step("g1", 0, "o", 0.0, 0.0, "cfg", False), role="bob"),
             dict(step("g2", 0, "o", 0.0, 0.0, "cfg", False), role="alice"),
             dict(step("g2", 0, "o", 1.0, 1.0, "cfg", True), role="bob")]
    assert method_pairs("traj_dpo", seats) == [((0,), (2,)), ((3,), (1,))]


def test_aria_with_one_cluster_per_text_is_the_mean_return_over_equal_texts():
    """With every distinct text its own cluster, ARIA's Q of a step is the mean step return of the
    steps whose (history, action) texts are exactly equal: checked through the real pipeline maths."""
    from aria.intention.aggregate import aggregate
    from aria.intention.corpus import IntentionSpec, build_corpus
    from aria.trajectories import make_record

    spec = IntentionSpec.from_config({"channels": {"action": {"cluster": "q"}, "observation": {"cluster": "a"}},
                                      "trained": ["action"]})
    games = [([("Is it alive?", "No."), ("Is it metal?", "Yes."), ("Is it a spoon?", "Yes.")], True),
             ([("Is it alive?", "No."), ("Is it metal?", "Yes."), ("Is it a fork?", "No.")], False),
             ([("Is it alive?", "No."), ("Is it red?", "No.")], False),
             ([("Is it alive?", "Yes.")], True)]
    records = [make_record(game_id=f"g{i}", game="twenty_questions", target=None, success=won,
                           turns=[{"action": f"Question: {q}", "question": q, "observation": a, "reward": -1.0} for q, a in qa])
               for i, (qa, won) in enumerate(games)]
    corpus = build_corpus(records, spec, gamma=0.5, use_precomputed=False)
    labels = {p: np.arange(len(texts)) for p, texts in corpus.pools.items()}  # one cluster per distinct text
    got = aggregate(corpus.table, corpus.utterance_labels(labels)).reward
    # By hand, R_t = .5^(T−t)·R: g0 (.25, .5, 1), g1 (0, 0, 0), g2 (0, 0), g3 (1).
    # Equal (history, action): "alive?" opens all four games -> (.25 + 0 + 0 + 1)/4; "metal?" after "alive? No."
    # in g0, g1 -> (.5 + 0)/2; "red?" after "alive? No." in g2 -> 0; the last questions of g0, g1 are unique.
    close(got, [0.3125, 0.25, 1.0, 0.3125, 0.25, 0.0, 0.3125, 0.0, 0.3125])


def method_config(tmp_path, model_dir, *overrides: str) -> dict:
    """The offline config on STEPS (written to ``tmp_path``), tiny model, one process, lr 0.01."""
    import json
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    repo = Path(__file__).resolve().parents[1]
    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps(STEPS))
    with initialize_config_dir(config_dir=str(repo / "config"), version_base="1.3"):
        return OmegaConf.to_container(compose("reinforce_llm", overrides=[
            f"model.path={model_dir}", f"data.train_file={train_file}", f"output_dir={tmp_path / 'out'}",
            "device=cpu", "train.mixed_precision=no", "train.gradient_accumulation_steps=1", "train.lr=0.01",
            "train.save_freq=1000", *overrides]), resolve=True)


@pytest.mark.parametrize("name", WEIGHT_METHODS)
def test_two_steps_of_every_method_on_a_tiny_model(name, tmp_path, tiny_model_dir):
    """Every method trains through the offline trainer: the weights it trains on are the method's
    (NaN steps dropped), the release's −1 demonstration marker is off (these are pipeline step 4's
    steps: a reward of −1 is a reward), and its optimizer steps change the adapter."""
    import torch

    from aria.trainers.offline import OfflineTrainer

    # no warm-up: a run of one step (filtered_bc) would take it at a learning rate of 0
    cfg = method_config(tmp_path, tiny_model_dir, "train.epochs=1", "train.micro_batch_size=4", "train.warmup_ratio=0",
                        f"method={name}")
    trainer = OfflineTrainer(cfg)
    weights = method_weights(name, STEPS)
    expected = [(s["game_id"], s["turn"], w) for s, w in zip(STEPS, weights) if np.isfinite(w)]
    got = [(s["game_id"], s["turn"], float(r)) for s, r in zip(trainer.samples, trainer.rewards)]
    assert [g[:2] for g in got] == [e[:2] for e in expected]
    close([g[2] for g in got], [e[2] for e in expected])
    assert trainer.loss_options["sft_reward"] is None
    before = {k: v.clone() for k, v in trainer.model.named_parameters() if v.requires_grad}
    result = trainer.train()
    # about two micro-batches of 4 (whole games: filtered_bc's won game is one micro-batch of its own)
    assert result["steps"] == trainer.total_steps and 1 <= result["steps"] <= 2
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_the_demonstration_marker_is_the_release_files_and_aria_s_only(tmp_path, tiny_model_dir):
    """The release's ARIA files mark demonstrations with a reward of exactly −1 (their SFT term);
    a file of pipeline step 4 (its steps carry step_return) has none: there R̃ = −1 is a two-player
    role's reward and must keep its sign (before: trained as imitation)."""
    import json

    from aria.trainers.offline import OfflineTrainer

    release = [{"observation": s["observation"], "action": s["action"], "reward": -1.0 if i == 0 else 0.5}
               for i, s in enumerate(STEPS)]
    for name, steps, expected in (("aria", release, -1.0), ("aria", STEPS, None), ("bc", release, None)):
        cfg = method_config(tmp_path, tiny_model_dir, "train.epochs=1", "train.micro_batch_size=4", f"method={name}")
        (tmp_path / "train.json").write_text(json.dumps(steps))
        assert OfflineTrainer(cfg).loss_options["sft_reward"] == expected, (name, expected)


def test_two_steps_of_trajectory_dpo_on_a_tiny_model(tmp_path, tiny_model_dir):
    """traj_dpo trains on the pair (A, B): its log-probs are the sums over the agent's steps, the
    reference is the base model (the adapter off, before and after training), the first loss is
    log 2 (policy = reference), and two steps make the policy prefer the won game."""
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aria.llm.policy import Encoding
    from aria.trainers.dpo import TrajectoryDPOTrainer
    from aria.trainers.methods import trainer_for
    from conftest import naive_action_logprob

    cfg = method_config(tmp_path, tiny_model_dir, "train.epochs=2", "train.micro_batch_size=1", "train.warmup_ratio=0",
                        "method=traj_dpo")
    assert trainer_for(cfg) is TrajectoryDPOTrainer
    trainer = TrajectoryDPOTrainer(cfg)
    assert [(s["game_id"], s["turn"], s["weight"]) for s in trainer.samples] == \
        [("A", 0, 1.0), ("A", 1, 1.0), ("A", 2, 1.0), ("B", 0, -1.0), ("B", 1, -1.0)]
    assert trainer.trajectories == [[0, 1, 2], [3, 4]] and trainer.pairs.tolist() == [[0, 1]]

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    encoding = Encoding.of(trainer.cfg.data)
    with torch.no_grad():
        by_hand = [sum(float(naive_action_logprob(base, encoding.encode(tokenizer, s["observation"], s["action"])))
                       for s in STEPS[a:b]) for a, b in ((0, 3), (3, 5))]
    torch.testing.assert_close(trainer.reference, torch.tensor(by_hand), rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        first = trainer.micro_loss(trainer.make_batch([0]), [0])
    assert abs(float(first) - math.log(2)) < 1e-4

    result = trainer.train()
    assert result["steps"] == 2 and result["pairs"] == 1 and result["reward_accuracy"] == 1.0
    torch.testing.assert_close(trainer.reference_logprobs(), torch.tensor(by_hand), rtol=1e-4, atol=1e-4)
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert abs(metrics[0]["loss"] - math.log(2)) < 1e-4 and metrics[1]["loss"] < metrics[0]["loss"]


def test_trajectory_dpo_without_a_pair_is_one_line(tmp_path):
    """The training command in this process (through a subprocess: tests/test_cli.py)."""
    from pathlib import Path

    from in_process import run_script

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "train.json").write_text(__import__("json").dumps(STEPS[5:]))  # dog won, fox lost: no shared target
    done = run_script(repo / "scripts/run_offline.py", "method=traj_dpo", "model.path=/no/model",
                      f"data.train_file={tmp_path / 'train.json'}", f"output_dir={tmp_path / 'out'}")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "no pair of a won and a lost game with the same target" in done.stderr.strip().splitlines()[-1]


def test_an_unknown_method_is_one_line_before_the_model_loads(tmp_path):
    """The training command in this process (through a subprocess: tests/test_cli.py)."""
    from pathlib import Path

    from in_process import run_script

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "train.json").write_text(__import__("json").dumps(STEPS))
    done = run_script(repo / "scripts/run_offline.py", "method=ppo", "model.path=/no/model",
                      f"data.train_file={tmp_path / 'train.json'}", f"output_dir={tmp_path / 'out'}")
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("error: method: unknown 'ppo'")


def games_for_two_processes() -> list[dict]:
    """Four targets, each with a won and a lost two-step game: 16 steps, 4 DPO pairs."""
    steps = []
    for k, target in enumerate(["cat", "dog", "fox", "owl"]):
        for won in (True, False):
            game, final = f"{target}-{'won' if won else 'lost'}", float(won)
            steps += [step(game, 0, f"{target}0", final, 0.5 * final, target, won, reward=0.5 * final),
                      step(game, 1, f"{target}0|{k}{won}", final, final, target, won, reward=final)]
    return steps


@pytest.mark.parametrize("name, processes, units, accumulation, steps_per_epoch",
                         [("gigpo", 2, 16, 2, 2), ("traj_dpo", 2, 4, 1, 2), ("traj_dpo", 1, 4, 1, 4)])
def test_accelerate_launch_and_resume_per_method(name, processes, units, accumulation, steps_per_epoch, tmp_path,
                                                 tiny_model_dir):
    """`accelerate launch` with two CPU processes trains a group-normalised method (GiGPO, with
    gradient accumulation: 16 samples / (2 a micro-batch x 2 accumulated x 2 processes) = 2 optimizer
    steps an epoch) and trajectory DPO, and the training command with one process (in this one: a
    launcher adds nothing to one process) trains trajectory DPO: two processes split the units
    (samples, pairs) without overlap, and a run resumed from an earlier checkpoint ends with the
    same weights as the uninterrupted one."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import torch
    from safetensors.torch import load_file

    repo = Path(__file__).resolve().parents[1]
    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps(games_for_two_processes()))
    out = tmp_path / "out"

    def launch() -> str:
        command = [str(repo / "scripts/run_offline.py"), f"model.path={tiny_model_dir}", f"data.train_file={train_file}",
                   f"output_dir={out}", "device=cpu", "train.mixed_precision=no", "train.epochs=2",
                   f"train.micro_batch_size={2 if name == 'gigpo' else 1}", f"train.gradient_accumulation_steps={accumulation}",
                   "train.save_freq=1", "train.keep_checkpoints=null", "train.lr=0.01", "model.lora.dropout=0.2",
                   "logging.write_data_order=true", f"method={name}"]
        if name == "gigpo":  # signed advantages: the bounded loss, its reference split across the processes
            command.append("loss.name=clipped_reinforce")
        if processes == 1:
            from in_process import run_script

            done = run_script(*command, cwd=tmp_path)
        else:
            done = subprocess.run(
                [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                 str(repo / f"config/accelerate/cpu_{processes}proc.yaml"), *command],
                capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    launch()
    total = 2 * steps_per_epoch
    seen = [{i for b in json.loads((out / f"data_order_epoch0_rank{r}.json").read_text()) for i in b}
            for r in range(processes)]
    assert all(seen) and sum(map(len, seen)) == units and set().union(*seen) == set(range(units))
    last = out / "checkpoints" / f"step-{total}"
    assert json.loads((last / "trainer_state.json").read_text())["world_size"] == processes
    if name == "gigpo":  # each process computed half the start model's log-probs; gathered, they are every sample's
        from aria.llm.policy import encode_sample, load_policy
        from aria.trainers.checkpoint import load_state
        from conftest import naive_action_logprob

        tokenizer, base = load_policy(str(tiny_model_dir))
        encoded = [encode_sample(tokenizer, s["observation"], s["action"], 512) for s in games_for_two_processes()]
        stored = load_state(out / "reference_logprobs.safetensors")["logp"]
        per_sample = torch.split(stored, [e.action_len for e in encoded])
        with torch.no_grad():
            assert [float(t.sum()) for t in per_sample] == pytest.approx(
                [float(naive_action_logprob(base, e)) for e in encoded], abs=1e-4)
    expected = load_file(str(last / "trainable.safetensors"))

    for folder in [out / "final", *(out / "checkpoints" / f"step-{s}" for s in range(3, total + 1))]:
        shutil.rmtree(folder)
    log = launch()
    assert "resumed from" in log and "step-2" in log
    got = load_file(str(last / "trainable.safetensors"))
    early = load_file(str(out / "checkpoints" / "step-2" / "trainable.safetensors"))
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6)
    assert any(not torch.allclose(early[key], expected[key]) for key in expected)
    assert (out / "final" / "adapter_model.safetensors").is_file()
