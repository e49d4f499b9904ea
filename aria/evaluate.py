"""Evaluation statistics and reports (``docs/method.md`` §6).

Single-agent games: success rate with a Wilson 95 % interval, mean turns, share of invalid
questions, failed games. Two-player games: the policy's win rate (its payoff strictly above the
opponent's) per role and overall with Wilson intervals, tie and deal rates, its mean payoff share
(the normalised reward of :func:`aria.games.glee.normalized_rewards`, 0.5 on a tie) and the share
of its turns with no usable reply. ``summary.json`` / ``summary.md`` per evaluated model, and
the paper's Table 1 / Table 2 layout across models."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from aria.io import atomic_write_json, atomic_write_text, read_json

Z_95 = 1.959963984540054  # two-sided 95 % normal quantile


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when n = 0 (nothing is known)."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # With no successes the lower bound is exactly 0, with all successes the upper exactly 1;
    # the formula only gets within rounding of them (5.6e-17 for 0 of 3).
    low = 0.0 if successes == 0 else max(0.0, center - half)
    high = 1.0 if successes == n else min(1.0, center + half)
    return low, high


def summarize_games(records: Sequence[dict]) -> dict:
    """Statistics of one environment's transcripts (schema-v1 single-agent records).

    Failed games (requests that kept failing) are counted and listed, never scored as losses.
    """
    finished = [r for r in records if r["status"] == "finished"]
    failed = [r["game_id"] for r in records if r["status"] != "finished"]
    wins = sum(r["success"] for r in finished)
    turns = sum(r["num_turns"] for r in finished)
    invalid = sum(1 for r in finished for t in r["turns"] if t.get("question") is None)
    low, high = wilson_interval(wins, len(finished))
    return {
        "games": len(records), "finished": len(finished), "failed": len(failed), "failed_game_ids": failed,
        "successes": wins, "success_rate": wins / len(finished) if finished else None,
        "success_rate_ci95": [low, high],
        "mean_turns": turns / len(finished) if finished else None,
        "invalid_question_share": invalid / turns if turns else None,
    }


def summarize_two_player(games: Mapping[str, Sequence[dict]]) -> dict:
    """Statistics of the policy in two-player transcripts (schema-v1 two-player records).

    Args:
        games: the policy's seat (``"alice"`` / ``"bob"``) -> the records of the games it played
            in that seat; give both seats to get the statistics over both.
    """
    pairs = [(role, r) for role, records in games.items() for r in records]
    finished = [(role, r) for role, r in pairs if r["status"] == "finished"]
    failed = [r["game_id"] for _, r in pairs if r["status"] != "finished"]
    wins = ties = deals = turns = unusable = reprompted = 0
    shares = []
    for me, r in finished:
        winner = r["meta"]["winner"]
        wins += winner == me
        ties += winner is None
        deals += r["meta"]["outcome"] == "deal"
        shares.append(r["role_rewards"][me])
        mine = [t for t in r["turns"] if t["role"] == me]
        turns += len(mine)
        unusable += sum(1 for t in mine if t.get("forfeit"))
        reprompted += sum(1 for t in mine if t.get("attempts"))
    n = len(finished)
    low, high = wilson_interval(wins, n)
    return {
        "games": len(pairs), "finished": n, "failed": len(failed), "failed_game_ids": failed,
        "wins": wins, "ties": ties, "losses": n - wins - ties,
        "win_rate": wins / n if n else None, "win_rate_ci95": [low, high],
        "tie_rate": ties / n if n else None, "deal_rate": deals / n if n else None,
        "mean_payoff_share": sum(shares) / n if n else None,
        "unusable_reply_share": unusable / turns if turns else None,  # no usable reply after the re-prompts
        "reprompted_turn_share": reprompted / turns if turns else None,  # the first reply was not usable
    }


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


def generation_cost(policy, tokens_before: int, seconds_before: float) -> dict:
    """Reply tokens the policy generated in this run of an environment, the seconds its generate
    calls took, and their ratio (games already in the transcripts cost nothing)."""
    tokens = getattr(policy, "generated_tokens", 0) - tokens_before
    seconds = getattr(policy, "generation_seconds", 0.0) - seconds_before
    return {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None}


def reply_tokens_key(policy_cfg) -> str:
    """The policy config's name for the reply length: ``max_tokens`` for a served model (the
    OpenAI API's), ``max_new_tokens`` for a local transformers model."""
    return "max_tokens" if policy_cfg["name"] == "endpoint" else "max_new_tokens"
