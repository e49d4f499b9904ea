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
from omegaconf import OmegaConf

from aria.evaluate import summarize_games, write_summary
from aria.games.base import build_game, known_games, load_game_config, structured_output
from aria.games.glee import config_set
from aria.games.oracle import build_oracle
from aria.llm.endpoint import check_server
from aria.llm.registry import build_policy
from aria.rollout import play_games, reply_format
from aria.cli import command
from aria.trajectories import read_trajectories
from aria.two_player import PolicyPlayer, build_player, evaluate_two_player


@hydra.main(config_path="../config", config_name="eval", version_base="1.3")
def main(cfg) -> None:
    # OUT holding another model's games: one line, exit 2; Ctrl-C: exit 130, transcripts kept.
    with command(kept=lambda: f"the transcripts in {cfg.out}"):
        evaluate(OmegaConf.to_container(cfg, resolve=True))


def evaluate(cfg: dict) -> None:
    p = cfg["policy"]
    # A served model (the usual case) or a local transformers model (policy=local: no server, the
    # same games and summaries; for a quick look at a small model on a CPU).
    served = p["name"] == "endpoint"
    reply_tokens = "max_tokens" if served else "max_new_tokens"
    batch_size = cfg["batch_size"] or (p["concurrency"] if served else 16)
    unknown = [e for e in cfg["envs"] if e not in known_games()]
    if unknown:
        print(f"error: unknown environment(s) {unknown} (known: {known_games()})", file=sys.stderr)
        sys.exit(2)
    two_player = [e for e in cfg["envs"] if load_game_config(e).get("kind") == "two_player"]
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
        chosen = cfg["two_player"]["structured_output"] if env in two_player else cfg["structured_output"]
        if chosen is not None:
            game_cfg["structured_output"] = chosen
        if env in two_player:
            tp = cfg["two_player"]
            player = PolicyPlayer(build_policy({**p, reply_tokens: tp["max_tokens"]}))
            summary["environments"][env] = evaluate_two_player(
                game_cfg, config_set(game_cfg, tp["config_set"]), player, build_player(cfg["opponent"], env, player),
                out / env, games_per_config=tp["games_per_config"], seed=cfg["seed"], batch_size=batch_size,
                progress=cfg["progress"], force_new=cfg["force_new"])
            summary["environments"][env]["generation"] = generation_cost(player.model, 0, 0.0)
            summary["environments"][env]["structured_output"] = structured_output(game_cfg, "two_player")
            continue
        if cfg["max_turns"] is not None:
            game_cfg["max_turns"] = cfg["max_turns"]
        transcripts = out / env / "transcripts.jsonl"
        tokens, seconds = getattr(policy, "generated_tokens", 0), getattr(policy, "generation_seconds", 0.0)
        run = play_games(build_game(game_cfg), policy, build_oracle(cfg["oracle"], game_cfg), transcripts,
                         num_games=cfg["num_games"], seed=cfg["seed"], batch_size=batch_size, progress=cfg["progress"],
                         force_new=cfg["force_new"], reply_format=reply_format(game_cfg))
        print(f"[eval] {env}: {run.line()}")
        summary["environments"][env] = summarize_games(list(read_trajectories(transcripts)))
        summary["environments"][env]["generation"] = generation_cost(policy, tokens, seconds)
        summary["environments"][env]["structured_output"] = structured_output(game_cfg, "question")  # what was used
    write_summary(out, summary)
    print(f"[eval] wrote {out / 'summary.json'} and {out / 'summary.md'}")
    print((out / "summary.md").read_text())
    if any(s.get("overall", s)["failed"] for s in summary["environments"].values()):
        print("[eval] some games failed (listed in summary.json); re-run to retry them", file=sys.stderr)
        sys.exit(1)


def generation_cost(policy, tokens_before: int, seconds_before: float) -> dict:
    """Reply tokens the policy generated in this run of an environment, the seconds its generate
    calls took, and their ratio (games already in the transcripts cost nothing)."""
    tokens = getattr(policy, "generated_tokens", 0) - tokens_before
    seconds = getattr(policy, "generation_seconds", 0.0) - seconds_before
    return {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None}


if __name__ == "__main__":
    main()
