"""The power of the exact McNemar test (aria/power.py): by hand, against scipy's own test, and
against a simulation of paired games scored by the experiment's own test."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from aria.experiment.report import render_table
from aria.statistics import mcnemar, sensitivity
from aria.power import critical_counts, detectable_difference, mcnemar_power, pairs_needed, runs_detectable_difference


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
    from aria.experiment.runner import check_settings
    from aria.experiment.report import planned_power
    from aria.experiment.settings import ExperimentSettings
    from aria.resources import compose_config
    from aria.settings import typed

    def settings(*overrides: str) -> ExperimentSettings:
        return typed(ExperimentSettings, compose_config("experiment", list(overrides)))

    cfg = settings("eval.games=200", "seeds=[0,1]", "report.discordant_share=0.355")
    line = planned_power(cfg)
    found = detectable_difference(400, 0.355)
    runs = runs_detectable_difference(2, 200, 0.355, cfg.report.between_run_sd ** 2)
    assert runs is None  # two runs (t with 1 df) detect nothing at Twenty Questions' spread
    assert line.startswith("the paired test (aria against no_aggregation) has 200 pairs a seed and iteration over 2 seed(s): "
                           f"400 pairs detect {100 * found:.1f} points; over training runs (the method): 2 runs of 200 pairs "
                           "detect no difference at a between-run spread of 2.7 points (report.between_run_sd); "
                           f"each arm against its parent: over 2 seed(s) 400 pairs "
                           f"detect {100 * found:.1f} points; with 80% power at the 5% level"), line
    six = settings("eval.games=600", "seeds=[0,1,2,3,4,5]")
    assert f"6 runs of 600 pairs detect {100 * runs_detectable_difference(6, 600, 0.355, 0.027 ** 2):.1f} points" \
        in planned_power(six)
    one = settings("seeds=[0]")
    assert "over training runs (the method): one run an arm gives no method-level test" in planned_power(one)
    # an arm outside the paired test on fewer seeds: its own detectable difference
    fewer = replace(cfg, methods=["aria", "no_aggregation", "bc"], seeds_by_method={"bc": [1]})
    assert f"over 1 seed(s) 200 pairs detect {100 * detectable_difference(200, 0.355):.1f} points; over 2 seed(s)" in planned_power(fewer)
    # Bargaining: every configuration in both seats
    barg = settings("experiment=bargaining", "seeds=[0]")
    assert "has 192 pairs a seed and iteration (both seats) over 1 seed(s): 192 pairs detect" in planned_power(barg)  # 48 configurations x 2 games x 2 seats
    with pytest.raises(ConfigError, match=r"report.discordant_share: expected a finite number > 0 and <= 1, got 0"):
        check_settings(compose_config("experiment", ["report.discordant_share=0"]))


# ---- training runs as the unit (aria.statistics.pool_runs, aria.power.runs_power) --------------------

def _runs(*table):
    return [{"first_only": b, "second_only": c, "pairs": n} for b, c, n in table]


def test_runs_pooled_by_hand_on_a_three_run_table():
    """Three runs of 100 pairs, (b, c) = (30, 10), (25, 15), (12, 18); every figure below is the
    module doc's formula worked by hand (Agresti-Min variances over m = n + 2 = 102)."""
    from scipy.stats import binomtest, t as student

    from aria.statistics import pool_runs

    out = pool_runs(_runs((30, 10, 100), (25, 15, 100), (12, 18, 100)))
    d = [0.2, 0.1, -0.06]
    v = [(41 - 20 ** 2 / 102) / 102 ** 2, (41 - 10 ** 2 / 102) / 102 ** 2, (31 - 6 ** 2 / 102) / 102 ** 2]
    assert v == pytest.approx([0.0035638631, 0.0038465598, 0.0029456996])
    assert [r["difference"] for r in out["per_run"]] == pytest.approx(d)
    assert [r["variance"] for r in out["per_run"]] == pytest.approx(v)
    # pairs pooled: (67 - 43) / 300; the stratified exact test is 67 of 110 against Binomial(110, 1/2)
    assert out["pairs_pooled"]["difference"] == pytest.approx(24 / 300)
    assert out["pairs_pooled"]["p_value"] == pytest.approx(0.0278508881)
    assert out["pairs_pooled"]["p_value"] == pytest.approx(binomtest(67, 110, 0.5).pvalue)
    # heterogeneity: w = 1/v = 280.594, 259.973, 339.478; fixed mean 0.0701640; Q = Σw(d - 0.0701640)²
    w = [1 / x for x in v]
    fixed = sum(a * b for a, b in zip(w, d)) / sum(w)
    assert fixed == pytest.approx(0.0701639890)
    h = out["heterogeneity"]
    assert h["q"] == pytest.approx(10.7131738741) and h["df"] == 2
    assert h["i2"] == pytest.approx((10.7131738741 - 2) / 10.7131738741)
    # tau² = (Q - 2) / (Σw - Σw²/Σw) = 8.71317 / 582.82799
    assert h["tau2"] == pytest.approx(8.7131738741 / 582.8279861557)
    # random effects: w* = 1/(v + tau²); mu = 0.0782988; q = Σw*(d - mu)²/2 = 0.946929; se = sqrt(q/Σw*)
    re = out["random_effects"]
    assert re["difference"] == pytest.approx(0.0782987904)
    se = 0.0761969150
    t2 = student.ppf(0.975, 2)
    assert t2 == pytest.approx(4.3026527297)
    assert re["ci95"] == pytest.approx([0.0782987904 - t2 * se, 0.0782987904 + t2 * se])
    assert re["p_value"] == pytest.approx(0.4121778742)
    assert re["ci95_normal"] == pytest.approx([0.0782987904 - 1.959963985 * 0.0783030521,
                                               0.0782987904 + 1.959963985 * 0.0783030521])


