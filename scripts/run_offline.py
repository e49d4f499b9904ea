#!/usr/bin/env python3
"""Offline ARIA: REINFORCE on the aggregated-reward training set (docs/method.md §5), or any other method
by name (``method=no_aggregation``, ``method=traj_dpo``, ...: aria/trainers/methods.py).

    python scripts/run_offline.py --config-name reinforce_llm [data.train_file=...] [scale=paper ...]
    accelerate launch --config_file config/accelerate/cpu_2proc.yaml scripts/run_offline.py --config-name reinforce_llm

Re-running the same command resumes from the newest checkpoint in output_dir. Bad training data
prints one line naming the file, sample and field, before any training, and exits 2.
(``python -m aria.trainers.launch --config-dir config ...`` is the same command as a module.)
"""

from aria.cli import hydra_command
from aria.trainers.launch import run

if __name__ == "__main__":
    hydra_command("reinforce_llm", run)  # bad data or settings: one line, exit 2; Ctrl-C: exit 130, checkpoints kept
