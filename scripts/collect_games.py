"""Collect games (pipeline step 0): python scripts/collect_games.py [game=guess_my_city] [num_games=200] ...

Plays ``num_games`` games with the configured policy against the configured oracle, many at
once, appending one JSON line per finished game to ``out``. Re-running resumes. Exits 1 with a
one-line summary when any game failed. The default policy (``policy=vllm``) serves the model with
a vLLM server of the run's own; ``policy=local`` plays in this process.
"""
import sys

import hydra
from omegaconf import DictConfig

from aria.cli import check_command_line, command, games_in, protect_terminal
from aria.games.family import collect_from_config


@hydra.main(config_path="../config", config_name="collect", version_base="1.3")
def main(cfg: DictConfig) -> None:
    # Bad settings, or an out of another policy's games: one line, exit 2; Ctrl-C: exit 130.
    with command(kept=lambda: games_in(cfg.out)):
        summary = collect_from_config(cfg)
    print(f"[collect] {cfg.game.name}: {summary.line()} -> {cfg.out}")
    if summary.failed:
        print(f"[collect] {summary.failed} game(s) failed; their errors are in {cfg.out}; re-run to retry them", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    check_command_line("collect")  # an unknown option or key: one line, exit 2, before Hydra
    main()
