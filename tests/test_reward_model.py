"""Pointwise reward model (aria/trainers/reward_model.py) on a tiny random Llama built in the test."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import load_file

from aria.trainers.reward_model import (
    RewardModelTrainer, correlations, held_out_split, load_reward_model, score_encoded,
)
from aria.llm.policy import encode_sample

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


@pytest.fixture(scope="module")
def trained_toy_rm(tmp_path_factory, tiny_model_dir) -> tuple[dict, Path]:
    """A reward model trained on the toy set (its result, its folder): trained once, for the
    tests that need a trained model (six epochs take most of a minute)."""
    tmp_path = tmp_path_factory.mktemp("toy-rm")
    cfg = config(tmp_path, tiny_model_dir, toy_set(40), "train.epochs=6", "train.micro_batch_size=8",
                 "train.gradient_accumulation_steps=1", "train.lr=3e-3", "data.eval_fraction=0.25", "train.save_freq=1000")
    return RewardModelTrainer(cfg).train(), tmp_path


def test_reward_model_learns_a_separable_toy_set(trained_toy_rm):
    result, tmp_path = trained_toy_rm
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
              "train.lr=0.003", "data.eval_fraction=0", "train.keep_checkpoints=null",
              "train.threads=1"]  # one thread whatever the load: the same sums in the same order
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
    from aria.llm.policy import ENCODING_FILE, Encoding
    from aria.trainers.reward_service import InProcessScorer

    cfg = config(tmp_path, tiny_model_dir, toy_set(8), "train.epochs=1", "train.micro_batch_size=4",
                 "train.gradient_accumulation_steps=1", "train.lr=3e-3", "data.eval_fraction=0", "train.save_freq=1000",
                 "data.append_eos=true", "data.system_prompt=You judge questions.", "data.max_prompt_tokens=64",
                 "data.over_long=cut_left")
    RewardModelTrainer(cfg).train()
    final = tmp_path / "out" / "final"
    assert json.loads((final / ENCODING_FILE).read_text()) == {"max_prompt_tokens": 64, "append_eos": True,
                                                               "system_prompt": "You judge questions.",
                                                               "over_long": "cut_left", "context": 4096}
    samples = toy_set(3)
    got = InProcessScorer(final, max_prompt_tokens=512).score(samples)
    tokenizer, model = load_reward_model(str(final))
    trained_as = Encoding(64, True, "You judge questions.", "cut_left")
    expected = score_encoded(model, [trained_as.encode(tokenizer, s["observation"], s["action"]) for s in samples],
                             tokenizer.pad_token_id)
    defaults = score_encoded(model, [Encoding(512, False).encode(tokenizer, s["observation"], s["action"]) for s in samples],
                             tokenizer.pad_token_id)
    assert got == pytest.approx(expected, abs=1e-5)
    assert np.abs(expected - defaults).max() > 1e-3  # the two encodings score differently


def test_bfloat16_scores_are_within_the_stated_tolerance_of_float32(trained_toy_rm):
    """The scorer's bfloat16 path (``dtype="auto"`` on hardware with native bfloat16) against
    float32, on a reward model trained here: every score within BF16_SCORE_TOLERANCE, and the
    two classes of the toy set still apart. bfloat16 is forced, so this runs on any CPU."""
    from aria.trainers.reward_service import BF16_SCORE_TOLERANCE, InProcessScorer

    tmp_path = trained_toy_rm[1]
    held = toy_set(16)
    full = InProcessScorer(tmp_path / "out" / "final", dtype="float32").score(held)
    half = InProcessScorer(tmp_path / "out" / "final", dtype="bfloat16").score(held)
    assert next(InProcessScorer(tmp_path / "out" / "final", dtype="bfloat16").model.parameters()).dtype == torch.bfloat16
    assert np.abs(half - full).max() <= BF16_SCORE_TOLERANCE, np.abs(half - full).max()
    assert np.abs(half - full).max() > 0  # it did run in another dtype
    good = [s["reward"] == 1.0 for s in held]
    assert half[good].min() > half[np.logical_not(good)].max()


# ---- prefix-tree scoring --------------------------------------------------------------------------
def test_prefix_tree_packs_by_hand():
    from aria.packing import prefix_tree_packs

    sequences = [[1, 2, 3], [1, 2, 4], [1, 5], [1, 2, 3]]
    (pack,) = prefix_tree_packs(sequences, max_tokens=100)
    # Lexicographic order [1,2,3] (0), [1,2,3] (3), [1,2,4] (1), [1,5] (2): the duplicate adds no
    # node, [1,2,4] adds the 4 under [1,2], [1,5] adds the 5 under [1].
    assert pack.input_ids.tolist() == [1, 2, 3, 4, 5]
    assert pack.positions.tolist() == [0, 1, 2, 2, 1]
    assert pack.samples.tolist() == [0, 3, 1, 2] and pack.leaves.tolist() == [2, 2, 3, 4]
    seen = [set(np.flatnonzero(row).tolist()) for row in pack.attends]
    assert seen == [{0}, {0, 1}, {0, 1, 2}, {0, 1, 3}, {0, 4}]
    assert pack.trunk == 3  # the longest sample, [1,2,3], computed first without a mask
    # A budget of four nodes: [1,5] would be the fifth, so it starts a second pack.
    first, second = prefix_tree_packs(sequences, max_tokens=4)
    assert first.samples.tolist() == [0, 3, 1] and first.input_ids.tolist() == [1, 2, 3, 4]
    assert second.samples.tolist() == [2] and second.input_ids.tolist() == [1, 5]
    with pytest.raises(ValueError):
        prefix_tree_packs([[1], []], 10)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=12), st.integers(1, 20))
def test_prefix_tree_packs_rebuild_every_sequence(sequences, max_tokens):
    """Brute force: the nodes a sample's leaf sees, in order of position, are exactly its tokens;
    every sample sits in one pack; a pack is over budget only when one sequence alone is."""
    from aria.packing import prefix_tree_packs

    packs = prefix_tree_packs(sequences, max_tokens)
    placed = sorted(i for p in packs for i in p.samples.tolist())
    assert placed == list(range(len(sequences)))
    for p in packs:
        assert len(p.input_ids) <= max(max_tokens, max(len(sequences[i]) for i in p.samples))
        assert p.trunk == max(len(sequences[i]) for i in p.samples)
        for node in range(p.trunk):  # the trunk is a plain causal sequence
            assert np.flatnonzero(p.attends[node]).tolist() == list(range(node + 1))
        prefixes = {tuple(p.input_ids[np.flatnonzero(row)].tolist()) for row in p.attends}
        assert len(prefixes) == len(p.input_ids)  # no prefix is computed twice within a pack
        assert np.array_equal(p.attends, p.attends & np.tril(np.ones_like(p.attends)))  # only earlier nodes
        for i, leaf in zip(p.samples, p.leaves):
            path = np.flatnonzero(p.attends[leaf])
            assert p.positions[path].tolist() == list(range(len(path)))
            assert p.input_ids[path].tolist() == sequences[i]
            # every node on the path sees exactly the path before it (the causal history)
            for depth, node in enumerate(path):
                assert np.flatnonzero(p.attends[node]).tolist() == path[: depth + 1].tolist()


def game_steps(tokenizer, games: int = 3, turns: int = 5) -> list:
    """Encoded steps of short games whose prompts repeat the growing history, plus a duplicate."""
    steps = []
    for g in range(games):
        history = f"Game {g}. Here is the game history:\n"
        for t in range(turns):
            steps.append(encode_sample(tokenizer, history + "Now ask your next question.", f"Is it thing {t}?", 512))
            history += f"Question: Is it thing {t}?\nAnswer: No.\n"
    return steps + [steps[1]]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefix_tree_scores_equal_padded_scores(tiny_model_dir, dtype):
    from aria.packing import prefix_tree_packs
    from aria.trainers.reward_model import score_prefix_trees

    from aria.trainers.reward_service import BF16_SCORE_TOLERANCE

    tokenizer, model = load_reward_model(str(tiny_model_dir), dtype)
    torch.manual_seed(0)
    torch.nn.init.normal_(model.score.weight, std=0.3)  # scores of order 1, as the tolerance is stated for
    steps = game_steps(tokenizer)
    padded = score_encoded(model, steps, tokenizer.pad_token_id, batch_size=4)
    assert np.ptp(padded) > 0.1
    tolerance = 1e-4 if dtype == "float32" else BF16_SCORE_TOLERANCE  # bfloat16: another summation order
    for budget in (10_000, 150, 1):
        packs = prefix_tree_packs([s.input_ids for s in steps], budget)
        assert np.abs(score_prefix_trees(model, steps, budget, pad_id=tokenizer.pad_token_id) - padded).max() < tolerance, budget
    for batch_size in (4, 16):  # the trainer's evaluation: micro-batches as padded batches of prefix trees
        in_trees = score_encoded(model, steps, tokenizer.pad_token_id, batch_size=batch_size, packing="prefix_tree")
        assert np.abs(in_trees - padded).max() < tolerance, batch_size
    whole = prefix_tree_packs([s.input_ids for s in steps], 10_000)
    assert len(whole) == 1 and len(whole[0].input_ids) < 0.6 * sum(len(s.input_ids) for s in steps)
    assert len(packs) == len(steps)  # budget 1: one sample per pass, the plain forward


def test_the_scorer_checks_prefix_trees_on_its_model_and_falls_back(tmp_path, tiny_model_dir, monkeypatch, caplog):
    import aria.trainers.reward_model as rm
    from aria.trainers.reward_service import InProcessScorer

    tokenizer, model = load_reward_model(str(tiny_model_dir))
    torch.manual_seed(0)
    torch.nn.init.normal_(model.score.weight, std=0.3)
    model.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    tiny_model_dir = tmp_path / "rm"
    samples = [{"observation": "History: Is it red? No. " * (1 + i % 3) + "Ask.", "action": f"Is it {i}?"}
               for i in range(6)]
    tree = InProcessScorer(tiny_model_dir, 512)
    padded = InProcessScorer(tiny_model_dir, 512, packing="padded")
    assert tree.prefix_trees and not padded.prefix_trees
    assert tree.score(samples) == pytest.approx(padded.score(samples), abs=1e-5)
    # A model whose tree pass disagrees with its padded one (here: made to) is scored padded.
    monkeypatch.setattr(rm, "score_prefix_trees", lambda model, encoded, *a: np.full(len(encoded), 7.0))
    with caplog.at_level("WARNING"):
        checked = InProcessScorer(tiny_model_dir, 512)
    assert not checked.prefix_trees and "differ from padded" in caplog.text
    assert checked.score(samples) == pytest.approx(padded.score(samples), abs=1e-6)
    with pytest.raises(ValueError):
        InProcessScorer(None, packing="sorted")


def test_a_lora_reward_model_is_scored_with_its_trained_head_and_no_load_report(tmp_path, tiny_model_dir, capfd):
    """Loading a LoRA reward model loads its base first, which has no score head; the adapter
    then brings the trained one. The scoring model's head is the adapter's, transformers' many-line
    load report is not printed, and a new head is said in one line only where one is trained."""
    from aria.trainers.reward_service import load_scoring_model

    cfg = config(tmp_path, tiny_model_dir, toy_set(8), "train.epochs=1", "train.micro_batch_size=4",
                 "train.gradient_accumulation_steps=1", "train.lr=3e-3", "data.eval_fraction=0", "model.lora.enabled=true")
    RewardModelTrainer(cfg).train()
    trained = capfd.readouterr()
    assert "a new score head, randomly initialised (to be trained)" in trained.out
    final = tmp_path / "out" / "final"
    saved = {k: v for k, v in load_file(str(final / "adapter_model.safetensors")).items() if "score" in k and "lora_" not in k}
    _, model = load_scoring_model(final)
    loaded = capfd.readouterr()
    assert len(saved) == 1 and torch.equal(next(iter(saved.values())), model.score.weight)
    assert "LOAD REPORT" not in trained.err + loaded.err + loaded.out and "new score head" not in loaded.out
