#!/usr/bin/env python3
"""Train ArCHer's utterance-level critic on a training set; write each step's advantage (aria/trainers/archer.py).

    python scripts/train_critic.py data.train_file=outputs/intention/twenty_questions/train.json
    python scripts/run_offline.py method=archer data.train_file=outputs/critic/twenty_questions/train.json   # the actor
    accelerate launch --config_file config/accelerate/cpu_2proc.yaml scripts/train_critic.py ...

Re-running the same command resumes from the newest checkpoint in output_dir. Bad training data
prints one line naming the file, sample and field, before any model loads, and exits 2.
"""

from aria.cli import hydra_command
from aria.trainers.launch_critic import run

if __name__ == "__main__":
    hydra_command("critic", run)  # bad data or settings: one line, exit 2; Ctrl-C: exit 130, checkpoints kept
