"""Benchmark: pipeline step 1's clustering for k = 2..100 and step 2's selection at scale.

Synthetic data shaped like a collected Twenty Questions set: ``--games`` games of ``--turns``
questions each, every question a distinct 384-d vector drawn around ``--centers`` true
intentions (so 30,000 utterances by default), answers labelled yes/no/other, and a success
reward per game that depends on the intentions asked (so aggregation has signal). Times, in one
run:

* the k-means sweep for every k (step 1), and the whole selection (step 2: aggregation for every
  k, SplitScore, silhouette on a sample, Calinski-Harabasz, Davies-Bouldin);
* the k-means sweep two ways: one shared k-means++ seeding whose prefixes start every k (the
  default) and scikit-learn's k-means++ run independently per k, with the within-cluster sum of
  squares of both (the quality of the partitions);
* aggregation for all k two ways: the vectorised tree of ``aria.intention.aggregate`` and a
  plain-Python dictionary over label tuples (the obvious implementation), median of repeats,
  checking they agree;

and writes seconds and peak resident memory to JSON.

    python benchmarks/intention_sweep.py --out benchmarks/results/intention_sweep.json
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from collections import defaultdict

import numpy as np
import sklearn
import torch

from aria.intention.aggregate import StepTable, aggregate, discounted_returns
from aria.intention.cluster import cluster_all_k
from aria.intention.select import SampledSilhouette, calinski_harabasz, choose_k_by_split_score, davies_bouldin, split_scores
from aria.io import atomic_write_json
from aria.resources import REPO_ROOT


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def synthetic(games: int, turns: int, centers: int, dim: int, seed: int):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(centers, dim)).astype(np.float32)
    n = games * turns
    intention = rng.integers(0, centers, n)
    x = means[intention] + 0.6 * rng.normal(size=(n, dim)).astype(np.float32)
    good = rng.random(centers) < 0.3  # asking a "good" intention raises the odds of winning
    ug, up, uc, value, su, final, idx, cnt = [], [], [], [], [], [], [], []
    for g in range(games):
        asked = intention[g * turns : (g + 1) * turns]
        won = float(rng.random() < 0.1 + 0.8 * good[asked].mean())
        for t in range(turns):
            ug += [g, g]
            up += [2 * t, 2 * t + 1]
            uc += [0, 1]
            value += [g * turns + t, int(rng.integers(0, 3))]
            su.append(len(ug) - 2)
            final.append(won)
            idx.append(t + 1)
            cnt.append(turns)
    table = StepTable(np.array(ug), np.array(up), np.array(uc), np.array(su), np.zeros(len(su), dtype=np.int64),
                      discounted_returns(np.array(final), np.array(idx), np.array(cnt), 0.95))
    return x, table, np.array(value), np.array(uc)


def utterance_labels(question_labels: np.ndarray, value: np.ndarray, channel: np.ndarray) -> np.ndarray:
    out = value.copy()
    out[channel == 0] = question_labels[value[channel == 0]]
    return out


def aggregate_with_dicts(table: StepTable, labels: np.ndarray) -> np.ndarray:
    """The obvious implementation: key = tuple of (channel, label) up to the action, dict of lists."""
    sequences = defaultdict(list)
    for u in range(len(labels)):
        sequences[int(table.utterance_game[u])].append((int(table.utterance_channel[u]), int(labels[u])))
    keys = []
    for u in table.step_utterance.tolist():
        g, p = int(table.utterance_game[u]), int(table.utterance_position[u])
        keys.append(tuple(sequences[g][: p + 1]))
    sums, counts = defaultdict(float), defaultdict(int)
    for key, r in zip(keys, table.step_return.tolist()):
        sums[key] += r
        counts[key] += 1
    return np.array([sums[k] / counts[k] for k in keys])


def within_sse(x: np.ndarray, labels: np.ndarray) -> float:
    """Within-cluster sum of squared distances to the cluster means (k-means' objective)."""
    x = x.astype(np.float64)
    k = int(labels.max()) + 1
    sums = np.zeros((k, x.shape[1]))
    np.add.at(sums, labels, x)
    counts = np.bincount(labels, minlength=k)[:, None]
    return float((x**2).sum() - ((sums**2) / np.maximum(counts, 1)).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=3000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--centers", type=int, default=40)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k-max", type=int, default=100)
    parser.add_argument("--silhouette-sample", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the aggregation comparison")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks/results/intention_sweep.json"))
    args = parser.parse_args()

    x, table, value, channel = synthetic(args.games, args.turns, args.centers, args.dim, args.seed)
    ks = list(range(2, args.k_max + 1))
    rss_data = peak_rss_mb()

    start = time.perf_counter()
    labels = cluster_all_k(x, ks, "kmeans", seed=args.seed, max_iter=100, tol=1e-4)
    sweep_s = time.perf_counter() - start
    rss_sweep = peak_rss_mb()

    start = time.perf_counter()
    rewards = np.stack([aggregate(table, utterance_labels(labels[i], value, channel)).reward for i in range(len(ks))])
    aggregation_s = time.perf_counter() - start
    scores = split_scores(ks, rewards)
    choice = choose_k_by_split_score(ks, scores, 0.01, 10)
    sil = SampledSilhouette(x, args.silhouette_sample, args.seed)
    metrics = {"silhouette": [sil(lab) for lab in labels], "calinski_harabasz": [calinski_harabasz(x, lab) for lab in labels],
               "davies_bouldin": [davies_bouldin(x, lab) for lab in labels]}
    selection_s = time.perf_counter() - start
    rss_selection = peak_rss_mb()

    start = time.perf_counter()
    labels_per_k = cluster_all_k(x, ks, "kmeans", seed=args.seed, max_iter=100, tol=1e-4, seeding="per_k")
    per_k_s = time.perf_counter() - start
    sse_ratio = [within_sse(x, a) / within_sse(x, b) for a, b in zip(labels, labels_per_k)]

    vectorised, dicts = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        fast = [aggregate(table, utterance_labels(labels[i], value, channel)).q for i in range(len(ks))]
        vectorised.append(time.perf_counter() - start)
        start = time.perf_counter()
        slow = [aggregate_with_dicts(table, utterance_labels(labels[i], value, channel)) for i in range(len(ks))]
        dicts.append(time.perf_counter() - start)
    agree = all(np.allclose(a, b) for a, b in zip(fast, slow))

    result = {
        "benchmark": "intention_sweep",
        "data": {"utterances_clustered": int(len(x)), "dim": args.dim, "games": args.games, "agent_steps": table.num_steps,
                 "true_intentions": args.centers, "ks": f"{ks[0]}..{ks[-1]}", "seed": args.seed},
        "step1_kmeans_sweep_s": round(sweep_s, 2),
        "step2_selection_s": round(selection_s, 2),
        "step2_of_which_aggregation_all_k_s": round(aggregation_s, 2),
        "sweep_plus_selection_s": round(sweep_s + selection_s, 2),
        "silhouette_sample_size": sil.sample_size,
        "chosen_k_split_score": choice.k, "split_score_rule_satisfied": choice.rule_satisfied,
        "best_k_silhouette": ks[int(np.nanargmax(metrics["silhouette"]))],
        "peak_rss_mb": {"after_data": round(rss_data, 1), "after_sweep": round(rss_sweep, 1),
                        "after_selection": round(rss_selection, 1)},
        "kmeans_seeding": {"shared_sweep_s": round(sweep_s, 2), "per_k_sweep_s": round(per_k_s, 2),
                           "speedup": round(per_k_s / sweep_s, 2),
                           "sse_shared_over_per_k": {"median": round(float(np.median(sse_ratio)), 4),
                                                     "min": round(min(sse_ratio), 4), "max": round(max(sse_ratio), 4)}},
        "aggregation_all_k": {"vectorised_median_s": round(statistics.median(vectorised), 3),
                              "python_dicts_median_s": round(statistics.median(dicts), 3),
                              "speedup": round(statistics.median(dicts) / statistics.median(vectorised), 2),
                              "repeats": args.repeats, "results_agree": agree},
        "targets": {"sweep_plus_selection_s": 120, "peak_memory_mb": 4096, "aggregation_all_k_s": 10},
        "machine": {"python": sys.version.split()[0], "numpy": np.__version__, "sklearn": sklearn.__version__,
                    "torch_threads": torch.get_num_threads(), "platform": platform.platform()},
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    atomic_write_json(args.out, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
