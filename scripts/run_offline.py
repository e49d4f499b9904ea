#!/usr/bin/env python3
"""Offline ARIA: REINFORCE on the aggregated-reward training set (docs/method.md §5), or any other method
by name (``method=no_aggregation``, ``method=traj_dpo``, ...: aria/trainers/methods.py).

    python scripts/run_offline.py --config-name reinforce_llm [data.train_file=...] [scale=paper ...]
    accelerate launch --config_file config/accelerate/cpu_2proc.yaml scripts/run_offline.py --config-name reinforce_llm

Re-running the same command resumes from the newest checkpoint in output_dir. Bad training data
prints one line naming the file, sample and field, before any training, and exits 2.
(``python -m aria.trainers.launch --config-dir config ...`` is the same command as a module.)
"""

import hydra

from aria.trainers.launch import run
from aria.cli import check_command_line, protect_terminal


@hydra.main(config_path="../config", config_name="reinforce_llm", version_base="1.3")
def main(cfg) -> None:
    # Bad data or settings: one line before any model loads, exit 2; Ctrl-C: exit 130, checkpoints kept.
    run(cfg)


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    check_command_line("reinforce_llm")  # an unknown option or key: one line, exit 2, before Hydra
    main()
