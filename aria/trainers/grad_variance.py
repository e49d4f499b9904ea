"""Variance of the per-sample policy gradient under raw step returns vs aggregated rewards.

The paper's Figure 4 claim: replacing each step's raw return R_t by the intention-aggregated
R̃ lowers the variance of the REINFORCE gradient. For every sample i of a training set (which
carries both ``step_return`` and the aggregated ``reward``, pipeline step 4), with
g_i = ∇_θ Σ_t log π(a_i,t | ...) over the trainable parameters θ, this computes exactly (no
projection) the total variance across samples of the per-sample estimator r_i · g_i:

    tr Cov(r g) = mean_i ||r_i g_i||² − ||mean_i r_i g_i||²

streaming over samples (running sums of size |θ|), once with r = step_return, once with
r = reward, and once with r = the weights of each of ``grad_variance.methods``
(:mod:`aria.trainers.methods`; default ``aria``, ``no_aggregation`` and ``gigpo``: Figure 4's
two and GiGPO's exact-state grouping, from the same per-sample gradients). The samples are the
steps the aggregation kept (those with an aggregated reward); a method's weights are computed on
the whole file first (group statistics), and a step the method does not train on counts with
weight 0. ``games`` and ``games_won`` say whether the set has any signal at all (a set of lost
games has R = 0 everywhere and no gradient).

tr Cov scales with the square of the weights, so it compares weightings of one scale (raw and
aggregated returns) but not a normalised advantage (GiGPO's, of order 1) with a return (mostly 0
here). ``snr_<kind>`` = ||mean_i r_i g_i||² / tr Cov(r g), the signal-to-noise ratio of the
batch gradient, does not depend on the scale and compares them all.

One sample of steps gives one SNR per weighting, biased and without an interval. The plug-in
||ḡ||² / tr S overestimates the true ratio by about 1/n (a gradient of pure noise reads 1/(n−1)),
and per-step SNRs in these games are of that order, so ``snr_corrected_<kind>`` removes the bias
(:func:`corrected_snr`). With ``bootstrap`` resamples, the per-sample gradients are kept (n × |θ|
float32: 0.66 GB for 256 samples of SmolLM2-135M's LoRA) and reduced to their Gram matrix
G_ij = g_i · g_j, from which the SNR of any weighting on any resample follows exactly
(:func:`snr_from_gram`): ``snr_corrected_ci95_<kind>`` is a 95% interval of the corrected SNR,
and ``snr_difference_<kind>`` / ``snr_difference_ci95_<kind>`` its difference from the raw
return's, every weighting on the same resamples (paired; :func:`bootstrap_snr`). An interval of
the difference that holds 0 says this sample cannot tell the weighting from the raw return.
"""
from __future__ import annotations

import io
import time
from dataclasses import asdict
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from aria.data import read_training_set
from aria.io import DataError, atomic_write_bytes
from aria.llm.policy import Encoding, PromptTooLong, action_logprobs, collate, load_policy
from aria.settings import typed
from aria.trainers.methods import method_weights
from aria.trainers.settings import TrainerSettings


def snr_from_gram(gram: np.ndarray, weights: np.ndarray) -> float | None:
    """||mean_i w_i g_i||² / tr Cov(w g) of the samples whose Gram matrix is ``gram``
    (G_ij = g_i · g_j). None when the weighted gradients do not vary (:func:`_snr_batch`)."""
    value = _snr_batch(gram[None], np.diag(gram)[None], weights[None])[0]
    return None if np.isnan(value) else float(value)


