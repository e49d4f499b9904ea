"""Clustering the utterance embeddings for every k (docs/method.md §2 step 3, §7).

Methods, by name in :data:`CLUSTERINGS`:

* ``kmeans`` (this project's default, the design card's choice): scikit-learn's Lloyd k-means
  from a k-means++ start, on a PCA projection of the vectors (see :func:`kmeans_sweep`).
  Everything is seeded from ``seed``, so a resumed sweep gives the same labels as an
  uninterrupted one.
* ``ward`` (the original code: ``linkage(..., "ward")`` cut with ``fcluster(..., "maxclust")``)
  and ``average`` (the paper: average linkage, Euclidean). One linkage tree serves every k.
  Hierarchical clustering needs the O(n²) distance matrix (20,000 points ≈ 1.6 GB), so it is
  refused above ``max_hierarchical_points``; use k-means for larger sets.

Weights. The rows of ``x`` are distinct texts; ``sample_weight`` (how often each text occurs,
``clustering.weight: occurrences``) makes every method cluster occurrences, as the release does
(it clusters every utterance it reads): k-means takes the counts as ``sample_weight``, the
hierarchical methods run on the rows repeated by their counts.

Labels are renumbered in order of first appearance, so equal partitions give equal arrays.
A ``maxclust`` cut can give fewer than k clusters when merge heights tie.
"""
from __future__ import annotations

import warnings
from typing import Callable, Iterable, Iterator

import numpy as np
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): scipy, sklearn


def canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Renumber cluster ids 0, 1, 2, ... in order of first appearance."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    return rank[inverse]


def project(x: np.ndarray, dim: int | None, seed: int = 0, info: dict | None = None) -> np.ndarray:
    """The rows of ``x`` on their first ``dim`` principal components (``x`` itself when ``dim``
    is None or not below the vectors' size). float32 [n, min(dim, d)].

    ``info``, when given, receives ``pca_dim`` and ``pca_variance_kept`` (the share of the
    vectors' variance the projection keeps), so a run can say how much it left out.
    """
    if dim is None or dim >= x.shape[1] or len(x) <= dim:
        if info is not None:
            info.update(pca_dim=None, pca_variance_kept=1.0)
        return x
    from sklearn.decomposition import PCA

    pca = PCA(n_components=dim, svd_solver="covariance_eigh", random_state=seed)
    z = pca.fit_transform(x).astype(np.float32)
    if info is not None:
        info.update(pca_dim=dim, pca_variance_kept=round(float(pca.explained_variance_ratio_.sum()), 4))
    return z


def kmeans_sweep(x: np.ndarray, ks: Iterable[int], seed: int = 0, max_iter: int = 15, tol: float = 1e-4,
                 seeding: str = "shared", sample_weight: np.ndarray | None = None, pca_dim: int | None = 128,
                 info: dict | None = None, **_: object) -> Iterator[tuple[int, np.ndarray]]:
    """k-means for every k, fast enough for real embeddings (``benchmarks/intention_sweep.py``).

    * ``pca_dim``: cluster the vectors' first ``pca_dim`` principal components (None: the raw
      vectors). Sentence embeddings keep most of their variance there (all-MiniLM-L6-v2 on the
      benchmark's 13,331 questions: 93% in 128 of 384 dimensions), and the partitions' within-cluster
      SSE *in the full space* equals plain k-means' (the benchmark reports it per k).
    * ``seeding="shared"`` (default) draws one greedy k-means++ sequence of ``max(ks)`` centres
      and starts k-means for each k from its first k centres. A prefix of a k-means++ sequence is
      itself a k-means++ seeding, so each k still gets a k-means++ start, and the seeding is done
      once instead of once per k. ``seeding="per_k"`` runs scikit-learn's own k-means++
      independently for each k, seeded with ``seed + k``.
    * ``max_iter``: Lloyd iterations per k. Real embeddings have no clean clusters, so Lloyd
      creeps on for dozens of iterations while the SSE barely moves: on the benchmark, 15
      iterations end within 0.03% (median over k) of the SSE of running to convergence from
      the same start, at half the time.
    * ``sample_weight``: one non-negative weight per row (occurrence counts), or None.
    * ``info``: a dict that receives what the projection kept (see :func:`project`).
    """
    from sklearn.cluster import KMeans, kmeans_plusplus
    from sklearn.exceptions import ConvergenceWarning

    ks = list(ks)
    if seeding not in ("shared", "per_k"):
        raise ValueError(f"unknown k-means seeding {seeding!r} (shared | per_k)")
    x = project(np.asarray(x, dtype=np.float32), pca_dim, seed, info)
    weight = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    starts = kmeans_plusplus(x, max(ks), sample_weight=weight, random_state=seed)[0] if seeding == "shared" and ks else None
    for k in ks:
        init = starts[:k] if starts is not None else "k-means++"
        with warnings.catch_warnings():
            # Duplicate points give fewer distinct clusters than k; that is expected and harmless.
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = KMeans(n_clusters=k, n_init=1, init=init, max_iter=max_iter, tol=tol, random_state=seed + k)
            yield k, canonical_labels(model.fit_predict(x, sample_weight=weight))


def _hierarchical_sweep(method: str):
    def sweep(x: np.ndarray, ks: Iterable[int], max_hierarchical_points: int = 20000,
              sample_weight: np.ndarray | None = None, **_: object):
        from scipy.cluster.hierarchy import fcluster, linkage

        counts = None if sample_weight is None else np.asarray(sample_weight).astype(np.int64)
        if counts is not None and (np.any(counts < 1) or not np.allclose(counts, sample_weight)):
            raise ValueError(f"{method} linkage on occurrences needs whole-number counts >= 1")
        rows = np.arange(len(x)) if counts is None else np.repeat(np.arange(len(x)), counts)
        if len(rows) > max_hierarchical_points:
            raise ValueError(f"{method} linkage on {len(rows)} points needs an O(n²) distance matrix; the limit is "
                             f"max_hierarchical_points={max_hierarchical_points} (raise it, or use clustering.method=kmeans)")
        tree = linkage(np.asarray(x, dtype=np.float64)[rows], method=method, metric="euclidean")
        # Occurrences of one text are equal points, merged at height 0 before any cut: one label each.
        first = np.searchsorted(rows, np.arange(len(x)))
        for k in ks:
            yield k, canonical_labels(fcluster(tree, t=k, criterion="maxclust")[first])

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
