#!/usr/bin/env python3
"""Pipeline step 3 (see aria/intention/pipeline.py): label the trajectories at the chosen k with their aggregated rewards.

    python clustering/3_apply_labels.py [game=guess_my_city] [input=PATH] [run_dir=DIR] ...
"""
import hydra

from aria.cli import check_command_line, protect_terminal
from aria.intention.pipeline import run_step, step3_apply_labels


@hydra.main(config_path="../config", config_name="intention", version_base="1.3")
def main(cfg) -> None:
    run_step(step3_apply_labels, cfg)


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    check_command_line("intention")  # an unknown option or key: one line, exit 2, before Hydra
    main()