def _snr_batch(grams: np.ndarray, diagonals: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """:func:`snr_from_gram` for b sample sets at once (``grams`` b × n × n, ``diagonals`` and
    ``weights`` b × n): ||mean||² = wᵀGw / n² and mean_i ||w_i g_i||² = Σ_i w_i² G_ii / n. NaN where
    the weighted gradients do not vary, up to rounding (a resample of one sample repeated leaves a
    difference of a few ulps, not a variance)."""
    n = weights.shape[1]
    signal = np.einsum("bi,bij,bj->b", weights, grams, weights) / n ** 2
    second = (weights ** 2 * diagonals).sum(axis=1) / n
    noise = second - signal
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(noise > 1e-12 * second, signal / noise, np.nan)


def corrected_snr(snr: float | None, n: int) -> float | None:
    """The plug-in SNR of n samples, less its bias: ||ḡ||² overestimates ||E g||² by tr Cov/n, so
    the plug-in is about θ·n/(n−1) + 1/(n−1) for a true SNR θ, and a gradient of pure noise reads
    1/(n−1), not 0. Returns snr·(n−1)/n − 1/n, which is about θ (and may be negative); elementwise
    for an array of SNRs."""
    return None if snr is None else snr * (n - 1) / n - 1 / n


def bootstrap_snr(gram: np.ndarray, weights: dict[str, np.ndarray], reference: str, resamples: int,
                  seed: int = 0) -> dict[str, dict]:
    """Per weighting: the bias-corrected SNR (:func:`corrected_snr`) with a 95% interval, and its
    difference from ``reference``'s with a 95% interval, over ``resamples`` resamples (with
    replacement) of the samples, the same resamples for every weighting (paired).

    The intervals are basic (pivotal) bootstrap intervals around the bootstrap world's truth,
    the plug-in SNR P of the samples themselves: the corrected SNR C* of a resample estimates P
    without bias, so C − (C* − P) at C*'s 97.5th and 2.5th percentiles bounds the true SNR. (The
    percentile interval of the plug-in SNR lies above the truth by about 1/n, which is the size
    of the SNR itself for a few hundred steps of these games.) A resample where a weighting's SNR
    is undefined (no variation) is left out of that weighting's intervals."""
    rng = np.random.default_rng(seed)
    n = gram.shape[0]
    plug_in = {name: snr_from_gram(gram, w) for name, w in weights.items()}
    indices = rng.integers(0, n, (resamples, n))  # row b: the samples of resample b
    draws = {name: np.empty(resamples) for name in weights}
    diagonal = np.diag(gram)
    for first in range(0, resamples, 64):  # 64 resamples at once: 64 × n × n floats in memory
        idx = indices[first:first + 64]
        sub = gram[idx[:, :, None], idx[:, None, :]]
        for name, w in weights.items():
            draws[name][first:first + 64] = corrected_snr(_snr_batch(sub, diagonal[idx], w[idx]), n)

    def pivot(estimate, truth, values):
        values = values[~np.isnan(values)]
        if estimate is None or truth is None or not len(values):
            return None
        low, high = np.percentile(values, [2.5, 97.5])
        return [float(estimate - (high - truth)), float(estimate - (low - truth))]

    out = {}
    ref_truth, ref_estimate = plug_in[reference], corrected_snr(plug_in[reference], n)
    for name, values in draws.items():
        truth, estimate = plug_in[name], corrected_snr(plug_in[name], n)
        differences = values - draws[reference]  # NaN where either is undefined
        both = truth is not None and ref_truth is not None
        out[name] = {"snr_corrected": estimate, "snr_corrected_ci95": pivot(estimate, truth, values),
                     "snr_difference": estimate - ref_estimate if both else None,
                     "snr_difference_ci95": pivot(estimate - ref_estimate, truth - ref_truth, differences) if both else None}
    return out


def gradient_variance(cfg: Mapping | TrainerSettings, max_samples: int = 256, seed: int = 0, methods: list[str] | None = None,
                      weightings: dict[str, list[float]] | None = None, bootstrap: int = 0,
                      gram_out: str | Path | None = None) -> dict:
    """See the module doc. ``weightings``: further weights to compare from the same gradients, one
    per sample of the file in its order (e.g. R̃ under other groupings, scripts/grouping_schemes.py),
    reported as ``<measure>_weighting_<name>``. ``bootstrap``: resamples for the SNR intervals
    (0: none, and no gradient is kept); ``gram_out``: an ``.npz`` for the Gram matrix, the chosen
    samples and each weighting's weights on them."""
    cfg = typed(TrainerSettings, cfg, "trainer settings")
    m, d = cfg.model, cfg.data
    samples = read_training_set(d.train_file)
    methods = list(methods or [cfg.method])
    kinds = _weigh(samples, methods, weightings or {}, d.train_file)  # measure -> the sample field it weighs by
    chosen = _chosen_samples(samples, max_samples, seed, d.train_file)
    # A LoRA adapter's A matrices are drawn at random (B starts at 0, so the gradient lives in B and
    # depends on A): the seed fixes them too, or two runs of one command differ.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokenizer, model = load_policy(m.path, m.dtype, asdict(m.lora) if m.lora.enabled else None)
    model.eval()  # no dropout: the variance is over samples, not over dropout masks
    params = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    encoded = _encoded(samples, chosen, Encoding.of(d).for_model(model), tokenizer, d.train_file)

    sums = {k: torch.zeros(n_params, dtype=torch.float64) for k in kinds}
    squares = {k: 0.0 for k in kinds}
    kept_grads = torch.zeros((len(chosen), n_params), dtype=torch.float32) if bootstrap else None
    start = time.perf_counter()
    for row, i in enumerate(chosen):
        batch = collate([encoded[i]], tokenizer.pad_token_id)
        model.zero_grad(set_to_none=True)
        action_logprobs(model, batch)[0].backward()
        g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in params])
        if kept_grads is not None:
            kept_grads[row] = g.float()
        for kind, field in kinds.items():
            v = float(samples[i][field]) * g
            sums[kind] += v
            squares[kind] += float(v.dot(v))

    n = len(chosen)
    outcome = {(s.get("game_id"), s.get("role")): bool(s.get("success")) for s in samples}
    result = {"samples": n, "methods": methods, "games": len(outcome), "games_won": sum(outcome.values()),
              "trainable_parameters": n_params, "train_file": str(d.train_file), "model": str(m.path),
              "lora": bool(m.lora.enabled), "seed": seed, "seconds": round(time.perf_counter() - start, 2)}
    weights = {kind: np.array([float(samples[i][field]) for i in chosen]) for kind, field in kinds.items()}
    for kind in kinds:
        mean = sums[kind] / n
        result[f"trace_cov_{kind}"] = squares[kind] / n - float(mean.dot(mean))
        result[f"snr_{kind}"] = float(mean.dot(mean)) / result[f"trace_cov_{kind}"] if result[f"trace_cov_{kind}"] > 0 else None
        result[f"snr_corrected_{kind}"] = corrected_snr(result[f"snr_{kind}"], n)
        result[f"reward_variance_{kind}"] = float(weights[kind].var())
    if kept_grads is not None:
        result.update(_bootstrapped(kept_grads, weights, chosen, bootstrap, seed, gram_out))
    raw = result["trace_cov_raw_step_return"]
    result["ratio_aggregated_over_raw"] = result["trace_cov_aggregated_reward"] / raw if raw > 0 else None
    for method in methods:
        result[f"ratio_method_{method}_over_raw"] = result[f"trace_cov_method_{method}"] / raw if raw > 0 else None
    return result


