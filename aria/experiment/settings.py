"""The experiment's settings: ``config/experiment.yaml`` with a preset of ``config/experiment/``,
checked once by :func:`aria.experiment.runner.check_settings` and read as attributes by the
runner, the layout, the report and the game families (``cfg.eval.games``).

Two sections stay mappings and say so: ``game`` (a config group whose shape is its family's,
checked by :func:`aria.games.family.checked_game`) and ``oracle`` (checked by the oracle registry).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Dict, List, Optional, get_type_hints

from omegaconf import MISSING

from aria.io import ConfigError
from aria.settings import MAX_GAMES, bounded


@dataclass
class WarmStartSettings:
    enabled: bool = MISSING
    games: int = bounded(ge=0, le=MAX_GAMES)  # >= 1 when enabled (aria.experiment.runner.check_settings)
    epsilon: float = bounded(ge=0, le=1)
    seed: int = bounded(ge=0)
    train_overrides: List[str] = MISSING


@dataclass
class PlaySettings:
    """A collection or an evaluation: ``games`` for a question game; ``config_set`` and
    ``games_per_config`` for a two-player one (docs/games.md)."""
    games: Optional[int] = bounded(ge=1, le=MAX_GAMES, default=None)
    config_set: Optional[str] = None
    games_per_config: Optional[int] = bounded(ge=1, le=MAX_GAMES, default=None)
    temperature: float = bounded(ge=0)
    max_tokens: int = bounded(ge=1)
    batch_size: Optional[int] = bounded(ge=1)


@dataclass
class EvalPlaySettings(PlaySettings):
    seed: int = bounded(ge=0)
    opponent: Optional[Any] = None  # two-player: who sits in the other seat (config/opponent/)


@dataclass
class VariantSettings:
    method: str = MISSING
    intention_overrides: List[str] = field(default_factory=list)


@dataclass
class VllmSettings:
    eager: bool = MISSING
    restarts: int = bounded(ge=0)


@dataclass
class ExperimentGradVarianceSettings:
    enabled: bool = MISSING
    max_samples: int = MISSING


@dataclass
class MovementSettings:
    enabled: bool = MISSING
    steps: int = bounded(ge=1)
    min_token_kl: float = bounded(ge=0, why="nats")
    kl_from: str = bounded(one_of=("lower_bound", "estimate"))  # what min_token_kl is held against
    min_weight_share: float = bounded(ge=0, le=1)
    min_kept_share: float = bounded(ge=0, le=1)


@dataclass
class ReportSettings:
    paired: Optional[List[str]] = MISSING
    more_pairs: List[List[str]] = MISSING
    discordant_share: float = bounded(gt=0, le=1)
    verdict_on: str = bounded(one_of=("runs", "pairs"))  # aria.experiment.report.VERDICTS
    between_run_sd: float = bounded(ge=0, le=1)
    preflight_ks: List[int] = bounded(each={"ge": 2})
    movement: MovementSettings = field(default_factory=MovementSettings)


@dataclass
class ArcherArmSettings:
    critic_overrides: List[str] = MISSING
    actor_warmup_iterations: int = bounded(ge=0)


@dataclass
class ExperimentSettings:
    """config/experiment.yaml with a preset of config/experiment/."""
    name: str = MISSING
    run_dir: str = MISSING
    results_dir: str = MISSING
    report_only: bool = MISSING
    game: Any = MISSING  # a config group (config/game/)
    oracle: Any = MISSING  # a config group (config/oracle/)
    base_model: str = MISSING
    methods: List[str] = MISSING
    variants: Dict[str, VariantSettings] = MISSING
    seeds: List[int] = bounded(nonempty=True, each={"ge": 0})
    seeds_by_method: Dict[str, List[int]] = MISSING
    iterations: int = MISSING
    iterations_by_method: Dict[str, int] = MISSING
    engine: str = bounded(one_of=("vllm", "local"))
    vllm: VllmSettings = field(default_factory=VllmSettings)
    policy_dtype: Optional[str] = bounded(one_of=("float32", "bfloat16", "float16"))
    launcher: Optional[str] = MISSING
    warm_start: WarmStartSettings = field(default_factory=WarmStartSettings)
    collect: PlaySettings = field(default_factory=PlaySettings)
    intention_overrides: List[str] = MISSING
    train_overrides: List[str] = MISSING
    train_overrides_by_method: Dict[str, List[str]] = MISSING
    archer: ArcherArmSettings = field(default_factory=ArcherArmSettings)
    eval: EvalPlaySettings = field(default_factory=EvalPlaySettings)
    grad_variance: ExperimentGradVarianceSettings = field(default_factory=ExperimentGradVarianceSettings)
    report: ReportSettings = field(default_factory=ReportSettings)


def recorded_over(current: dict, recorded: dict, schema: type = ExperimentSettings,
                  where: str = "") -> tuple[dict, list[str], list[str]]:
    """``current`` (settings as a dict) with every value ``recorded`` holds (a run's experiment.json):
    the merged settings, the dotted names whose values differ (and recorded names no longer
    settings), and the names the record lacks (settings the code gained after the run), which keep
    ``current``'s values. Sections recurse; a mapping (``game``, ``variants``) is one value; a
    section recorded as anything but a mapping is a :class:`ConfigError` naming it."""
    hints = get_type_hints(schema)
    merged, differ, missing = {}, [], []
    for f in fields(schema):
        name, ours = where + f.name, current[f.name]
        if f.name not in recorded:
            merged[f.name] = ours
            missing.append(name)
        elif is_dataclass(hints[f.name]):
            if not isinstance(recorded[f.name], dict):  # a record no run wrote: said here, where its name is known
                raise ConfigError(f"{name}: expected a section of settings (a mapping), got {recorded[f.name]!r}")
            merged[f.name], d, m = recorded_over(ours, recorded[f.name], hints[f.name], name + ".")
            differ, missing = differ + d, missing + m
        else:
            merged[f.name] = recorded[f.name]
            differ += [name] if recorded[f.name] != ours else []
    differ += [f"{where}{k} (no longer a setting)" for k in recorded if k not in merged]
    return merged, differ, missing
