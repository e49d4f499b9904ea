"""The trainers' settings, typed: the offline trainer (config/reinforce_llm.yaml, and
scripts/grad_variance.py), the reward model (config/reward_model.yaml), the online actor
(config/onlinereinforce_llm.yaml), all three on config/default.yaml, and ArCHer's critic
(config/critic.yaml). Each trainer turns its config into one of these where it starts
(:func:`aria.settings.typed`) and reads it as attributes (``cfg.train.lr``); a bound is declared
once here (:func:`aria.settings.bounded`). Names a registry holds stay strings, checked by the
registry (``method``, ``loss.name``, ``train.packing``, ``train.optimizer``,
``train.lr_scheduler``); the online trainer's ``oracle`` is a config group whose options differ
by oracle, so it stays a mapping.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, List, Optional

from omegaconf import MISSING

from aria.settings import bounded

#: How each V head of ArCHer's critic gets its target from the target Q heads (aria.trainers.critic).
V_TARGETS = ("paired", "min")
#: Where a trainer computes (``device``): ``auto`` a GPU when one is visible, else the CPU.
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class LoraSettings:
    enabled: bool = MISSING
    r: int = bounded(ge=1)
    alpha: int = bounded(gt=0)
    dropout: float = bounded(ge=0, lt=1)
    target_modules: List[str] = MISSING


@dataclass
class ModelSettings:
    path: str = MISSING
    dtype: str = bounded(one_of=("float32", "bfloat16", "float16"))
    gradient_checkpointing: bool = MISSING
    lora: LoraSettings = field(default_factory=LoraSettings)


@dataclass
class DataSettings:
    train_file: str = MISSING
    max_prompt_tokens: int = bounded(ge=1)
    over_long: str = bounded(one_of=("refuse", "cut_left"))  # aria.llm.policy.OVER_LONG
    append_eos: bool = MISSING
    system_prompt: Optional[str] = MISSING
    max_samples: Optional[int] = bounded(ge=1, why="null: all")


@dataclass
class ReinforceLossSettings:
    sft_reward: Optional[float] = MISSING
    sft_weight: float = MISSING


@dataclass
class ClippedReinforceLossSettings(ReinforceLossSettings):
    epsilon: float = bounded(gt=0)
    kl_coef: float = bounded(ge=0)


@dataclass
class DpoLossSettings:
    beta: float = bounded(gt=0)


@dataclass
class LossSettings:
    name: str = MISSING
    reinforce: ReinforceLossSettings = field(default_factory=ReinforceLossSettings)
    clipped_reinforce: ClippedReinforceLossSettings = field(default_factory=ClippedReinforceLossSettings)
    dpo: DpoLossSettings = field(default_factory=DpoLossSettings)

    def options(self, name: str) -> dict[str, Any]:
        """The options of the loss ``name``: the section named like it, or none (a loss without options)."""
        section = getattr(self, name, None)
        return asdict(section) if is_dataclass(section) else {}


@dataclass
class EngineTrainSettings:
    """The ``train`` section every trainer's step reads (aria.trainers.engine)."""
    epochs: int = bounded(ge=1)
    micro_batch_size: int = bounded(ge=1)
    gradient_accumulation_steps: int = bounded(ge=1)
    lr: float = bounded(gt=0)
    optimizer: str = MISSING
    betas: List[float] = bounded(length=2, each={"ge": 0, "lt": 1})  # Adam's (beta1, beta2)
    eps: float = bounded(gt=0)
    weight_decay: float = bounded(ge=0)
    lr_scheduler: str = MISSING
    warmup_ratio: float = bounded(ge=0, le=1)
    warmup_steps: Optional[int] = bounded(ge=0)
    max_grad_norm: float = bounded(ge=0, why="0: no clipping")
    mixed_precision: str = bounded(one_of=("auto", "no", "bf16", "fp16", "fp8"))
    threads: str = MISSING  # "auto" or a count: checked by aria.trainers.engine (no union type here)
    save_freq: int = bounded(ge=1)
    keep_checkpoints: Optional[int] = bounded(ge=1)


@dataclass
class TrainSettings(EngineTrainSettings):
    """... and how the policy trainers lay out their micro-batches."""
    packing: str = MISSING
    length_bucketing: bool = MISSING
    bucket_batches: int = bounded(ge=1)


@dataclass
class LoggingSettings:
    log_every: int = bounded(ge=1)
    report_to: Optional[str] = bounded(one_of=(None, "tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml",
                                               "dvclive", "swanlab", "trackio", "all"))  # accelerate's LoggerType
    run_name: Optional[str] = MISSING
    write_data_order: bool = MISSING


@dataclass
class GradVarianceSettings:
    methods: List[str] = bounded(nonempty=True)
    max_samples: int = bounded(ge=1)
    seed: int = bounded(ge=0)
    out: str = bounded(nonempty=True)


