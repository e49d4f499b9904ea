#!/usr/bin/env python3
"""Online ARIA (docs/method.md §5): roll out, score with the reward model, REINFORCE, refresh the reward model.

    python scripts/run_online.py --config-name onlinereinforce_llm [online.iterations=...] [online_scale=paper ...]
    accelerate launch --config_file config/accelerate/cpu_2proc.yaml scripts/run_online.py --config-name onlinereinforce_llm

Re-running the same command resumes after the last checkpointed iteration.
"""

import hydra
from aria.cli import check_command_line, checkpoints_in, command, protect_terminal
from aria.trainers.online import OnlineTrainer


@hydra.main(config_path="../config", config_name="onlinereinforce_llm", version_base="1.3")
def main(cfg) -> None:
    # Bad settings: one line before any model loads, exit 2; Ctrl-C: exit 130, checkpoints kept.
    with command(kept=lambda: checkpoints_in(cfg.output_dir)):
        result = OnlineTrainer(cfg).train()
    print(f"[online] {result['iterations']} iterations, {result['steps']} actor steps; final policy in {result['final']}; "
          f"reward model {result['reward_model']}")


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    check_command_line("onlinereinforce_llm")  # an unknown option or key: one line, exit 2, before Hydra
    main()