def test_paired_scores_by_hand():
    """Payoff shares (1, .25, .75) against (.5, .5, .5): d = (.5, -.25, .25), Σd = .5, Σd² = .375,
    m = 5: variance (.375 + 1 - .25/5)/25 = .053, centre .1, normal p of .1/sqrt(.053)."""
    from scipy.stats import norm

    from aria.statistics import paired_scores

    out = paired_scores([1, 0.25, 0.75], [0.5, 0.5, 0.5])
    assert out["difference"] == pytest.approx(0.5 / 3) and out["variance"] == pytest.approx(0.053)
    assert out["first_mean"] == pytest.approx(2 / 3) and out["second_mean"] == pytest.approx(0.5)
    se = 0.053 ** 0.5
    assert out["difference_ci95"] == pytest.approx([0.1 - 1.959963985 * se, 0.1 + 1.959963985 * se])
    assert out["p_value"] == pytest.approx(2 * norm.sf(0.1 / se))  # the test of the interval's own centre
    # so p and the interval agree about 0: ten pairs 0.2 apart have a centre 2/12 and an interval just holding 0
    for first, second in (([0.7] * 10, [0.5] * 10), ([0.9] * 10, [0.5] * 10), ([1, 0.25, 0.75], [0.5, 0.5, 0.5])):
        t = paired_scores(first, second)
        assert (t["p_value"] < 0.05) == (t["difference_ci95"][0] > 0 or t["difference_ci95"][1] < 0), t
    # arms that score alike on every game still have a variance (the pseudo-pairs'), never a point
    alike = paired_scores([0.5] * 10, [0.5] * 10)
    assert alike["variance"] == pytest.approx(1 / 144) and alike["p_value"] == 1.0
    with pytest.raises(ValueError, match="one length"):
        paired_scores([0.5], [0.5, 0.5])
    for bad in ([2.0], [-0.5], [float("nan")]):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            paired_scores(bad, [0.0])


def test_win_loss_scores_pool_as_the_win_loss_tests_do():
    """Scores of 0 and 1 are win/loss outcomes: their smoothed variance is Agresti-Min's, so each run,
    the heterogeneity and the method-level interval are pool_runs' on the same games."""
    from aria.statistics import paired_difference_interval, pool_runs, pool_score_runs

    rng = np.random.default_rng(3)
    runs = [(rng.random(n) < p, rng.random(n) < q) for n, p, q in ((120, 0.5, 0.4), (90, 0.45, 0.45), (150, 0.3, 0.4))]
    scores = pool_score_runs([(a.astype(float), b.astype(float)) for a, b in runs])
    tests = [mcnemar(list(a), list(b)) for a, b in runs]
    wins = pool_runs(tests)
    assert [r["variance"] for r in scores["per_run"]] == pytest.approx([r["variance"] for r in wins["per_run"]])
    for run, test in zip(scores["per_run"], tests):
        assert run["difference_ci95"] == pytest.approx(paired_difference_interval(test["first_only"], test["second_only"],
                                                                                  test["pairs"]))
    assert scores["heterogeneity"] == pytest.approx(wins["heterogeneity"])
    for key in ("difference", "ci95", "p_value", "ci95_normal"):
        assert scores["random_effects"][key] == pytest.approx(wins["random_effects"][key])
    assert scores["pairs_pooled"]["difference"] == pytest.approx(wins["pairs_pooled"]["difference"])
    assert scores["pairs_pooled"]["ci95"] == pytest.approx(wins["pairs_pooled"]["ci95"])
    at_90 = pool_score_runs([(a.astype(float), b.astype(float)) for a, b in runs], alpha=0.1)
    assert at_90["pairs_pooled"]["ci95"] == pytest.approx(pool_runs(tests, alpha=0.1)["pairs_pooled"]["ci95"])
    assert at_90["pairs_pooled"]["ci95"][1] < scores["pairs_pooled"]["ci95"][1]  # the level reaches every interval
    assert pool_score_runs(runs[:1])["random_effects"] is None


