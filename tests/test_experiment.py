"""The experiment runner (aria/experiment/runner.py) and its results (aria/experiment/report.py).

The statistics are checked against values worked out by hand; the runner is run end to end on a
tiny random model (engine local, a tiny sentence model for the intention space), once straight
through and once interrupted after every stage in turn, and both give the same table.
"""
from __future__ import annotations

import json
import math
import re
import socket
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from aria.experiment import runner as experiment
from aria.experiment.report import mcnemar, movement_rule, preflight_row_name, render_table, wilson_interval
from aria.experiment.settings import ExperimentSettings
from aria.games.family import family_of
from aria.games.two_player.glee import other
from aria.io import atomic_write_json
from aria.resources import compose_config, config_dir
from aria.settings import typed
from aria.statistics import paired_difference_interval
from aria.trajectories import read_trajectories


def settings(*overrides: str) -> ExperimentSettings:
    """The experiment's settings as the runner reads them, composed with ``overrides`` (types and
    ranges checked; the base model and the override lists not, as the runner's own check does)."""
    return typed(ExperimentSettings, compose_config("experiment", list(overrides)))

REPO = Path(__file__).resolve().parents[1]


# ---- statistics by hand ------------------------------------------------------------------------------
def test_wilson_interval_by_hand():
    # 7 wins in 20: p = 0.35, z² = 3.841459; denominator 1 + z²/n = 1.192073;
    # centre (0.35 + 0.096036)/1.192073 = 0.374170; half-width
    # 1.959964·sqrt(0.35·0.65/20 + 3.841459/1600)/1.192073 = 1.959964·0.117372/1.192073 = 0.192977
    low, high = wilson_interval(7, 20)
    assert low == pytest.approx(0.374170 - 0.192977, abs=2e-6)
    assert high == pytest.approx(0.374170 + 0.192977, abs=2e-6)
    # 0 of 10: the interval starts at 0 and ends at z²/(n + z²) = 3.841459/13.841459 = 0.277533
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.277533, abs=1e-6))
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0) and wilson_interval(10, 10)[0] == pytest.approx(1 - 0.277533, abs=1e-6)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
    for bad in ((True, 2), (0.5, 2), (1, 2.5)):  # counts, not flags or shares
        with pytest.raises(ValueError, match="must be a whole number"):
            wilson_interval(*bad)
    assert wilson_interval(np.int64(3), np.int64(10)) == wilson_interval(3, 10)


def test_exact_mcnemar_by_hand():
    # 20 pairs: 8 won by the first only, 2 by the second only, 5 by both, 5 by neither.
    first = [True] * 8 + [False] * 2 + [True] * 5 + [False] * 5
    second = [False] * 8 + [True] * 2 + [True] * 5 + [False] * 5
    t = mcnemar(first, second)
    assert (t["first_only"], t["second_only"], t["both"], t["pairs"]) == (8, 2, 5, 20)
    # two-sided binomial test of 8 of 10 at 1/2: 2·P(X ≤ 2) = 2·(1 + 10 + 45)/1024 = 0.109375
    assert t["p_value"] == pytest.approx(0.109375)
    # difference (8 − 2)/20 = 0.3; Agresti-Min: 1/2 added to each cell, so 22 pairs, centre 6/22 = 0.272727,
    # se = sqrt((8.5 + 2.5) − 6²/22)/22 = sqrt(9.363636)/22 = 0.139091
    assert t["difference"] == pytest.approx(0.3)
    assert t["difference_ci95"] == pytest.approx([0.272727 - 1.959964 * 0.139091, 0.272727 + 1.959964 * 0.139091], abs=1e-5)
    assert t["odds_ratio"] == pytest.approx(4.0)
    # no discordant pair: nothing to test
    same = mcnemar([True, False], [True, False])
    assert same["p_value"] == 1.0 and same["odds_ratio"] is None


def test_paired_interval_never_collapses_or_leaves_the_range():
    # 10 pairs, none discordant: centre 0, se = sqrt(1 − 0)/12, so ±1.959964/12 (Wald: width 0)
    assert paired_difference_interval(0, 0, 10) == pytest.approx([-1.959964 / 12, 1.959964 / 12], abs=1e-6)
    # all 10 discordant one way: centre 10/12, se = sqrt(11 − 100/12)/12 = 0.136083; the top clipped to 1
    assert paired_difference_interval(10, 0, 10) == pytest.approx([10 / 12 - 1.959964 * 0.136083, 1.0], abs=1e-5)
    assert paired_difference_interval(0, 10, 10)[0] == -1.0
    assert paired_difference_interval(0, 0, 0) == [-1.0, 1.0]
    # 9 of 10 one way (Wald: 0.714 to 1.086): inside [−1, 1]
    low, high = mcnemar([True] * 9 + [False], [False] * 10)["difference_ci95"]
    assert -1.0 <= low < 0.9 < high <= 1.0


def test_paired_interval_covers_the_true_difference_at_95_percent():
    # Simulated paired arms, true difference 0.1 − 0.2 = −0.1, at a size where Wald under-covers
    # (few discordant pairs): the interval must hold the truth in about 95% of 4,000 draws.
    rng = np.random.default_rng(0)
    n, covered = 40, 0
    cells = rng.multinomial(n, [0.1, 0.2, 0.3, 0.4], size=4000)   # first only, second only, both, neither
    for b, c, _, _ in cells:
        low, high = paired_difference_interval(int(b), int(c), n)
        covered += low <= -0.1 <= high
    assert 0.93 <= covered / 4000 <= 0.975


def test_the_paired_test_says_what_its_runs_detect_at_their_own_spread():
    """Three seeds of 100 pairs, (b, c) = (30, 18), (28, 20), (27, 19): the runs' detectable difference
    is aria.power's at their own τ² and the pooled discordant share (142 of 300), and the table says it."""
    from aria.experiment.report import paired_tests, runs_lines
    from aria.power import runs_detectable_difference
    from aria.statistics import pool_runs

    cfg = settings("seeds=[0,1,2]", "methods=[aria,no_aggregation]", "iterations=1", "report.verdict_on=runs")
    evaluations = {}
    for seed, (b, c) in enumerate(((30, 18), (28, 20), (27, 19))):
        first = [True] * b + [False] * c + [True] * 20 + [False] * (80 - b - c)
        second = [False] * b + [True] * c + [True] * 20 + [False] * (80 - b - c)
        for method, won in (("aria", first), ("no_aggregation", second)):
            evaluations[(method, seed, 1)] = {f"g{i:03d}": {"success": w, "score": float(w), "deal": None, "turns": 5}
                                              for i, w in enumerate(won)}
    test, = paired_tests(cfg, evaluations, [])
    tau2 = pool_runs(test["runs"]["per_seed"])["heterogeneity"]["tau2"]
    assert test["discordant_share"] == pytest.approx(142 / 300)
    assert test["runs"]["detectable_difference"] == runs_detectable_difference(3, 100, 142 / 300, tau2) is not None
    lines = runs_lines({**test, "power": 0.8})
    assert f"3 runs of 100 pairs detect {100 * test['runs']['detectable_difference']:.1f} points with 80% power" in "\n".join(lines)
    assert "payoff_share" not in test  # a question game: the score is the success itself


def test_the_table_shows_the_arithmetic_and_says_whether_it_is_significant():
    results = {
        "name": "t", "game": "twenty_questions_subset", "eval_games": 20, "eval_seed": 7,
        "pooled": [{"method": "warm start", "iteration": 0, "seeds": 1, "games": 20, "wins": 7, "success": 0.35,
                    "ci95": list(wilson_interval(7, 20)), "mean_turns": 6.5}],
        "arms": [], "gradient_variance": {}, "intention_recovery": None,
        "paired_tests": [{"first": "aria", "second": "no_aggregation", "iteration": 1, "seeds": [0],
                          **mcnemar([True] * 8 + [False] * 12, [False] * 8 + [False] * 12)}],
    }
    table = render_table(results)
    assert "| warm start | 0 | 1 | 35.0 | 18.1–56.7 | 7 / 20 | 6.50 |" in table
    # 8 discordant pairs all one way: p = 2/256 = 0.0078125
    assert "p = 0.00781: **significant** at the 5% level" in table
    # 8 against 2: p = 0.109375 (above)
    results["paired_tests"][0].update(mcnemar([True] * 8 + [False] * 12, [False] * 8 + [True] * 2 + [False] * 10))
    assert "**not significant**" in render_table(results)


def test_the_verdict_reads_the_rule_fixed_before_the_run():
    """Two seeds whose pairs pooled as one run are significant (34 against 8) while the runs disagree:
    under verdict_on=pairs the verdict is the McNemar test's, under runs the method-level
    (Hartung-Knapp, 1 df) interval's, which spans 0; one run gives no method-level verdict."""
    from aria.experiment.report import runs_lines, verdict
    from aria.statistics import pool_runs

    seeds = [mcnemar([True] * 30 + [False] * 70, [False] * 100), mcnemar([True] * 4 + [False] * 96, [False] * 4 + [True] * 8 + [False] * 88)]
    pooled = mcnemar([True] * 30 + [False] * 70 + [True] * 4 + [False] * 96,
                     [False] * 100 + [False] * 4 + [True] * 8 + [False] * 88)
    assert (pooled["first_only"], pooled["second_only"]) == (34, 8) and pooled["p_value"] < 0.001
    test = {**pooled, "runs": {**pool_runs(seeds), "per_seed": [{"seed": i, **s} for i, s in enumerate(seeds)]}}
    assert verdict({**test, "verdict_on": "pairs"}, []) == "significant"
    method = test["runs"]["random_effects"]
    assert method["ci95"][0] < 0 < method["ci95"][1] and verdict({**test, "verdict_on": "runs"}, []) == "not significant"
    assert verdict({**test, "verdict_on": "runs"}, ["aria seed 1"]) == "uninformative: the policy did not move"
    one = {**seeds[0], "runs": {**pool_runs(seeds[:1]), "per_seed": [{"seed": 0, **seeds[0]}]}, "verdict_on": "runs"}
    assert verdict(one, []) == "no verdict on the method: one training run an arm"
    lines = runs_lines({**test, "verdict_on": "runs", "verdict": "not significant"})
    assert lines[0].startswith("**Over training runs**") and "seed 0 +30.0 (" in lines[0] and "seed 1 -4.0 (" in lines[0]
    assert f"Runs as a random effect: +{100 * method['difference']:.1f} points" in lines[1] and "t with 1 df" in lines[1]
    assert lines[2] == "Verdict (report.verdict_on = runs, fixed before the run): **not significant**."


def test_the_summary_gives_each_arm_its_gain_over_its_start_and_where_and_how_long_it_ran():
    from aria.experiment.report import render_stage_times, render_summary

    test = mcnemar([True] * 9 + [False] * 11, [True] * 5 + [False] * 15)  # 4 won by the arm alone: +20 points
    results = {
        "name": "t", "game": "twenty_questions_subset", "eval_games": 20,
        "pooled": [{"method": "warm start", "iteration": 0, "seeds": 1, "games": 20, "wins": 5, "ci95": list(wilson_interval(5, 20))}],
        "arms": [{"method": "aria", "seed": 0, "iteration": 1, "games": 20, "wins": 9, "ci95": list(wilson_interval(9, 20)),
                  "against_parent": {**test, "detectable_difference": 0.3},
                  "movement": {"token_kl": 0.0412, "moved": True}},
                 {"method": "no_aggregation", "seed": 0, "iteration": 1, "games": 20, "wins": 5,
                  "ci95": list(wilson_interval(5, 20)), "against_parent": {**mcnemar([True] * 5 + [False] * 15,
                                                                                      [True] * 5 + [False] * 15),
                                                                             "detectable_difference": None},
                  "movement": {"token_kl": 0.002, "moved": False}}],
        "paired_tests": [{"first": "aria", "second": "no_aggregation", "iteration": 1, "pairs": 20,
                          **mcnemar([True] * 9 + [False] * 11, [True] * 5 + [False] * 15), "verdict": "uninformative: the policy did not move"}],
        "run": {"cpu": "AMD EPYC, 2 cores (AVX2 only)", "wall_seconds": 601.4, "resumed": False,
                "stage_seconds": {"warm start": 40.0, "iteration 0: evaluate": 61.5}},
    }
    summary = render_summary(results)
    assert summary.startswith("`t` on twenty_questions_subset, 20 evaluation games an arm on the same targets; "
                              "AMD EPYC, 2 cores (AVX2 only), 10 min 01 s wall:")
    assert "| warm start | 5 / 20 (11.2–46.9%) | – | – | – | – |" in summary
    assert f"| aria | 9 / 20 (25.8–65.8%) | +20.0 ({100 * test['difference_ci95'][0]:+.1f} to " \
           f"{100 * test['difference_ci95'][1]:+.1f}) | 30.0 points | 0.041 | yes |" in summary
    assert "| no_aggregation | 5 / 20 (11.2–46.9%) | +0.0 " in summary and "| no gain at 80% power | 0.002 | **no** |" in summary
    assert "aria against no_aggregation, paired on 20 targets: +20.0 points" in summary
    assert summary.rstrip().endswith("uninformative: the policy did not move.")
    results["run"]["resumed"] = True  # a run before invocations.json: its wall time is its last command's
    assert "10 min 01 s wall (the last of several runs):" in render_summary(results)
    stages = render_stage_times(results)
    assert "| warm start | 0 min 40 s |" in stages and "| iteration 0: evaluate | 1 min 02 s |" in stages
    assert "| all stages | 1 min 42 s |" in stages and "| the command, start to end (the last of several runs) | 10 min 01 s |" in stages
    results["run"]["invocations"] = 3  # since then: every command's time, summed
    assert "10 min 01 s wall over 3 commands:" in render_summary(results)
    assert "| the 3 commands that ran it, each start to end, summed | 10 min 01 s |" in render_stage_times(results)
    results["run"].update(timed_to_last_beat=1, not_timed=2)  # killed (or still running): a lower bound, said
    assert ("10 min 01 s wall over 3 commands (a lower bound: of the commands with no recorded end, killed or still "
            "running, 1 timed to its last minute, 2 not timed):") in render_summary(results)
    assert "| the 3 commands that ran it, each start to end, summed (a lower bound: " in render_stage_times(results)
    results["run"].update(invocations=1, resumed=False, timed_to_last_beat=1, not_timed=0)  # one command, no end yet
    assert "| the command, start to end (a lower bound: of the commands with no recorded end, killed or still running, " \
           "1 timed to its last minute) | 10 min 01 s |" in render_stage_times(results)


