"""Cluster-quality indices (aria/intention/select.py ClusterQuality) against scikit-learn.

scikit-learn's own functions are the independent reference: our vectorised, occurrence-weighted
versions must give its values on the same points, and on the points repeated by their counts.
"""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import calinski_harabasz_score, davies_bouldin_score, silhouette_score

from aria.intention.select import ClusterQuality, choose_k


def blobs(seed: int = 0, n: int = 60, dim: int = 5):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim))
    labels = rng.integers(0, 4, n)
    return x, labels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_indices_equal_scikit_learn(seed):
    x, labels = blobs(seed)
    quality = ClusterQuality(x, sample_size=1000)  # the sample is every point
    scores = quality.scores(labels)
    assert scores["silhouette"] == pytest.approx(silhouette_score(x, labels), rel=1e-10)
    assert scores["calinski_harabasz"] == pytest.approx(calinski_harabasz_score(x, labels), rel=1e-10)
    assert scores["davies_bouldin"] == pytest.approx(davies_bouldin_score(x, labels), rel=1e-10)


def test_weights_count_as_repeated_rows():
    x, labels = blobs(3, n=40)
    counts = np.random.default_rng(4).integers(1, 5, len(x))
    repeated, repeated_labels = np.repeat(x, counts, axis=0), np.repeat(labels, counts)
    quality = ClusterQuality(x, counts, sample_size=10_000)
    assert quality.sample_size == counts.sum()
    assert quality.silhouette(labels) == pytest.approx(silhouette_score(repeated, repeated_labels), rel=1e-10)
    assert quality.calinski_harabasz(labels) == pytest.approx(calinski_harabasz_score(repeated, repeated_labels), rel=1e-10)
    assert quality.davies_bouldin(labels) == pytest.approx(davies_bouldin_score(repeated, repeated_labels), rel=1e-10)
    # Without the weights the values differ: the counts matter.
    assert ClusterQuality(x, sample_size=10_000).calinski_harabasz(labels) != pytest.approx(quality.calinski_harabasz(labels))


def test_sampled_silhouette_is_the_silhouette_of_the_sample():
    x, labels = blobs(5, n=300)
    quality = ClusterQuality(x, sample_size=50, seed=7)
    sample = quality.sample
    assert len(sample) == 50 and len(set(sample.tolist())) == 50
    assert quality.silhouette(labels) == pytest.approx(silhouette_score(x[sample], labels[sample]), rel=1e-10)
    assert np.array_equal(ClusterQuality(x, sample_size=50, seed=7).sample, sample)  # seeded


def test_singletons_duplicates_and_undefined_cases():
    x = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [5.0, 5.0], [5.0, 6.0]])
    labels = np.array([0, 0, 1, 2, 2])  # cluster 1 is a single point; cluster 0 two equal points
    quality = ClusterQuality(x, sample_size=100)
    assert quality.silhouette(labels) == pytest.approx(silhouette_score(x, labels), rel=1e-10)
    assert quality.davies_bouldin(labels) == pytest.approx(davies_bouldin_score(x, labels), rel=1e-10)
    assert np.isnan(quality.silhouette(np.zeros(5, dtype=int)))  # one cluster: undefined
    assert np.isnan(quality.calinski_harabasz(np.arange(5)))     # n clusters: undefined
    # Labels with gaps (1, 5, 9) mean the same partition as 0, 1, 2.
    assert quality.calinski_harabasz(np.array([1, 1, 5, 9, 9])) == pytest.approx(calinski_harabasz_score(x, labels))


def test_each_index_picks_the_planted_k():
    """Three tight, well-separated blobs: every index prefers k = 3 among labellings with k = 2..5.

    The labellings are built by hand: k = 3 is the blobs, k = 2 merges two blobs, k = 4 and 5
    split a blob in halves. Silhouette and Calinski-Harabasz are larger-is-better, Davies-Bouldin
    smaller-is-better.
    """
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    x = np.concatenate([c + 0.3 * rng.normal(size=(20, 2)) for c in centres])
    blob = np.repeat([0, 1, 2], 20)
    half = np.tile(np.repeat([0, 1], 10), 3)
    labellings = {2: np.minimum(blob, 1), 3: blob, 4: np.where((blob == 0) & (half == 1), 3, blob),
                  5: np.where((blob == 0) & (half == 1), 3, np.where((blob == 1) & (half == 1), 4, blob))}
    ks = sorted(labellings)
    quality = ClusterQuality(x, sample_size=1000)
    curves = {name: [quality.scores(labellings[k])[name] for k in ks]
              for name in ("silhouette", "calinski_harabasz", "davies_bouldin")}
    for name in curves:
        assert choose_k(name, curves, ks).k == 3, (name, curves[name])
    # And the direction matters: the worst k by each index is not 3.
    assert ks[int(np.argmin(curves["silhouette"]))] != 3 and ks[int(np.argmax(curves["davies_bouldin"]))] != 3