def test_one_run_has_no_method_level_interval_and_equal_runs_no_point_interval():
    from aria.statistics import pool_runs

    one = pool_runs(_runs((30, 10, 100)))
    assert one["random_effects"] is None and "between-run variance" in one["why_not"]
    assert one["pairs_pooled"]["difference"] == pytest.approx(0.2)
    same = pool_runs(_runs((5, 3, 100), (5, 3, 100)))["random_effects"]
    assert same["ci95"][1] - same["ci95"][0] > 0.1  # not a point: the normal standard error, times t(1)
    with pytest.raises(ValueError, match="at least one run"):
        pool_runs([])


def test_the_twenty_questions_collections_pooled_as_the_audit_found():
    """The three committed Twenty Questions comparisons of aria against no_aggregation (the powered
    run's seeds 0 and 1, the grouping run's seed 0), pooled: the figures issue 73's independent
    recomputation gave, from the committed outcomes."""
    import json
    from pathlib import Path

    from aria.statistics import pool_runs

    root = Path(__file__).resolve().parents[1] / "results" / "experiments"
    arms = json.loads((root / "powered" / "outcomes.json").read_text())["arms"]
    runs = []
    for seed in (0, 1):
        first = arms[f"aria, seed {seed}, iteration 1"]["outcomes"]
        second = arms[f"no_aggregation, seed {seed}, iteration 1"]["outcomes"]
        runs.append(mcnemar([first[k][0] for k in sorted(first)], [second[k][0] for k in sorted(first)]))
    grouping = json.loads((root / "grouping" / "results.json").read_text())
    order = {a["method"]: a["won"] for a in grouping["arms"] if a["iteration"] == 1}
    runs.append(mcnemar([w == "1" for w in order["aria"]], [w == "1" for w in order["no_aggregation"]]))
    assert [(r["first_only"], r["second_only"]) for r in runs] == [(104, 126), (128, 129), (96, 142)]
    out = pool_runs(runs)
    assert [round(100 * r["difference"], 1) for r in out["per_run"]] == [-3.7, -0.2, -7.7]
    pairs = out["pairs_pooled"]
    assert [round(100 * x, 1) for x in (pairs["difference"], *pairs["ci95"])] == [-3.8, -6.8, -0.9]
    assert round(pairs["p_value"], 3) == 0.012
    re = out["random_effects"]
    assert [round(100 * x, 1) for x in (re["difference"], *re["ci95_normal"])] == [-3.9, -8.1, 0.3]
    assert round(re["p_value_normal"], 2) == 0.07 and round(out["heterogeneity"]["i2"], 2) == 0.52
    assert re["ci95"][0] < -0.13 and re["ci95"][1] > 0.05  # at 3 runs the t interval is what the method can claim
    # the spread the presets plan with (report.between_run_sd) is this one
    from aria.resources import compose_config

    assert compose_config("experiment", [])["report"]["between_run_sd"] == round(out["heterogeneity"]["tau2"] ** 0.5, 3)