def test_the_movement_verdict_by_hand(tmp_path):
    """An arm moved when its token KL and its share of weights changed at the served precision
    both reach report.movement's thresholds; a paired test between arms of which one did not move
    reads "uninformative", never a verdict on the methods."""
    from aria.experiment.layout import Layout, model_version
    from aria.experiment.report import moved_from_parent

    cfg = settings(f"run_dir={tmp_path}", "report.movement.min_token_kl=0.01", "report.movement.kl_from=estimate",
                   "report.movement.min_weight_share=0.001", "report.movement.min_kept_share=0.0")
    lay = Layout(cfg)
    warm, arm = lay.model("", 0, 0), lay.model("aria", 0, 1)
    for model in (warm, arm):  # the training markers: the arm trained from the warm start, as the runner records it
        model.parent.mkdir(parents=True, exist_ok=True)
        (model.parent / "trained_on.json").write_text(json.dumps(
            {"method": "bc"} if model == warm else {"method": "aria", "start_model": "warm/model", "start_model_version": model_version(warm)}))
    key = {"parent": "warm/model", "parent_version": model_version(warm), "child_version": model_version(arm),
           "steps": cfg.report.movement.steps}
    parent = {f"g{i}": {"success": i < 3, "turns": 5} for i in range(10)}   # won 3
    child = {f"g{i}": {"success": i < 5, "turns": 5} for i in range(10)}    # won 5: +2 pairs, none lost
    evaluations = {("aria", 0, 0): parent, ("aria", 0, 1): child}

    def measured(kl: float, share: float, low: float | None = None, kept: float = 1.0) -> dict:
        lay.movement("aria", 0, 1).parent.mkdir(parents=True, exist_ok=True)
        weights = {"dtype": "bfloat16", "share": share, "changed": round(1000 * kept), "changed_float32": 1000}
        atomic_write_json(lay.movement("aria", 0, 1), {"key": key, "steps": 8, "token_kl": kl, "logprob_change_won": 0.2,
                                                       "logprob_change_lost": -0.1, "weights": weights,
                                                       **({} if low is None else {"token_kl_ci95": [low, 2 * kl - low]})})
        return moved_from_parent(cfg, lay, evaluations, "aria", 0, 1)

    # b = 2 pairs only the child won, c = 0: difference 2/10; Agresti-Min centre 2/12, se = sqrt(3 − 4/12)/12,
    # exact McNemar p = 2 · (1/2)² = 0.5; no movement measured yet
    half_width = 1.959963984540054 * math.sqrt(3 - 4 / 12) / 12
    assert moved_from_parent(cfg, lay, evaluations, "aria", 0, 1) == {
        "against_parent": {"pairs": 10, "difference": 0.2, "difference_ci95": pytest.approx([2 / 12 - half_width, 2 / 12 + half_width]),
                           "p_value": 0.5, "discordant_share": 0.2, "detectable_difference": None, "power": 0.8}}
    # 2 discordant pairs of 10: no difference reaches 80% power with 10 pairs at that share
    assert measured(0.01, 0.001)["movement"]["moved"] is True       # both at their threshold
    assert measured(0.0099, 0.5)["movement"]["moved"] is False      # the behaviour barely changed
    assert measured(0.5, 0.0009)["movement"]["moved"] is False      # the served weights are the parent's
    assert "key" not in measured(0.5, 0.5)["movement"]
    # the rule of new presets: the KL's lower end, and the update kept at the served precision
    cfg.report.movement.kl_from, cfg.report.movement.min_kept_share = "lower_bound", 0.5
    assert measured(0.03, 0.5, low=0.012)["movement"]["moved"] is True
    assert measured(0.03, 0.5, low=0.004)["movement"]["moved"] is False   # a mean above 0.01, an interval not
    assert measured(0.03, 0.5, low=0.012, kept=0.125)["movement"]["moved"] is False  # bfloat16 rounded the update away
    assert measured(0.03, 0.5)["movement"]["moved"] is None               # measured before the KL had an interval
    cfg.report.movement.kl_from, cfg.report.movement.min_kept_share = "estimate", 0.0

    results = {"name": "t", "game": "twenty_questions_subset", "eval_games": 10, "eval_seed": 7,
               "movement_rule": movement_rule(cfg), "gradient_variance": {}, "intention_recovery": None,
               "pooled": [], "arms": [{"method": "aria", "seed": 0, "iteration": 1, "games": 10, "wins": 5, "success": 0.5,
                                       "ci95": list(wilson_interval(5, 10)), "mean_turns": 5.0,
                                       **measured(0.0099, 0.5)}],
               "paired_tests": [{"first": "aria", "second": "no_aggregation", "iteration": 1, "seeds": [0],
                                 **mcnemar([True] * 5 + [False] * 5, [False] * 10), "not_moved": ["aria seed 0"]}]}
    table = render_table(results)
    assert "| aria | 0 | 1 | 0.0099 | +0.200 / -0.100 | 50.00% at bfloat16 (100% of float32's) | +20.0 (-10.0 to +43.3) | – | **no** |" in table
    assert "**Uninformative: the policy did not move** (by the movement rule above: aria seed 0)" in table
    assert "An arm moved when its KL is at least 0.01 and at least 0.1% of its weights changed at the served precision " \
           "(report.movement" in table
    results["movement_rule"] = {**movement_rule(cfg), "kl_from": "lower_bound", "min_kept_share": 0.5}
    results["arms"][0].update(measured(0.03, 0.5, low=0.012))
    table = render_table(results)
    assert "| aria | 0 | 1 | 0.03 (0.012–0.048) |" in table
    assert "An arm moved when the lower end of its KL's 95% interval (over games) is at least 0.01, at least 0.1% of its " \
           "weights changed at the served precision, and at least 50.0% of the elements its update changed in float32 " \
           "still differ there" in table
    # served in bfloat16 the weights half can fail; at float32 it cannot, and the table says so
    assert "cannot fail here in practice" not in table
    results["arms"][0]["movement"]["weights"]["dtype"] = "float32"
    assert "the weights half of the rule cannot fail here in practice, and the KL decides" in render_table(results)


# ---- the runner, end to end on tiny models -------------------------------------------------------------
def tiny_overrides(root, tiny_model_dir, tiny_sentence_model_dir) -> list[str]:
    return [
            "name=tiny", f"run_dir={root / 'run'}", f"results_dir={root / 'results'}", f"base_model={tiny_model_dir}",
            "engine=local", "methods=[aria,no_aggregation]", "seeds=[0]", "iterations=2",
            # 5 questions a game, not 20: a random tiny model never wins, so every game runs to the limit,
            # and the games are most of these runs' time
            "game.max_turns=5",
            "warm_start.games=6", "warm_start.epsilon=0.3",
            # float32 as every training test (accelerate's state is one per process)
            "warm_start.train_overrides=['train.mixed_precision=no','train.epochs=1','train.micro_batch_size=4',"
            "'train.gradient_accumulation_steps=1',"
            "'train.lr=1.0e-3','train.save_freq=2']",
            "collect.games=4", "collect.max_tokens=12", "collect.batch_size=4",
            "eval.games=4", "eval.max_tokens=12", "eval.batch_size=4",
            f"intention_overrides=['embedder.model={tiny_sentence_model_dir}','clustering.k_max=6']",
            "train_overrides=['train.mixed_precision=no','train.epochs=1','train.micro_batch_size=4',"
            "'train.gradient_accumulation_steps=1',"
            "'train.save_freq=2']",
            "grad_variance.enabled=true", "grad_variance.max_samples=4",
        ]


@pytest.fixture(scope="module")
def tiny_experiment(tmp_path_factory, tiny_model_dir, tiny_sentence_model_dir):
    def make(root) -> dict:
        return compose_config("experiment", tiny_overrides(root, tiny_model_dir, tiny_sentence_model_dir))
    return make


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, tiny_experiment):
    """The tiny experiment run straight through: its folder, its results folder and its lines."""
    root = tmp_path_factory.mktemp("straight")
    lines: list[str] = []
    out = experiment.run(tiny_experiment(root), lines.append)
    return root, out, lines


class Interrupted(Exception):
    pass


