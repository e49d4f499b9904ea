"""The experiment's results: success with Wilson intervals, the paired test, variances, a plot.

Written to ``results_dir`` (``results/experiments/<name>/``) from the evaluation games in the run
folder, whatever stage the experiment has reached (a row appears once its evaluation is
complete):
* ``results.json``: every arm (method, seed, iteration) with its games, wins, success rate,
  Wilson 95% interval, mean turns and every game's outcome (``won``, a 0/1 string in the order of
  ``outcome_keys``, so the paired tests can be redone from this file alone); the pooled rows per
  method and iteration; the paired tests;
  the reward and gradient variances; the intention recovery (ARI, NMI) on the expert's games.
* ``table.md``: the paper's Table 2 layout (rows: methods and iterations; success % on the
  game) with intervals and mean turns, then the paired test and the variances, in words. The
  words are ``table.md.j2`` beside this module, one macro a section; this module computes what
  they say.
* ``success_vs_iteration.png``: success per iteration and method, with the intervals.

The statistics (Wilson intervals, the exact McNemar test of two arms on the same targets and
its sensitivity) are :mod:`aria.statistics`, shared with the evaluation harness.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Sequence

import jinja2

from aria.experiment.layout import Layout, games_of, iterations_of, seeds_of
from aria.experiment.run_files import (INVOCATIONS, STAGE_TIMES, SetAside, read_checked, read_evaluations,
                                       read_gradient_variance, read_movement, read_preflights, read_recovery)
from aria.experiment.settings import ExperimentSettings
from aria.games.family import family_of
from aria.io import atomic_save_figure, atomic_write_json, atomic_write_text
from aria.llm.hardware import describe, label
from aria.power import detectable_difference, runs_detectable_difference
from aria.statistics import (ALPHA, POWER, mcnemar, percent, pool_runs, pool_score_runs, runs_sensitivity, sensitivity,
                             wilson_interval)
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): matplotlib


def paired_arms(cfg: ExperimentSettings) -> tuple[str, str] | None:
    """The two arms of the paired test: ``report.paired`` when both are in ``methods``, else none."""
    paired = cfg.report.paired
    return tuple(paired) if paired and set(paired) <= set(cfg.methods) else None


def tested_pairs(cfg: ExperimentSettings) -> list[tuple[str, str]]:
    """Every paired test of the table: ``report.paired`` (the one the preset is sized for) first,
    then ``report.more_pairs``."""
    main = paired_arms(cfg)
    more = [tuple(p) for p in cfg.report.more_pairs if tuple(p) != main]
    return ([main] if main else []) + more


def planned_power(cfg: ExperimentSettings, power: float = POWER, alpha: float = ALPHA) -> str:
    """One line, said before a run starts: the pairs of its paired test per iteration and the
    difference they detect with ``power`` at the discordant share named in ``report``."""
    seats, share = family_of(cfg.game).seats, cfg.report.discordant_share

    def detects(seeds: int) -> str:
        pairs = games_of(cfg, cfg.eval) * seats * seeds
        found = detectable_difference(pairs, share, power, alpha)
        return f"{pairs} pairs detect " + (f"{100 * found:.1f} points" if found is not None else "no difference")

    per_seed = f"{games_of(cfg, cfg.eval) * seats} pairs a seed and iteration{' (both seats)' if seats == 2 else ''}"
    if paired_arms(cfg) is None:
        line = f"no paired test between arms (report.paired: {cfg.report.paired or 'null'}, methods: {cfg.methods}); {per_seed}"
    else:
        first, second = paired_arms(cfg)
        both = [s for s in seeds_of(cfg, first) if s in seeds_of(cfg, second)]
        line = f"the paired test ({first} against {second}) has {per_seed} over {len(both)} seed(s): {detects(len(both))}"
        line += f"; over training runs (the method): {runs_detect(len(both), games_of(cfg, cfg.eval) * seats, cfg, power, alpha)}"
    for first, second in tested_pairs(cfg)[1 if paired_arms(cfg) else 0:]:
        both = [s for s in seeds_of(cfg, first) if s in seeds_of(cfg, second)]
        line += f"; also {first} against {second} over {len(both)} seed(s): {detects(len(both))}"
    others = sorted({len(seeds_of(cfg, m)) for m in cfg.methods})
    against = "; ".join(f"over {n} seed(s) {detects(n)}" for n in others)
    return (f"{line}; each arm against its parent: {against}; with {100 * power:.0f}% power at the {100 * alpha:g}% level "
            f"and a discordant share of {share} (report.discordant_share)")


def runs_detect(runs: int, pairs: int, cfg: ExperimentSettings, power: float = POWER, alpha: float = ALPHA) -> str:
    """What the method-level test of ``runs`` training runs an arm detects, at the between-run
    spread in ``report.between_run_sd``."""
    sd, share = cfg.report.between_run_sd, cfg.report.discordant_share
    if runs < 2:
        return "one run an arm gives no method-level test"
    found = runs_detectable_difference(runs, pairs, share, sd ** 2, power, alpha)
    return (f"{runs} runs of {pairs} pairs detect " + (f"{100 * found:.1f} points" if found is not None else "no difference")
            + f" at a between-run spread of {100 * sd:.1f} points (report.between_run_sd)")


def _row(games: list[dict]) -> dict[str, Any]:
    wins, n = sum(g["success"] for g in games), len(games)
    low, high = wilson_interval(wins, n)
    return {"games": n, "wins": wins, "success": wins / n if n else None, "ci95": [low, high],
            "mean_turns": sum(g["turns"] for g in games) / n if n else None}


def collect_results(cfg: ExperimentSettings) -> dict[str, Any]:
    """Everything ``results.json`` holds (module doc), from the run folder."""
    lay = Layout(cfg)
    base, evaluations, set_aside = read_evaluations(cfg, lay)
    # Every game's outcome, in one order for all arms, so that the file alone can be tested again
    # (paired by key) once the run folder is gone: two powered runs' folders were lost with their machines.
    keys = sorted(next(iter(evaluations.values()))) if evaluations else []
    two_player = lay.family.seats > 1
    arms = []
    for (m, s, i), g in sorted(evaluations.items()):
        arm = {"method": m, "seed": s, "iteration": i, **_row(list(g.values())),
               "won": "".join("1" if g[k]["success"] else "0" for k in keys)}
        if two_player:  # and each game's payoff share, the secondary outcome, as exactly
            arm["scores"] = [round(g[k]["score"], 6) for k in keys]
        if i > 0:
            arm.update(moved_from_parent(cfg, lay, evaluations, m, s, i, set_aside))
        arms.append(arm)
    preflight, behaviour = read_preflights(cfg, lay)
    return {"name": cfg.name, "game": cfg.game["name"], "two_player": two_player,
            "opponent": cfg.eval.opponent if two_player else None, "eval_games": games_of(cfg, cfg.eval),
            "eval_seed": cfg.eval.seed, "movement_rule": movement_rule(cfg), "preflight": preflight,
            "outcome_keys": keys, "arms": arms, "pooled": pooled_rows(cfg, base, evaluations),
            "paired_tests": paired_tests(cfg, evaluations, arms), "gradient_variance": read_gradient_variance(cfg, lay),
            "intention_recovery": read_recovery(lay), "behaviour": behaviour, "set_aside": set_aside}


def pooled_rows(cfg: ExperimentSettings, base: dict | None, evaluations: dict) -> list[dict[str, Any]]:
    """Success of the starting model, then of each arm and iteration, its seeds pooled."""
    pooled = []
    if base is not None:
        label = "warm start" if cfg.warm_start.enabled else "base model"
        pooled.append({"method": label, "iteration": 0, "seeds": 1, **_row(list(base.values()))})
    for method in cfg.methods:
        for it in range(1, iterations_of(cfg, method) + 1):
            seeds = [s for s in cfg.seeds if (method, s, it) in evaluations]
            if seeds:
                games = [g for s in seeds for g in evaluations[(method, s, it)].values()]
                pooled.append({"method": method, "iteration": it, "seeds": len(seeds), **_row(games)})
    return pooled


def paired_tests(cfg: ExperimentSettings, evaluations: dict, arms: list[dict]) -> list[dict[str, Any]]:
    """Each tested pair of arms at each iteration: the exact McNemar test of all pairs, per seed, over
    training runs, and the verdict its rule reads."""
    tests, two_player = [], family_of(cfg.game).seats > 1
    for first, second, it in [(x, y, it) for x, y in tested_pairs(cfg)
                              for it in range(1, max(iterations_of(cfg, m) for m in (x, y)) + 1)]:
        seeds = [s for s in cfg.seeds if (first, s, it) in evaluations and (second, s, it) in evaluations]
        if not seeds:
            continue
        a, b, per_seed, scores, deals = [], [], [], [], []
        for s in seeds:
            one, two = evaluations[(first, s, it)], evaluations[(second, s, it)]
            ids = sorted(set(one) & set(two))
            a_s, b_s = [bool(one[i]["success"]) for i in ids], [bool(two[i]["success"]) for i in ids]
            per_seed.append({"seed": s, **mcnemar(a_s, b_s)})
            a, b = a + a_s, b + b_s
            if two_player:
                scores.append(([one[i]["score"] for i in ids], [two[i]["score"] for i in ids]))
                deals.append([sum(games[i]["deal"] for i in ids) / len(ids) for games in (one, two)])
        test = {"first": first, "second": second, "iteration": it, "seeds": seeds, **mcnemar(a, b)}
        test.update(sensitivity(test))
        # Each seed is a training run of both arms (its own collection): the unit of a claim about the method.
        test["runs"] = {**pool_runs(per_seed), "per_seed": [
            {k: r[k] for k in ("seed", "pairs", "first_only", "second_only", "difference", "difference_ci95", "p_value")}
            for r in per_seed]}
        if test["runs"]["random_effects"] is not None:  # what these runs detect at their own spread and share
            test["runs"]["detectable_difference"] = runs_sensitivity(per_seed, test["runs"]["heterogeneity"]["tau2"])
        if two_player:  # payoff shares: what a win rate at its floor cannot show (a secondary outcome)
            pooled = pool_score_runs(scores)
            runs = pooled.pop("per_run")
            # a no deal scores 0.5, above most of a weak player's deals: the deal rates say which moved the share
            test["payoff_share"] = {**pooled, "per_seed": [{"seed": s, **r, "deal_rates": d} for s, r, d in zip(seeds, runs, deals)]}
        # Comparing arms that did not both move measures the evaluation's noise, not the methods.
        verdicts = {(r["method"], r["seed"]): r.get("movement", {}).get("moved") for r in arms
                    if r["iteration"] == it and r["method"] in (first, second) and r["seed"] in seeds}
        still = sorted(f"{m} seed {s}" for (m, s), moved in verdicts.items() if moved is False)
        unknown = sorted(f"{m} seed {s}" for (m, s), moved in verdicts.items() if moved is None)
        test["not_moved"], test["movement_unknown"] = still, unknown
        test["verdict_on"] = cfg.report.verdict_on
        test["verdict"] = verdict(test, still)
        tests.append(test)
    return tests


#: What a paired test's verdict reads (``report.verdict_on``): the method-level test over the seeds'
#: training runs, or the exact McNemar test of all pairs pooled (two fixed models a seed).
VERDICTS = ("runs", "pairs")


def verdict(test: dict[str, Any], not_moved: list[str]) -> str:
    """The verdict of one paired test under the rule ``test["verdict_on"]`` (fixed before the run)."""
    if not_moved:
        return "uninformative: the policy did not move"
    if test["verdict_on"] == "pairs":
        return "significant" if test["p_value"] < ALPHA else "not significant"
    method = test["runs"]["random_effects"]
    if method is None:
        return "no verdict on the method: one training run an arm"
    return "significant" if method["p_value"] < ALPHA else "not significant"


def preflight_row_name(row: dict) -> str:
    """``k = 8 (chosen, trained on)``, ``behavioural intentions = 175 (trained on)``: a pre-flight row's labels, step 2's
    choice and the labels the training set used (files written before ``trained`` was recorded say
    only which k step 2 chose)."""
    k = "/".join(map(str, sorted(set(row["k"].values()))))
    marks = [mark for mark, on in (("chosen", row["chosen"]), ("trained on", row.get("trained", False))) if on]
    name = f"behavioural intentions = {k}" if row.get("labels") == "behavioural" else f"k = {k}"
    return name + (f" ({', '.join(marks)})" if marks else "")


def moved_from_parent(cfg: ExperimentSettings, lay, evaluations: dict, method: str, seed: int, iteration: int,
                      set_aside: list[dict] | None = None) -> dict[str, Any]:
    """An arm against the model it started from: success paired by game (difference with its
    interval), and the movement measures with the verdict of ``report.movement`` (moved when the
    token KL and the share of weights changed at the served precision both reach their thresholds)."""
    out: dict[str, Any] = {}
    parent = evaluations.get((method, seed, iteration - 1))
    if parent is not None:
        ids = sorted(set(parent) & set(evaluations[(method, seed, iteration)]))
        test = mcnemar([bool(evaluations[(method, seed, iteration)][i]["success"]) for i in ids],
                       [bool(parent[i]["success"]) for i in ids])
        out["against_parent"] = {**{k: test[k] for k in ("pairs", "difference", "difference_ci95", "p_value")},
                                 **sensitivity(test)}
    try:
        m = read_movement(cfg, lay, method, seed, iteration)
    except SetAside as why:  # measured on another model or at other steps: not measured yet, and named
        m = None
        if set_aside is not None:
            set_aside.append(why.record(cfg, lay.movement(method, seed, iteration)))
    if m is not None:
        m["moved"] = moved(m, movement_rule(cfg))
        out["movement"] = m
    return out


def movement_rule(cfg: ExperimentSettings) -> dict[str, Any]:
    """The rule a trained arm is judged moved by (``report.movement``), as results.json records it."""
    m = cfg.report.movement
    return {"min_token_kl": m.min_token_kl, "kl_from": m.kl_from, "min_weight_share": m.min_weight_share,
            "min_kept_share": m.min_kept_share}


def moved(m: dict[str, Any], rule: dict[str, Any]) -> bool | None:
    """``report.movement``'s verdict on one arm's measures (:mod:`aria.experiment.movement`): its token KL (the
    mean, or the lower end of its interval) reaches ``min_token_kl``, and its weights changed at the
    served precision by ``min_weight_share`` of all and ``min_kept_share`` of those its update
    changed in float32. None where the rule asks for what the measures lack (a movement file
    written before the KL had an interval)."""
    if rule["kl_from"] == "lower_bound":
        if "token_kl_ci95" not in m:
            return None
        kl = m["token_kl_ci95"][0]
    else:
        kl = m["token_kl"]
    kept = kept_share(m["weights"])
    if kept is None and rule["min_kept_share"] > 0:
        return None
    return kl >= rule["min_token_kl"] and m["weights"]["share"] >= rule["min_weight_share"] and \
        (kept or 0.0) >= rule["min_kept_share"]


def kept_share(weights: dict[str, Any]) -> float | None:
    """Of the elements an update changed in float32, the share still changed at the served
    precision (:func:`aria.experiment.movement.weight_change_share`); None where the file has no counts."""
    if "kept_share" in weights:
        return weights["kept_share"]
    if "changed" not in weights or "changed_float32" not in weights:
        return None
    return weights["changed"] / weights["changed_float32"] if weights["changed_float32"] else 0.0


# ---- table.md: its words in table.md.j2, one macro a section --------------------------------------------
def _recovery_points(rec: dict[str, Any]) -> tuple[Any, int | None, int]:
    """(the chosen k, its index among the ks or None, the index of the best ARI) of an intention recovery."""
    ks, chosen = rec["ks"], rec["chosen_k"]
    k = next(iter(chosen.values())) if isinstance(chosen, dict) and len(chosen) == 1 else chosen
    at = ks.index(k) if isinstance(k, int) and k in ks else None
    return k, at, max(range(len(rec["ari"])), key=lambda i: rec["ari"][i])


@functools.cache
def _table_template():
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters.update(f=format, pts=lambda x: f"{100 * x:+.1f}", percent=percent, kept_share=kept_share,
                       preflight_k=lambda row: preflight_row_name(row).removeprefix("k = "),
                       recovery_points=_recovery_points, prefixed=lambda name, prefix: prefix + name, minutes=minutes,
                       won_ci=lambda r: f"{r['wins']} / {r['games']} ({percent(r['ci95'][0])}–{percent(r['ci95'][1])}%)")
    env.tests.update(measured=lambda arm: bool(arm.get("movement")), startswith=str.startswith)
    env.globals["alpha"] = ALPHA
    return env.get_template("table.md.j2")


def _section(name: str, data: dict[str, Any]) -> list[str]:
    """The lines of macro ``name`` of table.md.j2 (none when the section has nothing to say)."""
    text = str(getattr(_table_template().module, name)(data)).removesuffix("\n")  # a last row's own newline
    return text.split("\n") if text else []


def movement_rule_text(rule: dict[str, Any]) -> str:
    """The movement rule in a sentence (results written before its interval and kept share say less)."""
    return "\n".join(_section("rule_text", rule))


def render_table(results: dict[str, Any]) -> str:
    """``table.md`` (module doc): its sections in order, each a function of ``results`` that docs
    render too (aria/experiment/tables.py)."""
    lines = _section("header", results) + [""] + pooled_lines(results) + preflight_lines(results) \
        + movement_lines(results) + paired_lines(results) + gradient_lines(results) + behaviour_lines(results) \
        + recovery_lines(results) + _section("set_aside", results)
    return "\n".join(lines) + "\n"


def pooled_lines(results: dict[str, Any]) -> list[str]:
    """Success of every arm, the seeds pooled, then per seed."""
    return _section("pooled", results)


def preflight_lines(results: dict[str, Any]) -> list[str]:
    """The pre-flight of every collection: how many steps share their intention key."""
    return _section("preflight", results)


def movement_lines(results: dict[str, Any]) -> list[str]:
    """Each trained arm against the model it started from, with the movement verdict."""
    return _section("movement", results)


def paired_lines(results: dict[str, Any]) -> list[str]:
    """The paired tests between arms, over pairs and over training runs."""
    return _section("paired", results)


def gradient_lines(results: dict[str, Any]) -> list[str]:
    """Reward variance and the per-sample gradient's covariance of each weighting, per seed."""
    return _section("gradients", results)


