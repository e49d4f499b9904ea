#!/usr/bin/env python3
"""Does aggregation help? Warm start, the iterated loop for every method and seed, and the table.

    python scripts/run_experiment.py --config-name experiment                  # small preset (main job)
    python scripts/run_experiment.py --config-name experiment experiment=cpu   # the full CPU comparison

Every stage resumes; results go to results/experiments/<name>/ (table.md, results.json, plot).
"""
import sys

import hydra
from aria.cli import check_command_line, command, command_line, protect_terminal
from aria.experiment.runner import GamesFailed, run


@hydra.main(config_path="../config", config_name="experiment", version_base="1.3")
def main(cfg) -> None:
    with command(kept=lambda: f"the finished stages in {cfg.run_dir} (a re-run skips them)"):
        try:
            out = run(cfg, command=command_line())  # kept with the run (its invocations.json), secrets redacted
        except GamesFailed as failed:  # their records say why; exit 1, as collection does
            print(f"error: {failed}", file=sys.stderr)
            sys.exit(1)
        print((out / "table.md").read_text())


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    check_command_line("experiment")  # an unknown option or key: one line, exit 2, before Hydra
    main()