def test_the_runner_resumes_at_every_stage_to_the_same_table(tmp_path, tiny_experiment, straight_run, monkeypatch):
    straight_root, out, lines = straight_run
    table = (out / "table.md").read_text()
    results = json.loads((out / "results.json").read_text())
    # every arm was evaluated, the warm start included, and the paired test ran at both iterations
    assert [(r["method"], r["iteration"]) for r in results["pooled"]] == \
        [("warm start", 0), ("aria", 1), ("aria", 2), ("no_aggregation", 1), ("no_aggregation", 2)]
    assert [t["iteration"] for t in results["paired_tests"]] == [1, 2]
    assert all(r["games"] == 4 for r in results["pooled"])
    # every game's outcome is in the file, in one order, so the paired tests can be redone from it alone
    assert len(results["outcome_keys"]) == 4 and all(len(r["won"]) == 4 and r["won"].count("1") == r["wins"]
                                                     for r in results["arms"])
    arm = {(r["method"], r["seed"], r["iteration"]): [c == "1" for c in r["won"]] for r in results["arms"]}
    for t in results["paired_tests"]:
        redone = mcnemar(arm[(t["first"], 0, t["iteration"])], arm[(t["second"], 0, t["iteration"])])
        assert all(t[k] == v for k, v in redone.items()), (t, redone)
        # one seed is one training run an arm: its pairs, and no interval for the method
        assert t["runs"]["runs"] == 1 and t["runs"]["random_effects"] is None and t["verdict_on"] == "runs"
        assert [(r["seed"], r["first_only"], r["second_only"]) for r in t["runs"]["per_seed"]] == \
            [(0, t["first_only"], t["second_only"])]
        assert t["verdict"] in ("uninformative: the policy did not move", "no verdict on the method: one training run an arm")
    assert results["intention_recovery"]["steps"] > 0 and len(results["intention_recovery"]["ari"]) >= 1
    assert set(results["gradient_variance"]["0"]["methods"]) == {"aria", "no_aggregation"}
    assert (out / "success_vs_iteration.png").stat().st_size > 0
    stage_lines = [line for line in lines if line.startswith("[experiment] (")]
    total = len(stage_lines)
    assert total == 3 + 1 + 2 * 2 * 4 + 1 and all("ETA" in line for line in stage_lines)
    # every trained arm measured against its parent on the same held-out steps, with a verdict
    trained = [r for r in results["arms"] if r["iteration"] > 0]
    assert len(trained) == 4 and all(r["movement"]["steps"] == trained[0]["movement"]["steps"] > 0 for r in trained)
    dtype = experiment.served_dtype(typed(ExperimentSettings, tiny_experiment(straight_root)))
    assert all(r["movement"]["token_kl"] >= 0 and r["movement"]["weights"]["dtype"] == dtype
               and isinstance(r["movement"]["moved"], bool) and r["against_parent"]["pairs"] == 4 for r in trained)
    assert "**Did training move the policy?**" in table and table.count(f"% at {dtype} (") == 4
    # the KL's interval over games holds the mean (the rule reads its lower end)
    assert all(r["movement"]["token_kl_ci95"][0] <= r["movement"]["token_kl"] <= r["movement"]["token_kl_ci95"][1]
               for r in trained)
    assert results["movement_rule"] == {k: tiny_experiment(straight_root)["report"]["movement"][k]
                                        for k in ("min_token_kl", "kl_from", "min_weight_share", "min_kept_share")}
    # the pre-flight of every collection: the chosen k (10, 20 and 40 are above this run's k_max of 6)
    # and the game's behavioural intentions (twenty_questions_subset has an offline oracle)
    assert list(results["preflight"]) == ["seed 0, iteration 1 (shared)", "seed 0, aria, iteration 2",
                                          "seed 0, no_aggregation, iteration 2"]
    first = results["preflight"]["seed 0, iteration 1 (shared)"]
    assert [(r["chosen"], r.get("labels")) for r in first["rows"]] == [(True, None), (False, "behavioural")]
    assert all(0 <= r["shared"] <= 1 for r in first["rows"]) and "| behavioural intentions = " in table
    assert f"| {first['rows'][0]['k']['questions']} (chosen, trained on) |" in table
    # the clusters against the behavioural intentions, at the chosen k and at the k closest to them
    against = results["behaviour"]["seed 0, iteration 1 (shared)"]
    assert against["chosen_k"] == first["rows"][0]["k"]["questions"] and against["intentions"] > 0
    for found in (against["at_chosen_k"], against["at_closest_k"]):
        assert found["mse"] == pytest.approx(found["bias_squared"] + found["variance_within"])
    assert against["at_closest_k"]["mse"] <= against["at_chosen_k"]["mse"]
    assert "**The clusters against the behavioural intentions**" in table
    assert set(first["rows"][0]["shared_by_turn"]) <= {"0", "1", "2", "3", "4", "5+"} and first["steps"] > 0
    assert "**Pre-flight: can aggregation change anything?**" in table
    assert any(line.startswith("[experiment] pre-flight: steps that share their intention key") for line in lines)
    assert all(t["verdict"] in ("significant", "not significant", "uninformative: the policy did not move")
               for t in results["paired_tests"])
    # where and how long: every stage timed, the command's wall time from its process start
    run = results["run"]
    assert run["resumed"] is False and run["cpu"] and len(run["stage_seconds"]) == total
    assert run["wall_seconds"] >= sum(run["stage_seconds"].values()) - 1.0

    # Interrupted after stage 1, resumed and interrupted after stage 2, and so on: same table.
    cut = tiny_experiment(tmp_path / "cut")
    original_run = experiment.Stages.run
    for stop_after in range(1, total + 1):
        done: list[str] = []

        def run_then_stop(self, stage, stop_after=stop_after, done=done):
            result = original_run(self, stage)
            done.append(stage.name)
            if len(done) == stop_after:
                raise Interrupted(stage.name)
            return result
        monkeypatch.setattr(experiment.Stages, "run", run_then_stop)
        with pytest.raises(Interrupted):
            experiment.run(cut, lambda line: None)
    monkeypatch.setattr(experiment.Stages, "run", original_run)
    resumed = experiment.run(cut, lambda line: None)
    assert (resumed / "table.md").read_text().replace(str(tmp_path / "cut"), "") == table.replace(str(straight_root), "")
    assert json.loads((resumed / "results.json").read_text())["run"]["resumed"] is True


def test_a_copied_run_dir_resumes_and_its_tables_follow_the_settings(tmp_path, tiny_experiment, straight_run):
    """1. The finished run folder copied elsewhere: every stage is found done (before: the
    producers and training markers named absolute model paths, so the copy played its evaluations
    again and retrained). 2. ``eval.games`` lowered from 4 to 2: every row and the paired test
    count 2 games (before: the header said 2 and the rows 4). 3. A game setting changed
    (``game.max_turns``): the games are played again under it (before: every stage was skipped and
    the table reported games of the old length)."""
    import shutil

    straight_root, _, _ = straight_run
    shutil.copytree(straight_root / "run", tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))
    cfg = tiny_experiment(tmp_path)
    lines: list[str] = []
    out = experiment.run(cfg, lines.append)
    assert not [line for line in lines if "games done (" in line or line.startswith("[experiment] trained")], lines
    table = json.loads((out / "results.json").read_text())
    assert all(r["games"] == 4 for r in table["pooled"])

    fewer = {**cfg, "eval": {**cfg["eval"], "games": 2}}
    lines = []
    results = json.loads((experiment.run(fewer, lines.append) / "results.json").read_text())
    assert not [line for line in lines if "games done (" in line]
    assert all(r["games"] == 2 for r in results["pooled"] + results["arms"])
    assert all(t["pairs"] == 2 for t in results["paired_tests"]) and results["eval_games"] == 2

    shorter = {**fewer, "game": {**cfg["game"], "max_turns": 2}}
    lines = []
    results = json.loads((experiment.run(shorter, lines.append) / "results.json").read_text())
    assert any(line.startswith("[experiment] evaluation") and "games done (" in line for line in lines)
    assert all(r["games"] == 2 and r["mean_turns"] <= 2 for r in results["pooled"])

    # 4. The warm start's training changed: it trains again, and a line names the setting that changed
    # (before: its model and checkpoints were deleted without a word). Only the warm start's arm here.
    overrides = [*cfg["warm_start"]["train_overrides"], "train.lr=2.0e-3"]
    other = {**shorter, "methods": [], "warm_start": {**cfg["warm_start"], "train_overrides": overrides}}
    lines = []
    experiment.run(other, lines.append)
    said = [line for line in lines if "trained under other settings" in line]
    assert len(said) == 1 and said[0].startswith("[experiment] warm") and "train.lr=2.0e-3" in said[0], lines


def test_which_recorded_paths_name_a_model_of_the_run(tmp_path):
    """A base model given as a relative folder (models/chat) is no model of the run: the report
    refused such runs' own iteration-0 evaluation (found by a review), and a resume replayed it for nothing."""
    from types import SimpleNamespace

    from aria.experiment.layout import Layout

    lay = Layout(SimpleNamespace(run_dir=str(tmp_path / "run"), game={"name": "twenty_questions"}, variants={}))
    assert [lay.holds_model(p) for p in ("warm/model", "s0/aria/it1/model", "s12/aria_k20/it3/model", str(tmp_path / "run" / "warm" / "model"))] \
        == [True] * 4
    assert not any(lay.holds_model(p) for p in ("models/chat", "embedded", "/opt/models/SmolLM2", "s0/aria/model", "warm/model/x"))


def test_a_copy_replaces_only_an_earlier_copy_of_the_same_run(tmp_path):
    """scripts/copy_run.py's destination: a new folder, or an earlier copy of this run; the run
    itself, a folder inside it or holding it, another run (or the run a copy came from) and a
    folder of other files are refused in one line and left whole (before: each was replaced, a
    run folder shrank to its markers)."""
    import subprocess
    import sys

    from aria.experiment.layout import copy_without_weights

    def run_folder(path, name):
        (path / "s0" / "aria" / "it1" / "model").mkdir(parents=True)
        (path / "s0" / "aria" / "it1" / "model" / "model.safetensors").write_bytes(b"weights")
        (path / "experiment.json").write_text(json.dumps({"name": name}))
        return path

    run, other = run_folder(tmp_path / "run", "powered"), run_folder(tmp_path / "other", "small")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("mine")
    copy_without_weights(run, tmp_path / "copy")
    assert not (tmp_path / "copy" / "s0" / "aria" / "it1" / "model").exists()
    copy_without_weights(run, tmp_path / "copy")  # an earlier copy of the same run: replaced
    script = Path(__file__).resolve().parents[1] / "scripts" / "copy_run.py"
    for src, dest, message in [(run, run, "is .*run itself"), (run, run / "s0", "lies inside"),
                               (run / "s0" / "..", tmp_path, "holds"), (run, other, "not a previous copy of this run"),
                               (tmp_path / "copy", run, "not a previous copy of this run"),
                               (run, tmp_path / "notes", "not a previous copy of this run")]:
        done = subprocess.run([sys.executable, str(script), str(src), str(dest)], capture_output=True, text=True)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert re.search(message, done.stderr), (message, done.stderr)
    for folder in (run, other):
        assert (folder / "s0" / "aria" / "it1" / "model" / "model.safetensors").read_bytes() == b"weights"
    assert (tmp_path / "notes" / "mine.txt").read_text() == "mine" and not list(run.glob("**/*.tmp"))
    # a link to nowhere: before, the copy was staged whole in dangling.tmp, then could not be put there
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    done = subprocess.run([sys.executable, str(script), str(run), str(tmp_path / "dangling")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip() == (f"error: {tmp_path / 'dangling'} is a symbolic link to "
                                                            f"{tmp_path / 'nowhere'}, which does not exist: give a folder")
    assert not (tmp_path / "dangling.tmp").exists()
    # a link to an earlier copy: the copy goes where the link leads (the folder checked and held);
    # before, the link was moved aside to linked.old and a folder of its own put in its place
    (tmp_path / "linked").symlink_to(tmp_path / "copy")
    (run / "stage_times.json").write_text("{}")
    copy_without_weights(run, tmp_path / "linked")
    assert (tmp_path / "linked").is_symlink() and (tmp_path / "copy" / "stage_times.json").read_text() == "{}"
    assert not (tmp_path / "linked.old").exists() and not (tmp_path / "copy.old").exists()


def test_a_run_folder_copied_without_its_weights_reports_and_resumes_without_training_finished_arms(
        tmp_path, tiny_experiment, straight_run):
    """A long run carried to another machine as its games, labels, markers and evaluations only
    (scripts/copy_run.py): the last iteration's arms, evaluated and measured, are not trained again;
    a model something still reads is (iteration 1's, the next iteration's start; the warm start, the
    parent); an arm whose movement is gone trains again and measures it."""
    from aria.experiment.layout import COPY_MARK, copy_without_weights

    straight_root, out, _ = straight_run
    size = copy_without_weights(straight_root / "run", tmp_path / "run")
    copied = tmp_path / "run"
    assert 0 < size < 5 * 2**20 and (copied / "s0" / "aria" / "it2" / "trained_on.json").is_file()
    assert not [p for p in copied.rglob("*") if p.name in ("model", "train", "checkpoints", "embedding_cache") or p.suffix == ".log"]
    assert list((straight_root / "run").rglob("embedding_cache/*.npz"))  # the run had one; its copy resumes without
    lines: list[str] = []
    resumed = experiment.run(tiny_experiment(tmp_path), lines.append)
    assert not [line for line in lines if "games done (" in line], lines  # no game played again
    assert sorted(line.split(":")[0] for line in lines if "not trained again" in line) == \
        ["[experiment] s0/aria/it2", "[experiment] s0/no_aggregation/it2"]
    assert len([line for line in lines if line.startswith("[experiment] trained")]) == 3  # warm start, 2 x iteration 1
    assert (resumed / "table.md").read_text().replace(str(tmp_path), "") == \
        (out / "table.md").read_text().replace(str(straight_root), "")

    assert not (copied / COPY_MARK).exists()  # resumed, the copy is a run of its own: no copy may replace it now
    (copied / "s0" / "aria" / "it2" / "movement.json").unlink()
    lines = []
    experiment.run(tiny_experiment(tmp_path), lines.append)
    assert [line.split(" -> ")[1] for line in lines if line.startswith("[experiment] trained")] == \
        [str(copied / "s0" / "aria" / "it2" / "model")]
    assert (copied / "s0" / "aria" / "it2" / "movement.json").is_file()


def test_a_results_only_copy_leaves_out_a_critics_weights_and_a_resumable_copy_keeps_them(tmp_path):
    """ArCHer's final critic (184 MB at the replicated preset): a later iteration's critic starts
    from it, so the resumable copy keeps it; the report never reads it, so the committed copy does not."""
    from aria.experiment.layout import copy_without_weights

    final = tmp_path / "run" / "s0" / "archer" / "it1" / "critic" / "final"
    final.mkdir(parents=True)
    (tmp_path / "run" / "experiment.json").write_text("{}")
    (final / "critic.safetensors").write_bytes(b"weights")
    (final / "critic.json").write_text("{}")
    copy_without_weights(tmp_path / "run", tmp_path / "whole")
    copy_without_weights(tmp_path / "run", tmp_path / "light", results_only=True)
    kept = lambda root: sorted(p.name for p in (root / "s0" / "archer" / "it1" / "critic" / "final").iterdir())  # noqa: E731
    assert kept(tmp_path / "whole") == ["critic.json", "critic.safetensors"] and kept(tmp_path / "light") == ["critic.json"]


def test_a_results_only_copy_reports_the_same_tables(tmp_path, tiny_experiment, straight_run):
    """scripts/copy_run.py --results-only, the copy committed beside a finished run: no step data
    or training set, yet report_only on it writes the run's own results (pre-flight included)."""
    from aria.experiment.layout import STEP_DATA, copy_without_weights

    straight_root, out, _ = straight_run
    whole = copy_without_weights(straight_root / "run", tmp_path / "whole" / "run")
    light = copy_without_weights(straight_root / "run", tmp_path / "light" / "run", results_only=True)
    assert light < whole and not [p for p in (tmp_path / "light").rglob("*") if p.name in STEP_DATA]
    assert list((tmp_path / "light" / "run").rglob("preflight.json"))
    reported = experiment.run({**tiny_experiment(tmp_path / "light"), "report_only": True}, [].append)
    assert json.loads((reported / "results.json").read_text())["preflight"] == \
        json.loads((out / "results.json").read_text())["preflight"]
    assert (reported / "table.md").read_text().replace(str(tmp_path / "light"), "") == \
        (out / "table.md").read_text().replace(str(straight_root), "")


def test_a_variant_labels_the_shared_games_its_own_way_and_trains_its_method(tmp_path, tiny_experiment, straight_run):
    """An arm ``aria_k2`` (``variants``: method aria, ``selection.fixed_k=2``) added to a finished
    run: it labels the shared iteration-1 games at k = 2 from the shared step-1 outputs (linked,
    not computed again), trains aria on them, and has its own rows: evaluation, movement, pre-flight."""
    import shutil

    straight_root, _, _ = straight_run
    shutil.copytree(straight_root / "run", tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))
    cfg = tiny_experiment(tmp_path)
    cfg = {**cfg, "methods": [*cfg["methods"], "aria_k2"], "iterations_by_method": {"aria_k2": 1},
           "variants": {"aria_k2": {"method": "aria", "intention_overrides": ["selection.fixed_k=2"]}}}
    lines: list[str] = []
    out = experiment.run(cfg, lines.append)
    shared, own = tmp_path / "run" / "s0" / "it1-shared" / "intention", tmp_path / "run" / "s0" / "it1-shared" / "intention-aria_k2"
    assert (own / "labels.npz").stat().st_ino == (shared / "labels.npz").stat().st_ino  # step 1 reused
    assert json.loads((own / "selection.json").read_text())["chosen"]["k"] == {"questions": 2}
    assert json.loads((shared / "selection.json").read_text())["chosen"]["k"] != {"questions": 2}
    marker = json.loads((tmp_path / "run" / "s0" / "aria_k2" / "it1" / "trained_on.json").read_text())
    assert marker["method"] == "aria"
    import hashlib
    assert marker["train_json_sha256"] == hashlib.sha256((own / "train.json").read_bytes()).hexdigest()
    # only the new arm's stages did work
    assert [line for line in lines if line.startswith("[experiment] trained")] == [
        f"[experiment] trained aria from model -> {tmp_path / 'run' / 's0' / 'aria_k2' / 'it1' / 'model'}"]
    results = json.loads((out / "results.json").read_text())
    row, = [r for r in results["arms"] if r["method"] == "aria_k2" and r["iteration"] == 1]
    assert row["movement"]["steps"] > 0
    chosen, = [r for r in results["preflight"]["seed 0, aria_k2, iteration 1"]["rows"] if r["chosen"]]
    assert chosen["k"] == {"questions": 2}
    assert "| aria_k2 | 1 |" in (out / "table.md").read_text()


def test_report_only_tables_the_evaluated_arms_and_runs_nothing(tmp_path, tiny_experiment, straight_run):
    """A run of several sessions (or one going on in another process): its table so far, the
    arms not yet evaluated named, nothing in its folder touched."""
    import shutil

    from aria.io import ConfigError

    straight_root, _, _ = straight_run
    shutil.copytree(straight_root / "run", tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))
    unfinished = tmp_path / "run" / "s0" / "no_aggregation" / "it2" / "eval.jsonl"
    kept = unfinished.read_text().splitlines(keepends=True)
    unfinished.write_text("".join(kept[:-1]))  # one game short: an evaluation going on
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")}
    lines: list[str] = []
    out = experiment.run({**tiny_experiment(tmp_path), "report_only": True}, lines.append)
    assert lines == [f"[experiment] report only: {out / 'table.md'}; not evaluated yet: no_aggregation seed 0 iteration 2"]
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")} == before
    results = json.loads((out / "results.json").read_text())
    assert [(r["method"], r["iteration"]) for r in results["pooled"]] == \
        [("warm start", 0), ("aria", 1), ("aria", 2), ("no_aggregation", 1)]
    assert [t["iteration"] for t in results["paired_tests"]] == [1]
    with pytest.raises(ConfigError, match="holds no run"):
        experiment.run({**tiny_experiment(tmp_path / "none"), "report_only": True}, lines.append)
    assert not (tmp_path / "none").exists()  # before: an empty results_dir was left behind


