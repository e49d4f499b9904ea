#!/usr/bin/env python3
"""Grouping schemes side by side on one labelled collection (aria/experiment/grouping.py): ARIA's
whole-history keys, windowed keys, the behavioural intentions, GiGPO's exact and similar anchor
states; the share of steps that share a group, by turn, the variance ratio, the error against the
behavioural ceiling, and with --model the gradient signal-to-noise ratio of each weighting.

    python scripts/grouping_schemes.py RUN_DIR [--window 2] [--threshold 0.9] [--model MODEL --samples 256 --bootstrap 2000] [--out FILE]

RUN_DIR is a pipeline run folder whose steps 1-4 ran (an experiment's ``.../intention``). Writes
the JSON to --out (default RUN_DIR/grouping_schemes.json) and prints the table; with --model and
--bootstrap also the per-sample gradients' Gram matrix and each weighting's weights beside it
(``<out>.gram.npz``), from which ``aria.trainers.grad_variance.bootstrap_snr`` draws the SNR
intervals again without the model.
"""
import argparse
import sys
import time
from pathlib import Path

from aria.cli import number, protect_terminal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a pipeline run folder (steps 1-4 done)")
    parser.add_argument("--window", type=number(int, ge=0), default=2, help="turns kept by the windowed keys (default 2)")
    parser.add_argument("--threshold", type=number(float, gt=0, lt=1), default=0.9,
                        help="GiGPO's similarity threshold, in (0, 1) (verl-agent's scripts: 0.9)")
    parser.add_argument("--model", default=None, help="a policy folder: also the gradient SNR of each weighting")
    parser.add_argument("--samples", type=number(int, ge=2), default=256, help="samples for the gradient SNR (default 256)")
    parser.add_argument("--bootstrap", type=number(int, ge=0), default=2000,
                        help="resamples for the SNR intervals (default 2000; 0: none, and no gradient kept)")
    parser.add_argument("--out", default=None, help="the JSON (default RUN_DIR/grouping_schemes.json)")
    args = parser.parse_args()

    from aria.cli import command
    from aria.experiment.grouping import compare, markdown, run_config
    from aria.io import atomic_write_json

    with command():
        out = Path(args.out) if args.out else Path(args.run_dir) / "grouping_schemes.json"
        start = time.perf_counter()
        found = compare(run_config(args.run_dir), args.window, args.threshold)
        found["seconds_grouping"] = round(time.perf_counter() - start, 2)
        if args.model:
            from aria.resources import compose_config
            from aria.trainers.grad_variance import gradient_variance

            train = Path(args.run_dir) / "train.json"
            cfg = compose_config("reinforce_llm", [])  # the paths set, not parsed as overrides (a comma in a name)
            cfg["data"]["train_file"], cfg["model"]["path"] = str(train), args.model
            # GiGPO's similarity advantages come with the groupings, at --threshold (compare)
            gradients = gradient_variance(cfg, args.samples, 0, ["no_aggregation", "gigpo"],
                                          weightings=found["sample_weights"], bootstrap=args.bootstrap,
                                          gram_out=out.with_suffix(".gram.npz") if args.bootstrap else None)
            found["gradients"] = gradients
            for name, row in found["schemes"].items():
                kind = f"weighting_{name}" if f"snr_weighting_{name}" in gradients else f"method_{name}"
                for measure in ("snr", "snr_corrected", "snr_corrected_ci95", "snr_difference", "snr_difference_ci95"):
                    row[measure] = gradients.get(f"{measure}_{kind}")
        atomic_write_json(out, {k: v for k, v in found.items() if k != "sample_weights"})
        sys.stdout.write(markdown(found))
        print(f"wrote {out}")


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    main()
