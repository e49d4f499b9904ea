#!/usr/bin/env python3
"""Evaluate a served model on the single-agent games (spec §6); usually run through eval.sh.

Checks the server first (one line naming the URL and what /v1/models returned, exit 2), then
plays ``num_games`` games per environment with the same seeded targets for every model, with
concurrent requests, appending transcripts to ``out/<env>/transcripts.jsonl`` (re-running
continues where it stopped), and writes ``out/summary.json`` and ``out/summary.md``. Games whose
requests kept failing are recorded as failed, counted and listed; the exit status is then 1.
"""
import logging
import sys
from pathlib import Path

import hydra
from omegaconf import OmegaConf

from aria.evaluate import summarize_games, write_summary
from aria.games.base import build_game, load_game_config
from aria.games.oracle import build_oracle
from aria.llm.endpoint import check_server
from aria.rollout import build_policy, play_games
from aria.trajectories import read_trajectories

SINGLE_AGENT = ("twenty_questions", "guess_my_city")


@hydra.main(config_path="../config", config_name="eval", version_base="1.3")
def main(cfg) -> None:
    cfg = OmegaConf.to_container(cfg, resolve=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    p = cfg["policy"]
    unknown = [e for e in cfg["envs"] if e not in SINGLE_AGENT]
    if unknown:
        print(f"error: environment(s) {unknown} not supported here (single-agent: {list(SINGLE_AGENT)})", file=sys.stderr)
        sys.exit(2)
    try:
        check_server(p["base_url"], p.get("api_key"), p["model"])
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    out = Path(cfg["out"])
    policy = build_policy(p)
    summary = {"model": p["model"], "base_url": p["base_url"], "oracle": cfg["oracle"]["name"], "seed": cfg["seed"],
               "num_games": cfg["num_games"], "sampling": {k: p.get(k) for k in ("temperature", "top_p", "max_tokens")},
               "environments": {}}
    for env in cfg["envs"]:
        game_cfg = load_game_config(env)
        transcripts = out / env / "transcripts.jsonl"
        run = play_games(build_game(game_cfg), policy, build_oracle(cfg["oracle"], game_cfg), transcripts,
                         num_games=cfg["num_games"], seed=cfg["seed"], batch_size=p["concurrency"], progress=cfg["progress"])
        print(f"[eval] {env}: {run.line()}")
        summary["environments"][env] = summarize_games(list(read_trajectories(transcripts)))
    write_summary(out, summary)
    print(f"[eval] wrote {out / 'summary.json'} and {out / 'summary.md'}")
    print((out / "summary.md").read_text())
    if any(s["failed"] for s in summary["environments"].values()):
        print("[eval] some games failed (listed in summary.json); re-run to retry them", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