def test_report_only_reports_the_run_under_the_settings_it_recorded(tmp_path, tiny_experiment, straight_run):
    """A preset that gained an arm, a seed and a pair since the run (and a run older than a
    setting): the report is the run's own (its arms, its tests), the differences named, and the
    setting the run never recorded said in the table rather than passed off as fixed before it."""
    import shutil

    straight_root, out, _ = straight_run
    shutil.copytree(straight_root / "run", tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))
    recorded = json.loads((tmp_path / "run" / "experiment.json").read_text())
    del recorded["report"]["verdict_on"]  # as a run from before the setting existed
    (tmp_path / "run" / "experiment.json").write_text(json.dumps(recorded))
    cfg = tiny_experiment(tmp_path)
    grown = {**cfg, "report_only": True, "methods": [*cfg["methods"], "filtered_bc"], "seeds": [0, 1],
             "report": {**cfg["report"], "more_pairs": [["filtered_bc", "aria"]]}}
    lines: list[str] = []
    reported = experiment.run(grown, lines.append)
    assert lines[:2] == [
        "[experiment] report only: the run's own settings (its experiment.json) are reported; "
        "this command's differ on methods, seeds, report.more_pairs",
        "[experiment] report only: settings added since the run (not in its experiment.json), this command's used: "
        "report.verdict_on"]
    assert lines[2].endswith("not evaluated yet: none")
    mine, theirs = (json.loads((d / "results.json").read_text()) for d in (reported, out))
    for key in ("arms", "pooled", "paired_tests", "preflight"):
        assert mine[key] == theirs[key], key
    assert mine["settings_not_recorded"] == ["report.verdict_on"] and "settings_not_recorded" not in theirs
    table = (reported / "table.md").read_text()
    assert "the run's record cannot show they were fixed before it: report.verdict_on." in table
    assert "Verdict (report.verdict_on = runs, not in the run's record)" in table and "fixed before the run)" in table  # the movement rule was recorded


@pytest.mark.parametrize("damage, said", [
    (lambda r: [1, 2], "expected the run's settings as a JSON object, got a list"),
    (lambda r: {**r, "report": "not a mapping"}, "report: expected a section of settings (a mapping), got 'not a mapping'"),
    (lambda r: {**r, "seeds": ["zero"]}, "seeds[0]: Value 'zero' of type 'str' could not be converted to Integer"),
    (lambda r: {**r, "report": {**r["report"], "paired": ["aria", "nobody"]}}, "report.paired: unknown ['nobody']"),
    # found by a review: a traceback (AttributeError), and a false replication (a seed counted twice)
    (lambda r: {**r, "game": "twenty_questions_subset"}, "game: expected a game's settings (a mapping, as config/game/ holds)"),
    (lambda r: {**r, "seeds": [0, 0]}, "seeds: each seed once, got [0, 0]"),
])
def test_report_only_names_the_record_a_damaged_run_folder_holds(tmp_path, tiny_experiment, straight_run, damage, said):
    """An experiment.json edited or damaged by hand: one error naming the file and the setting, no
    traceback, nothing written (the report reads the run's record, not the command's settings)."""
    import shutil

    from aria.io import ConfigError

    straight_root, _, _ = straight_run
    shutil.copytree(straight_root / "run", tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))
    record = tmp_path / "run" / "experiment.json"
    record.write_text(json.dumps(damage(json.loads(record.read_text()))))
    with pytest.raises(ConfigError) as raised:
        experiment.run({**tiny_experiment(tmp_path), "report_only": True}, lambda line: None)
    assert str(raised.value).startswith(str(record)) and said in str(raised.value)
    assert not (tmp_path / "results").exists()


MOVED, PREFLIGHT, SELECTION = "s0/aria/it1/movement.json", "s0/it1-shared/intention/preflight.json", "s0/it1-shared/intention/selection.json"
RECOVERY, GRADIENTS = "warm/intention/selection.json", "s0/it1-shared/grad_variance.json"


@pytest.mark.parametrize("file, damage, said", [
    (MOVED, lambda m: {**m, "token_kl": "big"}, "field 'token_kl': 'big' is not of type 'number'"),
    (MOVED, lambda m: {k: v for k, v in m.items() if k != "weights"}, "field 'weights': missing"),
    (MOVED, lambda m: {**m, "weights": {**m["weights"], "share": None}}, "field 'weights.share': None is not of type 'number'"),
    (MOVED, lambda m: {**m, "token_kl_ci95": [0.1]}, "field 'token_kl_ci95': [0.1] is too short"),
    (MOVED, lambda m: {**m, "logprob_change_won": None}, None),  # no step of a won game: null is a value
    (PREFLIGHT, lambda p: {**p, "rows": [{**p["rows"][0], "shared": "most"}]}, "field 'rows[0].shared': 'most' is not of type 'number'"),
    (SELECTION, lambda s: {**s, "chosen": []}, "field 'chosen': [] is not of type 'object'"),
    (SELECTION, lambda s: {**s, "behaviour": {**(s.get("behaviour") or {}), "step_intentions": 3, **{
        c: [0.5] for c in ("ari", "nmi", "mse", "bias_squared", "variance_within")}}}, "field 'behaviour.ari': 1 values for the "),
    # found by a review: each a traceback in the report or its template, or a wrong "best k"
    (SELECTION, lambda s: {**s, "chosen": {**s["chosen"], "k": {"questions": 999}}}, "field 'chosen.k.questions': 999 is not among the ks"),
    (SELECTION, lambda s: {**s, "behaviour": {**(s.get("behaviour") or {}), "step_intentions": 3, **{
        c: [None if c == "mse" and i == 0 else 0.5 for i in range(len(s["ks"]))]
        for c in ("ari", "nmi", "mse", "bias_squared", "variance_within")}}}, "field 'behaviour.mse[0]': None is not of type 'number'"),
    (RECOVERY, lambda s: {**s, "intention_recovery": {"ari": [0.1]}}, "field 'intention_recovery.steps': missing"),
    (RECOVERY, lambda s: {**s, "intention_recovery": {**s["intention_recovery"], "ari": [0.1]}},
     "field 'intention_recovery.ari': 1 values for the "),
    (GRADIENTS, lambda g: {"samples": 10}, "field 'games': missing"),
    (GRADIENTS, lambda g: {k: v for k, v in g.items() if k != "trace_cov_method_aria"}, "field 'trace_cov_method_aria': missing"),
    (MOVED, lambda m: {**m, "weights": {**m["weights"], "share": 5.0}}, "field 'weights.share': 5.0 is greater than the maximum of 1"),
    (MOVED, lambda m: {**m, "token_kl_ci95": [0.5, 0.1]}, "field 'token_kl_ci95': [0.5, 0.1]: the lower end above the upper"),
])
def test_report_only_names_a_damaged_file_of_the_run(tmp_path, tiny_experiment, straight_run, file, damage, said):
    """A run's movement, pre-flight or selection file edited or cut by hand: one error naming the
    file and the field, where the verdict and the template raised a TypeError or an IndexError; a
    null log-prob change (no won game among the steps) still reports."""
    import shutil

    from aria.io import DataError

    straight_root, _, _ = straight_run
    shutil.copytree(straight_root / "run", tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))
    damaged = tmp_path / "run" / file
    damaged.write_text(json.dumps(damage(json.loads(damaged.read_text()))))
    cfg = {**tiny_experiment(tmp_path), "report_only": True}
    if said is None:
        out = experiment.run(cfg, lambda line: None)
        row, = [a for a in json.loads((out / "results.json").read_text())["arms"] if a["method"] == "aria" and a["iteration"] == 1]
        assert row["movement"]["logprob_change_won"] is None
        return
    with pytest.raises(DataError) as raised:
        experiment.run(cfg, lambda line: None)
    assert str(raised.value).startswith(f"{damaged}, ") and said in str(raised.value), raised.value