@dataclass
class TrainerSettings:
    """config/reinforce_llm.yaml: the offline trainer (and scripts/grad_variance.py)."""
    seed: int = bounded(ge=0)
    device: str = bounded(one_of=DEVICES)
    output_dir: str = MISSING
    scale_name: str = MISSING
    model: ModelSettings = field(default_factory=ModelSettings)
    data: DataSettings = field(default_factory=DataSettings)
    method: str = MISSING
    loss: LossSettings = field(default_factory=LossSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    grad_variance: GradVarianceSettings = field(default_factory=GradVarianceSettings)


@dataclass
class RewardModelDataSettings(DataSettings):
    eval_fraction: float = bounded(ge=0, lt=1)


@dataclass
class WeightedMseSettings:
    """aria.trainers.losses.mse_weights; ``low <= high`` is checked with the loss's name
    (aria.trainers.losses.LOSS_OPTION_CHECKS)."""
    extreme_weight: float = bounded(ge=0)
    low: float = MISSING
    high: float = MISSING
    middle_weight: float = bounded(ge=0)
    middle: float = MISSING
    middle_halfwidth: float = bounded(ge=0)


@dataclass
class RewardModelLossSettings(LossSettings):
    weighted_mse: WeightedMseSettings = field(default_factory=WeightedMseSettings)


@dataclass
class RewardModelTrainerSettings(TrainerSettings):
    """config/reward_model.yaml."""
    data: RewardModelDataSettings = field(default_factory=RewardModelDataSettings)
    loss: RewardModelLossSettings = field(default_factory=RewardModelLossSettings)


@dataclass
class OnlineSettings:
    games: List[str] = bounded(nonempty=True)
    max_turns: Optional[int] = bounded(ge=1)
    iterations: int = bounded(ge=1)
    rollout_size: int = bounded(ge=1)
    rollout_batch_size: int = bounded(ge=1)
    actor_updates: int = bounded(ge=1)
    advantage: str = MISSING
    rm_refresh: int = bounded(ge=0, why="0: never")
    refresh_window: Optional[int] = bounded(ge=1, why="null: every iteration since the last refresh")
    save_freq: int = bounded(ge=1)
    intention_overrides: List[str] = MISSING


@dataclass
class RolloutSettings:
    max_new_tokens: int = bounded(ge=1)
    temperature: float = bounded(ge=0)
    top_p: float = bounded(gt=0, le=1)
    max_prompt_tokens: int = bounded(ge=1)
    reuse_cache: bool = MISSING
    dtype: Optional[str] = MISSING
    system_prompt: Optional[str] = MISSING


@dataclass
class RewardServiceSettings:
    name: str = MISSING
    url: Optional[str] = MISSING
    token_env: Optional[str] = MISSING
    timeout: float = bounded(gt=0)
    retries: int = bounded(ge=0)


@dataclass
class OnlineRewardModelSettings:
    init_path: Optional[str] = MISSING
    train_file: Optional[str] = MISSING
    base_path: str = MISSING
    refresh_from: str = MISSING
    train_command: Optional[List[str]] = MISSING
    train_overrides: List[str] = MISSING
    max_prompt_tokens: int = bounded(ge=1)
    score_batch_size: int = bounded(ge=1)
    score_packing: str = MISSING
    score_pack_tokens: int = bounded(ge=1)
    dtype: str = MISSING
    serve: RewardServiceSettings = field(default_factory=RewardServiceSettings)


@dataclass
class OnlineLoggingSettings(LoggingSettings):
    progress: bool = MISSING


@dataclass
class OnlineTrainerSettings(TrainerSettings):
    """config/onlinereinforce_llm.yaml."""
    logging: OnlineLoggingSettings = field(default_factory=OnlineLoggingSettings)
    oracle: Any = MISSING  # a config group (config/oracle/)
    online: OnlineSettings = field(default_factory=OnlineSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    reward_model: OnlineRewardModelSettings = field(default_factory=OnlineRewardModelSettings)


# --- ArCHer's critic (config/critic.yaml) -------------------------------------------------------------

@dataclass
class CriticDataSettings:
    train_file: str = MISSING
    eval_fraction: float = bounded(ge=0, lt=1)
    max_samples: Optional[int] = bounded(ge=1)


@dataclass
class CriticModelSettings:
    encoder: Optional[str] = MISSING
    hidden: Optional[int] = bounded(ge=1)
    max_tokens: int = bounded(ge=1)
    gamma: float = bounded(ge=0, le=1)
    tau: float = bounded(gt=0, le=1, why="the target critic's step toward the critic; 0 would never move it")
    v_target: str = bounded(one_of=V_TARGETS)
    train_encoder: bool = MISSING
    init: Optional[str] = MISSING


@dataclass
class CriticLoggingSettings:
    log_every: int = bounded(ge=1)


@dataclass
class CriticTrainerSettings:
    """config/critic.yaml: ArCHer's critic (aria.trainers.archer)."""
    seed: int = bounded(ge=0)
    device: str = bounded(one_of=DEVICES)
    output_dir: str = MISSING
    out: str = bounded(nonempty=True)
    data: CriticDataSettings = field(default_factory=CriticDataSettings)
    critic: CriticModelSettings = field(default_factory=CriticModelSettings)
    train: EngineTrainSettings = field(default_factory=EngineTrainSettings)  # its batches are not packed
    logging: CriticLoggingSettings = field(default_factory=CriticLoggingSettings)
