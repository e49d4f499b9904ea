"""Choosing k (``docs/method.md`` §4): SplitScore and the usual cluster-quality indices.

``split_score`` and ``choose_k_by_split_score`` are the paper's rule (§3.4 of the paper).
Silhouette, Calinski–Harabasz and Davies–Bouldin are computed for every k as well, so that
their disagreement with SplitScore (the paper's point: they favour k = 2) can be plotted.
The criterion that picks k is chosen by name from :data:`SELECTORS`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): scipy, sklearn


def split_score(rewards_k: np.ndarray, rewards_k_plus_1: np.ndarray) -> float:
    """SplitScore(k) = (1/|D|) Σ_{(h,a)∈D} |R̃^(k+1)(h,a) − R̃^(k)(h,a)| (docs/method.md §4).

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
    """The smallest k with SplitScore(j) < ε for every j in [k, k+τ] (docs/method.md §4; paper ε=0.01, τ=10).

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


# ---- cluster-quality indices (on the pool's embeddings, every occurrence counted) -------------
def pairwise_distances(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Euclidean distances between the rows of ``a`` and ``b`` (default ``a``), by one matrix product."""
    b = a if b is None else b
    squared = np.einsum("ij,ij->i", a, a)[:, None] - 2 * (a @ b.T) + np.einsum("ij,ij->i", b, b)[None, :]
    return np.sqrt(np.maximum(squared, 0))


