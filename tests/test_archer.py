"""ArCHer's critic trainer and actor (aria/trainers/archer.py, method ``archer``): turn rewards and
the ranking accuracy by hand; the trainer learns a planted value (held-out ranking above a floor)
and writes every step's advantage; an interrupted run resumes bit-identical; bad data is one
line; two actor steps raise the log-probability of the higher-advantage action; two processes
under accelerate."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from aria.trainers.archer import CriticTrainer, ranking_accuracy, turn_rewards
from aria.trainers.checkpoint import load_state
from in_process import run_script

REPO = Path(__file__).resolve().parents[1]
OPENING = "Let's play a game of Twenty Questions. Guess the object.\nHere is the game history:\n"
OBJECTS = ["cat", "dog", "fox", "owl", "hen", "cow", "pig", "elk", "bee", "ant", "eel", "yak"]


def planted_games(n: int) -> list[dict]:
    """n three-step games with one history at each turn: two fixed questions, then the utterance
    that decides, "Question: Is it a win?" (final reward 1) or "Question: Is it a loss?" (0),
    alternating. So the values are known by hand (γ = 0.95): Q(s_2, win) = 1, Q(s_2, loss) = 0,
    V(s_2) = 0.5, Q(s_1, ·) = V(s_1) = 0.95 · 0.5 = 0.475, Q(s_0, ·) = V(s_0) = 0.95² · 0.5 = 0.45125."""
    steps = []
    for g in range(n):
        won = g % 2 == 0
        history = OPENING
        for turn, action in enumerate(["Question: Is it an animal?", "Question: Is it alive?",
                                       f"Question: Is it a {'win' if won else 'loss'}?"]):
            steps.append({"game_id": f"g{g}", "turn": turn, "observation": history, "action": action,
                          "reward": 1.0 if won else 0.0, "final_reward": 1.0 if won else 0.0, "success": won,
                          "step_return": (0.95 ** (2 - turn)) * (1.0 if won else 0.0)})
            history += f"{action}\nAnswer: No.\n"
    return steps


def critic_config(tmp_path: Path, encoder: Path, steps: list[dict], *overrides: str) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps(steps))
    with initialize_config_dir(config_dir=str(REPO / "config"), version_base="1.3"):
        cfg = compose("critic", overrides=[
            f"critic.encoder={encoder}", "critic.hidden=32", "critic.max_tokens=128", f"data.train_file={train_file}",
            f"output_dir={tmp_path / 'out'}", "device=cpu", "train.mixed_precision=no", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def test_turn_rewards_and_ranking_accuracy_by_hand():
    steps = [{"final_reward": 1.0}, {"final_reward": 1.0}, {"final_reward": -2.0}]
    # the game pays at the end: the last step of each player holds its final reward
    assert turn_rewards(steps, torch.tensor([0.0, 1.0, 1.0])).tolist() == [0.0, 1.0, -2.0]
    # won 3, 1; lost 2, 1: pairs (3>2) 1, (3>1) 1, (1<2) 0, (1=1) 0.5 -> 2.5 / 4
    assert ranking_accuracy([3, 1, 2, 1], [True, True, False, False]) == 0.625
    # by turn: turn 0 has won 3 against lost 2 (1 of 1); turn 1 has won 1 against lost 1 (a tie, 0.5) -> 1.5 / 2
    assert ranking_accuracy([3, 1, 2, 1], [True, True, False, False], strata=[0, 1, 0, 1]) == 0.75
    assert ranking_accuracy([1, 2], [True, True]) is None  # no lost step: no pair


def test_the_critic_trainer_learns_the_values_by_hand_and_writes_advantages(tmp_path, tiny_sentence_model_dir):
    """TD with bootstrapping reaches the hand values of :func:`planted_games` (within 0.1); the
    written advantage is min Q − min V of every step: positive for the winning utterance, negative
    for the losing one, about 0 where every game says the same. On the held-out games Q ranks
    won above lost steps where the utterance decides (turn 2) and ties where the games do not
    differ (turns 0 and 1): 2/3 of the same-turn pairs, by hand."""
    steps = planted_games(16)
    cfg = critic_config(tmp_path, tiny_sentence_model_dir, steps, "train.epochs=25", "train.micro_batch_size=12",
                        "train.gradient_accumulation_steps=1", "train.lr=3e-3", "critic.tau=0.5",
                        "data.eval_fraction=0.25", "train.save_freq=1000")
    result = CriticTrainer(cfg).train()
    assert result["steps"] == 25 * 3  # 12 training games x 3 steps / 12 per micro-batch
    assert result["eval_steps"] == 12  # 4 held-out games
    assert result["eval_ranking_accuracy_same_turn"] == pytest.approx(2 / 3, abs=1e-4), result
    assert result["eval_td_mse"] < 0.01, result
    rows = json.loads(Path(result["train_file"]).read_text())
    assert len(rows) == len(steps)
    assert all(r["advantage"] == pytest.approx(r["critic_q"] - r["critic_v"], abs=1e-6) for r in rows)
    by_hand = {(0, True): 0.45125, (0, False): 0.45125, (1, True): 0.475, (1, False): 0.475, (2, True): 1.0, (2, False): 0.0}
    for r in rows:
        assert r["critic_q"] == pytest.approx(by_hand[r["turn"], r["success"]], abs=0.1), r
    for r in rows:
        expected = {2: 0.5 if r["success"] else -0.5}.get(r["turn"], 0.0)
        assert r["advantage"] == pytest.approx(expected, abs=0.15), r
    final = tmp_path / "out" / "final"
    saved = load_state(final / "critic.safetensors")
    assert set(saved) == {"online", "target"} and json.loads((final / "critic.json").read_text())["steps"] == 75
    # the target copy trails the online critic (Polyak averaging), it is not a copy of it
    assert not torch.equal(saved["online"]["q1.4.weight"], saved["target"]["q1.4.weight"])
    assert json.loads((tmp_path / "out" / "eval.json").read_text())["eval_steps"] == 12


def test_a_frozen_encoder_trains_the_heads_on_one_encoding_of_each_text(tmp_path, tiny_sentence_model_dir):
    """``critic.train_encoder=false``: the encoder's weights end as they began, each distinct text is
    encoded once (shared with the target copy), and the heads still learn the hand values."""
    from transformers import AutoModel

    steps = planted_games(16)
    cfg = critic_config(tmp_path, tiny_sentence_model_dir, steps, "critic.train_encoder=false", "train.epochs=80",
                        "train.micro_batch_size=12", "train.gradient_accumulation_steps=1", "train.lr=1e-2",
                        "critic.tau=0.5", "data.eval_fraction=0.25", "train.save_freq=1000")
    trainer = CriticTrainer(cfg)
    trainer.train()
    texts = {s["observation"] for s in steps} | {s["action"] for s in steps}
    assert trainer.target.cache is trainer.model.cache and set(trainer.model.cache) == texts  # 3 histories, 4 utterances
    critic = trainer.accelerator.unwrap_model(trainer.model)
    critic.encoder.eval()
    with torch.no_grad():  # kept without dropout: the encoder's output in evaluation mode
        torch.testing.assert_close(trainer.model.cache[OPENING], critic._encode([OPENING])[0])
    saved = load_state(tmp_path / "out" / "final" / "critic.safetensors")["online"]
    start = AutoModel.from_pretrained(str(tiny_sentence_model_dir)).state_dict()
    assert all(torch.equal(saved[f"encoder.{name}"], value) for name, value in start.items() if f"encoder.{name}" in saved)
    rows = json.loads((tmp_path / "out" / "train.json").read_text())
    by_hand = {0: 0.45125, 1: 0.475}
    for r in rows:
        assert r["critic_q"] == pytest.approx(by_hand.get(r["turn"], 1.0 if r["success"] else 0.0), abs=0.1), r


def test_an_interrupted_critic_run_resumes_bit_identical(tmp_path, tiny_sentence_model_dir):
    steps = planted_games(8)
    # one thread, whatever the load: under train.threads=auto the count follows the free cores, and
    # two runs that sum in another order differ in the last bit (the suite's workers fix it at 1 too)
    common = ["train.epochs=2", "train.micro_batch_size=4", "train.gradient_accumulation_steps=2", "train.save_freq=1",
              "train.lr=1e-3", "data.eval_fraction=0.25", "train.keep_checkpoints=null", "train.threads=1"]
    full = CriticTrainer(critic_config(tmp_path / "full", tiny_sentence_model_dir, steps, *common)).train()
    assert full["steps"] == 4  # 6 training games x 3 steps = 18 -> 5 micro-batches -> 2 steps an epoch

    def crash(step):
        if step == 3:
            raise KeyboardInterrupt

    cut_cfg = critic_config(tmp_path / "cut", tiny_sentence_model_dir, steps, *common)
    with pytest.raises(KeyboardInterrupt):
        CriticTrainer(cut_cfg, on_step=crash).train()
    (tmp_path / "cut" / "out" / "checkpoints" / "step-3").rename(tmp_path / "cut" / "step-3-away")  # resume from 2
    resumed = CriticTrainer(cut_cfg).train()
    assert resumed["resumed_from"].endswith("step-2") and resumed["steps"] == 4
    expected = load_state(tmp_path / "full" / "out" / "final" / "critic.safetensors")
    got = load_state(tmp_path / "cut" / "out" / "final" / "critic.safetensors")
    for part in ("online", "target"):
        for name, value in expected[part].items():
            assert torch.equal(got[part][name], value), (part, name)
    early = load_state(tmp_path / "full" / "out" / "checkpoints" / "step-1" / "critic.safetensors")
    assert not torch.equal(early["online"]["v1.0.weight"], expected["online"]["v1.0.weight"])  # it did train
    # other data in the same output_dir is not continued
    other = critic_config(tmp_path / "cut", tiny_sentence_model_dir, planted_games(9), *common)
    with pytest.raises(ValueError, match="trained on other data"):
        CriticTrainer(other).train()


@pytest.mark.parametrize("field, value, message", [
    ("final_reward", None, "field 'sample 4.final_reward': missing"),
    ("final_reward", "1", "field 'sample 4.final_reward': expected a finite number"),
    ("turn", 1.5, "field 'sample 4.turn': expected a whole number >= 0, got 1.5"),
    ("turn", -1, "field 'sample 4.turn': expected a whole number >= 0, got -1"),
])
def test_bad_steps_are_one_line_before_the_encoder_loads(tmp_path, field, value, message):
    steps = planted_games(3)
    if value is None:
        del steps[4][field]
    else:
        steps[4][field] = value
    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps(steps))
    done = run_script(REPO / "scripts/train_critic.py", f"data.train_file={train_file}", "critic.encoder=/nonexistent",
                      f"output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and str(train_file) in last and message in last, last
    assert not (tmp_path / "out").exists()


def test_two_actor_steps_raise_the_log_prob_of_the_higher_advantage_action(tmp_path, tiny_model_dir, capsys):
    """method=archer trains the token policy on the written advantages with the REINFORCE of every
    method: of two utterances at one history, the one with the positive advantage gains log-prob
    and the one with the negative advantage loses it."""
    from aria.trainers.offline import OfflineTrainer
    from test_offline_trainer import config, final_logprob

    good = {"observation": OPENING, "action": "Question: Is it an animal?", "reward": 0.0, "advantage": 0.8,
            "game_id": "g0", "turn": 0}
    bad = {"observation": OPENING, "action": "Question: Is it a car?", "reward": 0.0, "advantage": -0.6,
           "game_id": "g1", "turn": 0}
    before = [final_logprob(tiny_model_dir, tiny_model_dir, s) for s in (good, bad)]
    cfg = config(tmp_path, tiny_model_dir, [good, bad], "method=archer", "train.epochs=2", "train.micro_batch_size=2",
                 "train.gradient_accumulation_steps=1", "train.lr=0.01", "train.optimizer=adam")
    assert OfflineTrainer(cfg).train()["steps"] == 2
    assert "[train] warning: 50% of the samples have a negative weight (method archer)" in capsys.readouterr().out
    after = [final_logprob(tiny_model_dir, tmp_path / "out" / "final", s) for s in (good, bad)]
    assert after[0] > before[0] + 1e-3 and after[1] < before[1] - 1e-3, (before, after)


def test_archer_without_advantages_says_what_writes_them(tmp_path, tiny_model_dir):
    from aria.io import DataError
    from aria.trainers.offline import OfflineTrainer
    from test_offline_trainer import config

    cfg = config(tmp_path, tiny_model_dir, planted_games(2), "method=archer")
    with pytest.raises(DataError, match="no 'advantage', which method 'archer' needs \\(re-run scripts/train_critic.py"):
        OfflineTrainer(cfg)


@pytest.mark.subprocess
def test_two_processes_under_accelerate_train_one_critic(tmp_path, tiny_sentence_model_dir):
    steps = planted_games(8)
    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps(steps))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "config/accelerate/cpu_2proc.yaml"),
         str(REPO / "scripts/train_critic.py"), f"critic.encoder={tiny_sentence_model_dir}", "critic.hidden=16",
         "critic.max_tokens=64", f"data.train_file={train_file}", f"output_dir={out}", "device=cpu",
         "train.mixed_precision=no", "train.epochs=1", "train.micro_batch_size=2", "train.gradient_accumulation_steps=2",
         "train.save_freq=1", "data.eval_fraction=0.25"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # 18 training steps / (2 per micro-batch x 2 accumulation x 2 processes) -> 2 steps (the last micro-batches dropped)
    state = json.loads((out / "checkpoints" / "step-2" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["step"] == 2
    assert "[critic] 2 steps" in done.stdout and len(json.loads((out / "train.json").read_text())) == len(steps)
