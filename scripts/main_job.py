#!/usr/bin/env python3
"""The main job: the whole ARIA loop on the embedded defaults (see aria/main_job.py).

    python scripts/main_job.py [eval.num_games=200 collect.num_games=1000 ...]
"""
import hydra
from omegaconf import OmegaConf

from aria.cli import command
from aria.main_job import run


@hydra.main(config_path="../config", config_name="main", version_base="1.3")
def main(cfg) -> None:
    with command(kept=lambda: f"the finished steps in {cfg.run_dir} (a re-run skips them)"):
        run(OmegaConf.to_container(cfg, resolve=True))


if __name__ == "__main__":
    main()