def _weigh(samples: list[dict], methods: list[str], weightings: dict[str, list[float]], train_file) -> dict[str, str]:
    """Each method's weights (computed on the whole file: group statistics) and each extra
    weighting written into the samples; returns measure -> the sample field it weighs by."""
    missing = [i for i, s in enumerate(samples) if "step_return" not in s]
    if missing:
        raise DataError(train_file, None, f"sample {missing[0]}.step_return",
                        "missing (the raw return is needed; pipeline step 4 writes it)")
    for method in methods:
        try:
            weights = np.nan_to_num(method_weights(method, samples), nan=0.0)
        except KeyError as error:
            raise DataError(train_file, None, None, error.args[0]) from None
        for s, w in zip(samples, weights):
            s[f"weight_{method}"] = float(w)
    for name, values in weightings.items():
        if len(values) != len(samples):
            raise ValueError(f"weighting {name!r}: {len(values)} values for {len(samples)} samples")
        for s, w in zip(samples, values):
            s[f"weighting_{name}"] = float(np.nan_to_num(w, nan=0.0))
    return {"raw_step_return": "step_return", "aggregated_reward": "reward",
            **{f"method_{method}": f"weight_{method}" for method in methods},
            **{f"weighting_{name}": f"weighting_{name}" for name in weightings}}


def _chosen_samples(samples: list[dict], max_samples: int, seed: int, train_file) -> list[int]:
    """A seeded choice of at most ``max_samples`` of the steps the aggregation kept, in file order."""
    kept = [i for i, s in enumerate(samples) if s["reward"] is not None]
    if not kept:
        raise DataError(train_file, None, None, "no sample has an aggregated reward (none was kept)")
    rng = np.random.default_rng(seed)
    return sorted(np.asarray(kept)[rng.choice(len(kept), size=min(max_samples, len(kept)), replace=False)].tolist())


def _encoded(samples: list[dict], chosen: list[int], encoding: Encoding, tokenizer, train_file) -> dict:
    """The chosen samples' tokens, as the policy played them (aria.llm.policy); all of them before the
    first gradient, so an over-long prompt is refused at once."""
    encoded = {}
    for i in chosen:
        try:
            encoded[i] = encoding.encode(tokenizer, samples[i]["observation"], samples[i]["action"])
        except PromptTooLong as too_long:
            raise DataError(train_file, None, f"sample {i}.observation", f"{too_long} (data.max_prompt_tokens; "
                            "data.over_long=cut_left cuts it on the left as the release did)") from None
    return encoded


def _bootstrapped(kept_grads: torch.Tensor, weights: dict[str, np.ndarray], chosen: list[int], bootstrap: int,
                  seed: int, gram_out: str | Path | None) -> dict:
    """The SNR intervals from the Gram matrix of the kept gradients (:func:`bootstrap_snr`); the
    matrix written to ``gram_out`` when given."""
    n, n_params = kept_grads.shape
    gram = np.zeros((n, n))
    for start_col in range(0, n_params, 1 << 18):  # float64 products a slice at a time
        part = kept_grads[:, start_col:start_col + (1 << 18)].double()
        gram += (part @ part.T).numpy()
    result = {}
    for kind, found in bootstrap_snr(gram, weights, "raw_step_return", bootstrap, seed).items():
        result.update({f"{measure}_{kind}": value for measure, value in found.items() if measure != "snr_corrected"})
    result["bootstrap"] = bootstrap
    if gram_out is not None:  # the intervals can be drawn again, or for other weightings, without the model
        buffer = io.BytesIO()  # n × n floats: half a megabyte at 256 samples
        np.savez_compressed(buffer, gram=gram, chosen=np.asarray(chosen), **{f"weights_{kind}": w for kind, w in weights.items()})
        atomic_write_bytes(gram_out, buffer.getvalue())
    return result
