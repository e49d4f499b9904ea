#!/usr/bin/env python3
"""Did training move the policy? A trained model against the model it started from (aria/experiment/movement.py).

    python scripts/movement.py PARENT_MODEL TRAINED_MODEL STEPS_JSON [--served-dtype bfloat16] [--max-steps 256]
        [--out movement.json]

STEPS_JSON: pipeline step-4 samples (``observation``, ``action``, ``success``), e.g. the
iteration's ``intention/train.json`` (the log-prob change of the trained actions) or the steps
of games the trained model did not see (the token KL on held-out prompts). Prints the token KL,
the log-prob change on steps of won and of lost games, and the share of weight elements changed
at float32 and at the served precision.
"""
import argparse
import json
from pathlib import Path

from aria.cli import command, number, protect_terminal
from aria.io import DataError, atomic_write_json, check_output_file, read_json
from aria.experiment.movement import DTYPES, movement


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("parent", help="the model training started from (a saved model folder)")
    parser.add_argument("child", help="the trained model (merged, a saved model folder)")
    parser.add_argument("steps", help="pipeline step-4 samples (JSON list)")
    parser.add_argument("--served-dtype", default="float32", choices=sorted(DTYPES),
                        help="the precision the trained model is served in")
    parser.add_argument("--max-steps", type=number(int, ge=1), default=256, help="a seeded sample of at most this many steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="also write the result here (JSON)")
    args = parser.parse_args(argv)
    with command():  # a bad file, a path that is no model, an unwritable --out: one line, exit 2
        if args.out:  # before the models load, not after the work
            check_output_file(args.out, "--out")
        samples = read_json(args.steps)
        if not isinstance(samples, list):
            raise DataError(Path(args.steps), None, None, "expected a JSON list of samples")
        result = movement(Path(args.parent), Path(args.child), samples, args.served_dtype, args.max_steps, args.seed,
                          source=args.steps)
        result = {"parent": args.parent, "child": args.child, "steps_file": args.steps, **result}
        if args.out:
            atomic_write_json(args.out, result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    raise SystemExit(main())
