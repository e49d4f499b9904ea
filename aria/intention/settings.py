"""The labelling pipeline's settings (config/intention.yaml), typed: what steps 1-4 read as
attributes (``cfg.aggregation.gamma``), each bound declared once here (:func:`aria.settings.bounded`).

:func:`aria.intention.pipeline.check_settings` turns a composed config or a dict into an
:class:`IntentionSettings` and adds the checks a field's type cannot say: a name that a registry
holds (``clustering.method``, ``aggregation.mode``, ``aggregation.discount``,
``selection.criterion``, the embedder), and settings that depend on each other (``k_max`` >=
``k_min``; behavioural labels need a game with an offline oracle). Two sections stay mappings:
``game``, checked against its family's schema where a command takes its game
(:func:`aria.games.family.checked_game`), and ``embedder``, whose options differ by backend
(:func:`aria.intention.embed.check_embedder`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from aria.settings import bounded

#: ``labels``: what steps 3-4 aggregate with: step 1's clusters at the chosen k (the paper), or the
#: behavioural partition (the ceiling any clustering can reach; question games with an offline oracle).
LABELS = ("clusters", "behavioural")
#: ``behaviour``: auto computes the behavioural intentions wherever the game has an offline oracle,
#: required refuses a game without one, never skips them.
BEHAVIOUR = ("auto", "required", "never")
#: How the texts of a pool are weighted when clustered (``clustering.weight``).
WEIGHTS = ("occurrences", "distinct")


@dataclass
class EmbeddingSettings:
    use_precomputed: bool = MISSING  # take a trajectory's own vectors where it carries them
    save_every: int = bounded(ge=1)  # texts embedded between two saves of the cache


@dataclass
class ClusteringSettings:
    method: str = MISSING  # a name of aria.intention.cluster.CLUSTERINGS
    weight: str = bounded(one_of=WEIGHTS)
    k_min: int = bounded(ge=1)
    k_max: int = bounded(ge=1)  # >= k_min (checked with it)
    pca_dim: Optional[int] = bounded(ge=1)
    max_iter: int = bounded(ge=1)
    seeding: str = bounded(one_of=("shared", "per_k"))
    tol: float = bounded(ge=0)
    max_hierarchical_points: int = bounded(ge=2)

    def sweep_options(self) -> dict[str, Any]:
        """What the k sweep of one method takes as keywords (aria.intention.cluster.cluster_all_k)."""
        return {"pca_dim": self.pca_dim, "max_iter": self.max_iter, "seeding": self.seeding, "tol": self.tol,
                "max_hierarchical_points": self.max_hierarchical_points}


@dataclass
class AggregationSettings:
    gamma: float = bounded(gt=0, le=1, why="the discount of R_t = gamma^(T-t) R: 0 would erase every step but the last")
    discount: str = MISSING  # a name of aria.intention.aggregate.DISCOUNTS
    mode: str = MISSING  # a name of aria.intention.aggregate.AGGREGATION_MODES
    n_rollout: int = bounded(ge=1)
    include_first_action: bool = MISSING
    window: Optional[int] = bounded(ge=0, why="null: the whole history")  # null: the whole history (the paper); m: the last m turns (ours)

    def aggregate_args(self) -> dict[str, Any]:
        """The keywords of :func:`aria.intention.aggregate.aggregate` these settings give."""
        return {"mode": self.mode, "n_rollout": self.n_rollout, "include_first_action": self.include_first_action,
                "window": self.window}


@dataclass
class SelectionSettings:
    criterion: str = MISSING  # a name of aria.intention.select.SELECTORS (unless fixed_k is set)
    epsilon: float = bounded(ge=0)
    tau: int = bounded(ge=0)
    fixed_k: Any = MISSING  # null, an int, or {pool: int}: checked by aria.intention.pipeline (no union type here)
    keys: str = bounded(one_of=("aggregation", "whole_history"), default="aggregation")  # the keys SplitScore's R~ is aggregated under
    silhouette_sample: int = bounded(ge=2)


@dataclass
class IntentionSettings:
    """config/intention.yaml: the labelling pipeline, steps 1-4."""
    game: Any = MISSING  # the game's section, checked by its family (a mapping)
    embedder: Any = MISSING  # the embedding model's options (a mapping; aria.intention.embed)
    input: Any = MISSING  # a glob, a file, or a list of them
    run_dir: str = MISSING
    train_out: Optional[str] = MISSING  # null: run_dir/train.json
    seed: int = bounded(ge=0)
    labels: str = bounded(one_of=LABELS)
    behaviour: str = bounded(one_of=BEHAVIOUR)
    embedding: EmbeddingSettings = field(default_factory=EmbeddingSettings)
    clustering: ClusteringSettings = field(default_factory=ClusteringSettings)
    aggregation: AggregationSettings = field(default_factory=AggregationSettings)
    selection: SelectionSettings = field(default_factory=SelectionSettings)
