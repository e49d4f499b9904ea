#!/usr/bin/env python3
"""Train the pointwise reward model on the aggregated-reward training set (docs/method.md §5).

    python scripts/train_rm.py [data.train_file=...] [model.path=...]
    accelerate launch --config_file config/accelerate/cpu_2proc.yaml scripts/train_rm.py
    bash scripts/train_rm.sh            # the same, every setting an environment variable

Re-running the same command resumes from the newest checkpoint in output_dir. Bad training data
prints one line naming the file, sample and field, before any training, and exits 2.
(``python -m aria.trainers.launch_reward_model --config-dir config ...`` is the same command as a module.)
"""

from aria.cli import hydra_command
from aria.trainers.launch_reward_model import run

if __name__ == "__main__":
    hydra_command("reward_model", run)  # bad data or settings: one line, exit 2; Ctrl-C: exit 130, checkpoints kept
