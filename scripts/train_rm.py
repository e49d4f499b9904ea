#!/usr/bin/env python3
"""Train the pointwise reward model on the aggregated-reward training set (docs/method.md §5).

    python scripts/train_rm.py [data.train_file=...] [model.path=...]
    accelerate launch --config_file config/accelerate/cpu_2proc.yaml scripts/train_rm.py
    bash scripts/train_rm.sh            # the same, every setting an environment variable

Re-running the same command resumes from the newest checkpoint in output_dir. Bad training data
prints one line naming the file, sample and field, before any training, and exits 2.
"""

import hydra
from omegaconf import OmegaConf

from aria.cli import checkpoints_in, command
from aria.trainers.reward_model import RewardModelTrainer


@hydra.main(config_path="../config", config_name="reward_model", version_base="1.3")
def main(cfg) -> None:
    # Bad data or settings: one line before any model loads, exit 2; Ctrl-C: exit 130, checkpoints kept.
    with command(kept=lambda: checkpoints_in(cfg.output_dir)):
        trainer = RewardModelTrainer(OmegaConf.to_container(cfg, resolve=True))
        result = trainer.train()
    if trainer.accelerator.is_main_process:
        held_out = (f"; held out ({result['eval_samples']} samples): loss {result['eval_loss']:.4f}, "
                    f"Pearson {result['eval_pearson']}, Spearman {result['eval_spearman']}") if "eval_loss" in result else ""
        print(f"[reward model] {result['steps']} steps; final model in {result['final']}{held_out}")


if __name__ == "__main__":
    main()