class ClusterQuality:
    """Silhouette, Calinski–Harabasz and Davies–Bouldin of many labellings of one set of vectors.

    The rows of ``embeddings`` are distinct texts and ``weight`` their occurrence counts (None:
    one each). Every index equals scikit-learn's on the occurrences, i.e. on the rows repeated by
    their counts (``tests/test_select.py`` checks this), but costs a few matrix products per
    labelling instead of scikit-learn's per-cluster masks, so step 2 scores 99 labellings of
    13,000 texts in about a second:

    * Calinski–Harabasz from the cluster sums: W = Σ w‖x‖² − Σ_j n_j‖c_j‖², B = Σ_j n_j‖c_j − μ‖².
    * Davies–Bouldin from each point's distance to its own centroid (read off x·Cᵀ) and the
      centroid distances.
    * Silhouette on a seeded sample of ``sample_size`` occurrences (the full index is O(n²) per
      labelling), its distance matrix computed once; per labelling, the sums of distances to each
      cluster are one matrix product.

    Products run in the embeddings' dtype (float32 for real embeddings; sums in float64). An index
    is NaN where scikit-learn's is undefined (fewer than 2 or more than n − 1 clusters).
    """

    def __init__(self, embeddings: np.ndarray, weight: np.ndarray | None = None, sample_size: int = 2000, seed: int = 0):
        x = np.asarray(embeddings)
        self.x = x if x.dtype in (np.float32, np.float64) else x.astype(np.float64)
        self.weight = np.ones(len(x)) if weight is None else np.asarray(weight, dtype=np.float64)
        self.total = float(self.weight.sum())
        self.norms = np.einsum("ij,ij->i", self.x, self.x, dtype=np.float64)
        self.mean = self.weight @ self.x.astype(np.float64) / self.total
        rng = np.random.default_rng(seed)
        occurrences = int(round(self.total))
        if occurrences > sample_size:  # a sample of occurrences: texts drawn by their counts, without replacement
            picked = np.sort(rng.choice(occurrences, size=sample_size, replace=False))
            self.sample = np.searchsorted(np.cumsum(self.weight), picked, side="right")
        else:
            self.sample = np.repeat(np.arange(len(x)), np.round(self.weight).astype(np.int64))
        self.distances = pairwise_distances(self.x[self.sample])
        np.fill_diagonal(self.distances, 0.0)

    @property
    def sample_size(self) -> int:
        return len(self.sample)

    def _centroids(self, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        _, labels = np.unique(labels, return_inverse=True)
        k = int(labels.max()) + 1
        members = np.zeros((k, len(labels)), dtype=self.x.dtype)
        members[labels, np.arange(len(labels))] = self.weight
        sizes = np.bincount(labels, weights=self.weight, minlength=k)
        return labels, (members @ self.x) / sizes[:, None].astype(self.x.dtype), sizes

    def scores(self, labels: np.ndarray) -> dict[str, float]:
        """All three indices of one labelling (the centroids computed once)."""
        parts = self._centroids(labels)
        return {"silhouette": self.silhouette(labels), "calinski_harabasz": self._calinski_harabasz(*parts),
                "davies_bouldin": self._davies_bouldin(*parts)}

    def calinski_harabasz(self, labels: np.ndarray) -> float:
        return self._calinski_harabasz(*self._centroids(labels))

    def davies_bouldin(self, labels: np.ndarray) -> float:
        return self._davies_bouldin(*self._centroids(labels))

    def _calinski_harabasz(self, labels: np.ndarray, centroids: np.ndarray, sizes: np.ndarray) -> float:
        k = len(sizes)
        if not 2 <= k <= self.total - 1:
            return float("nan")
        within = float(self.weight @ self.norms - sizes @ np.einsum("ij,ij->i", centroids, centroids, dtype=np.float64))
        between = float(sizes @ ((centroids.astype(np.float64) - self.mean) ** 2).sum(axis=1))
        return 1.0 if within <= 0.0 else between * (self.total - k) / (within * (k - 1.0))

    def _davies_bouldin(self, labels: np.ndarray, centroids: np.ndarray, sizes: np.ndarray) -> float:
        k = len(sizes)
        if not 2 <= k <= self.total - 1:
            return float("nan")
        own_dot = (self.x @ centroids.T)[np.arange(len(labels)), labels]
        centroid_norms = np.einsum("ij,ij->i", centroids, centroids, dtype=np.float64)
        to_own = np.sqrt(np.maximum(self.norms - 2 * own_dot + centroid_norms[labels], 0))
        intra = np.bincount(labels, weights=self.weight * to_own, minlength=k) / sizes
        between = pairwise_distances(centroids.astype(np.float64))
        np.fill_diagonal(between, 0.0)
        if np.allclose(intra, 0) or np.allclose(between, 0):
            return 0.0
        between[between == 0] = np.inf
        return float(np.mean(np.max((intra[:, None] + intra) / between, axis=1)))

    def silhouette(self, labels: np.ndarray) -> float:
        _, sample = np.unique(np.asarray(labels)[self.sample], return_inverse=True)
        k, n = int(sample.max()) + 1, len(sample)
        if not 2 <= k <= n - 1:
            return float("nan")
        members = np.zeros((n, k), dtype=self.distances.dtype)
        members[np.arange(n), sample] = 1.0
        sums = self.distances @ members  # [n, k]: each point's summed distance to every cluster
        sizes = members.sum(axis=0)
        own_size = sizes[sample]
        a = sums[np.arange(n), sample] / np.maximum(own_size - 1, 1)
        means = sums / sizes
        means[np.arange(n), sample] = np.inf
        b = means.min(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            score = np.nan_to_num((b - a) / np.maximum(a, b))
        score[own_size == 1] = 0.0  # scikit-learn: a point alone in its cluster scores 0
        return float(score.mean())


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


def intention_recovery(true_intentions: Sequence[str], labels: np.ndarray) -> dict[str, float]:
    """How well cluster labels recover known intentions: the adjusted Rand index (1 = the same
    partition, about 0 = chance, negative = worse than chance) and the normalised mutual
    information (arithmetic normalisation, 1 = the same partition, 0 = independent) between the
    two partitions of the same steps ([n] each). Known only for data whose player recorded what
    it meant, e.g. the scripted expert's ``intention`` on every turn."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    truth = list(true_intentions)
    labels = np.asarray(labels)
    if len(truth) != len(labels) or not truth:
        raise ValueError(f"expected as many labels as intentions (> 0), got {len(labels)} and {len(truth)}")
    return {"ari": float(adjusted_rand_score(truth, labels)), "nmi": float(normalized_mutual_info_score(truth, labels))}
