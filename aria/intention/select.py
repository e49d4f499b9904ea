"""Choosing k (spec ``aria_method.md`` §4): SplitScore and the usual cluster-quality indices.

``split_score`` and ``choose_k_by_split_score`` are the paper's rule (§3.4 of the paper).
Silhouette, Calinski–Harabasz and Davies–Bouldin are computed for every k as well, so that
their disagreement with SplitScore (the paper's point: they favour k = 2) can be plotted.
The criterion that picks k is chosen by name from :data:`SELECTORS`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from sklearn.metrics import calinski_harabasz_score, davies_bouldin_score, silhouette_score
from sklearn.metrics.pairwise import euclidean_distances


def split_score(rewards_k: np.ndarray, rewards_k_plus_1: np.ndarray) -> float:
    """SplitScore(k) = (1/|D|) Σ_{(h,a)∈D} |R̃^(k+1)(h,a) − R̃^(k)(h,a)| (spec §4).

    D is every agent step; steps without an aggregated reward at either k (NaN, dropped by the
    n_rollout filter) are left out of D. NaN when D is empty.
    """
    diff = np.abs(np.asarray(rewards_k_plus_1, dtype=np.float64) - np.asarray(rewards_k, dtype=np.float64))
    diff = diff[np.isfinite(diff)]
    return float(diff.mean()) if diff.size else float("nan")


def split_scores(ks: Sequence[int], rewards: np.ndarray) -> np.ndarray:
    """SplitScore for every k but the last; ``rewards`` is [len(ks), n_steps] and ``ks`` consecutive."""
    ks = list(ks)
    if any(b != a + 1 for a, b in zip(ks, ks[1:])):
        raise ValueError("SplitScore compares k with k+1: ks must be consecutive integers")
    return np.array([split_score(rewards[i], rewards[i + 1]) for i in range(len(ks) - 1)])


@dataclass(frozen=True)
class Choice:
    k: int
    rule_satisfied: bool
    why: str


def choose_k_by_split_score(ks: Sequence[int], scores: np.ndarray, epsilon: float = 0.01, tau: int = 10) -> Choice:
    """The smallest k with SplitScore(j) < ε for every j in [k, k+τ] (spec §4; paper ε=0.01, τ=10).

    ``scores[i]`` is SplitScore(ks[i]) (one fewer than ``ks``). The window must lie wholly inside
    the computed range. When no k qualifies, the largest k is returned with
    ``rule_satisfied=False``: the rewards keep changing up to the end of the range, which is what
    the paper's ε = 0.001 ablation reports as k = 100.
    """
    ks = list(ks)
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    below = np.asarray(scores, dtype=np.float64) < epsilon  # NaN compares False: a gap fails the window
    for i in range(len(below) - tau):
        if below[i : i + tau + 1].all():
            return Choice(ks[i], True, f"smallest k with SplitScore < {epsilon} for all of [k, k+{tau}]")
    return Choice(ks[-1], False, f"no k in {ks[0]}..{ks[-1]} has SplitScore < {epsilon} on a window of {tau + 1}; "
                                 f"took the largest k")


# ---- cluster-quality indices (computed on the distinct utterances' embeddings) ----------------

class SampledSilhouette:
    """Silhouette on a fixed random sample of points, with its distance matrix computed once.

    The full silhouette is O(n²) per k; on a seeded sample of ``sample_size`` points (a common
    practice; the sample size is reported) the distances are computed once and reused for all k.
    """

    def __init__(self, embeddings: np.ndarray, sample_size: int = 2000, seed: int = 0):
        n = len(embeddings)
        rng = np.random.default_rng(seed)
        self.index = np.sort(rng.choice(n, size=sample_size, replace=False)) if n > sample_size else np.arange(n)
        self.distances = euclidean_distances(embeddings[self.index])
        np.fill_diagonal(self.distances, 0.0)

    @property
    def sample_size(self) -> int:
        return len(self.index)

    def __call__(self, labels: np.ndarray) -> float:
        sample = labels[self.index]
        if not 2 <= len(np.unique(sample)) <= len(sample) - 1:
            return float("nan")
        return float(silhouette_score(self.distances, sample, metric="precomputed"))


def calinski_harabasz(embeddings: np.ndarray, labels: np.ndarray) -> float:
    if not 2 <= len(np.unique(labels)) <= len(labels) - 1:
        return float("nan")
    return float(calinski_harabasz_score(embeddings, labels))


def davies_bouldin(embeddings: np.ndarray, labels: np.ndarray) -> float:
    if not 2 <= len(np.unique(labels)) <= len(labels) - 1:
        return float("nan")
    return float(davies_bouldin_score(embeddings, labels))


def _best(values: Sequence[float], ks: Sequence[int], larger_is_better: bool, name: str) -> Choice:
    values = np.asarray(values, dtype=np.float64)
    if not np.isfinite(values).any():
        return Choice(list(ks)[0], False, f"{name} undefined for every k; took the smallest k")
    pick = np.nanargmax(values) if larger_is_better else np.nanargmin(values)
    return Choice(list(ks)[int(pick)], True, f"{'largest' if larger_is_better else 'smallest'} {name}")


#: Criteria that pick k, by name. Each takes the per-k curves (dict of name -> list) and ks.
SELECTORS: dict[str, Callable[..., Choice]] = {
    "split_score": lambda curves, ks, epsilon, tau: choose_k_by_split_score(ks, curves["split_score"], epsilon, tau),
    "silhouette": lambda curves, ks, **_: _best(curves["silhouette"], ks, True, "silhouette"),
    "calinski_harabasz": lambda curves, ks, **_: _best(curves["calinski_harabasz"], ks, True, "Calinski-Harabasz index"),
    "davies_bouldin": lambda curves, ks, **_: _best(curves["davies_bouldin"], ks, False, "Davies-Bouldin index"),
}


def choose_k(criterion: str, curves: dict[str, Sequence[float]], ks: Sequence[int], epsilon: float = 0.01, tau: int = 10) -> Choice:
    if criterion not in SELECTORS:
        raise ValueError(f"unknown selection criterion {criterion!r}; known: {sorted(SELECTORS)} or a fixed k")
    return SELECTORS[criterion](curves, ks, epsilon=epsilon, tau=tau)