def _simulate(runs, pairs, d, delta, tau2, reps, rng):
    """Designs of ``runs`` training runs, each with its own true difference delta + N(0, tau2) and
    ``pairs`` paired games (a pair discordant with probability d), scored by pool_runs."""
    from aria.statistics import pool_runs

    found = {"hksj": 0, "normal": 0, "pairs": 0, "covered_hksj": 0, "covered_normal": 0}
    for _ in range(reps):
        table = []
        for _ in range(runs):
            true = float(np.clip(delta + rng.normal(0, np.sqrt(tau2)), -d, d))
            b, c, _ = rng.multinomial(pairs, [(d + true) / 2, (d - true) / 2, 1 - d])
            table.append((int(b), int(c), pairs))
        out = pool_runs(_runs(*table))
        re = out["random_effects"]
        found["hksj"] += re["p_value"] < 0.05
        found["normal"] += re["p_value_normal"] < 0.05
        found["pairs"] += out["pairs_pooled"]["p_value"] < 0.05
        found["covered_hksj"] += re["ci95"][0] <= delta <= re["ci95"][1]
        found["covered_normal"] += re["ci95_normal"][0] <= delta <= re["ci95_normal"][1]
    return {k: v / reps for k, v in found.items()}


def test_the_designs_power_agrees_with_a_simulation_of_runs_that_differ():
    """At Twenty Questions' measured between-run variance (tau² = 0.0007, about 2.7 points) the
    design's power is the simulated rejection rate of the method-level test; with no true
    difference that test keeps its 5% while pooling pairs as one run rejects about three times as
    often and the normal (DerSimonian-Laird) interval covers about 90%."""
    from aria.power import runs_power

    rng = np.random.default_rng(7)
    reps = 1000  # Monte Carlo standard error of a rate near 0.5: 0.016
    for runs, delta in ((3, 0.05), (6, 0.05)):
        found = _simulate(runs, 600, 0.4, delta, 0.0007, reps, rng)
        assert abs(found["hksj"] - runs_power(runs, 600, 0.4, delta, 0.0007)) < 0.05, (runs, found)
    null = _simulate(4, 600, 0.4, 0.0, 0.0007, reps, rng)
    assert runs_power(4, 600, 0.4, 0.0, 0.0007) == pytest.approx(0.05)
    assert null["hksj"] < 0.075 and null["covered_hksj"] > 0.925
    assert null["pairs"] > 0.10 and null["covered_normal"] < 0.93


def test_the_detectable_difference_over_runs_is_where_the_power_reaches_80_percent():
    from aria.power import runs_power

    found = runs_detectable_difference(6, 600, 0.355, 0.0007)
    assert runs_power(6, 600, 0.355, found, 0.0007) >= 0.8 > runs_power(6, 600, 0.355, found - 2e-4, 0.0007)
    assert runs_detectable_difference(8, 600, 0.355, 0.0007) < found < runs_detectable_difference(6, 600, 0.355, 0.002)


def test_runs_needed_grows_with_the_between_run_variance():
    from aria.power import runs_needed, runs_power

    assert runs_power(1, 600, 0.4, 0.05, 0.0) == 0.0
    fixed = runs_needed(600, 0.4, 0.05, 0.0)
    spread = runs_needed(600, 0.4, 0.05, 0.0007)
    assert fixed < spread and runs_power(spread, 600, 0.4, 0.05, 0.0007) >= 0.8
    assert runs_power(spread - 1, 600, 0.4, 0.05, 0.0007) < 0.8
    assert runs_needed(600, 0.4, 0.0, 0.0007, limit=20) is None  # no difference is never detected with 80%
    for runs in (2, 3, 6, 20):  # a number, growing with the difference (scipy's noncentral t gives NaN in a tail)
        found = [runs_power(runs, 600, 0.355, x, 0.0007) for x in np.linspace(0, 0.355, 200)]
        assert all(np.isfinite(found)) and all(b >= a - 1e-12 for a, b in zip(found, found[1:])), runs
    with pytest.raises(ValueError, match="between-run variance"):
        runs_power(3, 600, 0.4, 0.05, -1.0)


def test_the_replicated_presets_plan_is_what_the_power_calculation_gives():
    """config/experiment/replicated.yaml's plan (docs/experiments.md): 7 runs of 600 pairs detect 4.8 points at the
    measured spread and share, 5 points need 7 runs, 6 runs detect 5.4."""
    from aria.power import runs_needed
    from aria.resources import compose_config

    cfg = compose_config("experiment", ["experiment=replicated"])
    report, pairs = cfg["report"], cfg["eval"]["games"]
    tau2, share = report["between_run_sd"] ** 2, report["discordant_share"]
    assert len(cfg["seeds"]) == 7 == runs_needed(pairs, share, 0.05, tau2)
    assert round(100 * runs_detectable_difference(7, pairs, share, tau2), 1) == 4.8
    assert round(100 * runs_detectable_difference(6, pairs, share, tau2), 1) == 5.4
    assert report["verdict_on"] == "runs" and report["movement"]["kl_from"] == "lower_bound"
