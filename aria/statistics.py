"""The statistics of evaluations (``docs/method.md`` §6): one place for every interval and test.

* **Wilson score interval** for k wins in n games: centre (k + z²/2)/(n + z²), half-width
  z·sqrt(k(n−k)/n + z²/4)/(n + z²), z = 1.959964 (95%); exactly 0 / 1 at the edges.
* **Summaries of games**: single-agent success rate with its interval, mean turns, share of
  invalid questions, failed games (counted and listed, never scored as losses); two-player win
  rate (the policy's payoff strictly above the opponent's) per seat or over both, tie and deal
  rates, mean payoff share (the normalised reward of :func:`aria.games.two_player.glee.normalized_rewards`,
  0.5 on a tie) and the share of turns with no usable reply.
* **Paired test** of two arms evaluated on the same targets (games paired by seed and game id):
  exact McNemar, the two-sided binomial test of b against Binomial(b + c, 1/2), where b = pairs
  only the first arm won and c = pairs only the second won. Effect size: the difference of
  success rates (b − c)/n with the Agresti-Min interval for paired proportions (the Wald interval
  after adding 1/2 to each of the four cells, clipped to [−1, 1]: it keeps its coverage where the
  Wald interval collapses to a point, with no or all pairs discordant), and the odds ratio b/c;
  its sensitivity (the difference detectable with 80% power at the observed discordant share)
  comes from :mod:`aria.power`.
* **Training runs as the unit** (:func:`pool_runs`): the paired tests above are for two fixed
  trained models; a second training run of the same arm differs by about as much as the effects
  in question, so a claim about a *method* pools the per-run differences d_i = (b_i − c_i)/n_i,
  each with its within-run variance v_i (the Agresti-Min variance above, never 0). Pairs pooled
  as if from one run: Σ(b−c)/Σn with its Agresti-Min interval and the stratified exact test (Σb against
  Binomial(Σb + Σc, 1/2): the conditional test of a common effect, each run a stratum).
  Heterogeneity: Cochran's Q = Σ w_i (d_i − d̄)² with w_i = 1/v_i, its χ²(k−1) p-value, and
  I² = max(0, (Q − (k−1))/Q). The random-effects (method-level) difference takes the
  DerSimonian-Laird between-run variance τ² = max(0, (Q − (k−1))/(Σw − Σw²/Σw)) and weights
  w*_i = 1/(v_i + τ²); its interval is Hartung-Knapp-Sidik-Jonkman: the standard error
  sqrt(q/Σw*) with q = Σ w*_i (d_i − μ)²/(k−1), against Student's t with k−1 degrees of
  freedom. Why HKSJ rather than DerSimonian-Laird's normal interval (also reported): with the 2 to
  8 runs an experiment here affords, τ² is estimated from a handful of values and the normal
  interval covers about 90% where runs differ as much as they did on Twenty Questions; with runs
  of equal size HKSJ is the one-sample t-test of the d_i and holds its level
  (tests/test_power.py simulates both). Its variant with q floored at 1 was tried and left out:
  at 3 runs it rejected 0.4% of null designs and had half the power. One run gives no
  method-level interval: τ² cannot be estimated from it.
* **Graded outcomes** (:func:`paired_scores`, :func:`pool_score_runs`): a two-player game also
  gives the policy a payoff share in [0, 1] (0.5 on a tie), which moves where a win rate sits at
  its floor (a model that wins no Negotiation game). Paired by game, the mean difference with the
  Agresti-Min smoothing carried over to differences in [−1, 1] (two pseudo-pairs: Σd² + 1 over
  m = n + 2 pairs; for win/loss scores exactly the paired test's interval above), a normal test of
  the same smoothed centre (so p and the interval agree about 0), and the same random-effects
  pooling over runs; pairs pooled have no stratified exact test (the scores are not win/loss).

Everything here is a pure function of game records and counts, checked by hand in
``tests/test_evaluation.py`` and ``tests/test_power.py``; the commands that play and write the
evaluations are :mod:`aria.games.evaluate` (a served or local model on every environment) and
:mod:`aria.experiment.report` (the experiment's table).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from aria.power import detectable_difference, runs_detectable_difference
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): scipy

Z_95 = 1.959963984540054  # two-sided 95 % normal quantile


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when n = 0 (nothing is known)."""
    for name, count in (("successes", successes), ("n", n)):
        if isinstance(count, bool) or not float(count).is_integer():
            raise ValueError(f"{name} must be a whole number, got {count!r}")
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