def behaviour_lines(results: dict[str, Any]) -> list[str]:
    """The clusters against the behavioural intentions."""
    return _section("behaviour", results)


def recovery_lines(results: dict[str, Any]) -> list[str]:
    """Intention recovery on the expert's games."""
    return _section("recovery", results)


def runs_lines(t: dict[str, Any]) -> list[str]:
    """A paired test over training runs (``t["runs"]``, :func:`aria.statistics.pool_runs`) and the
    verdict its rule reads; nothing for results written before runs were pooled."""
    return _section("runs", t)


def minutes(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s"


def render_summary(results: dict[str, Any]) -> str:
    """A run's result in a few lines, as the README shows the main job's: where and how long, each
    arm's success, its gain over the model it started from (paired by target) with the interval
    and the difference those pairs detect, whether it moved, then the paired tests between arms."""
    return "\n".join(_section("summary", results)) + "\n"


def stage_lines(results: dict[str, Any]) -> list[str]:
    """Each stage's time of the run that wrote ``results`` (:func:`run_record`), in the order they ran."""
    return _section("stage_times", results)


def render_stage_times(results: dict[str, Any]) -> str:
    return "\n".join(stage_lines(results)) + "\n"


def plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib  # here: the file backend is chosen before pyplot loads, and only a plot pays for it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    base = [r for r in results["pooled"] if r["iteration"] == 0]
    methods = list(dict.fromkeys(r["method"] for r in results["pooled"] if r["iteration"] > 0))
    for i, method in enumerate(methods):
        rows = base + [r for r in results["pooled"] if r["method"] == method]
        x = [r["iteration"] + 0.04 * (i - len(methods) / 2) for r in rows]
        y = [100 * r["success"] for r in rows]
        err = [[100 * (r["success"] - r["ci95"][0]) for r in rows], [100 * (r["ci95"][1] - r["success"]) for r in rows]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=method)
    ax.set_xlabel("iteration (0 = the starting model)")
    ax.set_ylabel(f"{'win' if results.get('two_player') else 'success'} % (Wilson 95% CI)")
    ax.set_title(f"{results['name']}: {results['game']}")
    if methods:  # (a run of the starting model alone has no arm to name)
        ax.legend()
    fig.tight_layout()
    atomic_save_figure(fig, out, dpi=120)


def run_record(cfg: ExperimentSettings, wall_seconds: float | None = None, resumed: bool | None = None) -> dict[str, Any]:
    """Where and how long: each stage's seconds and the CPUs it ran on (the run folder's
    ``stage_times.json``; a stage resumed over several runs counts them all), ``cpu`` every machine
    the stages ran on (:func:`aria.llm.hardware.label`), and the wall time: the sum over every
    command that ran stages in the folder, with their command lines (``invocations.json``), else the
    given ``wall_seconds`` of this command (runs before that file) and whether it continued earlier ones. The machine that writes the
    report is ``reported_on``, never taken for the run's (``report_only`` runs no stage); stages
    timed before their machines were recorded leave the CPU unknown rather than guessed."""
    times_path, invocations_path = Path(cfg.run_dir) / "stage_times.json", Path(cfg.run_dir) / "invocations.json"
    times = read_checked(times_path, STAGE_TIMES) if times_path.is_file() else {}
    listed = read_checked(invocations_path, INVOCATIONS) if invocations_path.is_file() else []
    # A command killed outright (a lost machine, a session's end) has no end: timed to its last heartbeat
    # (aria.experiment.runner.Heartbeat, a minute at most short), else not timed at all (killed before heartbeats).
    invocations = [i for i in listed if "seconds" in i or "last_beat_seconds" in i]
    to_last_beat, untimed = sum("seconds" not in i for i in invocations), len(listed) - len(invocations)
    if invocations:  # every command that ran stages here (runs since 2026-12-07): their times summed, their command lines
        wall_seconds, resumed = sum(i.get("seconds", i.get("last_beat_seconds")) for i in invocations), len(listed) > 1
    finished = {name: t for name, t in times.items() if "seconds" in t}
    here = label(describe())
    record: dict[str, Any] = {"stage_seconds": {name: round(t["seconds"], 1) for name, t in finished.items()},
                              "stage_cpus": {name: t["cpus"] for name, t in finished.items() if t.get("cpus")},
                              "wall_seconds": None if wall_seconds is None else round(wall_seconds, 1), "resumed": resumed}
    if invocations:
        record["invocations"] = len(invocations)
        record["commands"] = list(dict.fromkeys(i["command"] for i in invocations if i.get("command")))
        record["timed_to_last_beat"], record["not_timed"] = to_last_beat, untimed
    cpus = list(dict.fromkeys(c for t in finished.values() for c in t.get("cpus", [])))
    unknown = sum(not t.get("cpus") for t in finished.values())
    if cpus:
        record["cpu"] = " / ".join(cpus) + (f" ({unknown} stage{'s' * (unknown > 1)} on a machine not recorded)" if unknown else "")
    record["reported_on"] = here
    return record


def write_results(cfg: ExperimentSettings, run: dict[str, Any] | None = None, unrecorded: Sequence[str] = ()) -> Path:
    """``results.json``, ``table.md`` and the plot (module doc); ``run`` (:func:`run_record`) says
    where and how long the run that wrote them took; ``unrecorded``, the settings the run did not
    record (a report of a run older than them: :func:`aria.experiment.runner.as_recorded`)."""
    out = Path(cfg.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = {**collect_results(cfg), "run": run or run_record(cfg)}
    if unrecorded:
        results["settings_not_recorded"] = list(unrecorded)
    # everything that reads the data first: a run folder the template cannot render leaves the
    # results of the last report whole, not a new results.json beside an old table.md
    table = render_table(results)
    if results["pooled"]:
        plot(results, out / "success_vs_iteration.png")
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "table.md", table)
    return out
