"""Pointwise reward model (aria/trainers/reward_model.py) on a tiny random Llama built in the test."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import load_file

from aria.trainers.reward_model import (
    RewardModelTrainer, correlations, held_out_split, load_reward_model, score_encoded,
)
from aria.policy import encode_sample

REPO = Path(__file__).resolve().parents[1]


def config(tmp_path: Path, model_dir: Path, data: list[dict], *overrides: str) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps(data))
    with initialize_config_dir(config_dir=str(REPO / "config"), version_base="1.3"):
        cfg = compose("reward_model", overrides=[
            f"model.path={model_dir}", f"data.train_file={train_file}", f"output_dir={tmp_path / 'out'}",
            "device=cpu", "train.mixed_precision=no", "train.warmup_ratio=0", "train.lr_scheduler=constant", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def test_held_out_split_keeps_games_whole():
    data = [{"game_id": f"g{i // 3}", "observation": "o", "action": "a", "reward": 0.0} for i in range(30)]
    train, held = held_out_split(data, 0.2, seed=1)
    assert len(held) == 6 and len(train) == 24
    assert not {s["game_id"] for s in train} & {s["game_id"] for s in held}
    assert held_out_split(data, 0.2, seed=1) == (train, held)
    assert held_out_split(data, 0.0, seed=1) == (data, [])
    with pytest.raises(ValueError):
        held_out_split(data, 1.0, seed=1)


def test_correlations():
    c = correlations([1, 2, 3, 4], [2, 4, 6, 9])
    assert c["spearman"] == pytest.approx(1.0) and 0.98 < c["pearson"] < 1.0
    assert correlations([1, 1, 1], [0, 1, 2]) == {"pearson": None, "spearman": None}


def toy_set(n_games: int) -> list[dict]:
    """Separable: an action answering 'Yes.' is worth 1, one answering 'No.' is worth 0."""
    rng = np.random.default_rng(0)
    data = []
    for g in range(n_games):
        for t in range(2):
            good = bool(rng.integers(0, 2))
            data.append({"game_id": f"g{g}", "turn": t, "reward": 1.0 if good else 0.0,
                         "observation": "Let's play a game. Question: Is it an animal? " * (1 + (g + t) % 3),
                         "action": "Yes. Yes. It is a fruit." if good else "No. No. Is it alive?"})
    return data


def test_reward_model_learns_a_separable_toy_set(tmp_path, tiny_model_dir):
    cfg = config(tmp_path, tiny_model_dir, toy_set(40), "train.epochs=6", "train.micro_batch_size=8",
                 "train.gradient_accumulation_steps=1", "train.lr=3e-3", "data.eval_fraction=0.25", "train.save_freq=1000")
    result = RewardModelTrainer(cfg).train()
    assert result["eval_samples"] == 20  # 10 of 40 games, 2 steps each
    assert result["eval_pearson"] > 0.9, result
    saved = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert saved["eval_pearson"] == result["eval_pearson"] and saved["step"] == result["steps"]
    # The saved model scores like the trained one: load it back through from_pretrained.
    tokenizer, model = load_reward_model(str(tmp_path / "out" / "final"))
    held = toy_set(40)
    encoded = [encode_sample(tokenizer, s["observation"], s["action"], 512, append_eos=False) for s in held]
    scores = score_encoded(model, encoded, tokenizer.pad_token_id)
    good = scores[[s["reward"] == 1.0 for s in held]]
    bad = scores[[s["reward"] == 0.0 for s in held]]
    assert good.min() > bad.max()


def test_padding_does_not_change_a_score(tmp_path, tiny_model_dir):
    tokenizer, model = load_reward_model(str(tiny_model_dir))
    data = toy_set(4)
    encoded = [encode_sample(tokenizer, s["observation"], s["action"], 512, append_eos=False) for s in data]
    together = score_encoded(model, encoded, tokenizer.pad_token_id, batch_size=8)
    alone = np.array([score_encoded(model, [e], tokenizer.pad_token_id)[0] for e in encoded])
    assert len({len(e.input_ids) for e in encoded}) > 1
    assert together == pytest.approx(alone, abs=1e-5)


def test_interrupted_and_resumed_run_ends_with_the_same_weights(tmp_path, tiny_model_dir):
    data = toy_set(8)
    common = ["train.epochs=2", "train.micro_batch_size=2", "train.gradient_accumulation_steps=2", "train.save_freq=1",
              "train.lr=0.003", "data.eval_fraction=0", "train.keep_checkpoints=null"]
    full = RewardModelTrainer(config(tmp_path / "full", tiny_model_dir, data, *common)).train()
    assert full["steps"] == 8  # 16 samples / 2 per micro-batch / 2 accumulation = 4 steps per epoch

    class Interrupt(Exception):
        pass

    def stop_at_5(step):
        if step == 5:
            raise Interrupt

    cfg = config(tmp_path / "cut", tiny_model_dir, data, *common)
    with pytest.raises(Interrupt):
        RewardModelTrainer(cfg, on_step=stop_at_5).train()
    resumed = RewardModelTrainer(cfg).train()
    assert resumed["resumed_from"].endswith("step-5") and resumed["steps"] == 8
    a = load_file(str(tmp_path / "full" / "out" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "out" / "final" / "model.safetensors"))
    first = load_file(str(tmp_path / "full" / "out" / "checkpoints" / "step-1" / "trainable.safetensors"))
    assert any(not torch.allclose(first[k], a[k]) for k in first if k in a)  # the run changed the weights
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_train_rm_sh_with_lora(tmp_path, tiny_model_dir):
    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps(toy_set(10)))
    env = {"TRAIN_FILE": str(train_file), "MODEL_PATH": str(tiny_model_dir), "OUTPUT_DIR": str(tmp_path / "rm"),
           "LORA": "true", "EPOCHS": "1", "MICRO_BATCH": "4", "GRAD_ACCUM": "1", "EVAL_FRACTION": "0.2"}
    import os

    done = subprocess.run(["bash", str(REPO / "scripts/train_rm.sh"), "device=cpu", "train.mixed_precision=no"],
                          env={**os.environ, **env}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "[reward model] 4 steps" in done.stdout and "held out (4 samples)" in done.stdout
    adapter = tmp_path / "rm" / "final" / "adapter_config.json"
    assert adapter.is_file()
    saved = load_file(str(tmp_path / "rm" / "final" / "adapter_model.safetensors"))
    assert any("score" in k for k in saved)  # the new head is saved with the adapter
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"observation": "o", "action": "a"}]))
    done = subprocess.run(["bash", str(REPO / "scripts/train_rm.sh"), "device=cpu"],
                          env={**os.environ, **env, "TRAIN_FILE": str(bad)}, capture_output=True, text=True)
    assert done.returncode == 2 and "sample 0.reward" in done.stderr.strip().splitlines()[-1]


def test_the_scorer_encodes_as_the_model_was_trained(tmp_path, tiny_model_dir):
    """A reward model trained with the end-of-turn token and a system prompt (not the defaults)
    saves that encoding beside its weights, and the in-process scorer reads it back: its scores
    equal scoring samples encoded exactly as in training, not as the scorer's own defaults."""
    from aria.policy import ENCODING_FILE, Encoding
    from aria.reward_service import InProcessScorer

    cfg = config(tmp_path, tiny_model_dir, toy_set(8), "train.epochs=1", "train.micro_batch_size=4",
                 "train.gradient_accumulation_steps=1", "train.lr=3e-3", "data.eval_fraction=0", "train.save_freq=1000",
                 "data.append_eos=true", "data.system_prompt=You judge questions.", "data.max_prompt_tokens=64")
    RewardModelTrainer(cfg).train()
    final = tmp_path / "out" / "final"
    assert json.loads((final / ENCODING_FILE).read_text()) == {"max_prompt_tokens": 64, "append_eos": True,
                                                               "system_prompt": "You judge questions."}
    samples = toy_set(3)
    got = InProcessScorer(final, max_prompt_tokens=512).score(samples)
    tokenizer, model = load_reward_model(str(final))
    trained_as = Encoding(64, True, "You judge questions.")
    expected = score_encoded(model, [trained_as.encode(tokenizer, s["observation"], s["action"]) for s in samples],
                             tokenizer.pad_token_id)
    defaults = score_encoded(model, [Encoding(512, False).encode(tokenizer, s["observation"], s["action"]) for s in samples],
                             tokenizer.pad_token_id)
    assert got == pytest.approx(expected, abs=1e-5)
    assert np.abs(expected - defaults).max() > 1e-3  # the two encodings score differently


