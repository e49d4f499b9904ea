"""Clustering every k (aria/intention/cluster.py) and the k range rules."""
from __future__ import annotations

import numpy as np
import pytest

from aria.intention.cluster import canonical_labels, cluster_all_k, k_range


def blobs(seed=0, n_per=15, centers=4, dim=6):
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=10, size=(centers, dim))
    truth = np.repeat(np.arange(centers), n_per)
    return means[truth] + rng.normal(size=(len(truth), dim)), truth


def same_partition(a, b) -> bool:
    return (canonical_labels(a) == canonical_labels(b)).all()


@pytest.mark.parametrize("method", ["kmeans", "ward", "average"])
def test_every_method_recovers_well_separated_blobs(method):
    x, truth = blobs()
    ks = list(range(2, 8))
    labels = cluster_all_k(x, ks, method, seed=0)
    assert labels.shape == (len(ks), len(x)) and labels.dtype == np.int32
    assert same_partition(labels[ks.index(4)], truth)
    for k, row in zip(ks, labels):
        assert len(np.unique(row)) <= k
        assert same_partition(row, row)  # canonical: first appearance order
        assert row[0] == 0


@pytest.mark.parametrize("seeding", ["shared", "per_k"])
def test_kmeans_is_deterministic_and_resumable(seeding):
    x, _ = blobs(seed=1, n_per=20, centers=6)
    ks = list(range(2, 10))
    full = cluster_all_k(x, ks, "kmeans", seed=3, seeding=seeding)
    assert (cluster_all_k(x, ks, "kmeans", seed=3, seeding=seeding) == full).all()
    done = {k: full[i] for i, k in enumerate(ks) if k % 2 == 0}
    resumed = cluster_all_k(x, ks, "kmeans", seed=3, seeding=seeding, done=done)
    assert (resumed == full).all()


def test_hierarchical_refuses_sets_too_large_for_its_distance_matrix():
    x, _ = blobs()
    with pytest.raises(ValueError, match="max_hierarchical_points"):
        cluster_all_k(x, [2, 3], "ward", max_hierarchical_points=10)


def test_k_range_is_clipped_to_the_distinct_points():
    assert k_range(2, 100, 500) == list(range(2, 101))
    assert k_range(2, 100, 7) == list(range(2, 8))
    assert k_range(2, 100, 1) == [1]
    assert cluster_all_k(np.ones((5, 3)), [1]).tolist() == [[0] * 5]
    with pytest.raises(ValueError):
        k_range(5, 3, 10)


def test_unknown_method():
    with pytest.raises(ValueError, match="unknown clustering method"):
        cluster_all_k(np.zeros((3, 2)), [2], "dbscan")