@pytest.mark.parametrize("change, named, field, said", [
    ("swapped", "eval.jsonl.producer.json", "producer.policy.model_path", "games of s0/no_aggregation/it1/model, not of s0/aria/it1/model"),
    ("retrained", "eval.jsonl.producer.json", "producer.policy.model_version", "not as its trained_on.json says"),
    ("other_seed", "eval.jsonl.producer.json", "producer.seed", "games of evaluation seed 7, not the run's"),
    ("other_temperature", "eval.jsonl.producer.json", "producer.policy.temperature", "0.0 here, 1.0 in "),
    ("other_target", "eval.jsonl", "game ", "paired games share their target"),
    ("no_producer", "eval.jsonl.producer.json", None, "missing: nothing says which model played eval.jsonl"),
    ("no_marker", "trained_on.json", None, "missing: nothing says what the arm was trained on"),
    ("other_parent", "trained_on.json", "start_model_version", "trained from warm/model as version '0000000000000000' trained it"),
    ("movement_swapped", "movement.json", "key.child_version", "not s0/aria/it1/model as its trained_on.json says"),
    ("movement_no_key", "movement.json", "key", "missing: nothing says which models were measured"),
    ("movement_other_steps", "movement.json", "key.steps", "measured on 3 steps, not report.movement.steps"),
])
def test_report_only_sets_aside_what_the_runner_would_redo(tmp_path, tiny_experiment, straight_run, change, named, field, said):
    """A run folder edited or assembled by hand, or caught mid-way by a report: an arm's evaluation
    copied from another arm, kept beside the marker of a later training, played on other targets or
    at another temperature, its producer record or training marker removed, trained from another
    warm start; its movement measured on another arm, at other steps or without its key. Before,
    the report counted them as the arm's (only the runner read the producer records and movement
    keys; a review turned a null result into p = 1e-5 this way). Now each is left out of the tables
    and named, file, field and why, as the runner would play, train or measure it again."""
    import shutil

    from aria.trajectories import producer_path

    straight_root, _, _ = straight_run
    shutil.copytree(straight_root / "run", tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))
    arm, other = tmp_path / "run" / "s0" / "aria" / "it1", tmp_path / "run" / "s0" / "no_aggregation" / "it1"
    producer = producer_path(arm / "eval.jsonl")
    record = json.loads(producer.read_text())
    games = [json.loads(line) for line in (arm / "eval.jsonl").read_text().splitlines()]
    if change == "swapped":
        for name in ("eval.jsonl", "eval.jsonl.producer.json"):
            shutil.copyfile(other / name, arm / name)
    elif change == "retrained":
        marker = json.loads((arm / "trained_on.json").read_text())
        (arm / "trained_on.json").write_text(json.dumps({**marker, "seed": marker["seed"] + 1}))
    elif change in ("other_seed", "other_temperature"):
        record["producer"]["seed" if change == "other_seed" else "policy"] = \
            7 if change == "other_seed" else {**record["producer"]["policy"], "temperature": 0.0}
        producer.write_text(json.dumps(record))
    elif change == "other_target":
        games[0]["target"] = games[0]["target"] + "x"
        (arm / "eval.jsonl").write_text("".join(json.dumps(g) + "\n" for g in games))
    elif change == "no_producer":
        producer.unlink()
    elif change == "no_marker":
        (arm / "trained_on.json").unlink()
    elif change == "movement_swapped":
        shutil.copyfile(other / "movement.json", arm / "movement.json")
    elif change.startswith("movement_"):
        measured = json.loads((arm / "movement.json").read_text())
        if change == "movement_no_key":
            del measured["key"]
        else:
            measured["key"]["steps"] = 3
        (arm / "movement.json").write_text(json.dumps(measured))
    else:  # an arm of another warm start, consistent in itself: its marker's version everywhere it is named
        from aria.experiment.layout import model_version

        marker = json.loads((arm / "trained_on.json").read_text())
        (arm / "trained_on.json").write_text(json.dumps({**marker, "start_model_version": "0000000000000000"}))
        record["producer"]["policy"]["model_version"] = model_version(arm / "model")
        producer.write_text(json.dumps(record))
        measured = json.loads((arm / "movement.json").read_text())
        measured["key"]["child_version"] = model_version(arm / "model")
        (arm / "movement.json").write_text(json.dumps(measured))
    lines: list[str] = []
    out = experiment.run({**tiny_experiment(tmp_path), "report_only": True}, lines.append)
    results = json.loads((out / "results.json").read_text())
    aside = results["set_aside"][0]  # and what follows from it: a later iteration trained from it, its movement
    assert all(x["what"].startswith("s0/aria/") for x in results["set_aside"]), results["set_aside"]
    assert aside["file"] == f"s0/aria/it1/{named}" and said in aside["reason"], aside
    assert aside["field"] is None if field is None else aside["field"].startswith(field), aside  # (a game's: its id follows)
    rows = {(r["method"], r["seed"], r["iteration"]): r for r in results["arms"]}
    if named == "movement.json":  # the arm is counted; its movement is not measured yet
        assert aside["what"] == "s0/aria/it1/movement.json" and "movement" not in rows[("aria", 0, 1)]
    else:  # the arm is not evaluated yet, and said so; nothing of it is tested
        assert aside["what"] == "s0/aria/it1/eval.jsonl" and ("aria", 0, 1) not in rows
        assert "not evaluated yet: aria seed 0 iteration 1" in lines[-1], lines[-1]
    table = (out / "table.md").read_text()
    assert "**Set aside** (the runner plays, trains or measures these again" in table and aside["reason"] in table


def test_a_report_that_cannot_render_leaves_the_last_one_whole(tmp_path, tiny_experiment, straight_run, monkeypatch):
    """results.json was written before table.md was rendered: a template that failed on a run
    folder left a new results.json beside the old table (found by a review). Now nothing is written."""
    import shutil

    from aria.experiment import report

    straight_root, _, _ = straight_run
    shutil.copytree(straight_root / "run", tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))
    out = experiment.run({**tiny_experiment(tmp_path), "report_only": True}, lambda line: None)
    before = {name: (out / name).read_bytes() for name in ("results.json", "table.md")}
    (tmp_path / "run" / "stage_times.json").write_text("{}")  # the next results.json would differ

    def fails(results):
        raise RuntimeError("the template failed")

    monkeypatch.setattr(report, "render_table", fails)
    with pytest.raises(RuntimeError):
        experiment.run({**tiny_experiment(tmp_path), "report_only": True}, lambda line: None)
    assert {name: (out / name).read_bytes() for name in before} == before


def test_recorded_settings_win_section_by_section():
    """Hand-made: a recorded value wins (a section recursing, a mapping whole), a setting the record
    lacks keeps the current value and is named, a recorded name that is no longer a setting is named."""
    from dataclasses import asdict

    from aria.experiment.settings import (ExperimentSettings, MovementSettings, ReportSettings, VariantSettings,
                                          recorded_over)

    current = asdict(ExperimentSettings(
        name="x", methods=["aria"], seeds=[0], variants={"v": VariantSettings(method="aria")},
        report=ReportSettings(verdict_on="runs", movement=MovementSettings(min_token_kl=0.01, kl_from="estimate"))))
    recorded = {k: v for k, v in current.items() if k != "iterations"}
    recorded.update(seeds=[0, 1], variants={}, old_knob=3,
                    report={**{k: v for k, v in current["report"].items() if k != "verdict_on"},
                            "movement": {**current["report"]["movement"], "min_token_kl": 0.02}})
    merged, differ, missing = recorded_over(current, recorded)
    assert merged["seeds"] == [0, 1] and merged["variants"] == {} and merged["iterations"] == current["iterations"]
    assert merged["report"]["movement"] == {**current["report"]["movement"], "min_token_kl": 0.02}
    assert merged["report"]["verdict_on"] == "runs" and "old_knob" not in merged
    assert differ == ["variants", "seeds", "report.movement.min_token_kl", "old_knob (no longer a setting)"]
    assert missing == ["iterations", "report.verdict_on"]


def test_archer_trains_its_critic_each_iteration_and_its_actor_after_the_warm_up(tmp_path, tiny_experiment, straight_run,
                                                                                   tiny_sentence_model_dir):
    """``archer`` added to a finished run, with one warm-up iteration: iteration 1 trains the critic
    only (the iteration's model is its start model, file for file), iteration 2 trains the critic
    from iteration 1's and then the actor on the critic's advantages; both have their rows, and a
    paired test against aria (``report.more_pairs``) beside the preset's own."""
    import shutil

    straight_root, _, _ = straight_run
    shutil.copytree(straight_root / "run", tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))
    cfg = tiny_experiment(tmp_path)
    cfg = {**cfg, "methods": [*cfg["methods"], "archer"],
           "archer": {"actor_warmup_iterations": 1, "critic_overrides": [
               f"critic.encoder={tiny_sentence_model_dir}", "critic.hidden=16", "critic.max_tokens=64", "device=cpu",
               "train.mixed_precision=no", "train.epochs=1", "train.micro_batch_size=4", "train.gradient_accumulation_steps=1",
               "data.eval_fraction=0.25"]},
           "report": {**cfg["report"], "more_pairs": [["archer", "aria"]]}}
    lines: list[str] = []
    out = experiment.run(cfg, lines.append)
    assert "; also archer against aria over 1 seed(s): 4 pairs detect" in lines[0]
    arm = tmp_path / "run" / "s0" / "archer"
    start = tmp_path / "run" / "warm" / "model" / "model.safetensors"
    assert (arm / "it1" / "model" / "model.safetensors").stat().st_ino == start.stat().st_ino  # the policy stayed
    assert (arm / "it1" / "critic" / "final" / "critic.safetensors").is_file()
    second = json.loads((arm / "it2" / "critic" / "final" / "critic.json").read_text())
    assert second["steps"] > 0
    marker = json.loads((arm / "it2" / "trained_on.json").read_text())
    assert marker["critic_init"] == str(arm / "it1" / "critic" / "final") and marker["actor"] is True
    # the actor trains on the critic's signed advantages with the bounded loss (the preset's train_overrides_by_method)
    assert marker["overrides"][-1] == "loss.name=clipped_reinforce"
    assert (arm / "it2" / "train" / "reference_logprobs.safetensors").is_file()
    trained = json.loads((arm / "it2" / "critic" / "train.json").read_text())
    assert trained and all("advantage" in step for step in trained)
    assert [line for line in lines if line.startswith("[experiment] trained")] == [
        f"[experiment] trained archer from model -> {arm / 'it2' / 'model'}"]
    assert sum(line.startswith("[experiment] archer warm-up: critic only") for line in lines) == 1
    results = json.loads((out / "results.json").read_text())
    rows = {r["iteration"]: r for r in results["arms"] if r["method"] == "archer"}
    assert set(rows) == {0, 1, 2} and rows[2]["movement"]["steps"] > 0
    assert rows[1]["movement"]["token_kl"] == 0.0 and rows[1]["movement"]["moved"] is False  # the warm-up iteration
    assert "| archer | 2 |" in (out / "table.md").read_text()
    tests = {(t["first"], t["second"], t["iteration"]): t for t in results["paired_tests"]}
    assert set(tests) == {("aria", "no_aggregation", 1), ("aria", "no_aggregation", 2), ("archer", "aria", 1),
                          ("archer", "aria", 2)}
    # the warm-up iteration left archer's policy where it was: that comparison cannot speak
    assert tests[("archer", "aria", 1)]["verdict"] == "uninformative: the policy did not move"
    assert "archer seed 0" in tests[("archer", "aria", 1)]["not_moved"] and tests[("archer", "aria", 2)]["pairs"] == 4
    assert "(archer against aria, 4 games paired" in (out / "table.md").read_text()
    # the gradient-variance report weighs the same steps by the critic's advantages too
    assert set(results["gradient_variance"]["0"]["methods"]) == {"aria", "no_aggregation", "archer"}

    # Stopped after the critic, in the actor (its model not merged yet, so neither evaluated nor
    # measured): the run again keeps the finished critic and its advantages, which the actor's
    # checkpoints and reference belong to (before: the critic resumed from its last checkpoint and
    # rewrote them, and the actor refused).
    advantages = arm / "it2" / "critic" / "train.json"
    written = (advantages.read_bytes(), advantages.stat().st_mtime_ns)
    shutil.rmtree(arm / "it2" / "model")
    (arm / "it2" / "movement.json").unlink()
    again: list[str] = []
    experiment.run(cfg, again.append)
    assert (advantages.read_bytes(), advantages.stat().st_mtime_ns) == written
    assert sum(line.startswith("[experiment] critic: done (") for line in again) == 1
    assert f"[experiment] trained archer from model -> {arm / 'it2' / 'model'}" in again


