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
from pathlib import Path

import hydra

from aria.cli import command
from aria.evaluate import reply_tokens_key, write_summary
from aria.games.base import known_games, load_game_config
from aria.games.family import family_of
from aria.llm.endpoint import check_server
from aria.llm.registry import build_policy
from aria.settings import load

@hydra.main(config_path="../config", config_name="eval", version_base="1.3")
def main(cfg) -> None:
    # OUT holding another model's games: one line, exit 2; Ctrl-C: exit 130, transcripts kept.
    with command(kept=lambda: f"the transcripts in {cfg.out}"):
        evaluate(cfg)


def evaluate(cfg) -> None:
    cfg = load("eval", cfg)
    p = cfg["policy"]
    # A served model (the usual case) or a local transformers model (policy=local: no server, the
    # same games and summaries; for a quick look at a small model on a CPU).
    served = p["name"] == "endpoint"
    reply_tokens = reply_tokens_key(p)
    batch_size = cfg["batch_size"] or (p["concurrency"] if served else 16)
    unknown = [e for e in cfg["envs"] if e not in known_games()]
    if unknown:
        print(f"error: unknown environment(s) {unknown} (known: {known_games()})", file=sys.stderr)
        sys.exit(2)
    two_player = [e for e in cfg["envs"] if family_of(load_game_config(e)).seats > 1]  # against an opponent
    try:
        if served:
            check_server(p["base_url"], p.get("api_key"), p["model"])
        if two_player and cfg["opponent"]["name"] == "endpoint":
            o = cfg["opponent"]
            check_server(o["base_url"], o.get("api_key"), o["model"])
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    out = Path(cfg["out"])
    policy = build_policy(p)
    summary = {"model": p["model"] if served else p["model_path"], "base_url": p.get("base_url"),
               "oracle": cfg["oracle"]["name"], "seed": cfg["seed"], "num_games": cfg["num_games"],
               "max_turns": cfg["max_turns"],
               "sampling": {k: p.get(k) for k in ("temperature", "top_p", reply_tokens)},
               "environments": {}}
    if two_player:  # what the win rates were measured under (reply length matters a lot to a small model)
        summary["two_player"] = {**{k: cfg["two_player"][k] for k in ("config_set", "games_per_config", "max_tokens")},
                                 "opponent": {k: v for k, v in cfg["opponent"].items() if k != "api_key"}}  # no secrets in results
    for env in cfg["envs"]:
        game_cfg = load_game_config(env)
        summary["environments"][env] = family_of(game_cfg).evaluate_served(cfg, game_cfg, policy, out / env, batch_size)
    write_summary(out, summary)
    print(f"[eval] wrote {out / 'summary.json'} and {out / 'summary.md'}")
    print((out / "summary.md").read_text())
    if any(s.get("overall", s)["failed"] for s in summary["environments"].values()):
        print("[eval] some games failed (listed in summary.json); re-run to retry them", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
