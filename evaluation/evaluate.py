#!/usr/bin/env python3
"""Evaluate a served model (docs/method.md §6); usually run through eval.sh. ``policy=local`` plays a local
transformers model instead (no server): ``python evaluation/evaluate.py policy=local out=DIR ...``.

Checks the server first (one line naming the URL and what /v1/models returned, exit 2), then:

* single-agent games: ``num_games`` games per environment with the same seeded targets for every
  model, transcripts in ``out/<env>/transcripts.jsonl``;
* two-player games: the policy as Alice and as Bob against the opponent on every configuration of
  ``two_player.config_set`` × ``two_player.games_per_config``, transcripts in
  ``out/<env>/as_alice.jsonl`` / ``as_bob.jsonl``;

with concurrent requests (re-running continues where it stopped), and writes
``out/summary.json`` and ``out/summary.md``. Games whose requests kept failing are recorded as
failed, counted and listed; the exit status is then 1.
"""
import sys

import hydra

from aria.cli import check_command_line, command, protect_terminal
from aria.games.evaluate import evaluate_model


@hydra.main(config_path="../config", config_name="eval", version_base="1.3")
def main(cfg) -> None:
    # Bad settings, an unknown environment, a server that does not answer or OUT holding another
    # model's games: one line, exit 2; Ctrl-C: exit 130, transcripts kept.
    with command(kept=lambda: f"the transcripts in {cfg.out}"):
        out, summary = evaluate_model(cfg)
    print(f"[eval] wrote {out / 'summary.json'} and {out / 'summary.md'}")
    print((out / "summary.md").read_text())
    if any(s.get("overall", s)["failed"] for s in summary["environments"].values()):
        print("[eval] some games failed (listed in summary.json); re-run to retry them", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    check_command_line("eval")  # an unknown option or key: one line, exit 2, before Hydra
    main()