def test_a_launcher_trains_the_module_in_a_process_of_its_own_to_the_same_weights(tmp_path, tiny_experiment, straight_run):
    """With ``launcher`` set the runner starts the trainer as a module (``<launcher> -m
    aria.trainers.launch --config-dir <config folder>``), never a script by its path; a plain
    ``python`` launcher trains the same weights as training in this process."""
    import sys

    import torch
    from safetensors.torch import load_file

    run = straight_run[0] / "run"
    cfg = tiny_experiment(tmp_path)
    train_file, start = run / "s0" / "it1-shared" / "intention" / "train.json", run / "warm" / "model"
    recorder = tmp_path / "launcher.py"  # records what it was asked to run, then runs it with python
    recorder.write_text("import json, os, sys\n"
                        f"open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
                        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")
    weights = {}
    for name, launcher in (("in_process", None), ("launched", f"{sys.executable} {recorder}")):
        # behaviour cloning: the tiny model never wins, so every return (and any RL gradient) is zero
        model = experiment.train(typed(ExperimentSettings, {**cfg, "launcher": launcher}), "bc", train_file, start,
                                 tmp_path / name, 0, cfg["train_overrides"], print)
        weights[name] = load_file(model / "model.safetensors")
        assert (tmp_path / name / "train" / "final" / "aria_training.json").is_file()
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[:4] == ["-m", "aria.trainers.launch", "--config-dir", str(config_dir())]
    parent = load_file(start / "model.safetensors")
    assert weights["launched"].keys() == weights["in_process"].keys() == parent.keys()
    for key, value in weights["in_process"].items():
        torch.testing.assert_close(weights["launched"][key], value, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(value, parent[key]) for key, value in weights["in_process"].items())  # it trained


def test_memory_a_stage_freed_goes_back_to_the_system():
    """Small blocks freed on the heap stay resident under glibc until trimmed (a training stage:
    8.1-8.7 GB resident, 0.5 GB live); the runner trims after every stage."""
    import ctypes.util

    if "libc.so" not in (ctypes.util.find_library("c") or ""):
        pytest.skip("glibc only: other C libraries are left as they are")

    def resident_mb() -> float:
        return int(next(line for line in open("/proc/self/status") if line.startswith("VmRSS")).split()[1]) / 1024

    blocks = [bytearray(64 * 1024) for _ in range(4000)]  # 250 MB in blocks below glibc's mmap threshold
    keep = blocks[-1]  # the top of the heap stays in use, so the heap cannot simply shrink from its end
    del blocks
    before = resident_mb()
    experiment.release_freed_memory()
    assert before - resident_mb() > 150, (before, resident_mb())
    assert keep is not None


def test_a_stage_resumed_after_an_interrupt_is_timed_over_all_its_runs(tmp_path, monkeypatch):
    clock = iter([0.0, 100.0, 1000.0, 1030.0, 2000.0, 2000.5])  # start and end of each run

    monkeypatch.setattr(experiment.time, "perf_counter", lambda: next(clock))
    runs = []

    def train():
        runs.append(1)
        if len(runs) == 1:
            raise KeyboardInterrupt  # stopped after 100 s of work

    stage, times, path = experiment.Stage("s0 train", "train"), {}, tmp_path / "stage_times.json"
    with pytest.raises(KeyboardInterrupt):
        experiment.timed_stage(stage, train, times, path, "machine A")
    assert json.loads(path.read_text()) == {"s0 train": {"kind": "train", "unfinished": 100.0, "cpus": ["machine A"]}}
    assert experiment.eta([stage], times) == (0.0, {"train": 1})  # a part is no estimate of the whole
    assert experiment.timed_stage(stage, train, times, path, "machine B") == 30.0  # resumed elsewhere: 30 s more
    finished = {"s0 train": {"kind": "train", "seconds": 130.0, "cpus": ["machine A", "machine B"]}}
    assert json.loads(path.read_text()) == finished
    assert experiment.timed_stage(stage, train, times, path, "machine C") == 0.5  # finished: skipped, its time and machines kept
    assert times == finished


def test_a_stage_killed_outright_keeps_its_time_to_its_last_heartbeat(tmp_path, monkeypatch):
    """SIGKILL, a lost machine or a session's end runs no handler: before, the stage's and the
    command's time were lost whole (a 46-minute training timed by its last 17 minutes). The
    heartbeat writes both while the stage runs; the next run counts the stage's part as unfinished."""
    import threading
    import time

    path, times, invocations = tmp_path / "stage_times.json", {}, [{"command": "c", "cpu": "A", "started": "x"}]
    beat = experiment.Heartbeat(tmp_path, times, invocations, every=0.02)
    seen, done = {}, threading.Event()

    def train():  # what a kill would leave on disk, read while the stage runs
        while not done.is_set():
            on_disk = json.loads(path.read_text()) if path.is_file() else {}
            if on_disk.get("s0 train", {}).get("running", 0) >= 0.1:
                seen.update(stage=on_disk["s0 train"], command=json.loads((tmp_path / "invocations.json").read_text())[-1])
                done.set()
            time.sleep(0.01)

    beat.start()
    try:
        experiment.timed_stage(experiment.Stage("s0 train", "train"), train, times, path, "machine A", beat)
    finally:
        beat.stop()
    assert seen["stage"]["kind"] == "train" and seen["stage"]["cpus"] == ["machine A"] and "seconds" not in seen["stage"]
    assert seen["command"]["last_beat_seconds"] >= 0.1 and "seconds" not in seen["command"]
    # a finished stage skipped on another machine while beats fall: never gains that machine, killed or not
    finished = {"kind": "train", "seconds": 130.0, "cpus": ["machine A"]}
    times.clear()
    times["s0 train"] = dict(finished)
    beat = experiment.Heartbeat(tmp_path, times, invocations, every=0.02)
    beat.start()
    try:
        experiment.timed_stage(experiment.Stage("s0 train", "train"), lambda: time.sleep(0.2), times, path, "machine B", beat)
        assert {k: v for k, v in json.loads(path.read_text())["s0 train"].items() if k != "running"} == finished
    finally:
        beat.stop()
    assert times["s0 train"] == finished and json.loads(path.read_text())["s0 train"] == finished
    # the next run, on another machine, finds a stage killed after 40 s: it counts, as an interrupt's part does
    times = {"s1 train": {"kind": "train", "cpus": ["machine A"], "unfinished": 5.0, "running": 40.0}}
    clock = iter([0.0, 30.0])
    monkeypatch.setattr(experiment.time, "perf_counter", lambda: next(clock))
    assert experiment.timed_stage(experiment.Stage("s1 train", "train"), lambda: None, times, path, "machine B") == 30.0
    assert json.loads(path.read_text())["s1 train"] == {"kind": "train", "seconds": 75.0, "cpus": ["machine A", "machine B"]}


def test_the_run_record_names_the_machines_its_stages_ran_on_and_never_guesses(tmp_path):
    """results.json's CPU is every machine a finished stage ran on (stage_times.json); the machine that
    writes the report is only ``reported_on``; a stage timed before machines were recorded is counted, not guessed."""
    from types import SimpleNamespace

    from aria.experiment.report import run_record
    from aria.llm.hardware import describe, label

    times = {"a": {"kind": "train", "seconds": 10.0, "cpus": ["A"]}, "b": {"kind": "eval", "seconds": 5.0, "cpus": ["A", "B"]},
             "c": {"kind": "eval", "unfinished": 3.0, "cpus": ["C"]}}
    atomic_write_json(tmp_path / "stage_times.json", times)
    record = run_record(SimpleNamespace(run_dir=tmp_path), 20.0, False)
    assert record["cpu"] == "A / B" and record["stage_cpus"] == {"a": ["A"], "b": ["A", "B"]}
    assert record["stage_seconds"] == {"a": 10.0, "b": 5.0} and record["reported_on"] == label(describe())
    atomic_write_json(tmp_path / "stage_times.json", {**times, "old": {"kind": "eval", "seconds": 1.0}})
    assert run_record(SimpleNamespace(run_dir=tmp_path))["cpu"] == "A / B (1 stage on a machine not recorded)"
    atomic_write_json(tmp_path / "stage_times.json", {"old": {"kind": "eval", "seconds": 1.0}})
    assert "cpu" not in run_record(SimpleNamespace(run_dir=tmp_path))  # the table then says "a CPU not recorded"
    # every command that ran stages: the wall time is their sum, over sessions and machines (one still running: not yet)
    atomic_write_json(tmp_path / "invocations.json", [
        {"command": "python scripts/run_experiment.py a", "cpu": "A", "started": "x", "seconds": 100.0},
        {"command": "python scripts/run_experiment.py a", "cpu": "B", "started": "y", "seconds": 50.5},
        {"command": "python scripts/run_experiment.py b", "cpu": "B", "started": "z"}])
    record = run_record(SimpleNamespace(run_dir=tmp_path), 7.0, False)
    assert (record["wall_seconds"], record["resumed"], record["invocations"]) == (150.5, True, 2)
    assert record["commands"] == ["python scripts/run_experiment.py a"]
    assert (record["timed_to_last_beat"], record["not_timed"]) == (0, 1)
    # a command killed outright: timed to its last heartbeat, and the wall time says it is a lower bound
    atomic_write_json(tmp_path / "invocations.json", [
        {"command": "a", "cpu": "A", "started": "x", "last_beat_seconds": 600.0},
        {"command": "a", "cpu": "A", "started": "y", "seconds": 50.5}])
    record = run_record(SimpleNamespace(run_dir=tmp_path))
    assert (record["wall_seconds"], record["invocations"], record["timed_to_last_beat"], record["not_timed"]) == (650.5, 2, 1, 0)


def test_eta_uses_the_times_of_finished_stages_of_the_same_kind():
    stages = [experiment.Stage("a", "train"), experiment.Stage("b", "train"), experiment.Stage("c", "eval"),
              experiment.Stage("d", "other")]
    times = {"a": {"kind": "train", "seconds": 100.0}, "x": {"kind": "train", "seconds": 50.0},
             "y": {"kind": "eval", "seconds": 20.0}}
    # a: its own 100; b: mean of train (75); c: mean of eval (20); d: no stage of its kind timed yet
    assert experiment.eta(stages, times) == (pytest.approx(100 + 75 + 20), {"other": 1})
    assert experiment.eta_text(stages, times) == "ETA at least 3m15s (not timed yet: 1 other stage)"
    assert experiment.eta_text(stages[:3], times) == "ETA 3m15s"
    # before any training: a lower bound that says what it leaves out, not hours timed by seconds of labelling
    assert experiment.eta_text(stages, {"y": {"kind": "eval", "seconds": 20.0}}) == \
        "ETA at least 0m20s (not timed yet: 2 train, 1 other stages)"
    assert experiment.eta_text(stages[:2], {}) == "ETA unknown (not timed yet: 2 train stages)"  # not "at least 0m00s"


def test_the_warm_start_training_does_not_time_the_arms_training(tmp_path):
    """The warm start's behaviour cloning is a stage of its own kind: an arm's training, many
    times longer, is not estimated by it (the powered preset's ETA read 38 minutes for 26 hours)."""
    cfg = settings("experiment=powered", f"run_dir={tmp_path}")
    stages = experiment.plan(cfg)
    kinds = {stage.name: stage.kind for stage in stages}
    assert kinds["warm start: behaviour cloning"] == "warm start training"
    arms = [stage for stage in stages if stage.name.endswith("label and train")]
    assert len(arms) == 9 and {stage.kind for stage in arms} == {"train"}
    times = {"warm start: behaviour cloning": {"kind": "warm start training", "seconds": 574.0}}
    assert experiment.eta(arms, times) == (0.0, {"train": 9})


def test_an_iterations_stages_run_kind_by_kind_so_that_one_server_plays_the_arms_in_turn(tmp_path):
    """Collections, then trainings, then evaluations, then movements, each over the arms: the
    evaluations follow each other (one server, its weights reloaded) and no training or movement
    runs between two of them."""
    cfg = settings("experiment=cpu", f"run_dir={tmp_path}")
    names = [s.name for s in experiment.plan(cfg)]
    seed0 = [n.removeprefix("seed 0 · ") for n in names if n.startswith("seed 0 · ")]
    arms = ["aria", "no_aggregation", "filtered_bc", "bc"]
    assert seed0[:16] == [f"{m} · iteration 1: {what}" for what in ("collect", "label and train", "evaluate", "how far the policy moved")
                          for m in arms]
    assert seed0[16:] == [f"{m} · iteration 2: {what}" for what in ("collect", "label and train", "evaluate", "how far the policy moved")
                          for m in arms[:2]]


def test_a_server_takes_the_next_models_weights_only_when_they_fit_its_architecture(tmp_path, tiny_model_dir):
    import shutil

    same, other = tmp_path / "same", tmp_path / "other"
    shutil.copytree(tiny_model_dir, same)
    config = json.loads((same / "config.json").read_text())
    (same / "config.json").write_text(json.dumps({**config, "_name_or_path": "elsewhere", "torch_dtype": "bfloat16"}))
    shutil.copytree(tiny_model_dir, other)
    (other / "config.json").write_text(json.dumps({**config, "num_hidden_layers": config["num_hidden_layers"] + 1}))
    assert experiment.same_architecture(tiny_model_dir, same)
    assert not experiment.same_architecture(tiny_model_dir, other) and not experiment.same_architecture(tiny_model_dir, tmp_path)


def test_methods_may_run_fewer_iterations_than_the_others(tmp_path):
    cfg = settings("experiment=cpu", f"run_dir={tmp_path}")
    assert [experiment.iterations_of(cfg, m) for m in cfg.methods] == [2, 2, 1, 1]
    names = [s.name for s in experiment.plan(cfg)]
    # per seed: aria and no_aggregation 2 iterations, filtered_bc and bc 1, 4 stages each, + gradient variance
    assert len(names) == 3 + 1 + 2 * ((2 + 2 + 1 + 1) * 4 + 1)
    assert "seed 1 · filtered_bc · iteration 1: evaluate" in names
    assert not any("bc · iteration 2" in n for n in names)
    with pytest.raises(ValueError, match="iterations_by_method.bc: expected a whole number >= 1, got 0"):
        experiment.iterations_of(replace(cfg, iterations_by_method={"bc": 0}), "bc")
    # and on fewer seeds: bc on seed 1 only
    fewer = replace(cfg, seeds_by_method={"bc": [1]})
    names = [s.name for s in experiment.plan(fewer)]
    assert "seed 1 · bc · iteration 1: evaluate" in names and not any(n.startswith("seed 0 · bc") for n in names)


def tiny_two_player(experiment_name, tmp_path, tiny_model_dir, tiny_sentence_model_dir, games: int) -> list[str]:
    """A two-player preset on a tiny model: ``games`` self-play games a configuration of the smoke
    set, 3 evaluation games a seat, one short training epoch."""
    return [
        f"experiment={experiment_name}", f"run_dir={tmp_path / 'run'}", f"results_dir={tmp_path / 'results'}",
        f"base_model={tiny_model_dir}", "engine=local",
        "collect.config_set=smoke", f"collect.games_per_config={games}", "collect.max_tokens=200", "collect.batch_size=4",
        "eval.config_set=smoke", "eval.games_per_config=3", "eval.max_tokens=200", "eval.batch_size=4",
        f"intention_overrides=['embedder.model={tiny_sentence_model_dir}','clustering.k_max=4']",
        "train_overrides=['train.mixed_precision=no','train.epochs=1','train.micro_batch_size=4',"
        "'train.gradient_accumulation_steps=1','train.save_freq=2']",
    ]


def test_negotiation_over_two_training_runs_reports_the_method_level_interval(tmp_path, tiny_model_dir,
                                                                              tiny_sentence_model_dir):
    """experiment=negotiation on a tiny model and two seeds: self-play, training and the scripted
    negotiator in both seats; the paired test of each seed (a training run) pooled over runs in
    results.json and table.md, the verdict read from the method level as the preset fixes."""
    from aria.power import runs_detectable_difference
    from aria.statistics import pool_runs, pool_score_runs

    cfg = compose_config("experiment", tiny_two_player("negotiation", tmp_path, tiny_model_dir, tiny_sentence_model_dir,
                                                       games=3) + ["seeds=[0,1]", "grad_variance.enabled=false",
                                                                   "report.movement.steps=8"])
    out = experiment.run(cfg, [].append)
    results = json.loads((out / "results.json").read_text())
    assert results["game"] == "negotiation"
    test, = results["paired_tests"]
    runs = test["runs"]
    assert [r["seed"] for r in runs["per_seed"]] == [0, 1] and all(r["pairs"] == 6 for r in runs["per_seed"])
    assert runs["runs"] == 2 and runs["random_effects"]["df"] == 1
    assert runs["random_effects"] == pool_runs(runs["per_seed"])["random_effects"]
    share = test["discordant_share"]  # 0 where no pair was won by one arm only: then nothing is detectable
    assert runs["detectable_difference"] == (runs_detectable_difference(2, 6, share, runs["heterogeneity"]["tau2"]) if share else None)
    assert test["verdict_on"] == "runs"
    moved = {(a["method"], a["seed"]): a["movement"]["moved"] for a in results["arms"] if a["iteration"] == 1}
    expected = ("uninformative: the policy did not move" if not all(moved.values()) else
                "significant" if runs["random_effects"]["p_value"] < 0.05 else "not significant")
    assert test["verdict"] == expected
    assert "**Over training runs**" in (out / "table.md").read_text()
    # the secondary outcome: each game's payoff share (0.5 each on a tie) read again from the evaluation files
    shares, deals = {}, {}
    for method, seed in ((m, s) for m in ("aria", "no_aggregation") for s in (0, 1)):
        for role in ("alice", "bob"):
            for r in read_trajectories(tmp_path / "run" / f"s{seed}" / method / "it1" / "eval" / f"as_{role}.jsonl"):
                a, b = r["meta"]["payoffs"][role], r["meta"]["payoffs"][other(role)]
                low = min(0.0, a, b)
                share = 0.5 if a == b else (a - low) / ((a - low) + (b - low))
                shares.setdefault((method, seed), {})[f"{role}:{r['game_id']}"] = share
                deals.setdefault((method, seed), []).append(r["meta"]["outcome"] == "deal")
    assert len({v for arm in shares.values() for v in arm.values()}) > 1  # not every game a tie: the check below can fail
    payoff = test["payoff_share"]
    for run in payoff["per_seed"]:
        first, second = (shares[(m, run["seed"])] for m in ("aria", "no_aggregation"))
        assert run["first_mean"] == pytest.approx(sum(first.values()) / len(first))
        assert run["difference"] == pytest.approx(sum(first[k] - second[k] for k in first) / len(first))
        assert run["deal_rates"] == pytest.approx([sum(deals[(m, run["seed"])]) / 6 for m in ("aria", "no_aggregation")])
    assert payoff["random_effects"] == pool_score_runs([tuple([shares[(m, s)][k] for k in sorted(shares[(m, s)])]
                                                              for m in ("aria", "no_aggregation")) for s in (0, 1)])["random_effects"]
    # every game's share is kept in results.json, in outcome_keys order, as the wins are
    arm = next(a for a in results["arms"] if (a["method"], a["seed"], a["iteration"]) == ("aria", 1, 1))
    assert arm["scores"] == pytest.approx([shares[("aria", 1)][k] for k in results["outcome_keys"]], abs=1e-6)
    assert "**Payoff share**" in (out / "table.md").read_text()


def test_a_two_player_experiment_runs_self_play_and_evaluates_against_the_opponent(tmp_path, tiny_model_dir,
                                                                                   tiny_sentence_model_dir):
    """experiment=bargaining on a tiny model: constrained self-play, steps 1-4, training, and the
    win rate of every model in both seats against the scripted opponent, paired by configuration and seat."""
    cfg = compose_config("experiment", tiny_two_player("bargaining", tmp_path, tiny_model_dir, tiny_sentence_model_dir,
                                                       games=4) + [
        "seeds=[0]", "grad_variance.max_samples=4", "methods=[aria,no_aggregation,archer]",
        f"archer.critic_overrides=['critic.encoder={tiny_sentence_model_dir}','critic.hidden=16','critic.max_tokens=64',"
        "'device=cpu','train.mixed_precision=no','train.epochs=1','train.micro_batch_size=4',"
        "'train.gradient_accumulation_steps=1','data.eval_fraction=0.25']",
    ])
    lines: list[str] = []
    out = experiment.run(cfg, lines.append)
    results = json.loads((out / "results.json").read_text())
    assert [(r["method"], r["iteration"]) for r in results["pooled"]] == [
        ("base model", 0), ("aria", 1), ("no_aggregation", 1), ("archer", 1)]
    # ArCHer's critic learnt each seat's values on the self-play steps: both roles have advantages
    critic_steps = json.loads((tmp_path / "run" / "s0" / "archer" / "it1" / "critic" / "train.json").read_text())
    assert {s["role"] for s in critic_steps} == {"alice", "bob"} and all("advantage" in s for s in critic_steps)
    assert all(r["games"] == 6 for r in results["pooled"])  # 3 games as Alice, 3 as Bob
    test, = results["paired_tests"]
    assert test["pairs"] == 6 and test["first"] == "aria"
    table = (out / "table.md").read_text()
    assert "win rate on bargaining against the opponent (name scripted, strength 1.0)" in table
    assert "paired by seed and configuration and seat" in table
    run = tmp_path / "run"
    producer = json.loads((run / "s0" / "it1-shared" / "games.jsonl.producer.json").read_text())["producer"]
    assert producer["structured_output"] == "json_schema" and producer["seats"]["alice"] == producer["seats"]["bob"]
    # the collection counts as done only under exactly its settings: with free replies it is played again
    cfg = experiment.check_settings(cfg)  # as the runner reads it
    games, n, seed = run / "s0" / "it1-shared" / "games.jsonl", experiment.games_of(cfg, cfg.collect), producer["seed"]
    family, made_by = family_of(cfg.game), producer["seats"]["alice"]
    assert experiment.games_done(games, n, family.collection_producer(cfg, cfg.collect, seed, made_by))
    free = replace(cfg, game={**cfg.game, "structured_output": "none"})
    assert not experiment.games_done(games, n, family.collection_producer(free, free.collect, seed, made_by))
    # nor under other rules: fewer re-prompts allowed for an illegal move
    strict = replace(cfg, game={**cfg.game, "max_reprompts": 0})
    assert not experiment.games_done(games, n, family.collection_producer(strict, strict.collect, seed, made_by))
    for role in ("alice", "bob"):
        assert (run / "s0" / "aria" / "it1" / "eval" / f"as_{role}.jsonl").is_file()
    # movement measured on the policy's own turns in both seats of the base model's evaluation
    held_out = experiment.held_out_steps(cfg, experiment.Layout(cfg))
    policy_turns = sum(t["role"] == role for role in ("alice", "bob")
                       for line in (run / "eval" / "it0" / f"as_{role}.jsonl").read_text().splitlines()
                       for t in json.loads(line)["turns"])
    assert len(held_out) == policy_turns > 0  # the opponent's turns are not the policy's
    assert all(r["movement"]["steps"] == min(len(held_out), 128) for r in results["arms"] if r["iteration"] == 1)
    # everything is done: running again plays and trains nothing and writes the same table
    again: list[str] = []
    experiment.run(cfg, again.append)
    assert not any("games done (" in line and "played now" in line and "(0 played now" not in line for line in again)
    assert (out / "table.md").read_text() == table
    # a report never counts the opponent's seat or an arm's games as the policy's (found by a review:
    # as_bob.jsonl copied over as_alice.jsonl made a null result p = 1e-5; an arm's as the base model's)
    import shutil
    from dataclasses import asdict

    from aria.io import DataError
    for where, source, field, said in [
            ("s0/aria/it1/eval", "s0/aria/it1/eval/as_bob.jsonl", "producer.seats.alice", "plays the policy's seat, not a model"),
            ("eval/it0", "s0/aria/it1/eval/as_alice.jsonl", "producer.seats.alice.model_path",
             "games of s0/aria/it1/model, a model of this run, not the base model")]:
        copy = tmp_path / f"copy_{where.replace('/', '_')}"
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns(".lock", "model", "train", "critic"))
        for suffix in ("", ".producer.json"):
            shutil.copyfile(run / f"{source}{suffix}", copy / where / f"as_alice.jsonl{suffix}")
        reported = experiment.run({**asdict(cfg), "run_dir": str(copy), "results_dir": str(copy / "results"), "report_only": True},
                                  lambda line: None)
        aside = json.loads((reported / "results.json").read_text())["set_aside"][0]
        assert (aside["file"], aside["field"]) == (f"{where}/as_alice.jsonl.producer.json", field) and said in aside["reason"], aside
    # a game whose outcome was cut by hand: its file and game named (before: KeyError: 'winner')
    evaluation = run / "s0" / "aria" / "it1" / "eval" / "as_alice.jsonl"
    games = [json.loads(line) for line in evaluation.read_text().splitlines()]
    del games[0]["meta"]["winner"]
    evaluation.write_text("".join(json.dumps(g) + "\n" for g in games))
    with pytest.raises(DataError, match=re.escape(f"{evaluation}, field 'game {games[0]['game_id']}': its outcome cannot be read (KeyError")):
        experiment.run({**asdict(cfg), "report_only": True}, lambda line: None)


