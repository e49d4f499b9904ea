"""How many paired games a comparison needs: the power of the exact McNemar test.

Two arms play the same n targets (games paired by seed and game id). A pair is *discordant* when
exactly one arm won it, with probability ``d`` (the discordant share); the first arm's success
rate exceeds the second's by ``delta = p10 - p01``, where ``p10 + p01 = d``. Given ``m``
discordant pairs, the number ``b`` that the first arm won is Binomial(m, q) with
``q = (1 + delta / d) / 2``, and the exact McNemar test (``aria.statistics.mcnemar``)
rejects at level ``alpha`` when the two-sided binomial p-value of ``b`` against Binomial(m, 1/2)
is at most ``alpha``. Since Binomial(m, 1/2) is symmetric, that p-value is
``min(1, 2 * P[X <= min(b, m - b)])``, so the test rejects exactly when ``b <= k_m`` or
``b >= m - k_m``, with ``k_m`` the largest k whose lower tail is at most ``alpha / 2``.

The power sums the probability of that region over ``m ~ Binomial(n, d)``; nothing is
approximated, but the pairs are taken as independent. (Where several seeds play the same
evaluation targets, pairs of one target are alike, and the real power is somewhat lower.) Like every exact test's, it is a saw-tooth in n (one more pair can lower it a
little); :func:`pairs_needed` scans up to the first n that reaches it.

    pairs_needed(d=0.355, delta=0.05)        # about 1,100 pairs for 80% power at alpha 0.05
    detectable_difference(n=400, d=0.355)    # the difference 400 pairs detect with 80% power
"""
from __future__ import annotations

import math

import numpy as np
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): scipy


def _check(d: float, alpha: float, power: float | None = None, n: int | None = None) -> None:
    # written so that NaN fails every check (a NaN power would otherwise be 'reached' by one pair)
    if not 0 < d <= 1:
        raise ValueError(f"the discordant share must be in (0, 1], got {d}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if power is not None and not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power}")
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0):
        raise ValueError(f"n must be a whole number of pairs >= 0, got {n!r}")


def critical_counts(max_discordant: int, alpha: float = 0.05) -> np.ndarray:
    """``k_m`` for m = 0..max_discordant: the test rejects b <= k_m or b >= m - k_m (-1: never)."""
    from scipy.stats import binom

    m = np.arange(max_discordant + 1)
    k = binom.ppf(alpha / 2, m, 0.5)  # smallest k with P[X <= k] >= alpha/2 ...
    k = np.where(binom.cdf(k, m, 0.5) * 2 <= alpha * (1 + 1e-9), k, k - 1)  # ... one less unless it is <= alpha/2
    return k.astype(int)


def mcnemar_power(n: int, d: float, delta: float, alpha: float = 0.05, critical: np.ndarray | None = None) -> float:
    """Probability that the exact McNemar test on n pairs rejects at level ``alpha`` when the
    discordant share is ``d`` and the first arm is better by ``delta`` (module doc).
    ``critical``: :func:`critical_counts` for ``alpha`` up to n or beyond, computed once by a caller
    that asks for many n."""
    from scipy.stats import binom

    _check(d, alpha, n=n)
    if not abs(delta) <= d:
        raise ValueError(f"a difference of {delta} cannot come from a discordant share of {d}: |delta| <= d")
    q = (1 + delta / d) / 2
    m = np.arange(n + 1)
    k = critical_counts(n, alpha) if critical is None else critical[: n + 1]
    low = np.where(k >= 0, binom.cdf(k, m, q), 0.0)  # b <= k_m
    high = np.where(k >= 0, binom.sf(m - k - 1, m, q), 0.0)  # b >= m - k_m
    # k_m < m/2 whenever k_m >= 0, so the two tails never overlap
    return float(np.sum(binom.pmf(m, n, d) * (low + high)))


def pairs_needed(d: float, delta: float, power: float = 0.8, alpha: float = 0.05, limit: int = 1_000_000) -> int:
    """The number of pairs at which the power first reaches ``power``: doubling from 16 pairs
    finds a size that reaches it, then every n upward from the size before it (which did not) is
    tried. (The power is a saw-tooth in n, module doc: a smaller n than the one returned may
    reach it too, with a larger n after it that does not.)"""
    _check(d, alpha, power)
    if not 0 < abs(delta) <= d:
        raise ValueError(f"the difference must satisfy 0 < |delta| <= d, got delta={delta}, d={d}")
    hi = 16
    while mcnemar_power(hi, d, delta, alpha) < power:
        hi *= 2
        if hi > limit:
            raise ValueError(f"more than {limit} pairs needed for a difference of {delta} at d={d}")
    critical = critical_counts(hi, alpha)
    n = hi // 2 + 1 if hi > 16 else 1
    while mcnemar_power(n, d, delta, alpha, critical) < power:
        n += 1
    return n


