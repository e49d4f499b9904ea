#!/usr/bin/env python3
"""Copy an experiment's run folder without its weights: a few MB, which report and resume.

Left out: merged models, training checkpoints, servers' logs and the embedding cache; kept: its
games, labels, evaluations and markers.

    python scripts/copy_run.py RUN_DIR DEST
    python scripts/copy_run.py --results-only RUN_DIR results/experiments/NAME/run   # to commit beside its results

To carry a long run across machines: copy it at a stage's end, and on the new machine run the
experiment's command with run_dir=DEST. Finished arms are not trained again; the stage that was
running starts over (its checkpoints stayed behind), and so does any model a stage still reads.
"""
import argparse

from aria.cli import command, protect_terminal
from aria.experiment.layout import copy_without_weights, left_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("dest")
    parser.add_argument("--results-only", action="store_true",
                        help="keep only what the report reads (no intention step data or training set either): the copy to commit")
    args = parser.parse_args()
    with command():
        size = copy_without_weights(args.run_dir, args.dest, results_only=args.results_only)
        print(f"copied {args.run_dir} -> {args.dest}: {size / 2**20:.1f} MiB, without {', '.join(left_out(args.results_only))}")


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    main()