def test_a_second_run_into_the_same_run_dir_is_refused_and_the_first_completes(tmp_path, tiny_model_dir,
                                                                                 tiny_sentence_model_dir):
    """Two runs started on one run_dir: the second stops at once with one line naming the first
    (exit 2) and the first ends as if alone, no game written twice (before: both ran, and the
    evaluation files ended with duplicate games)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from aria.trajectories import read_trajectories

    script = Path(__file__).resolve().parents[1] / "scripts" / "run_experiment.py"
    command = [sys.executable, str(script), "--config-name", "experiment",
               *tiny_overrides(tmp_path, tiny_model_dir, tiny_sentence_model_dir), "iterations=1", "methods=[aria]",
               "grad_variance.enabled=false"]
    first = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / "run" / ".lock"
    deadline = time.monotonic() + 300
    while not (lock.is_file() and f"process {first.pid} " in lock.read_text()):
        assert first.poll() is None, first.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # the second and third runs in this process (tests/in_process.py): a process other than the first
    from in_process import run_script

    second = run_script(*command[1:], cwd=tmp_path)
    assert first.poll() is None, "the first run ended before the second was refused: the test proves nothing"
    assert second.returncode == 2, second.stderr[-3000:]
    assert second.stderr.strip().splitlines() == [second.stderr.strip()]  # one line, no traceback
    assert f"in use by process {first.pid} " in second.stderr and str(tmp_path / "run") in second.stderr
    _, err = first.communicate(timeout=900)
    assert first.returncode == 0, err[-3000:]
    played = [p for p in (tmp_path / "run").rglob("*.jsonl") if p.name in ("expert.jsonl", "games.jsonl", "it0.jsonl", "eval.jsonl")]
    assert len(played) == 4, played  # the expert's games, the warm start's evaluation, the collection, aria's evaluation
    for games in played:
        ids = [r["game_id"] for r in read_trajectories(games)]
        assert len(ids) == len(set(ids)), games
    # the lock went with the process: a third run resumes (every stage is done: it only reports)
    third = run_script(*command[1:], cwd=tmp_path)
    assert third.returncode == 0, third.stderr[-3000:]


def test_a_full_disk_stops_the_run_with_one_line_and_the_rerun_after_freeing_space_resumes(
        tmp_path, capsys, tiny_experiment, straight_run):
    """run_dir on a small tmpfs that fills up part-way (root; elsewhere the disk is faked full at
    the same point: the 12th file written whole): the run stops with one line naming the
    problem and what to do (exit 2), nothing half-written is trusted, and the same command run
    again after space is freed ends with the table of a run that never stopped."""
    import errno
    import os
    import subprocess

    from aria import io
    from aria.cli import command

    straight_root, straight, _ = straight_run
    cfg = tiny_experiment(tmp_path / "full")
    run_dir = tmp_path / "full" / "run"
    run_dir.mkdir(parents=True)
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(run_dir)], capture_output=True).returncode == 0
    real_write = io.atomic_write_bytes
    try:
        if not mounted:  # no tmpfs to fill: the 12th whole file written finds the disk full
            writes = []

            def full_disk(path, data):
                writes.append(path)
                if len(writes) >= 12:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                real_write(path, data)
            io.atomic_write_bytes = full_disk
        with pytest.raises(SystemExit) as stop:
            with command(kept=lambda: "the finished stages"):
                experiment.run(cfg, lambda line: None)
        err = capsys.readouterr().err  # the progress bars of the stages before, then the one line
        line = err.strip().splitlines()[-1]
        assert stop.value.code == 2 and "Traceback" not in err and line.startswith("error: "), err[-2000:]
        assert "No space left on device" in line and line.endswith(
            "free some space, then re-run the same command to resume (finished work is kept)"), line
        assert not (tmp_path / "full" / "results" / "table.md").exists()
        # space freed: the same command resumes to the table of the run that never stopped
        if mounted:
            subprocess.run(["mount", "-o", "remount,size=512m", str(run_dir)], check=True)
        io.atomic_write_bytes = real_write
        resumed = experiment.run(cfg, lambda line: None)
        assert (resumed / "table.md").read_text().replace(str(tmp_path / "full"), "") == \
            (straight / "table.md").read_text().replace(str(straight_root), "")
    finally:
        io.atomic_write_bytes = real_write
        if mounted:
            subprocess.run(["umount", "-l", str(run_dir)], check=False)


def test_failed_games_stop_the_run_with_one_line_naming_the_file(tmp_path, tiny_model_dir, tiny_sentence_model_dir):
    """Every answer of the oracle's server fails (nothing listens on its port): the expert's games
    that ask a question fail, and the runner stops at that stage with exit 1 and one line naming the count and the
    file, not a traceback; the failed games are on disk for the re-run."""
    from in_process import run_script

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # free, and closed again: every request is refused
    done = run_script(REPO / "scripts/run_experiment.py", "--config-name", "experiment",
                      *tiny_overrides(tmp_path, tiny_model_dir, tiny_sentence_model_dir), "oracle=llm",
                      f"oracle.base_url=http://127.0.0.1:{closed}/v1", "oracle.max_retries=0", cwd=tmp_path)
    expert = tmp_path / "run" / "warm" / "expert.jsonl"
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    # a game the expert wins by its first guess never asks the oracle
    failed = sum(json.loads(line)["status"] == "failed" for line in expert.read_text().splitlines())
    assert failed >= 4
    assert done.stderr.strip().splitlines()[-1] == f"error: {failed} game(s) failed in {expert}; run again to play them again"


def test_an_embedding_endpoint_that_fails_in_the_labelling_stage_is_one_line(tmp_path, tiny_model_dir,
                                                                              tiny_sentence_model_dir):
    """The runner's labelling stage against an embeddings endpoint where nothing listens: one line
    naming the endpoint, exit 1, the expert's games kept (before: openai's traceback)."""
    from in_process import run_script

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    overrides = [o for o in tiny_overrides(tmp_path, tiny_model_dir, tiny_sentence_model_dir)
                 if not o.startswith("intention_overrides=")]
    done = run_script(REPO / "scripts/run_experiment.py", "--config-name", "experiment", *overrides,
                      "intention_overrides=['embedder=openai','embedder.model=m',"
                      f"'embedder.base_url=http://127.0.0.1:{closed}/v1','embedder.max_retries=0','clustering.k_max=6']",
                      cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: endpoint http://127.0.0.1:{closed}/v1/embeddings: APIConnectionError") and \
        "re-run the same command to resume" in line, line
    assert (tmp_path / "run" / "warm" / "expert.jsonl").is_file()


@pytest.mark.parametrize("override, message", [
    ("policy_dtype=float8", "policy_dtype: expected one of float32, bfloat16, float16, got 'float8'"),
    ("report.preflight_ks=[10,1]", "report.preflight_ks: expected a list whose every element is an integer >= 2, got [10, 1]"),
    ("report.preflight_ks=[10,ten]", "report.preflight_ks[1]: Value 'ten' of type 'str' could not be converted to Integer"),
    ("report.movement.steps=0", "report.movement.steps: expected an integer >= 1, got 0"),
    ("report.movement.min_token_kl=-1", "report.movement.min_token_kl: expected a finite number >= 0 (nats), got -1.0"),
    ("report.movement.min_weight_share=2", "report.movement.min_weight_share: expected a finite number >= 0 and <= 1, got 2.0"),
    ("report.movement.enabled=maybe", "report.movement.enabled: Value 'maybe' is not a valid bool"),
    ("+variants={aria:{method:bc}}", "variants.aria: the name of a method; give the variant a name of its own"),
    ("+variants={fine:{method:arya}}", "variants.fine.method: expected one of "),
    ("+variants={fine:{method:aria,k:20}}", "variants.fine.k: not a setting of this command"),
    ("+variants={fine:{method:aria,intention_overrides:[k20]}}",
     "variants.fine.intention_overrides: expected a list of key=value overrides, got ['k20']"),
    ("methods=[aria,fine]", "methods: unknown ['fine'] (known: "),
    ("methods=[aria,aria]", "methods: each arm once, got ['aria', 'aria']"),
    ("+train_overrides_by_method.archr=['loss.name=clipped_reinforce']", "train_overrides_by_method: unknown method ['archr']"),
    ("train_overrides_by_method.gigpo=['train.epoch=3']", "train_overrides_by_method.gigpo: "),
    ("train_overrides_by_method.gigpo=['loss.name=clipped']",
     "train_overrides_by_method.gigpo: loss.name: unknown 'clipped' (known: clipped_reinforce, reinforce)"),
    ("train_overrides=['train.lr=0']", "train_overrides: train.lr: expected a finite number > 0, got 0.0"),
    ("+seeds_by_method={aria:[5]}", "seeds_by_method.aria: expected a non-empty list of some of seeds [0], each once, got [5]"),
    ("report.paired=[aria,aria]", "report.paired: expected two arms (or null: no paired test), got ['aria', 'aria']"),
    ("vllm.restarts=-1", "vllm.restarts: expected an integer >= 0, got -1"),
    ("report.more_pairs=[[aria,bc]]",
     "report.more_pairs[0]: expected two different arms of methods ['aria', 'no_aggregation'], got ['aria', 'bc']"),
    ("intention_overrides=['aggregation.window=-1']",
     "intention_overrides: aggregation.window: expected an integer >= 0 (null: the whole history), got -1"),
    ("+variants={exact:{method:aria,intention_overrides:['labels=exact']}}",
     "variants.exact.intention_overrides: labels: expected one of clusters, behavioural, got 'exact'"),
])
def test_arm_movement_and_preflight_settings_are_checked_before_any_work(override, message):
    from aria.io import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):  # the composition checks the types (aria/settings.py)
        experiment.check_settings(compose_config("experiment", [override]))


@pytest.mark.parametrize("overrides, message", [
    (["oracle=llm", "oracle.timeout_s=-1"], "oracle.timeout_s: expected a finite number > 0, got -1"),
    (["+oracle.bogus=1"], "oracle.bogus: not an option of the knowledge_base oracle"),
    (["experiment=bargaining", "+eval.opponent.bogus=1"], "eval.opponent.bogus: not an option of the scripted opponent (known: strength)"),
    (["experiment=bargaining", "eval.opponent.strength=2"], "eval.opponent.strength: expected a finite number >= 0 and <= 1, got 2"),
    (["warm_start.games=0"], "warm_start.games: expected an integer >= 1 (or warm_start.enabled=false), got 0"),
])
def test_the_oracle_and_the_opponent_are_checked_before_any_work(overrides, message):
    """Before: an oracle option was refused after the policy's server started, an opponent's at
    the first evaluation, hours in."""
    from aria.io import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        experiment.check_settings(compose_config("experiment", overrides))


def test_a_report_needs_neither_the_model_nor_the_launcher():
    cfg = experiment.check_settings(compose_config("experiment", ["report_only=true", "base_model=/not/here",
                                                                  "launcher=nosuchcommand launch"]))
    assert cfg.base_model == "/not/here"
    experiment.check_settings(compose_config("experiment", ["warm_start.enabled=false", "warm_start.games=0"]))


def test_arms_with_signed_weights_train_with_the_bounded_loss_and_the_others_with_the_papers():
    """The paper's single-agent preset lists StarPO and GiGPO beside ARIA: their normalised
    advantages are signed, and plain REINFORCE on fixed data drives a negative step's
    log-probability to -inf (docs/method.md §5), so every arm of a signed method, a variant of
    one included, trains with the clipped loss after the shared settings; ARIA and the ablation
    train with the paper's loss (no loss override at all)."""
    from aria.experiment.layout import train_overrides_of

    cfg = experiment.check_settings(compose_config("experiment", [
        "experiment=paper_single", "base_model=embedded", "oracle.base_url=http://127.0.0.1:1/v1", "oracle.model=m",
        "methods=[aria,no_aggregation,starpo,gigpo,gigpo_similar,archer,gigpo_fine]",
        "+variants={gigpo_fine:{method:gigpo,intention_overrides:['selection.fixed_k=20']}}"]))
    shared = cfg.train_overrides
    assert shared and not any(o.startswith("loss.") for o in shared)
    for arm in ("aria", "no_aggregation"):
        assert train_overrides_of(cfg, arm) == shared
    for arm in ("starpo", "gigpo", "gigpo_similar", "archer", "gigpo_fine"):
        assert train_overrides_of(cfg, arm) == [*shared, "loss.name=clipped_reinforce"], arm