def detectable_difference(n: int, d: float, power: float = 0.8, alpha: float = 0.05) -> float | None:
    """The smallest difference (first arm better) that n pairs detect with ``power``; None when
    even ``delta = d`` (every discordant pair won by the first arm) does not reach it."""
    _check(d, alpha, power, n)
    if mcnemar_power(n, d, d, alpha) < power:
        return None
    lo, hi = 0.0, d  # the power grows with delta
    for _ in range(40):
        mid = (lo + hi) / 2
        if mcnemar_power(n, d, mid, alpha) >= power:
            hi = mid
        else:
            lo = mid
    return hi


# ---- training runs as the unit -------------------------------------------------------------------
# A claim about a method pools training runs (aria.statistics.pool_runs): run i's true difference is
# delta + u_i with u_i ~ N(0, tau2), the between-run variance, and its n pairs estimate it with the
# within-run variance (d - delta^2)/n. Each run's difference then is about N(delta, s2) with
# s2 = tau2 + (d - delta^2)/n, and the method-level (Hartung-Knapp) statistic over R runs of equal
# size is Student's t with R - 1 degrees of freedom, noncentral by delta / sqrt(s2 / R) (exactly so
# for normal run differences of equal variance; tests/test_power.py checks it against a simulation
# of runs that differ, won and lost games and all).

def runs_power(runs: int, pairs: int, d: float, delta: float, tau2: float, alpha: float = 0.05) -> float:
    """The power of the method-level test of a design of ``runs`` training runs an arm, each
    evaluated on ``pairs`` paired games, at discordant share ``d``, true difference ``delta`` and
    between-run variance ``tau2``; 0 for one run (no method-level test)."""
    from scipy.stats import nct, t as student

    _check(d, alpha, n=pairs)
    if tau2 < 0 or not math.isfinite(tau2):
        raise ValueError(f"the between-run variance must be >= 0, got {tau2}")
    if runs < 2 or pairs == 0:
        return 0.0
    s2 = tau2 + max(d - delta ** 2, 0.0) / pairs
    ncp = abs(delta) / math.sqrt(s2 / runs) if s2 > 0 else math.inf
    crit = float(student.ppf(1 - alpha / 2, runs - 1))
    # The wrong-sided tail is below P(T < 0) = Phi(-ncp): under 3e-7 past ncp 5, where scipy's
    # noncentral t can return NaN for it.
    wrong_side = float(nct.cdf(-crit, runs - 1, ncp)) if ncp < 5 else 0.0
    return float(nct.sf(crit, runs - 1, ncp)) + wrong_side if math.isfinite(ncp) else 1.0


def runs_needed(pairs: int, d: float, delta: float, tau2: float, power: float = 0.8, alpha: float = 0.05,
                limit: int = 1000) -> int | None:
    """The fewest training runs an arm (``pairs`` paired games each) whose method-level test
    reaches ``power`` for a true difference ``delta``; None when ``limit`` runs do not."""
    _check(d, alpha, power, pairs)
    for runs in range(2, limit + 1):
        if runs_power(runs, pairs, d, delta, tau2, alpha) >= power:
            return runs
    return None


def runs_detectable_difference(runs: int, pairs: int, d: float, tau2: float, power: float = 0.8,
                               alpha: float = 0.05) -> float | None:
    """The smallest true difference the method-level test of ``runs`` runs x ``pairs`` pairs
    detects with ``power`` (to 1e-4, by bisection: the power grows with the difference); None
    when not even a difference of ``d`` is."""
    _check(d, alpha, power, pairs)
    if runs_power(runs, pairs, d, d, tau2, alpha) < power:
        return None
    low, high = 0.0, d
    while high - low > 1e-4:
        mid = (low + high) / 2
        low, high = (low, mid) if runs_power(runs, pairs, d, mid, tau2, alpha) >= power else (mid, high)
    return high
