"""Offline REINFORCE (aria/trainers/offline.py) on a tiny random Llama built in the test."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import load_file

from aria.llm.policy import action_logprobs, collate, encode_sample, load_policy
from aria.trainers.offline import OfflineTrainer, length_bucketed_batches
from conftest import naive_action_logprob

REPO = Path(__file__).resolve().parents[1]
OBS = "Let's play a game of Twenty Questions. Guess the object.\nHere is the game history:\nQuestion: Is it alive?\nAnswer: No.\n"


def samples(n: int, reward=lambda i: 0.1 * (i % 5) - 0.2) -> list[dict]:
    return [{"observation": OBS + "Yes. " * (i % 4), "action": f"Question: Is it a fruit? {'No. ' * (i % 3)}",
             "reward": reward(i)} for i in range(n)]


def config(tmp_path: Path, model_dir: Path, data: list[dict], *overrides: str) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps(data))
    with initialize_config_dir(config_dir=str(REPO / "config"), version_base="1.3"):
        cfg = compose("reinforce_llm", overrides=[
            f"model.path={model_dir}", f"data.train_file={train_file}", f"output_dir={tmp_path / 'out'}",
            "device=cpu", "train.mixed_precision=no", "train.warmup_ratio=0", "train.lr_scheduler=constant", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def final_logprob(model_dir: Path, out: Path, sample: dict) -> float:
    tokenizer, base = load_policy(str(model_dir))
    if (out / "adapter_config.json").is_file():
        from peft import PeftModel

        base = PeftModel.from_pretrained(base, out)
    base.eval()
    batch = collate([encode_sample(tokenizer, sample["observation"], sample["action"], 512)], tokenizer.pad_token_id)
    with torch.no_grad():
        return float(action_logprobs(base, batch)[0])


@pytest.mark.parametrize("reward, direction", [(1.0, +1), (-0.5, -1), (-1.0, +1)], ids=["positive", "negative", "sft"])
def test_a_step_moves_the_log_prob_the_way_the_reward_says(tmp_path, tiny_model_dir, reward, direction, capsys):
    """Positive reward raises the action's log-prob, negative lowers it; −1 is the SFT branch (raises).
    A negative weight (and only that: the SFT-marked −1 is not one) is announced, because on fixed
    actions it is unbounded below."""
    data = samples(1, reward=lambda i: reward)
    before = final_logprob(tiny_model_dir, tiny_model_dir, data[0])
    cfg = config(tmp_path, tiny_model_dir, data, "train.epochs=1", "train.micro_batch_size=1",
                  "train.gradient_accumulation_steps=1", "train.lr=0.01", "train.optimizer=adam")
    OfflineTrainer(cfg).train()
    after = final_logprob(tiny_model_dir, tmp_path / "out" / "final", data[0])
    assert (after - before) * direction > 1e-3, (before, after)
    warned = [line for line in capsys.readouterr().out.splitlines() if "have a negative weight" in line]
    if reward == -0.5:
        assert warned == ["[train] warning: 100% of the samples have a negative weight (method aria): REINFORCE on "
                          "fixed actions is unbounded below for them, so their log-probabilities can be driven to "
                          "-inf over epochs (docs/pipeline.md, ArCHer); watch the loss and the policy's movement"]
    else:
        assert warned == []


def test_interrupted_and_resumed_run_ends_with_the_same_weights(tmp_path, tiny_model_dir):
    data = samples(12)
    common = ["train.epochs=2", "train.micro_batch_size=2", "train.gradient_accumulation_steps=2", "train.save_freq=2",
              "train.lr=0.005", "model.lora.dropout=0.2", "train.keep_checkpoints=null"]  # dropout: RNG state matters
    full_cfg = config(tmp_path / "full", tiny_model_dir, data, *common)
    result = OfflineTrainer(full_cfg).train()
    assert result["steps"] == 6  # 12 samples / 2 per micro-batch / 2 accumulation = 3 steps per epoch
    expected = load_file(str(tmp_path / "full" / "out" / "checkpoints" / "step-6" / "trainable.safetensors"))

    cut_cfg = config(tmp_path / "cut", tiny_model_dir, data, *common)

    def crash(step):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        OfflineTrainer(cut_cfg, on_step=crash).train()
    assert not (tmp_path / "cut" / "out" / "final").exists()
    resumed = OfflineTrainer(cut_cfg).train()
    assert resumed["resumed_from"].endswith("step-2")
    got = load_file(str(tmp_path / "cut" / "out" / "checkpoints" / "step-6" / "trainable.safetensors"))
    assert set(got) == set(expected) and any("lora" in name for name in got)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)
    # and training did change them (a trainer that does nothing would also resume "exactly")
    early = load_file(str(tmp_path / "full" / "out" / "checkpoints" / "step-2" / "trainable.safetensors"))
    assert any(not torch.allclose(early[name], expected[name]) for name in expected)
    metrics = [json.loads(line) for line in (tmp_path / "cut" / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]  # step 3, redone after the resume, is logged once
    assert all(math.isfinite(m["loss"]) for m in metrics)
    assert all(0 <= m["padded_fraction"] < 1 and m["tokens_per_s"] > 0 for m in metrics)

    # A half-written checkpoint folder is ignored; other data in the same output_dir is refused.
    (tmp_path / "cut" / "out" / "checkpoints" / "step-8.tmp").mkdir()
    (tmp_path / "cut" / "out" / "checkpoints" / "step-8.tmp" / "trainer_state.json").write_text("{}")
    other = config(tmp_path / "cut", tiny_model_dir, samples(12, reward=lambda i: 1.0), *common)
    with pytest.raises(ValueError, match="trained on other data"):
        OfflineTrainer(other).train()


def test_a_checkpoint_resumes_only_under_the_settings_it_was_trained_with(tmp_path, tiny_model_dir):
    """A resume under another lr, seed, batching, LoRA rank or base model is refused in one line
    naming the setting (before: the checkpoint's optimizer silently kept the old lr while the
    final model's record said the new one, a new seed reordered the rest of the data, another
    batching skipped micro-batches and saved a short run as complete, another base model carried
    the adapter over, a new rank failed copying tensors). The same weights at another path resume."""
    import shutil

    from safetensors.torch import save_file

    from aria.io import ResumeMismatch

    data = samples(12)
    common = ["train.epochs=2", "train.micro_batch_size=2", "train.gradient_accumulation_steps=2", "train.save_freq=2",
              "train.lr=0.005", "train.keep_checkpoints=null"]
    cfg = config(tmp_path, tiny_model_dir, data, *common)

    def crash(step):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        OfflineTrainer(cfg, on_step=crash).train()
    other_weights = tmp_path / "other_model"
    shutil.copytree(tiny_model_dir, other_weights)
    tensors = load_file(str(other_weights / "model.safetensors"))
    save_file({k: v + 0.01 for k, v in tensors.items()}, str(other_weights / "model.safetensors"))
    for change, message in ((["train.lr=0.01"], "train.lr was 0.005, now 0.01"),
                            (["seed=1"], "seed was 0, now 1"),
                            (["train.micro_batch_size=4", "train.gradient_accumulation_steps=1"], "train.micro_batch_size was 2, now 4"),
                            (["model.lora.r=4"], "model.lora.r was 8, now 4"),
                            ([f"model.path={other_weights}"], "model.weights was")):
        changed = config(tmp_path, tiny_model_dir, data, *common, *change)
        with pytest.raises(ResumeMismatch, match=re.escape(message)):
            OfflineTrainer(changed).train()
    copy = tmp_path / "copied_model"
    shutil.copytree(tiny_model_dir, copy)
    resumed = OfflineTrainer(config(tmp_path, copy, data, *common)).train()
    assert resumed["resumed_from"].endswith("step-2") and resumed["steps"] == 6


def test_full_fine_tuning_writes_a_full_model(tmp_path, tiny_model_dir):
    cfg = config(tmp_path, tiny_model_dir, samples(4), "model.lora.enabled=false", "train.epochs=1",
                 "train.micro_batch_size=2", "train.gradient_accumulation_steps=1")
    OfflineTrainer(cfg).train()
    final = tmp_path / "out" / "final"
    assert (final / "model.safetensors").is_file() and not (final / "adapter_config.json").exists()


def test_length_bucketing_reduces_padding():
    lengths = [10 + (i * 37) % 200 for i in range(400)]
    bucketed = length_bucketed_batches(lengths, 8, seed=0, epoch=0)
    assert sorted(i for b in bucketed for i in b) == list(range(400))
    assert bucketed == length_bucketed_batches(lengths, 8, seed=0, epoch=0)

    def padding(batches):
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)

    plain = [list(range(i, i + 8)) for i in range(0, 400, 8)]
    assert padding(bucketed) < 0.1 * padding(plain)


@pytest.mark.parametrize("data, field", [
    ([], None),
    ([{"observation": "o", "reward": 1.0}], "sample 0.action"),
    ([{"observation": "o", "action": "a", "reward": 1.0}, {"observation": "o", "action": "a", "reward": float("nan")}],
     "sample 1.reward"),
    ([{"observation": "o", "action": "a", "reward": 1.0}, {"observation": "o", "action": "  ", "reward": 1.0}],
     "sample 1.action"),  # with data.append_eos=false (below) an empty reply has no token to train
    ([{"observation": 3, "action": "a", "reward": 1.0}], "sample 0.observation"),
])
def test_bad_training_data_is_rejected_before_training(tmp_path, data, field):
    """The training command in this process (through a subprocess: tests/test_cli.py)."""
    from in_process import run_script

    train_file = tmp_path / "train.json"
    train_file.write_text(json.dumps(data))  # json writes NaN for float("nan")
    done = run_script(REPO / "scripts/run_offline.py", f"data.train_file={train_file}", "model.path=/nonexistent/model",
                      f"output_dir={tmp_path / 'out'}", "data.append_eos=false", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and str(train_file) in last
    assert (f"'{field}'" in last) if field else "empty" in last
    assert not (tmp_path / "out").exists()


def test_unknown_config_key_is_a_hydra_error(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "scripts/run_offline.py"), "train.learning_rate=0.1"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and "train.learning_rate" in done.stderr


def test_merged_model_equals_base_plus_adapter(tmp_path, tiny_model_dir):
    """scripts/merge_lora.py gives a plain model whose log-probs equal the adapter's."""
    data = samples(4)
    cfg = config(tmp_path, tiny_model_dir, data, "train.epochs=1", "train.micro_batch_size=2",
                 "train.gradient_accumulation_steps=1", "train.lr=0.01")
    OfflineTrainer(cfg).train()
    final, merged = tmp_path / "out" / "final", tmp_path / "merged"
    done = subprocess.run([sys.executable, str(REPO / "scripts/merge_lora.py"), str(final), str(merged)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (merged / "model.safetensors").is_file() and not (merged / "adapter_config.json").exists()
    with_adapter = final_logprob(tiny_model_dir, final, data[0])
    plain = final_logprob(merged, merged, data[0])
    before = final_logprob(tiny_model_dir, tiny_model_dir, data[0])
    assert plain == pytest.approx(with_adapter, abs=1e-4) and abs(plain - before) > 1e-3


def test_gradient_variance_tool_by_hand(tmp_path, tiny_model_dir):
    """Two different samples, gradients g_1, g_2 computed here with an independent log-prob.

    tr Cov(r g) = (||r_1 g_1||² + ||r_2 g_2||²)/2 − ||(r_1 g_1 + r_2 g_2)/2||², for the raw returns
    (1, 0) and the aggregated rewards (0.5, 0.5)."""
    from aria.trainers.grad_variance import gradient_variance

    actions = ["Question: Is it red?", "Question: Is it a fruit? Yes."]
    data = [{"observation": OBS, "action": a, "reward": 0.5, "step_return": r} for a, r in zip(actions, (1.0, 0.0))]
    cfg = config(tmp_path, tiny_model_dir, data, "model.lora.enabled=false")
    result = gradient_variance(cfg, max_samples=2)

    tokenizer, model = load_policy(str(tiny_model_dir))
    model.eval()
    grads = []
    for action in actions:
        model.zero_grad(set_to_none=True)
        naive_action_logprob(model, encode_sample(tokenizer, OBS, action, 512)).backward()
        grads.append(torch.cat([p.grad.reshape(-1).double() for p in model.parameters() if p.grad is not None]))

    def trace_cov(r1, r2):
        a, b = r1 * grads[0], r2 * grads[1]
        return float((a.dot(a) + b.dot(b)) / 2 - ((a + b) / 2).dot((a + b) / 2))

    assert result["samples"] == 2
    assert result["trace_cov_raw_step_return"] == pytest.approx(trace_cov(1.0, 0.0), rel=1e-4)
    assert result["trace_cov_aggregated_reward"] == pytest.approx(trace_cov(0.5, 0.5), rel=1e-4)
    # signal-to-noise: ||(r_1 g_1 + r_2 g_2)/2||² / tr Cov, the same for any scale of r
    mean = (0.5 * grads[0] + 0.5 * grads[1]) / 2
    assert result["snr_aggregated_reward"] == pytest.approx(float(mean.dot(mean)) / trace_cov(0.5, 0.5), rel=1e-4)
    assert result["ratio_aggregated_over_raw"] == pytest.approx(trace_cov(0.5, 0.5) / trace_cov(1.0, 0.0), rel=1e-4)
    # the configured method's weights, side by side (the default method's are the aggregated rewards)
    assert result["methods"] == ["aria"] and result["trace_cov_method_aria"] == result["trace_cov_aggregated_reward"]
    both = gradient_variance({**cfg, "method": "bc"}, max_samples=2, methods=["bc", "no_aggregation"])
    assert both["methods"] == ["bc", "no_aggregation"] and "trace_cov_method_aria" not in both
    assert both["trace_cov_method_bc"] == pytest.approx(trace_cov(1.0, 1.0), rel=1e-4)
    assert both["trace_cov_method_no_aggregation"] == both["trace_cov_raw_step_return"]
    assert both["ratio_method_bc_over_raw"] == pytest.approx(trace_cov(1.0, 1.0) / trace_cov(1.0, 0.0), rel=1e-4)
    # further weightings from the same gradients, one value per sample of the file (NaN trains nothing)
    extra = gradient_variance(cfg, max_samples=2, weightings={"half": [0.25, float("nan")]})
    assert extra["trace_cov_weighting_half"] == pytest.approx(trace_cov(0.25, 0.0), rel=1e-4)
    with pytest.raises(ValueError, match="weighting 'short': 1 values for 2 samples"):
        gradient_variance(cfg, max_samples=2, weightings={"short": [1.0]})
    # the bias-corrected SNR, and its bootstrap through the Gram matrix: with n = 2 the resamples are
    # {1,1}, {2,2} (no variance: left out) and {1,2}, whose corrected SNR C is the sample's own, so
    # the pivotal interval C − (C − P) collapses onto the plug-in P
    plug, raw = result["snr_aggregated_reward"], result["snr_raw_step_return"]
    assert result["snr_corrected_aggregated_reward"] == pytest.approx(plug / 2 - 1 / 2)
    boot = gradient_variance(cfg, max_samples=2, bootstrap=20, gram_out=tmp_path / "gram.npz")
    assert boot["bootstrap"] == 20 and boot["snr_aggregated_reward"] == plug
    assert boot["snr_corrected_ci95_aggregated_reward"] == pytest.approx([plug, plug], rel=1e-6)
    assert boot["snr_difference_aggregated_reward"] == pytest.approx((plug - raw) / 2, rel=1e-6)
    assert boot["snr_difference_ci95_aggregated_reward"] == pytest.approx([plug - raw] * 2, rel=1e-6)
    assert "snr_corrected_ci95_aggregated_reward" not in result
    kept = np.load(tmp_path / "gram.npz")
    assert kept["gram"][0, 0] == pytest.approx(float(grads[0].dot(grads[0])), rel=1e-4)
    assert kept["weights_raw_step_return"].tolist() == [1.0, 0.0] and kept["chosen"].tolist() == [0, 1]


def test_snr_from_the_gram_matrix_and_its_bootstrap_by_hand():
    """SNR from G = g_i · g_j equals the one from the vectors, on three hand-made gradients; the
    corrected SNR by hand; the bootstrap's intervals equal a brute-force recomputation from the
    vectors on the same resamples."""
    from aria.trainers.grad_variance import bootstrap_snr, corrected_snr, snr_from_gram

    g = np.array([[1.0, 0.0, 2.0], [0.0, 1.0, 1.0], [2.0, 1.0, 0.0]])
    w = np.array([1.0, 0.0, 0.5])
    # by hand: w g = (1,0,2), (0,0,0), (1,.5,0); mean = (2/3, 1/6, 2/3), ||mean||² = 33/36;
    # mean ||w g||² = (5 + 0 + 1.25)/3 = 25/12; tr Cov = 25/12 − 33/36 = 42/36
    assert snr_from_gram(g @ g.T, w) == pytest.approx((33 / 36) / (42 / 36))
    assert snr_from_gram(g @ g.T, np.zeros(3)) is None
    assert corrected_snr(33 / 42, 3) == pytest.approx(33 / 42 * 2 / 3 - 1 / 3) and corrected_snr(None, 3) is None

    def brute(vectors, weights):
        v = weights[:, None] * vectors
        mean = v.mean(axis=0)
        noise = (v * v).sum(axis=1).mean() - mean @ mean
        return mean @ mean / noise if noise > 0 else None

    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(12, 40))
    weights = {"raw": (rng.random(12) < 0.4).astype(float), "smooth": rng.random(12)}
    found = bootstrap_snr(vectors @ vectors.T, weights, "raw", resamples=200, seed=7)
    draws = np.random.default_rng(7)
    corrected = {name: [] for name in weights}
    for _ in range(200):
        idx = draws.integers(0, 12, 12)
        for name, w in weights.items():
            value = brute(vectors[idx], w[idx])
            corrected[name].append(None if value is None else value * 11 / 12 - 1 / 12)
    plug = {name: brute(vectors, w) for name, w in weights.items()}
    for name in weights:
        estimate = plug[name] * 11 / 12 - 1 / 12
        low, high = np.percentile([v for v in corrected[name] if v is not None], [2.5, 97.5])
        assert found[name]["snr_corrected"] == pytest.approx(estimate)
        assert found[name]["snr_corrected_ci95"] == pytest.approx([estimate - (high - plug[name]), estimate - (low - plug[name])])
        diffs = [v - r for v, r in zip(corrected[name], corrected["raw"]) if v is not None and r is not None]
        low, high = np.percentile(diffs, [2.5, 97.5])
        truth = plug[name] - plug["raw"]
        assert found[name]["snr_difference"] == pytest.approx(truth * 11 / 12)
        assert found[name]["snr_difference_ci95"] == pytest.approx([truth * 11 / 12 - (high - truth), truth * 11 / 12 - (low - truth)])
    assert found["raw"]["snr_difference_ci95"] == pytest.approx([0.0, 0.0])


def test_corrected_snr_and_its_interval_cover_the_true_snr():
    """Simulated gradients g = μ + N(0, I) in 30 dimensions, 60 samples, true per-sample SNR
    θ = ||μ||²/30 = 0.01 under weights 1, and 0.25||μ||²/(15 + 0.25||μ||²) under independent
    0/1 weights of probability 1/2. Over 300 simulated samples: the plug-in SNR sits about 1/n
    above θ and the corrected one on it; the pivotal intervals cover θ (and the difference of the
    two weightings' θ) about 95% of the time, where the plug-in's percentile interval, which the
    first version of this tool reported, misses θ in most samples."""
    from aria.trainers.grad_variance import bootstrap_snr, snr_from_gram

    d, n, sims = 30, 60, 300
    mu = np.full(d, 0.1)  # ||μ||² = 0.01 · d
    theta_ones = float(mu @ mu) / d
    theta_coin = 0.25 * float(mu @ mu) / (0.5 * d + 0.25 * float(mu @ mu))
    rng = np.random.default_rng(0)
    plug, corrected, covered, covered_diff, old_covered = [], [], 0, 0, 0
    for sim in range(sims):
        g = mu + rng.normal(size=(n, d))
        weights = {"ones": np.ones(n), "coin": (rng.random(n) < 0.5).astype(float)}
        gram = g @ g.T
        found = bootstrap_snr(gram, weights, "ones", resamples=200, seed=sim)
        plug.append(snr_from_gram(gram, weights["ones"]))
        corrected.append(found["ones"]["snr_corrected"])
        low, high = found["ones"]["snr_corrected_ci95"]
        covered += low <= theta_ones <= high
        low, high = found["coin"]["snr_difference_ci95"]
        covered_diff += low <= theta_coin - theta_ones <= high
        idx = np.random.default_rng(sim).integers(0, n, (200, n))  # under weights 1: ||ḡ||² = ΣG/n²
        sub = gram[idx[:, :, None], idx[:, None, :]]
        signal, second = sub.sum(axis=(1, 2)) / n ** 2, np.diag(gram)[idx].sum(axis=1) / n
        low, high = np.percentile(signal / (second - signal), [2.5, 97.5])
        old_covered += low <= theta_ones <= high
    assert np.mean(plug) - theta_ones == pytest.approx(1 / n, abs=0.004)
    assert np.mean(corrected) == pytest.approx(theta_ones, abs=0.004)
    assert covered / sims >= 0.88 and covered_diff / sims >= 0.88
    assert old_covered / sims < 0.5


def test_each_sample_is_weighted_by_its_own_reward(tmp_path, tiny_model_dir):
    """A micro-batch that is not a prefix of the data: the loss gradient must be
    −(1/B) Σ_i r_i ∇log p_i with each sample's own reward (per-sample gradients computed here with
    an independent log-prob). A reward taken from another sample fails this."""
    rewards = [0.7, -0.3, 0.2, 1.0, -0.8, 0.5]
    data = [{"observation": OBS + f" Round {i}.", "action": f"Question: Is it thing {i}? " + "Yes. " * i,
             "reward": r} for i, r in enumerate(rewards)]
    trainer = OfflineTrainer(config(tmp_path, tiny_model_dir, data, "train.micro_batch_size=3",
                                    "train.gradient_accumulation_steps=1"))
    model = trainer.accelerator.unwrap_model(trainer.model)
    params = [p for p in model.parameters() if p.requires_grad]
    indices = [3, 0, 5]
    model.zero_grad(set_to_none=True)
    batch = collate([trainer.encoded[i] for i in indices], trainer.tokenizer.pad_token_id)
    trainer.micro_loss(batch, indices).backward()
    got = torch.cat([p.grad.reshape(-1) for p in params])

    expected = torch.zeros_like(got)
    for i in indices:
        model.zero_grad(set_to_none=True)
        naive_action_logprob(model, trainer.encoded[i]).backward()
        expected -= rewards[i] / len(indices) * torch.cat([p.grad.reshape(-1) for p in params])
    # Batched (padded) and unpadded float32 passes differ by rounding only: ~1e-6 of the norm.
    assert (got - expected).norm() <= 1e-4 * expected.norm()


def test_gradient_accumulation_averages_like_one_large_batch(tmp_path, tiny_model_dir):
    """Two micro-batches of 2 accumulated give the gradient of one micro-batch of 4 (accelerate
    divides each micro-batch's loss by the accumulation steps): the logged gradient norms match."""
    data = samples(4)
    norms = []
    for name, micro, accumulation in (("one", 4, 1), ("two", 2, 2)):
        cfg = config(tmp_path / name, tiny_model_dir, data, f"train.micro_batch_size={micro}",
                     f"train.gradient_accumulation_steps={accumulation}", "train.max_grad_norm=1e9", "train.epochs=1",
                     "train.length_bucketing=false")
        OfflineTrainer(cfg).train()
        [line] = [json.loads(x) for x in (tmp_path / name / "out" / "metrics.jsonl").read_text().splitlines()]
        norms.append(line["grad_norm"])
    assert norms[1] == pytest.approx(norms[0], rel=1e-4)


@pytest.mark.parametrize("packing", ["prefix_tree", "padded"])
def test_the_clipped_loss_starts_with_reinforces_gradient_on_any_batch(tmp_path, tiny_model_dir, packing):
    """Before the first step every token's ratio is 1, so the clipped loss's gradient must be
    REINFORCE's, on a micro-batch whose samples are out of file order and, packed, out of tree
    order: a reference token lined up with another sample's token (or another position) gives a
    ratio other than 1 and fails this."""
    from aria.trainers.losses import reinforce_loss

    rewards = [0.7, -0.3, 0.2, 1.0, -0.8, 0.5]
    data = [{"observation": OBS + ("Yes. " * (i % 2)), "action": f"Question: Is it thing {i}? " + "No. " * i, "reward": r,
             "game_id": f"g{i % 2}", "turn": i // 2} for i, r in enumerate(rewards)]
    trainer = OfflineTrainer(config(tmp_path, tiny_model_dir, data, "loss.name=clipped_reinforce", f"train.packing={packing}",
                                    "train.micro_batch_size=3", "train.gradient_accumulation_steps=1"))
    trainer.reference = trainer.reference_logprobs()
    model = trainer.accelerator.unwrap_model(trainer.model)
    params = [p for p in model.parameters() if p.requires_grad]
    indices = [5, 0, 3]

    def gradient(loss) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss().backward()
        return torch.cat([p.grad.reshape(-1) for p in params])

    batch = trainer.make_batch(indices)
    clipped = gradient(lambda: trainer.micro_loss(batch, indices))
    plain = gradient(lambda: reinforce_loss(action_logprobs(model, batch), trainer.rewards[indices], sft_reward=None))
    assert plain.norm() > 0
    assert (clipped - plain).norm() <= 1e-4 * plain.norm()


def test_the_clipped_loss_keeps_negative_weights_bounded_and_resumes(tmp_path, tiny_model_dir):
    """``loss.name=clipped_reinforce``: the reference log-probs are the start model's, per action
    token (checked against an independent unpadded pass). Epochs of a negative weight on fixed
    actions (at a learning rate that moves this tiny model far) drive plain REINFORCE's
    log-probs down by about 5 nats a token; the clip alone halves that (a clipped token has no
    gradient, but the others still move the shared weights), and the KL penalty pulls tokens back:
    the further from REINFORCE the larger its coefficient. An interrupted clipped run reads its
    reference back (not the resumed model's) and ends with the weights of an uninterrupted one."""
    from aria.trainers.checkpoint import load_state

    data = samples(8, reward=lambda i: -0.5)
    common = ["train.epochs=6", "train.micro_batch_size=2", "train.gradient_accumulation_steps=1", "train.lr=0.01",
              "train.save_freq=4", "train.keep_checkpoints=null"]
    tokenizer, base = load_policy(str(tiny_model_dir))
    encoded = [encode_sample(tokenizer, s["observation"], s["action"], 512) for s in data]
    runs = {"reinforce": ["loss.name=reinforce"], "clip": ["loss.name=clipped_reinforce", "loss.clipped_reinforce.kl_coef=0"],
            "clip_kl": ["loss.name=clipped_reinforce"]}  # the default kl_coef, 0.04
    per_token = {}
    for name, loss in runs.items():
        OfflineTrainer(config(tmp_path / name, tiny_model_dir, data, *common, *loss)).train()
        per_token[name] = [(final_logprob(tiny_model_dir, tmp_path / name / "out" / "final", s)
                            - final_logprob(tiny_model_dir, tiny_model_dir, s)) / e.action_len for s, e in zip(data[:3], encoded)]
    # each step logs the share of tokens outside the clip band and the KL from the start model:
    # nothing at the first micro-batch (the start model itself), both growing as the tokens move
    metrics = [json.loads(line) for line in (tmp_path / "clip_kl" / "out" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["clip_fraction"] == 0 and metrics[0]["kl_start"] == pytest.approx(0, abs=1e-6)
    assert metrics[-1]["clip_fraction"] > 0.5 and metrics[-1]["kl_start"] > 0.1, metrics[-1]
    assert "clip_fraction" not in json.loads((tmp_path / "reinforce" / "out" / "metrics.jsonl").read_text().splitlines()[0])
    reference = load_state(tmp_path / "clip_kl" / "out" / "reference_logprobs.safetensors")["logp"]
    assert len(reference) == sum(e.action_len for e in encoded)
    assert float(reference[:encoded[0].action_len].sum()) == pytest.approx(
        float(naive_action_logprob(base, encoded[0]).detach()), abs=1e-4)
    # measured: REINFORCE −4.4 to −6.0 nats a token, the clip alone −1.7 to −2.4, with the penalty −1.1 to −1.3
    assert all(r < -3 for r in per_token["reinforce"]), per_token
    for r, c, k in zip(per_token["reinforce"], per_token["clip"], per_token["clip_kl"]):
        assert r < 1.5 * c and c < 1.3 * k < 0, per_token

    cut = config(tmp_path / "cut", tiny_model_dir, data, *common, "loss.name=clipped_reinforce")

    def crash(step):
        if step == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        OfflineTrainer(cut, on_step=crash).train()
    assert OfflineTrainer(cut).train()["resumed_from"].endswith("step-4")
    expected = load_file(str(tmp_path / "clip_kl" / "out" / "checkpoints" / "step-24" / "trainable.safetensors"))
    got = load_file(str(tmp_path / "cut" / "out" / "checkpoints" / "step-24" / "trainable.safetensors"))
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)


def test_a_launch_whose_processes_form_no_group_is_refused():
    """Two processes that each count one (accelerate without a process group) would each train
    on all the data: refused in one line naming both counts. One process, or a formed group, passes."""
    from aria.io import ConfigError
    from aria.trainers.engine import check_one_group

    with pytest.raises(ConfigError, match="started 2 processes, but they did not form one group .accelerate counts 1."):
        check_one_group(1, {"WORLD_SIZE": "2"})
    check_one_group(2, {"WORLD_SIZE": "2"})
    check_one_group(1, {})


def test_device_is_one_of_the_known_and_cuda_needs_a_gpu(tmp_path, tiny_model_dir, monkeypatch):
    """``device=bogus`` is a settings error before any work; ``device=cuda`` without a GPU is
    refused instead of training on the CPU; ``auto`` on a CPU-only machine trains on the CPU as
    ``cpu`` does (and so joins a CPU launch's processes)."""
    from aria.io import ConfigError
    from aria.trainers.engine import use_cpu

    with pytest.raises(ConfigError, match="device: .*one of auto, cpu, cuda"):
        OfflineTrainer(config(tmp_path, tiny_model_dir, samples(4), "device=bogus"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine has no GPU either way
    with pytest.raises(ConfigError, match="device=cuda: this process sees no CUDA device"):
        use_cpu("cuda")
    assert use_cpu("auto") and use_cpu("cpu")


def test_an_empty_reply_is_trained_on_as_the_end_of_turn_the_policy_played(tmp_path, tiny_model_dir):
    """A policy that ended its turn at once played a step the pipeline keeps (step 4 wrote it):
    with the end-of-turn token appended (the default) that token is its action, and a reward
    moves its log-probability as any other's."""
    data = [{"observation": "Is it alive?", "action": "", "reward": 1.0}]
    before = final_logprob(tiny_model_dir, tiny_model_dir, data[0])
    cfg = config(tmp_path, tiny_model_dir, data, "train.epochs=1", "train.micro_batch_size=1",
                 "train.gradient_accumulation_steps=1", "train.lr=0.01", "train.optimizer=adam")
    OfflineTrainer(cfg).train()
    assert final_logprob(tiny_model_dir, tmp_path / "out" / "final", data[0]) - before > 1e-3


def test_a_run_never_replaces_the_final_model_of_another(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """A second run into an output_dir whose final/ another method made is refused in one line
    before its model loads (the README's order once replaced ARIA's adapter with ArCHer's; the
    adversarial pass found the refusal after the model had loaded); the same
    run again is not refused, and an attempt that stopped before its first checkpoint leaves no
    metric lines for the next to append to. A merge of the adapter is named stale once the
    adapter is trained again."""
    from aria.io import ResumeMismatch
    from aria.llm.merge_record import stale_merge
    from aria.llm.policy import merge_lora

    data = samples(8)
    common = ("train.epochs=1", "train.micro_batch_size=4", "train.gradient_accumulation_steps=1", "train.save_freq=100")
    OfflineTrainer(config(tmp_path, tiny_model_dir, data, *common)).train()
    out = tmp_path / "out"
    merged = merge_lora(out / "final", out / "merged")
    assert stale_merge(merged) is None
    import aria.trainers.offline

    with monkeypatch.context() as patched:
        patched.setattr(aria.trainers.offline, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
        with pytest.raises(ResumeMismatch, match=r"final holds the model of another run \(method was 'aria', now 'bc'"):
            OfflineTrainer(config(tmp_path, tiny_model_dir, data, *common, "method=bc"))
    (out / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')  # an attempt without a checkpoint
    capsys.readouterr()
    OfflineTrainer(config(tmp_path, tiny_model_dir, data, *common)).train()  # the same run again: the same adapter
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert stale_merge(merged) is None and "note:" not in capsys.readouterr().out
    shutil.rmtree(out / "final")  # as the refusal says, to train here under other settings
    OfflineTrainer(config(tmp_path, tiny_model_dir, data, *common, "train.lr=1e-2")).train()
    assert f"[train] note: {merged} was merged from an earlier adapter" in capsys.readouterr().out
    assert "re-run python scripts/merge_lora.py" in stale_merge(merged)


def test_a_set_smaller_than_one_accumulated_step_trains_one_step_an_epoch(tmp_path, tiny_model_dir, capsys):
    """``data.max_samples`` small enough that an epoch holds fewer micro-batches than
    ``gradient_accumulation_steps``: one optimizer step over all of them, said in one line."""
    cfg = config(tmp_path, tiny_model_dir, samples(6), "train.epochs=2", "train.micro_batch_size=2",
                 "train.gradient_accumulation_steps=8", "train.packing=padded")
    result = OfflineTrainer(cfg).train()
    assert result["steps"] == 2
    assert ("[train] 3 micro-batches an epoch make no step of gradient_accumulation_steps=8 on 1 process(es): "
            "accumulating over 3, one optimizer step an epoch") in capsys.readouterr().out


def test_serving_a_stale_merge_is_refused_before_any_server_starts(tmp_path):
    """``scripts/serve_vllm.sh`` on a merge whose adapter was trained again since: one line,
    exit 2, no server (the check reads two small files); ``ARIA_SERVE_STALE=1`` lets it through."""
    from aria.llm.merge_record import write_merge_record

    adapter, merged = tmp_path / "final", tmp_path / "merged"
    adapter.mkdir()
    merged.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"first training")
    write_merge_record(merged, adapter, tmp_path / "base", "float32")
    (adapter / "adapter_model.safetensors").write_bytes(b"second training")
    env = {**os.environ, "VLLM_START_TIMEOUT": "1"}
    done = subprocess.run(["bash", str(REPO / "scripts/serve_vllm.sh"), str(merged), "1"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {merged} was merged from an earlier adapter in {adapter} (trained again since): re-run python "
        f"scripts/merge_lora.py {adapter} {merged} (ARIA_SERVE_STALE=1 serves it anyway)")
