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

One sample of steps gives one SNR per weighting and no idea how far another sample would move
it. With ``bootstrap`` resamples, the per-sample gradients are kept (n × |θ| float32: 0.66 GB for
256 samples of SmolLM2-135M's LoRA) and reduced to their Gram matrix G_ij = g_i · g_j, from which
the SNR of any weighting on any resample of the samples follows exactly (:func:`snr_from_gram`):
``snr_ci95_<kind>`` is its percentile interval, ``snr_ratio_<kind>`` its ratio to the raw
return's SNR and ``snr_ratio_ci95_<kind>`` that ratio's interval, every weighting on the same
resamples (paired), so that an interval of the ratio that holds 1 says this sample cannot tell
the weighting from the raw return.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from aria.data import read_training_set
from aria.io import DataError
from aria.policy import action_logprobs, collate, encode_sample, load_policy
from aria.trainers.methods import method_weights


def snr_from_gram(gram: np.ndarray, weights: np.ndarray) -> float | None:
    """||mean_i w_i g_i||² / tr Cov(w g) of the samples whose Gram matrix is ``gram``
    (G_ij = g_i · g_j): ||mean||² = wᵀGw / n² and mean_i ||w_i g_i||² = Σ_i w_i² G_ii / n.
    None when the weighted gradients do not vary (up to rounding: a resample of one sample
    repeated leaves a difference of a few ulps, not a variance)."""
    n = len(weights)
    signal = float(weights @ gram @ weights) / n ** 2
    second = float((weights ** 2 * np.diag(gram)).sum()) / n
    noise = second - signal
    return signal / noise if noise > 1e-12 * second else None


def bootstrap_snr(gram: np.ndarray, weights: dict[str, np.ndarray], reference: str, resamples: int,
                  seed: int = 0) -> dict[str, dict]:
    """Per weighting: the 95% percentile intervals of its SNR and of its SNR over ``reference``'s,
    over ``resamples`` resamples (with replacement) of the samples, the same resamples for all
    weightings. A resample where a weighting's SNR is undefined (no variation) is left out of
    that weighting's intervals."""
    rng = np.random.default_rng(seed)
    n = gram.shape[0]
    snrs: dict[str, list[float | None]] = {name: [] for name in weights}
    for _ in range(resamples):
        idx = rng.integers(0, n, n)
        sub = gram[np.ix_(idx, idx)]
        for name, w in weights.items():
            snrs[name].append(snr_from_gram(sub, w[idx]))

    def interval(values):
        values = [v for v in values if v is not None]
        return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))] if values else None

    out = {}
    for name, values in snrs.items():
        ratios = [v / r if v is not None and r else None for v, r in zip(values, snrs[reference])]
        out[name] = {"snr_ci95": interval(values), "snr_ratio_ci95": interval(ratios)}
    return out