def test_behavioural_labels_on_a_game_without_an_offline_oracle_are_refused_before_any_work():
    from aria.io import ConfigError

    with pytest.raises(ConfigError, match=re.escape("variants.exact.intention_overrides: game bargaining: no offline oracle")):
        experiment.check_settings(compose_config("experiment", [
            "experiment=bargaining", "+variants={exact:{method:aria,intention_overrides:['labels=behavioural']}}"]))


def test_preflight_rows_name_step_2s_choice_and_the_labels_trained_on():
    """The pre-flight line and table: which k step 2 chose and which labels the arm trained on. Under
    ``labels: behavioural`` they differ; a file written before ``trained`` was recorded names only the choice."""
    row = lambda k, **marks: {"k": {"questions": k}, **marks}  # noqa: E731
    assert preflight_row_name(row(8, chosen=True, trained=True)) == "k = 8 (chosen, trained on)"
    assert preflight_row_name(row(8, chosen=True, trained=False)) == "k = 8 (chosen)"
    assert preflight_row_name(row(20, chosen=False, trained=False)) == "k = 20"
    assert preflight_row_name(row(175, chosen=False, trained=True, labels="behavioural")) == \
        "behavioural intentions = 175 (trained on)"
    assert preflight_row_name(row(8, chosen=True)) == "k = 8 (chosen)"  # an older file: no claim about training
    two_pools = {"k": {"alice": 12, "bob": 9}, "chosen": True, "trained": True}
    assert preflight_row_name(two_pools) == "k = 9/12 (chosen, trained on)"
