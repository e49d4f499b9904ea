"""The power of the exact McNemar test (aria/power.py): by hand, against scipy's own test, and
against a simulation of paired games scored by the experiment's own test."""
from __future__ import annotations

import numpy as np
import pytest

from aria.experiment_report import render_table
from aria.statistics import mcnemar, sensitivity
from aria.power import critical_counts, detectable_difference, mcnemar_power, pairs_needed


def test_the_rejection_region_is_scipys_exact_test():
    from scipy.stats import binomtest

    k = critical_counts(60)
    assert k[0] == -1 and k[5] == -1 and k[6] == 0  # 2/32 > 0.05 >= 2/64: six discordant pairs are the fewest that can reject
    for m in range(1, 61):
        for b in range(m + 1):
            assert (binomtest(b, m, 0.5).pvalue <= 0.05) == (b <= k[m] or b >= m - k[m]), (m, b)


def test_power_by_hand():
    # Every pair discordant (d = 1), 7 pairs, first arm better by 0.5: q = 0.75; the test rejects
    # only b = 0 or b = 7 (2·P[X <= 1] = 2·8/128 > 0.05 >= 2·1/128), so the power is
    # 0.75^7 + 0.25^7 = 0.1334838867 + 0.0000610352
    assert mcnemar_power(7, 1.0, 0.5) == pytest.approx(0.1335449219)
    # no difference: the power is the test's size, P[b = 0] + P[b = 6] = 2/64
    assert mcnemar_power(6, 1.0, 0.0) == pytest.approx(2 / 64)
    assert mcnemar_power(5, 1.0, 1.0) == 0.0  # five pairs can never reject
    assert mcnemar_power(6, 1.0, 1.0) == pytest.approx(1.0)
    # half the pairs discordant, 2 pairs: at most 2 discordant, never enough
    assert mcnemar_power(2, 0.5, 0.5) == 0.0
    with pytest.raises(ValueError, match=r"\|delta\| <= d"):
        mcnemar_power(100, 0.2, 0.3)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: mcnemar_power(100, 0.2, float("nan")), r"\|delta\| <= d"),        # before: nan
    (lambda: mcnemar_power(10.5, 0.2, 0.1), "n must be a whole number"),        # before: nan
    (lambda: mcnemar_power(-1, 0.2, 0.1), "n must be a whole number"),
    (lambda: pairs_needed(0.35, 0.05, power=float("nan")), "power must be in"),   # before: 1 pair
    (lambda: detectable_difference(100, 0.35, power=1.0), "power must be in"),
    (lambda: detectable_difference(100, float("nan")), "discordant share"),
])
def test_power_refuses_what_has_no_answer(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_power_agrees_with_a_simulation_of_paired_games():
    rng = np.random.default_rng(0)
    n, d, delta, runs = 150, 0.35, 0.10, 3000
    p10, p01 = (d + delta) / 2, (d - delta) / 2  # first arm alone wins, second arm alone wins
    rejected = 0
    for _ in range(runs):
        kind = rng.choice(4, size=n, p=[p10, p01, (1 - d) / 2, (1 - d) / 2])  # 2: both won, 3: neither
        first, second = (kind == 0) | (kind == 2), (kind == 1) | (kind == 2)
        rejected += mcnemar(first.tolist(), second.tolist())["p_value"] <= 0.05
    expected = mcnemar_power(n, d, delta)
    assert 0.3 < expected < 0.7  # a power the simulation can tell apart from its neighbours
    assert abs(rejected / runs - expected) < 3 * np.sqrt(expected * (1 - expected) / runs), (rejected / runs, expected)


def test_pairs_needed_and_the_detectable_difference():
    # The figures for the first CPU comparison: discordant share 0.355, 80% power
    five, ten = pairs_needed(0.355, 0.05), pairs_needed(0.355, 0.10)
    assert 1050 <= five <= 1200 and 250 <= ten <= 310, (five, ten)
    # by hand: every pair discordant and won by the first arm, so b = m = n; five pairs never
    # reject (k_5 = -1), six always do
    assert pairs_needed(1.0, 1.0) == 6
    # six such pairs with a difference delta: power q^6 + (1 - q)^6 (above), 80% at delta = 0.926984
    assert detectable_difference(6, 1.0) == pytest.approx(0.926984, abs=1e-5)
    assert 0.05 < detectable_difference(400, 0.355) < 0.10  # 400 pairs: between the two sizes above
    assert detectable_difference(5, 1.0) is None  # five pairs never reject


def test_the_table_says_what_the_paired_test_can_see():
    def table(first, second) -> str:
        test = {"first": "aria", "second": "no_aggregation", "iteration": 1, "seeds": [0], **mcnemar(first, second)}
        test.update(sensitivity(test))
        return render_table({"name": "t", "game": "twenty_questions_subset", "eval_games": len(first), "eval_seed": 0,
                             "pooled": [], "arms": [], "gradient_variance": {}, "intention_recovery": None,
                             "paired_tests": [test]})

    # 6 pairs, all won by aria alone: k_6 = 0, so the power at q is q^6 + (1 - q)^6; 80% needs
    # q = 0.8^(1/6) = 0.963492, a difference of 2q - 1 = 0.926984
    assert "100.0% of the pairs were won by one arm only; at that share, 6 pairs detect a difference of 92.7 points" \
        in table([True] * 6, [False] * 6)
    assert "5 pairs are too few for any difference to reach 80% power" in table([True] * 5, [False] * 5)
    assert "What this test can see" not in render_table({"name": "t", "game": "g", "eval_games": 0, "eval_seed": 0,
                                                         "pooled": [], "arms": [], "gradient_variance": {},
                                                         "intention_recovery": None, "paired_tests": []})


def test_the_runner_says_first_what_its_pairs_can_detect():
    from aria.io import ConfigError
    from aria.experiment import check_settings
    from aria.experiment_report import planned_power
    from aria.resources import compose_config

    cfg = compose_config("experiment", ["eval.games=200", "seeds=[0,1]", "report.discordant_share=0.355"])
    line = planned_power(cfg)
    found = detectable_difference(400, 0.355)
    assert line.startswith("the paired test (aria against no_aggregation) has 200 pairs a seed and iteration over 2 seed(s): "
                           f"400 pairs detect {100 * found:.1f} points; each arm against its parent: over 2 seed(s) 400 pairs "
                           f"detect {100 * found:.1f} points; with 80% power at the 5% level"), line
    # an arm outside the paired test on fewer seeds: its own detectable difference
    fewer = {**cfg, "methods": ["aria", "no_aggregation", "bc"], "seeds_by_method": {"bc": [1]}}
    assert f"over 1 seed(s) 200 pairs detect {100 * detectable_difference(200, 0.355):.1f} points; over 2 seed(s)" in planned_power(fewer)
    # Bargaining: every configuration in both seats
    barg = compose_config("experiment", ["experiment=bargaining", "seeds=[0]"])
    assert "has 192 pairs a seed and iteration (both seats) over 1 seed(s): 192 pairs detect" in planned_power(barg)  # 48 configurations x 2 games x 2 seats
    with pytest.raises(ConfigError, match=r"report.discordant_share: expected a finite number > 0 and <= 1, got 0"):
        check_settings({**cfg, "report": {**cfg["report"], "discordant_share": 0}})