def gradient_variance(cfg: dict, max_samples: int = 256, seed: int = 0, methods: list[str] | None = None,
                      weightings: dict[str, list[float]] | None = None, bootstrap: int = 0) -> dict:
    """See the module doc. ``weightings``: further weights to compare from the same gradients, one
    per sample of the file in its order (e.g. R̃ under other groupings, scripts/grouping_schemes.py),
    reported as ``<measure>_weighting_<name>``. ``bootstrap``: resamples for the SNR intervals
    (0: none, and no gradient is kept)."""
    m, d = cfg["model"], cfg["data"]
    samples = read_training_set(d["train_file"])
    missing = [i for i, s in enumerate(samples) if "step_return" not in s]
    if missing:
        raise DataError(d["train_file"], None, f"sample {missing[0]}.step_return",
                        "missing (the raw return is needed; pipeline step 4 writes it)")
    methods = list(methods or [cfg["method"]])
    for method in methods:
        try:
            weights = np.nan_to_num(method_weights(method, samples), nan=0.0)
        except KeyError as error:
            raise DataError(d["train_file"], None, None, error.args[0]) from None
        for s, w in zip(samples, weights):
            s[f"weight_{method}"] = float(w)
    for name, values in (weightings or {}).items():
        if len(values) != len(samples):
            raise ValueError(f"weighting {name!r}: {len(values)} values for {len(samples)} samples")
        for s, w in zip(samples, values):
            s[f"weighting_{name}"] = float(np.nan_to_num(w, nan=0.0))
    kept = [i for i, s in enumerate(samples) if s["reward"] is not None]
    if not kept:
        raise DataError(d["train_file"], None, None, "no sample has an aggregated reward (none was kept)")
    rng = np.random.default_rng(seed)
    chosen = sorted(np.asarray(kept)[rng.choice(len(kept), size=min(max_samples, len(kept)), replace=False)].tolist())
    tokenizer, model = load_policy(m["path"], m["dtype"], m["lora"] if m["lora"]["enabled"] else None)
    model.eval()  # no dropout: the variance is over samples, not over dropout masks
    params = [p for p in model.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    kinds = {"raw_step_return": "step_return", "aggregated_reward": "reward",
             **{f"method_{method}": f"weight_{method}" for method in methods},
             **{f"weighting_{name}": f"weighting_{name}" for name in weightings or {}}}
    sums = {k: torch.zeros(n_params, dtype=torch.float64) for k in kinds}
    squares = {k: 0.0 for k in kinds}
    kept_grads = torch.zeros((len(chosen), n_params), dtype=torch.float32) if bootstrap else None
    start = time.perf_counter()
    for row, i in enumerate(chosen):
        s = samples[i]
        batch = collate([encode_sample(tokenizer, s["observation"], s["action"], d["max_prompt_tokens"], d["append_eos"],
                                       d.get("system_prompt"))], tokenizer.pad_token_id)
        model.zero_grad(set_to_none=True)
        action_logprobs(model, batch)[0].backward()
        g = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in params])
        if kept_grads is not None:
            kept_grads[row] = g.float()
        for kind, field in kinds.items():
            v = float(s[field]) * g
            sums[kind] += v
            squares[kind] += float(v.dot(v))
    n = len(chosen)
    outcome = {(s.get("game_id"), s.get("role")): bool(s.get("success")) for s in samples}
    result = {"samples": n, "methods": methods, "games": len(outcome), "games_won": sum(outcome.values()),
              "trainable_parameters": n_params, "train_file": str(d["train_file"]), "model": str(m["path"]),
              "lora": bool(m["lora"]["enabled"]), "seed": seed, "seconds": round(time.perf_counter() - start, 2)}
    for kind, field in kinds.items():
        mean = sums[kind] / n
        result[f"trace_cov_{kind}"] = squares[kind] / n - float(mean.dot(mean))
        result[f"snr_{kind}"] = float(mean.dot(mean)) / result[f"trace_cov_{kind}"] if result[f"trace_cov_{kind}"] > 0 else None
        rewards = np.array([float(samples[i][field]) for i in chosen])
        result[f"reward_variance_{kind}"] = float(rewards.var())
    if kept_grads is not None:
        gram = np.zeros((n, n))
        for start_col in range(0, n_params, 1 << 18):  # float64 products a slice at a time
            part = kept_grads[:, start_col:start_col + (1 << 18)].double()
            gram += (part @ part.T).numpy()
        weights = {kind: np.array([float(samples[i][field]) for i in chosen]) for kind, field in kinds.items()}
        raw_snr = result["snr_raw_step_return"]
        for kind, found in bootstrap_snr(gram, weights, "raw_step_return", bootstrap, seed).items():
            result[f"snr_ci95_{kind}"] = found["snr_ci95"]
            result[f"snr_ratio_{kind}"] = result[f"snr_{kind}"] / raw_snr if result[f"snr_{kind}"] and raw_snr else None
            result[f"snr_ratio_ci95_{kind}"] = found["snr_ratio_ci95"]
        result["bootstrap"] = bootstrap
    raw = result["trace_cov_raw_step_return"]
    result["ratio_aggregated_over_raw"] = result["trace_cov_aggregated_reward"] / raw if raw > 0 else None
    for method in methods:
        result[f"ratio_method_{method}_over_raw"] = result[f"trace_cov_method_{method}"] / raw if raw > 0 else None
    return result
