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

from aria.games.common.base import known_games, load_game_config
from aria.games.common.settings import EvalSettings
from aria.games.family import FAMILIES, checked_game, family_of, family_of_summary
from aria.games.question.oracle import check_oracle
from aria.games.two_player.glee import config_set
from aria.io import ConfigError, DataError, atomic_write_json, atomic_write_text, read_json
from aria.llm.registry import build_policy, reply_tokens_key
from aria.settings import typed
from aria.statistics import percent
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): openai


def summary_markdown(summary: dict) -> str:
    """``summary.md``: the run's settings, then a table per game family (its own columns)."""
    lines = [f"# {summary['model']}", "", f"Endpoint: {summary.get('base_url', '?')}; oracle: {summary.get('oracle', '?')}; "
             f"seed {summary.get('seed')}" + (f"; at most {summary['max_turns']} questions a game (not the game's own limit)"
                                              if summary.get("max_turns") else ""), ""]
    for family in FAMILIES.values():
        envs = [env for env, s in summary["environments"].items() if family_of_summary(s) is family]
        if envs:
            lines += family.summary_table(summary, envs)
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
    paths = [Path(f) / "summary.json" for f in folders]
    summaries = [_summary(path) for path in paths]
    envs: list[str] = []
    for s in summaries:
        envs += [e for e in s["environments"] if e not in envs]
    families = {e: next(family_of_summary(s["environments"][e]) for s in summaries if e in s["environments"]) for e in envs}
    lines = ["| model | " + " | ".join(f"{e} {families[e].outcome} % (95% CI)" for e in envs) + " |",
             "|---|" + "---|" * len(envs)]
    for path, s in zip(paths, summaries):
        cells = []
        for e in envs:
            env = s["environments"].get(e)
            if env is None:
                cells.append("-")
                continue
            try:
                rate, (low, high), finished, failed = families[e].headline(env)
                cell = f"{percent(rate)} ({percent(low)}-{percent(high)}), n={finished}" + (f", {failed} failed" if failed else "")
            except (KeyError, TypeError, ValueError) as error:  # a file edited or written by something else
                raise DataError(path, None, f"environments.{e}", f"not an evaluation summary's ({error!r})") from None
            cells.append(cell)
        lines.append(f"| {s['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _summary(path: Path) -> dict:
    """An evaluation's ``summary.json``, its shape checked where it is read."""
    summary = read_json(path)
    if not isinstance(summary, dict) or not isinstance(summary.get("model"), str):
        raise DataError(path, None, "model", "not an evaluation summary (an object with the model's name)")
    if not isinstance(summary.get("environments"), dict) or not all(isinstance(v, dict) for v in summary["environments"].values()):
        raise DataError(path, None, "environments", "not an evaluation summary (an object of environments)")

    for env, found in summary["environments"].items():
        if found.get("kind") is not None and found["kind"] not in FAMILIES:
            raise DataError(path, None, f"environments.{env}.kind", f"{found['kind']!r} is no game family "
                                                                   f"(known: {', '.join(sorted(FAMILIES))})")
    return summary


def evaluate_model(cfg: Mapping[str, Any]) -> tuple[Path, dict]:
    """The evaluation harness (module doc) on ``config/eval.yaml`` settings -> (out, summary).

    Checks the settings, the environments' names and the servers first (one
    :class:`~aria.io.ConfigError` naming the URL and what ``/v1/models`` returned)."""
    from aria.llm.endpoint import check_server
    cfg = typed(EvalSettings, cfg, "eval")
    p = cfg.policy
    # A served model (the usual case) or a local transformers model (policy=local: no server, the
    # same games and summaries; for a quick look at a small model on a CPU).
    served = p["name"] == "endpoint"
    reply_tokens = reply_tokens_key(p)
    batch_size = cfg.batch_size or (p["concurrency"] if served else 16)
    unknown = [e for e in cfg.envs if e not in known_games()]
    if unknown:
        raise ConfigError(f"unknown environment(s) {unknown} (known: {known_games()})")
    games = {env: checked_game(load_game_config(env)) for env in cfg.envs}
    two_player = [env for env, game in games.items() if family_of(game).seats > 1]  # against an opponent
    try:
        if served:
            check_server(p["base_url"], p.get("api_key"), p["model"])
        if two_player and cfg.opponent["name"] == "endpoint":
            o = cfg.opponent
            check_server(o["base_url"], o.get("api_key"), o["model"])
    except RuntimeError as err:
        raise ConfigError(str(err)) from None
    # what would otherwise fail after the policy's model loaded
    if len(two_player) < len(games):
        check_oracle(cfg.oracle)
    if two_player:
        for env in two_player:
            config_set(games[env], cfg.two_player.config_set, "two_player.config_set")
    out = Path(cfg.out)
    policy = build_policy(p)
    summary = {"model": p["model"] if served else p["model_path"], "base_url": p.get("base_url"),
               "oracle": cfg.oracle["name"], "seed": cfg.seed, "num_games": cfg.num_games,
               "max_turns": cfg.max_turns,
               "sampling": {k: p.get(k) for k in ("temperature", "top_p", reply_tokens)},
               "environments": {}}
    if two_player:  # what the win rates were measured under (reply length matters a lot to a small model)
        t = cfg.two_player
        summary["two_player"] = {"config_set": t.config_set, "games_per_config": t.games_per_config, "max_tokens": t.max_tokens,
                                 "opponent": {k: v for k, v in cfg.opponent.items() if k != "api_key"}}  # no secrets in results
    for env, game_cfg in games.items():
        summary["environments"][env] = family_of(game_cfg).evaluate_served(cfg, game_cfg, policy, out / env, batch_size)
    write_summary(out, summary)
    return out, summary
