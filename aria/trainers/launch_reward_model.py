"""The pointwise reward-model trainer as a module, for launchers and for online ARIA's refreshes.

    python -m aria.trainers.launch_reward_model --config-dir CONFIG --config-name reward_model ...
    accelerate launch --config_file ... -m aria.trainers.launch_reward_model --config-dir CONFIG ...

``scripts/train_rm.py`` is the same command with the repository's ``config/`` built in; online
ARIA (:mod:`aria.trainers.online`) starts this module with :func:`aria.resources.config_dir`, so
the library never runs a script by its path. Re-running resumes from the newest checkpoint in
``output_dir``; bad training data is one line naming the file, sample and field (exit 2).
"""
from __future__ import annotations

import hydra

from aria.cli import help_first
from aria.trainers.launch import train_and_report
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): torch


def run(cfg) -> dict:
    """Train the reward model of the config; print its held-out figures."""
    from aria.trainers.reward_model import RewardModelTrainer

    return train_and_report(cfg, RewardModelTrainer, summary)


def summary(result: dict) -> str:
    held_out = (f"; held out ({result['eval_samples']} samples): loss {result['eval_loss']:.4f}, "
                f"Pearson {result['eval_pearson']}, Spearman {result['eval_spearman']}") if "eval_loss" in result else ""
    return f"[reward model] {result['steps']} steps; final model in {result['final']}{held_out}"


@hydra.main(config_path=None, config_name="reward_model", version_base="1.3")
def main(cfg) -> None:
    run(cfg)


if __name__ == "__main__":
    help_first()  # --help: what the command does, then its settings
    main()
