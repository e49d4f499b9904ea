#!/usr/bin/env python3
"""Per-sample policy-gradient variance: raw step returns, aggregated rewards and methods' weights (paper Figure 4).

    python scripts/grad_variance.py --config-name reinforce_llm data.train_file=outputs/intention/twenty_questions/train.json \
        'grad_variance.methods=[aria,no_aggregation,gigpo,starpo]'

Settings: grad_variance.methods (default aria, no_aggregation, gigpo), grad_variance.max_samples,
grad_variance.seed, grad_variance.out (JSON written there).
"""
import json

import hydra

from aria.cli import check_command_line, command, protect_terminal
from aria.io import atomic_write_json, check_output_file
from aria.settings import typed
from aria.trainers.grad_variance import gradient_variance
from aria.trainers.settings import TrainerSettings


@hydra.main(config_path="../config", config_name="reinforce_llm", version_base="1.3")
def main(cfg) -> None:
    with command():  # bad settings or data, an unwritable out: one line, exit 2
        c = typed(TrainerSettings, cfg, "reinforce_llm")
        gv = c.grad_variance
        check_output_file(gv.out, "grad_variance.out")  # before the model loads, not after the work
        result = gradient_variance(c, gv.max_samples, gv.seed, gv.methods)
        atomic_write_json(gv.out, result)
    print(json.dumps(result, indent=1))
    print(f"[grad-variance] wrote {gv.out}")


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    check_command_line("reinforce_llm")  # an unknown option or key: one line, exit 2, before Hydra
    main()
