"""Evaluation statistics and reports (spec ``aria_method.md`` §6): success rate with a Wilson
95 % interval, mean turns, share of invalid questions, failed games; ``summary.json`` /
``summary.md`` per evaluated model, and the paper's Table 2 layout across models."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Sequence

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
    return max(0.0, center - half), min(1.0, center + half)


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


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def summary_markdown(summary: dict) -> str:
    lines = [f"# {summary['model']}", "", f"Endpoint: {summary.get('base_url', '?')}; oracle: {summary.get('oracle', '?')}; "
             f"seed {summary.get('seed')}", "",
             "| environment | games | success % | 95% CI | mean turns | invalid questions % | failed |",
             "|---|---|---|---|---|---|---|"]
    for env, s in summary["environments"].items():
        low, high = s["success_rate_ci95"]
        turns = "n/a" if s["mean_turns"] is None else f"{s['mean_turns']:.2f}"
        lines.append(f"| {env} | {s['finished']} | {_pct(s['success_rate'])} | {_pct(low)}-{_pct(high)} | {turns} | "
                     f"{_pct(s['invalid_question_share'])} | {s['failed']} |")
    return "\n".join(lines) + "\n"


def write_summary(out_dir: str | Path, summary: dict) -> None:
    out_dir = Path(out_dir)
    atomic_write_json(out_dir / "summary.json", summary)
    atomic_write_text(out_dir / "summary.md", summary_markdown(summary))


def compare_table(folders: Iterable[str | Path]) -> str:
    """Success rates of several result folders side by side (the paper's Table 2 layout)."""
    summaries = [read_json(Path(f) / "summary.json") for f in folders]
    envs: list[str] = []
    for s in summaries:
        envs += [e for e in s["environments"] if e not in envs]
    lines = ["| model | " + " | ".join(f"{e} success % (95% CI)" for e in envs) + " |",
             "|---|" + "---|" * len(envs)]
    for s in summaries:
        cells = []
        for e in envs:
            env = s["environments"].get(e)
            if env is None:
                cells.append("-")
                continue
            low, high = env["success_rate_ci95"]
            cells.append(f"{_pct(env['success_rate'])} ({_pct(low)}-{_pct(high)}), n={env['finished']}"
                         + (f", {env['failed']} failed" if env["failed"] else ""))
        lines.append(f"| {s['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
