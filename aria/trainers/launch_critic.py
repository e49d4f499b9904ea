"""ArCHer's critic trainer as a module, for launchers and for the experiment runner.

    python -m aria.trainers.launch_critic --config-dir CONFIG --config-name critic ...
    accelerate launch --config_file ... -m aria.trainers.launch_critic --config-dir CONFIG ...

``scripts/train_critic.py`` is the same command with the repository's ``config/`` built in.
Re-running resumes from the newest checkpoint in ``output_dir``; bad training data is one line
naming the file, sample and field (exit 2).
"""
from __future__ import annotations

import hydra

from aria.cli import help_first
from aria.trainers.launch import train_and_report
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): torch


def run(cfg) -> dict:
    """Train the critic of the config, write the steps' advantages; print its held-out figures."""
    from aria.trainers.archer import CriticTrainer

    return train_and_report(cfg, CriticTrainer, summary)


def summary(result: dict) -> str:
    held_out = (f"; held out ({result['eval_steps']} steps): TD error (MSE) {result['eval_td_mse']:.4f}, won above "
                f"lost {ranked(result['eval_ranking_accuracy'])} (same turn: {ranked(result['eval_ranking_accuracy_same_turn'])})"
                ) if "eval_td_mse" in result else ""
    return f"[critic] {result['steps']} steps; critic in {result['final']}; advantages in {result['train_file']}{held_out}"


def ranked(accuracy: float | None) -> str:
    """A ranking accuracy as printed; None where the held-out games hold no won-lost pair to rank."""
    return "n/a (no won and lost step to compare)" if accuracy is None else f"{accuracy}"


@hydra.main(config_path=None, config_name="critic", version_base="1.3")
def main(cfg) -> None:
    run(cfg)


if __name__ == "__main__":
    help_first()  # --help: what the command does, then its settings
    main()