def test_bfloat16_scores_are_within_the_stated_tolerance_of_float32(tmp_path, tiny_model_dir):
    """The scorer's bfloat16 path (``dtype="auto"`` on hardware with native bfloat16) against
    float32, on a reward model trained here: every score within BF16_SCORE_TOLERANCE, and the
    two classes of the toy set still apart. bfloat16 is forced, so this runs on any CPU."""
    from aria.reward_service import BF16_SCORE_TOLERANCE, InProcessScorer

    cfg = config(tmp_path, tiny_model_dir, toy_set(40), "train.epochs=6", "train.micro_batch_size=8",
                 "train.gradient_accumulation_steps=1", "train.lr=3e-3", "data.eval_fraction=0", "train.save_freq=1000")
    RewardModelTrainer(cfg).train()
    held = toy_set(16)
    full = InProcessScorer(tmp_path / "out" / "final", dtype="float32").score(held)
    half = InProcessScorer(tmp_path / "out" / "final", dtype="bfloat16").score(held)
    assert next(InProcessScorer(tmp_path / "out" / "final", dtype="bfloat16").model.parameters()).dtype == torch.bfloat16
    assert np.abs(half - full).max() <= BF16_SCORE_TOLERANCE, np.abs(half - full).max()
    assert np.abs(half - full).max() > 0  # it did run in another dtype
    good = [s["reward"] == 1.0 for s in held]
    assert half[good].min() > half[np.logical_not(good)].max()
