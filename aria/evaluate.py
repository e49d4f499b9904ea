"""Evaluating a model (``docs/method.md`` §6): every environment played, summarised and written.

:func:`evaluate_model` is the evaluation harness (``evaluation/evaluate.py``, ``eval.sh``): a
served model (or ``policy=local``, a transformers model in this process) plays ``num_games``
seeded games of each single-agent environment, and both seats of every configuration of each
two-player one against the opponent; transcripts go to ``out/<env>/`` (a re-run resumes) and
``summary.json`` / ``summary.md`` to ``out``. :func:`compare_table` puts several models side by
side in the paper's Table 1 / Table 2 layout. The numbers themselves (intervals, summaries,
paired tests) are :mod:`aria.statistics`; how each game family plays an evaluation is its
``evaluate_served`` (:mod:`aria.games.family`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from aria.io import ConfigError, atomic_write_json, atomic_write_text, read_json

def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def _two_player_rows(summary: dict) -> list[str]:
    rows = []
    for env, e in summary["environments"].items():
        if e.get("kind") != "two_player":
            continue
        for seat in ("as_alice", "as_bob", "overall"):
            s = e[seat]
            low, high = s["win_rate_ci95"]
            share = "n/a" if s["mean_payoff_share"] is None else f"{s['mean_payoff_share']:.3f}"
            rows.append(f"| {env} | {seat.replace('_', ' ')} | {s['finished']} | {_pct(s['win_rate'])} | {_pct(low)}-{_pct(high)} | "
                        f"{_pct(s['tie_rate'])} | {_pct(s['deal_rate'])} | {share} | {_pct(s['unusable_reply_share'])} | {s['failed']} |")
    if not rows:
        return []
    opponents = sorted({e["opponent"] for e in summary["environments"].values() if e.get("kind") == "two_player"})
    setup = summary.get("two_player")
    measured = (f" ({setup['config_set']}, {setup['games_per_config']} per configuration and seat, "
                f"replies up to {setup['max_tokens']} tokens)") if setup else ""
    return ["", f"Two-player games{measured} against {', '.join(opponents)}:", "",
            "| environment | policy plays | games | win % | 95% CI | ties % | deals % | mean payoff share | unusable replies % | failed |",
            "|---|---|---|---|---|---|---|---|---|---|", *rows]


def summary_markdown(summary: dict) -> str:
    lines = [f"# {summary['model']}", "", f"Endpoint: {summary.get('base_url', '?')}; oracle: {summary.get('oracle', '?')}; "
             f"seed {summary.get('seed')}" + (f"; at most {summary['max_turns']} questions a game (not the game's own limit)"
                                              if summary.get("max_turns") else ""), "",
             "| environment | games | success % | 95% CI | mean turns | invalid questions % | failed |",
             "|---|---|---|---|---|---|---|"]
    single = {env: s for env, s in summary["environments"].items() if s.get("kind") != "two_player"}
    if not single:
        lines = lines[:4]
    for env, s in single.items():
        low, high = s["success_rate_ci95"]
        turns = "n/a" if s["mean_turns"] is None else f"{s['mean_turns']:.2f}"
        lines.append(f"| {env} | {s['finished']} | {_pct(s['success_rate'])} | {_pct(low)}-{_pct(high)} | {turns} | "
                     f"{_pct(s['invalid_question_share'])} | {s['failed']} |")
    lines += _two_player_rows(summary)
    costs = [(env, s["generation"]) for env, s in summary["environments"].items() if (s.get("generation") or {}).get("tokens")]
    if costs:  # environments whose games were all played before this run generated nothing now
        lines += ["", "Generation (this run's games): " + "; ".join(
            f"{env} {c['tokens']} reply tokens in {c['seconds']:.0f} s ({c['tokens_per_s']} tokens/s)" for env, c in costs) + "."]
    return "\n".join(lines) + "\n"


def write_summary(out_dir: str | Path, summary: dict) -> None:
    out_dir = Path(out_dir)
    atomic_write_json(out_dir / "summary.json", summary)
    atomic_write_text(out_dir / "summary.md", summary_markdown(summary))


def compare_table(folders: Iterable[str | Path]) -> str:
    """Success rates (single-agent) and win rates over both seats (two-player) of several result
    folders side by side (the paper's Table 2 / Table 1 layout)."""
    summaries = [read_json(Path(f) / "summary.json") for f in folders]
    envs: list[str] = []
    for s in summaries:
        envs += [e for e in s["environments"] if e not in envs]
    kinds = {e: next(s["environments"][e].get("kind", "single_agent") for s in summaries if e in s["environments"]) for e in envs}
    metric = {e: "win %" if kinds[e] == "two_player" else "success %" for e in envs}
    lines = ["| model | " + " | ".join(f"{e} {metric[e]} (95% CI)" for e in envs) + " |",
             "|---|" + "---|" * len(envs)]
    for s in summaries:
        cells = []
        for e in envs:
            env = s["environments"].get(e)
            if env is None:
                cells.append("-")
                continue
            if kinds[e] == "two_player":
                env = env["overall"]
                rate, (low, high) = env["win_rate"], env["win_rate_ci95"]
            else:
                rate, (low, high) = env["success_rate"], env["success_rate_ci95"]
            cells.append(f"{_pct(rate)} ({_pct(low)}-{_pct(high)}), n={env['finished']}"
                         + (f", {env['failed']} failed" if env["failed"] else ""))
        lines.append(f"| {s['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def evaluate_model(cfg: Mapping[str, Any]) -> tuple[Path, dict]:
    """The evaluation harness (module doc) on ``config/eval.yaml`` settings -> (out, summary).

    Checks the settings, the environments' names and the servers first (one
    :class:`~aria.io.ConfigError` naming the URL and what ``/v1/models`` returned)."""
    from aria.games.base import known_games, load_game_config
    from aria.games.family import checked_game, family_of
    from aria.llm.endpoint import check_server
    from aria.llm.registry import build_policy, reply_tokens_key
    from aria.settings import load

    cfg = load("eval", cfg)
    p = cfg["policy"]
    # A served model (the usual case) or a local transformers model (policy=local: no server, the
    # same games and summaries; for a quick look at a small model on a CPU).
    served = p["name"] == "endpoint"
    reply_tokens = reply_tokens_key(p)
    batch_size = cfg["batch_size"] or (p["concurrency"] if served else 16)
    unknown = [e for e in cfg["envs"] if e not in known_games()]
    if unknown:
        raise ConfigError(f"unknown environment(s) {unknown} (known: {known_games()})")
    games = {env: checked_game(load_game_config(env)) for env in cfg["envs"]}
    two_player = [env for env, game in games.items() if family_of(game).seats > 1]  # against an opponent
    try:
        if served:
            check_server(p["base_url"], p.get("api_key"), p["model"])
        if two_player and cfg["opponent"]["name"] == "endpoint":
            o = cfg["opponent"]
            check_server(o["base_url"], o.get("api_key"), o["model"])
    except RuntimeError as err:
        raise ConfigError(str(err)) from None
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
    for env, game_cfg in games.items():
        summary["environments"][env] = family_of(game_cfg).evaluate_served(cfg, game_cfg, policy, out / env, batch_size)
    write_summary(out, summary)
    return out, summary
