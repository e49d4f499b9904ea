"""Clustering the utterance embeddings for every k (spec §2 step 3, §7).

Methods, by name in :data:`CLUSTERINGS`:

* ``kmeans`` (this project's default, the design card's choice): scikit-learn's Lloyd k-means
  from a k-means++ start (see :func:`kmeans_sweep`). Everything is seeded from ``seed``, so a
  resumed sweep gives the same labels as an uninterrupted one.
* ``ward`` (the original code: ``linkage(..., "ward")`` cut with ``fcluster(..., "maxclust")``)
  and ``average`` (the paper: average linkage, Euclidean). One linkage tree serves every k.
  Hierarchical clustering needs the O(n²) distance matrix (20,000 points ≈ 1.6 GB), so it is
  refused above ``max_hierarchical_points``; use k-means for larger sets.

Labels are renumbered in order of first appearance, so equal partitions give equal arrays.
A ``maxclust`` cut can give fewer than k clusters when merge heights tie.
"""
from __future__ import annotations

import warnings
from typing import Callable, Iterable, Iterator

import numpy as np


def canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Renumber cluster ids 0, 1, 2, ... in order of first appearance."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    return rank[inverse]


def kmeans_sweep(x: np.ndarray, ks: Iterable[int], seed: int = 0, max_iter: int = 100, tol: float = 1e-4,
                 seeding: str = "shared", **_: object) -> Iterator[tuple[int, np.ndarray]]:
    """k-means for every k.

    ``seeding="shared"`` (default) draws one greedy k-means++ sequence of ``max(ks)`` centres
    and starts k-means for each k from its first k centres. A prefix of a k-means++ sequence is
    itself a k-means++ seeding, so each k still gets a k-means++ start. The seeding is done
    once instead of once per k, and on 30,000 × 384 points the seeding costs more than Lloyd's
    iterations (benchmarks/intention_sweep.py compares both). ``seeding="per_k"`` runs
    scikit-learn's own k-means++ independently for each k, seeded with ``seed + k``.
    """
    from sklearn.cluster import KMeans, kmeans_plusplus
    from sklearn.exceptions import ConvergenceWarning

    ks = list(ks)
    if seeding not in ("shared", "per_k"):
        raise ValueError(f"unknown k-means seeding {seeding!r} (shared | per_k)")
    x = np.asarray(x, dtype=np.float32 if np.asarray(x).dtype == np.float32 else np.float64)
    starts = kmeans_plusplus(x, max(ks), random_state=seed)[0] if seeding == "shared" and ks else None
    for k in ks:
        init = starts[:k] if starts is not None else "k-means++"
        with warnings.catch_warnings():
            # Duplicate points give fewer distinct clusters than k; that is expected and harmless.
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = KMeans(n_clusters=k, n_init=1, init=init, max_iter=max_iter, tol=tol, random_state=seed + k)
            yield k, canonical_labels(model.fit_predict(x))


def _hierarchical_sweep(method: str):
    def sweep(x: np.ndarray, ks: Iterable[int], max_hierarchical_points: int = 20000, **_: object):
        from scipy.cluster.hierarchy import fcluster, linkage

        if len(x) > max_hierarchical_points:
            raise ValueError(f"{method} linkage on {len(x)} points needs an O(n²) distance matrix; the limit is "
                             f"max_hierarchical_points={max_hierarchical_points} (raise it, or use clustering.method=kmeans)")
        tree = linkage(np.asarray(x, dtype=np.float64), method=method, metric="euclidean")
        for k in ks:
            yield k, canonical_labels(fcluster(tree, t=k, criterion="maxclust"))

    sweep.__name__ = f"{method}_sweep"
    return sweep


#: Clustering methods by config name; each yields ``(k, labels)`` for the requested ks.
CLUSTERINGS: dict[str, Callable[..., Iterator[tuple[int, np.ndarray]]]] = {
    "kmeans": kmeans_sweep,
    "ward": _hierarchical_sweep("ward"),
    "average": _hierarchical_sweep("average"),
}


def k_range(k_min: int, k_max: int, n_points: int) -> list[int]:
    """ks from ``k_min`` to ``k_max``, clipped to the number of distinct points.

    With fewer than two distinct points there is nothing to split: the range is ``[1]``.
    """
    if k_min < 1 or k_max < k_min:
        raise ValueError(f"need 1 <= k_min <= k_max, got {k_min}..{k_max}")
    top = min(k_max, n_points)
    if top < max(k_min, 2):
        return [1]
    return list(range(max(k_min, 1), top + 1))


def distinct_points(x: np.ndarray) -> int:
    return len(np.unique(np.asarray(x), axis=0)) if len(x) else 0


def cluster_all_k(x: np.ndarray, ks: list[int], method: str = "kmeans", seed: int = 0,
                  done: dict[int, np.ndarray] | None = None,
                  on_result: Callable[[int, np.ndarray], None] | None = None, **options) -> np.ndarray:
    """Labels of the rows of ``x`` for every k in ``ks``: int array [len(ks), n].

    ``done`` holds labels of ks already computed (a resumed sweep); ``on_result`` is called
    after each new k (to save progress). k = 1 gives one cluster without running anything.
    """
    if method not in CLUSTERINGS:
        raise ValueError(f"unknown clustering method {method!r} (known: {sorted(CLUSTERINGS)})")
    done = dict(done or {})
    todo = [k for k in ks if k not in done and k > 1]
    for k in ks:
        if k == 1:
            done[1] = np.zeros(len(x), dtype=np.int64)
    if todo:
        for k, labels in CLUSTERINGS[method](x, todo, seed=seed, **options):
            done[k] = labels
            if on_result:
                on_result(k, labels)
    out = np.stack([done[k] for k in ks]) if ks else np.zeros((0, len(x)), dtype=np.int64)
    return out.astype(np.int32)