ALPHA = 0.05  # the level of every test in the report (the verdicts and the power statements)
POWER = 0.8   # the power at which a detectable difference is stated


def percent(x: float | None) -> str:
    """A share as the tables print it: one decimal of a percent, ``n/a`` where nothing was measured."""
    return "n/a" if x is None else f"{100 * x:.1f}"


def summarize_games(records: Sequence[dict], invalid_answer: str | None = None) -> dict:
    """Statistics of one environment's transcripts (schema-v1 single-agent records).

    Failed games (requests that kept failing) are counted and listed, never scored as losses.
    Two shares of turns say how a reply went wrong: ``invalid_question_share``, replies no
    question could be read from; ``invalid_answer_share``, turns the oracle answered with the
    game's ``invalid_answer`` ("Invalid Question.": not a yes/no question), when it is given.
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
        **({"invalid_answer_share": sum(1 for r in finished for t in r["turns"] if t.get("observation") == invalid_answer) / turns
            if turns else None} if invalid_answer is not None else {}),
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


def generation_cost(policy, tokens_before: int, seconds_before: float) -> dict:
    """Reply tokens the policy generated in this run of an environment, the seconds its generate
    calls took, and their ratio (games already in the transcripts cost nothing)."""
    tokens = getattr(policy, "generated_tokens", 0) - tokens_before
    seconds = getattr(policy, "generation_seconds", 0.0) - seconds_before
    return {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None}


def mcnemar(first: list[bool], second: list[bool]) -> dict[str, Any]:
    """Exact McNemar test of two paired win/loss lists (module doc)."""
    from scipy.stats import binomtest

    if len(first) != len(second):
        raise ValueError("paired lists must have the same length")
    n = len(first)
    b = sum(a and not o for a, o in zip(first, second))
    c = sum(o and not a for a, o in zip(first, second))
    p = binomtest(b, b + c, 0.5).pvalue if b + c else 1.0
    diff = (b - c) / n if n else 0.0
    return {"pairs": n, "first_only": b, "second_only": c, "both": sum(a and o for a, o in zip(first, second)),
            "p_value": float(p), "difference": diff, "difference_ci95": paired_difference_interval(b, c, n),
            "odds_ratio": (b / c) if c else None}


def paired_difference_interval(b: int, c: int, n: int, z: float = Z_95) -> list[float]:
    """Agresti & Min (2005), "Simple improved confidence intervals for comparing matched
    proportions": the Wald interval of (b − c)/n computed after adding 1/2 to every cell of the
    2×2 table (so b + c + 1 discordant and n + 2 pairs), clipped to [−1, 1]. The plain Wald
    interval has width 0 when no pair is discordant (two arms that play alike would read as a
    difference known exactly) and can leave [−1, 1]; this one does neither, and at hundreds of
    pairs it is the Wald interval to a tenth of a point. [−1, 1] when there are no pairs."""
    if n == 0:
        return [-1.0, 1.0]
    m = n + 2
    centre = (b - c) / m
    se = math.sqrt((b + c + 1) - (b - c) ** 2 / m) / m
    return [max(-1.0, centre - z * se), min(1.0, centre + z * se)]


def sensitivity(test: dict[str, Any], power: float = POWER, alpha: float = ALPHA) -> dict[str, Any]:
    """What a paired test of this size could see: the share of discordant pairs it observed, and
    the smallest difference of success rates that the exact McNemar test on as many pairs detects
    with ``power`` at that share (``aria/power.py``); None where no pair was discordant or no
    difference is detectable."""
    n = test["pairs"]
    share = (test["first_only"] + test["second_only"]) / n if n else 0.0
    detectable = detectable_difference(n, share, power, alpha) if share > 0 else None
    return {"discordant_share": share, "detectable_difference": detectable, "power": power}


def runs_sensitivity(runs: Sequence[Mapping[str, int]], tau2: float, power: float = POWER,
                     alpha: float = ALPHA) -> float | None:
    """:func:`sensitivity` of the method-level test over ``runs`` (per-run :func:`mcnemar` tests):
    the smallest difference it detects with ``power`` at their own between-run variance ``tau2``
    and pooled discordant share, each run at their mean number of pairs; None where no pair was
    discordant (a win rate at its floor) or no difference is detectable."""
    n = sum(r["pairs"] for r in runs)
    share = sum(r["first_only"] + r["second_only"] for r in runs) / n if n else 0.0
    return runs_detectable_difference(len(runs), round(n / len(runs)), share, tau2, power, alpha) if share > 0 else None


def run_difference(b: int, c: int, n: int) -> tuple[float, float]:
    """One run's paired difference (b − c)/n and its within-run variance, Agresti-Min's (the
    variance behind :func:`paired_difference_interval`: never 0, so a run whose arms play alike
    still has a weight)."""
    if n <= 0:
        raise ValueError(f"a run needs at least one pair, got n = {n}")
    return (b - c) / n, smoothed_variance(b - c, b + c, n)


def smoothed_variance(total: float, total_of_squares: float, n: int) -> float:
    """The variance of a mean paired difference from n differences in [−1, 1] (their sum and sum of
    squares), smoothed as Agresti-Min smooth a win/loss table, ½ added to each of its four cells:
    half a pair at +1, half at −1 and one pair at 0, so Σd is unchanged, Σd² grows by 1 and n by 2:
    (Σd² + 1 − (Σd)²/m)/m² with m = n + 2. For win/loss pairs (Σd = b − c, Σd² = b + c) it is
    Agresti-Min's variance exactly; it is never 0. For graded differences the +1 is this project's
    extension, conservative where few pairs differ (it weighs as much as one pair differing by 1)."""
    m = n + 2
    return (total_of_squares + 1 - total ** 2 / m) / m ** 2


def paired_scores(first: Sequence[float], second: Sequence[float], z: float = Z_95) -> dict[str, Any]:
    """Two arms' graded outcomes in [0, 1] on the same games (a two-player game's payoff share, module
    doc): the mean difference, its variance (:func:`smoothed_variance`), the Wald interval around the
    smoothed centre Σd/(n + 2) clipped to [−1, 1] (Agresti-Min's for win/loss scores) and the normal
    test of that centre, so p < 1 − the level exactly when the interval leaves out 0."""
    from scipy.stats import norm

    a, b = np.asarray(first, dtype=float), np.asarray(second, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError(f"paired scores need two lists of one length > 0, got {len(first)} and {len(second)}")
    if not (np.isfinite(a).all() and np.isfinite(b).all() and min(a.min(), b.min()) >= 0 and max(a.max(), b.max()) <= 1):
        raise ValueError("scores must be numbers in [0, 1]")
    d, n = a - b, len(a)
    variance = smoothed_variance(float(d.sum()), float((d ** 2).sum()), n)
    centre, se = float(d.sum()) / (n + 2), math.sqrt(variance)
    return {"pairs": n, "first_mean": float(a.mean()), "second_mean": float(b.mean()),
            "difference": float(d.mean()), "variance": variance,
            "difference_ci95": [max(-1.0, centre - z * se), min(1.0, centre + z * se)],
            "p_value": float(2 * norm.sf(abs(centre) / se))}


def pool_runs(runs: Sequence[Mapping[str, int]], alpha: float = ALPHA) -> dict[str, Any]:
    """The method-level comparison of two arms over training runs (module doc): ``runs`` are the
    per-run paired tests (:func:`mcnemar`'s ``first_only``, ``second_only``, ``pairs``)."""
    from scipy.stats import binomtest, norm

    if not runs:
        raise ValueError("pooling needs at least one run")
    bs, cs, ns = (np.array([r[key] for r in runs], dtype=float) for key in ("first_only", "second_only", "pairs"))
    d, v = (np.array(x) for x in zip(*(run_difference(*map(int, r)) for r in zip(bs, cs, ns))))
    b, c, n = bs.sum(), cs.sum(), ns.sum()
    z = float(norm.ppf(1 - alpha / 2))
    pairs = {"difference": float((b - c) / n), "ci95": paired_difference_interval(int(b), int(c), int(n), z),
             "p_value": float(binomtest(int(b), int(b + c), 0.5).pvalue) if b + c else 1.0}
    return {"runs": len(runs), "per_run": [{"difference": float(x), "variance": float(y)} for x, y in zip(d, v)],
            "pairs_pooled": pairs, **pool_random_effects(d, v, alpha)}


def pool_score_runs(runs: Sequence[tuple[Sequence[float], Sequence[float]]], alpha: float = ALPHA) -> dict[str, Any]:
    """:func:`pool_runs` for graded outcomes: ``runs`` are each run's (first arm's, second arm's)
    scores on the same games. Pairs pooled: :func:`paired_scores` of every pair (no stratified exact
    test: the scores are not win/loss); over runs: the same random-effects pooling of each run's
    mean difference and smoothed variance."""
    if not runs:
        raise ValueError("pooling needs at least one run")
    from scipy.stats import norm

    z = float(norm.ppf(1 - alpha / 2))
    tests = [paired_scores(a, b, z) for a, b in runs]
    d, v = np.array([t["difference"] for t in tests]), np.array([t["variance"] for t in tests])
    everything = paired_scores([x for a, _ in runs for x in a], [x for _, b in runs for x in b], z)
    pairs = {"difference": everything["difference"], "ci95": everything["difference_ci95"], "p_value": everything["p_value"]}
    return {"runs": len(runs), "per_run": tests, "pairs_pooled": pairs, **pool_random_effects(d, v, alpha)}


def pool_random_effects(d: np.ndarray, v: np.ndarray, alpha: float = ALPHA) -> dict[str, Any]:
    """Runs' differences ``d`` with within-run variances ``v`` pooled with the run as a random effect
    (module doc): the heterogeneity and the method-level difference, or neither from one run."""
    from scipy.stats import chi2, norm
    from scipy.stats import t as student

    k = len(d)
    if k < 2:
        return {"heterogeneity": None, "random_effects": None,
                "why_not": "one training run an arm: the between-run variance cannot be estimated"}
    z = float(norm.ppf(1 - alpha / 2))
    w = 1 / v
    fixed = float((w * d).sum() / w.sum())
    q_stat = float((w * (d - fixed) ** 2).sum())
    tau2 = max(0.0, (q_stat - (k - 1)) / float(w.sum() - (w ** 2).sum() / w.sum()))
    heterogeneity = {"q": q_stat, "df": k - 1, "p_value": float(chi2.sf(q_stat, k - 1)),
                     "i2": max(0.0, (q_stat - (k - 1)) / q_stat) if q_stat > 0 else 0.0, "tau2": tau2}
    ws = 1 / (v + tau2)
    mu = float((ws * d).sum() / ws.sum())
    se_dl = float(ws.sum() ** -0.5)
    q_hk = float((ws * (d - mu) ** 2).sum()) / (k - 1)
    # Runs whose differences are exactly equal give HKSJ a scale of 0 (a point interval): take the
    # normal interval's standard error there rather than claim the difference is known exactly.
    se_hk = math.sqrt(q_hk / ws.sum()) if q_hk > 0 else se_dl
    crit = float(student.ppf(1 - alpha / 2, k - 1))
    return {"heterogeneity": heterogeneity, "random_effects": {
        "difference": mu, "ci95": [mu - crit * se_hk, mu + crit * se_hk],
        "p_value": float(2 * student.sf(abs(mu) / se_hk, k - 1)), "df": k - 1,
        "ci95_normal": [mu - z * se_dl, mu + z * se_dl], "p_value_normal": float(2 * norm.sf(abs(mu) / se_dl)),
        "method": "DerSimonian-Laird tau^2, Hartung-Knapp-Sidik-Jonkman interval (t, k-1 df)"}}
