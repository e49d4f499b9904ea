#!/usr/bin/env python3
"""Pipeline step 1 (see aria/intention/pipeline.py): read the trajectories, embed every distinct utterance once, cluster every pool for every k.

    python reward_aggregation/1_embed_and_cluster.py [game=guess_my_city] [input=PATH] [run_dir=DIR] ...
"""
import hydra

from aria.cli import check_command_line, protect_terminal
from aria.intention.pipeline import run_step, step1_embed_and_cluster


@hydra.main(config_path="../config", config_name="intention", version_base="1.3")
def main(cfg) -> None:
    run_step(step1_embed_and_cluster, cfg)


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    check_command_line("intention")  # an unknown option or key: one line, exit 2, before Hydra
    main()
