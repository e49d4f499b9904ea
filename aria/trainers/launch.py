"""The offline trainer as a module, for launchers that start processes of their own.

    accelerate launch --config_file ... -m aria.trainers.launch --config-dir CONFIG --config-name reinforce_llm ...
    torchrun --nproc_per_node 8 -m aria.trainers.launch --config-dir CONFIG --config-name reinforce_llm ...

``scripts/run_offline.py`` is the same command with the repository's ``config/`` built in; the
experiment runner launches this module (``launcher``) with :func:`aria.resources.config_dir`, so the
library never runs a script by its path. Re-running resumes from the newest checkpoint in
``output_dir``; bad training data is one line naming the file, sample and field, before any
training (exit 2); Ctrl-C exits 130 with the checkpoints kept.
"""
from __future__ import annotations

from typing import Any, Callable

import hydra

from aria.cli import checkpoints_in, command, help_first
from aria.settings import resolved
from aria.trainers.methods import trainer_for


def train_and_report(cfg, build: Callable[[dict], Any], summary: Callable[[dict], str]) -> dict:
    """What every trainer module runs: the trainer ``build`` makes from the resolved config, trained
    under :func:`aria.cli.command` (one line for a bad file, the checkpoints kept on Ctrl-C), and
    its ``summary`` line printed by the main process."""
    with command(kept=lambda: checkpoints_in(cfg.output_dir)):
        trainer = build(resolved(cfg))
        result = trainer.train()
    if trainer.accelerator.is_main_process:
        print(summary(result))
    return result


def run(cfg) -> dict:
    """Train the method the config names (REINFORCE on weights, or trajectory DPO on pairs)."""
    return train_and_report(cfg, lambda config: trainer_for(config)(config), lambda result: (
        f"[train] {result['steps']} steps; final model in {result['final']}"
        + (f"; last loss {result['loss']:.4f}, {result['tokens_per_s']:.0f} tokens/s" if "loss" in result else "")))


@hydra.main(config_path=None, config_name="reinforce_llm", version_base="1.3")
def main(cfg) -> None:
    run(cfg)


if __name__ == "__main__":
    help_first()  # --help: what the command does, then its settings
    main()
