#!/usr/bin/env python3
"""Pipeline step 2 (see aria/intention/pipeline.py): aggregate rewards for every k, compute SplitScore and the cluster indices, choose k, plot.

    python clustering/2_select_k.py [game=guess_my_city] [input=PATH] [run_dir=DIR] ...
"""
import hydra

from aria.cli import check_command_line, protect_terminal
from aria.intention.pipeline import run_step, step2_select_k


@hydra.main(config_path="../config", config_name="intention", version_base="1.3")
def main(cfg) -> None:
    run_step(step2_select_k, cfg)


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    check_command_line("intention")  # an unknown option or key: one line, exit 2, before Hydra
    main()
