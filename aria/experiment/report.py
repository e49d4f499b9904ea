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
  game) with intervals and mean turns, then the paired test and the variances, in words.
* ``success_vs_iteration.png``: success per iteration and method, with the intervals.

The statistics (Wilson intervals, the exact McNemar test of two arms on the same targets and
its sensitivity) are :mod:`aria.statistics`, shared with the evaluation harness.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from aria.experiment.layout import Layout, games_of, iterations_of, seeds_of
from aria.experiment.settings import ExperimentSettings
from aria.games.family import family_of
from aria.io import atomic_save_figure, atomic_write_json, atomic_write_text, read_json
from aria.llm.hardware import describe, label
from aria.power import detectable_difference, runs_detectable_difference
from aria.statistics import ALPHA, POWER, mcnemar, percent, pool_runs, sensitivity, wilson_interval
from aria.trajectories import read_trajectories


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


def outcomes(path: Path, family, expected: set[str]) -> dict[str, dict] | None:
    """An arm's evaluation games as ``{pair key: {"success", "turns"}}``, or None until every game
    of ``expected`` (:func:`evaluation_ids`) is played in every seat. Only those count: a file that
    holds more (an evaluation since lowered from more games) reports the games the settings name,
    so a table always agrees with its header. success = the policy won (a question game: found the
    target), turns = the policy's own. A question game's games are keyed by game id; a two-player
    game's (``path`` the folder of ``as_alice.jsonl`` and ``as_bob.jsonl``) by seat and game id, so
    arms pair by configuration and seat."""

    out = {}
    for file, role in family.evaluation_seats(path):
        records = read_trajectories(file, allow_partial_last_line=True) if file.is_file() else []
        games = {r["game_id"]: r for r in records if r.get("status") != "failed" and r["game_id"] in expected}
        if len(games) < len(expected):
            return None
        out.update({f"{role}:{gid}" if role else gid: {"success": family.won(r, role), "turns": family.turns(r, role)}
                    for gid, r in games.items()})
    return out


def evaluation_ids(cfg: ExperimentSettings) -> set[str]:
    """The game ids of one arm's evaluation under the settings (``eval``): game ``i`` of the
    evaluation seed for ``i < eval.games``, or of every configuration of ``eval.config_set``."""

    return family_of(cfg.game).evaluation_ids(cfg)


def _row(games: list[dict]) -> dict[str, Any]:
    wins, n = sum(g["success"] for g in games), len(games)
    low, high = wilson_interval(wins, n)
    return {"games": n, "wins": wins, "success": wins / n if n else None, "ci95": [low, high],
            "mean_turns": sum(g["turns"] for g in games) / n if n else None}


def collect_results(cfg: ExperimentSettings) -> dict[str, Any]:
    """Everything ``results.json`` holds (module doc), from the run folder."""
    lay = Layout(cfg)
    base, evaluations = read_evaluations(cfg, lay)
    # Every game's outcome, in one order for all arms, so that the file alone can be tested again
    # (paired by key) once the run folder is gone: two powered runs' folders were lost with their machines.
    keys = sorted(next(iter(evaluations.values()))) if evaluations else []
    arms = [{"method": m, "seed": s, "iteration": i, **_row(list(g.values())),
             "won": "".join("1" if g[k]["success"] else "0" for k in keys)} for (m, s, i), g in sorted(evaluations.items())]
    for arm in arms:
        if arm["iteration"] > 0:
            arm.update(moved_from_parent(cfg, lay, evaluations, arm["method"], arm["seed"], arm["iteration"]))
    preflight, behaviour = read_preflights(cfg, lay)
    two_player = lay.family.seats > 1
    return {"name": cfg.name, "game": cfg.game["name"], "two_player": two_player,
            "opponent": cfg.eval.opponent if two_player else None, "eval_games": games_of(cfg, cfg.eval),
            "eval_seed": cfg.eval.seed, "movement_rule": movement_rule(cfg), "preflight": preflight,
            "outcome_keys": keys, "arms": arms, "pooled": pooled_rows(cfg, base, evaluations),
            "paired_tests": paired_tests(cfg, evaluations, arms), "gradient_variance": read_gradient_variance(cfg, lay),
            "intention_recovery": read_recovery(lay), "behaviour": behaviour}


def read_evaluations(cfg: ExperimentSettings, lay: Layout) -> tuple[dict | None, dict[tuple[str, int, int], dict[str, dict]]]:
    """The starting model's evaluation (None until it is finished), and each finished evaluation's
    games by id under (method, seed, iteration), the starting model's as iteration 0 of every arm."""
    expected, evaluations = evaluation_ids(cfg), {}
    base_games = outcomes(lay.evaluation("", 0, 0), lay.family, expected)
    for seed in cfg.seeds:
        for method in cfg.methods:
            if base_games is not None:
                evaluations[(method, seed, 0)] = base_games
            for it in range(1, iterations_of(cfg, method) + 1):
                games = outcomes(lay.evaluation(method, seed, it), lay.family, expected)
                if games is not None:
                    evaluations[(method, seed, it)] = games
    return base_games, evaluations


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
    tests = []
    for first, second, it in [(x, y, it) for x, y in tested_pairs(cfg)
                              for it in range(1, max(iterations_of(cfg, m) for m in (x, y)) + 1)]:
        seeds = [s for s in cfg.seeds if (first, s, it) in evaluations and (second, s, it) in evaluations]
        if not seeds:
            continue
        a, b, per_seed = [], [], []
        for s in seeds:
            ids = sorted(set(evaluations[(first, s, it)]) & set(evaluations[(second, s, it)]))
            a_s = [bool(evaluations[(first, s, it)][i]["success"]) for i in ids]
            b_s = [bool(evaluations[(second, s, it)][i]["success"]) for i in ids]
            per_seed.append({"seed": s, **mcnemar(a_s, b_s)})
            a, b = a + a_s, b + b_s
        test = {"first": first, "second": second, "iteration": it, "seeds": seeds, **mcnemar(a, b)}
        test.update(sensitivity(test))
        # Each seed is a training run of both arms (its own collection): the unit of a claim about the method.
        test["runs"] = {**pool_runs(per_seed), "per_seed": [
            {k: r[k] for k in ("seed", "pairs", "first_only", "second_only", "difference", "difference_ci95", "p_value")}
            for r in per_seed]}
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


def read_gradient_variance(cfg: ExperimentSettings, lay: Layout) -> dict[str, dict]:
    """Each seed's gradient-variance stage, by seed."""
    variance = {}
    for seed in cfg.seeds:
        path = lay.shared(seed) / "grad_variance.json"
        if path.is_file():
            variance[str(seed)] = {k: v for k, v in read_json(path).items() if k != "key"}
    return variance


def read_recovery(lay: Layout) -> dict[str, Any] | None:
    """Intention recovery on the expert's games (the warm start's labelling), if it ran."""
    selection = lay.warm / "intention" / "selection.json"
    if not selection.is_file():
        return None
    s = read_json(selection)
    return {"chosen_k": s["chosen"]["k"], "ks": s["ks"], **(s.get("intention_recovery") or {})}


def read_preflights(cfg: ExperimentSettings, lay: Layout) -> tuple[dict[str, dict], dict[str, dict]]:
    """Each collection's pre-flight, and its clusters against the behavioural intentions, by collection."""
    preflight, behaviour = {}, {}
    for seed in cfg.seeds:
        for method in cfg.methods:
            for it in range(1, iterations_of(cfg, method) + 1):
                where = lay.intention(method, seed, it) / "preflight.json"
                shared = where == lay.intention("", seed, it) / "preflight.json"
                name = f"seed {seed}, iteration 1 (shared)" if shared else f"seed {seed}, {method}, iteration {it}"
                if where.is_file() and name not in preflight:
                    preflight[name] = read_json(where)
                    against = behaviour_at_chosen_k(where.parent / "selection.json")
                    if against:
                        behaviour[name] = against
    return preflight, behaviour


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


def behaviour_at_chosen_k(selection_path: Path) -> dict | None:
    """A collection's clusters against its behavioural intentions (step 2's ``behaviour``
    section) at the chosen k, and the k whose R~ is closest to the behavioural R~."""
    if not selection_path.is_file():
        return None
    s = read_json(selection_path)
    b = s.get("behaviour")
    if not b or "mse" not in b or len(set(s["chosen"]["k"].values())) != 1:
        return None
    ks, k = s["ks"], next(iter(s["chosen"]["k"].values()))
    at, best = ks.index(k), min(range(len(ks)), key=lambda i: b["mse"][i])
    pick = lambda i: {name: b[name][i] for name in ("ari", "nmi", "mse", "bias_squared", "variance_within")}  # noqa: E731
    return {"intentions": b["step_intentions"], "steps": s["num_steps"], "chosen_k": k, "at_chosen_k": pick(at),
            "closest_k": ks[best], "at_closest_k": pick(best)}


def moved_from_parent(cfg: ExperimentSettings, lay, evaluations: dict, method: str, seed: int, iteration: int) -> dict[str, Any]:
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
    path = lay.movement(method, seed, iteration)
    if path.is_file():
        m = read_json(path)
        m.pop("key", None)
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


def movement_rule_text(rule: dict[str, Any]) -> str:
    """The movement rule in a sentence (results written before its interval and kept share say less)."""
    kl = ("the lower end of its KL's 95% interval (over games)" if rule.get("kl_from") == "lower_bound" else "its KL")
    kept = (f", and at least {percent(rule['min_kept_share'])}% of the elements its update changed in float32 still "
            "differ there" if rule.get("min_kept_share") else "")
    return (f"An arm moved when {kl} is at least {rule.get('min_token_kl')}, at least "
            f"{percent(rule.get('min_weight_share'))}% of its weights changed at the served precision{kept} "
            "(report.movement, fixed before the run).")


def measure_of(results: dict[str, Any]) -> str:
    return "win %" if results.get("two_player") else "success %"


def render_table(results: dict[str, Any]) -> str:
    """``table.md`` (module doc): its sections in order, each a function of ``results`` that docs
    render too (aria/experiment/tables.py)."""
    if results.get("two_player"):
        opponent = ", ".join(f"{k} {v}" for k, v in results["opponent"].items())
        lines = [f"# {results['name']}: win rate on {results['game']} against the opponent ({opponent})", "",
                 f"{results['eval_games']} evaluation games per arm, seed and seat, the same configurations for every "
                 f"arm; a win is a higher payoff than the opponent's; turns are the policy's own; rows pool the seeds.", ""]
    else:
        lines = [f"# {results['name']}: success on {results['game']}", "",
                 f"{results['eval_games']} evaluation games per arm and seed, the same seeded targets for every arm "
                 f"(evaluation seed {results['eval_seed']}); rows pool the seeds.", ""]
    lines += pooled_lines(results) + preflight_lines(results) + movement_lines(results) + paired_lines(results) \
        + gradient_lines(results) + behaviour_lines(results) + recovery_lines(results)
    return "\n".join(lines) + "\n"


def pooled_lines(results: dict[str, Any]) -> list[str]:
    """Success of every arm, the seeds pooled, then per seed."""
    measure = measure_of(results)
    lines = [f"| method | iteration | seeds | {measure} | 95% CI (Wilson) | wins / games | mean turns |",
             "|---|---|---|---|---|---|---|"]
    for r in results["pooled"]:
        lines.append(f"| {r['method']} | {r['iteration']} | {r['seeds']} | {percent(r['success'])} | "
                     f"{percent(r['ci95'][0])}–{percent(r['ci95'][1])} | {r['wins']} / {r['games']} | {r['mean_turns']:.2f} |")
    if results["arms"]:
        lines += ["", "Per seed:", "", f"| method | seed | iteration | {measure} | 95% CI | mean turns |", "|---|---|---|---|---|---|"]
        for r in results["arms"]:
            if r["iteration"] > 0:
                lines.append(f"| {r['method']} | {r['seed']} | {r['iteration']} | {percent(r['success'])} | "
                             f"{percent(r['ci95'][0])}–{percent(r['ci95'][1])} | {r['mean_turns']:.2f} |")
    return lines


def preflight_lines(results: dict[str, Any]) -> list[str]:
    """The pre-flight of every collection: how many steps share their intention key."""
    lines: list[str] = []
    if results.get("preflight"):
        lines += ["", "**Pre-flight: can aggregation change anything?** Measured on each collection after labelling, "
                  "before training: the share of steps whose intention key (history and action) another step of the "
                  "same role shares, over all steps and by turn, the mean |R̃ − R| and Var(R̃)/Var(R). A step alone "
                  "at its key gets its own return, so where few steps share, ARIA trains as its ablation.", "",
                  "| collection | k | steps sharing | by turn | mean abs(R̃ − R) | Var(R̃)/Var(R) |", "|---|---|---|---|---|---|"]
        for name, found in results["preflight"].items():
            for r in found["rows"]:
                k = preflight_row_name(r).removeprefix("k = ")
                turns = ", ".join(f"{t}: {percent(v)}" for t, v in r["shared_by_turn"].items())
                ratio = "–" if r["variance_ratio"] is None else f"{r['variance_ratio']:.3f}"
                mean = "–" if r["mean_abs_change"] is None else f"{r['mean_abs_change']:.4f}"
                lines.append(f"| {name} ({found['steps']} steps) | {k} | {percent(r['shared'])}% | {turns} | {mean} | {ratio} |")
    return lines


def movement_lines(results: dict[str, Any]) -> list[str]:
    """Each trained arm against the model it started from, with the movement verdict."""
    lines: list[str] = []
    moved = [r for r in results["arms"] if r.get("movement")]
    if moved:
        rule = results.get("movement_rule") or {}
        lines += ["", "**Did training move the policy?** Each arm against the model it started from, on "
                  f"{moved[0]['movement']['steps']} held-out steps of the iteration-0 evaluation games: mean per-token "
                  "KL, mean change of the action's log-probability on steps of won and of lost games, the share of "
                  "weights that differ at the precision the model is served in, success against the parent "
                  "on the same targets, and the difference those pairs detect with 80% power at their discordant share. "
                  + movement_rule_text(rule), "",
                  "| method | seed | iteration | token KL | Δ log-prob won / lost | weights changed | success vs parent (95% CI) "
                  "| its pairs detect | moved |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in moved:
            m, p = r["movement"], r.get("against_parent")
            delta = " / ".join("–" if x is None else f"{x:+.3f}" for x in (m["logprob_change_won"], m["logprob_change_lost"]))
            vs = ("–" if p is None else f"{100 * p['difference']:+.1f} ({100 * p['difference_ci95'][0]:+.1f} to "
                  f"{100 * p['difference_ci95'][1]:+.1f})")
            found = (p or {}).get("detectable_difference")  # at 80% power, at the discordant share these pairs had
            detects = "–" if found is None else f"{100 * found:.1f} points"
            kl = f"{m['token_kl']:.4g}" + (f" ({m['token_kl_ci95'][0]:.4g}–{m['token_kl_ci95'][1]:.4g})"
                                           if "token_kl_ci95" in m else "")
            kept = kept_share(m["weights"])
            lines.append(f"| {r['method']} | {r['seed']} | {r['iteration']} | {kl} | {delta} | "
                         f"{100 * m['weights']['share']:.2f}% at {m['weights']['dtype']}"
                         + ("" if kept is None else f" ({100 * kept:.0f}% of float32's)")
                         + f" | {vs} | {detects} | {'not measured' if m['moved'] is None else 'yes' if m['moved'] else '**no**'} |")
    return lines


def paired_lines(results: dict[str, Any]) -> list[str]:
    """The paired tests between arms, over pairs and over training runs."""
    lines: list[str] = []
    for t in results["paired_tests"]:
        significant = t["p_value"] < ALPHA
        lines += ["", f"**Paired test, iteration {t['iteration']}** ({t['first']} against {t['second']}, "
                  f"{t['pairs']} games paired by seed and {'configuration and seat' if results.get('two_player') else 'target'}): "
                  f"{t['first']} alone won {t['first_only']}, "
                  f"{t['second']} alone won {t['second_only']}, both won {t['both']}. Difference of success rates "
                  f"{100 * t['difference']:+.1f} points (95% CI {100 * t['difference_ci95'][0]:+.1f} to "
                  f"{100 * t['difference_ci95'][1]:+.1f}); exact McNemar p = {t['p_value']:.3g}: "
                  + f"**{'significant' if significant else 'not significant'}** at the {100 * ALPHA:g}% level."]
        lines += runs_lines(t)
        if t.get("not_moved"):
            lines.append(f"**Uninformative: the policy did not move** (by the movement rule above: "
                         f"{', '.join(t['not_moved'])}), so this test measures the evaluation's noise, not the methods.")
        elif t.get("movement_unknown"):
            lines.append(f"Whether the policy moved is not measured for {', '.join(t['movement_unknown'])}.")
        if "discordant_share" in t:
            found = t["detectable_difference"]
            lines.append(f"What this test can see: {100 * t['discordant_share']:.1f}% of the pairs were won by one arm "
                         f"only; at that share, {t['pairs']} pairs "
                         + (f"detect a difference of {100 * found:.1f} points or more with {100 * t['power']:.0f}% power "
                            f"(aria/power.py)." if found is not None
                            else f"are too few for any difference to reach {100 * t['power']:.0f}% power."))
    return lines


def gradient_lines(results: dict[str, Any]) -> list[str]:
    """Reward variance and the per-sample gradient's covariance of each weighting, per seed."""
    lines: list[str] = []
    for seed, v in results["gradient_variance"].items():
        # in self-play every game is two players' games, each won or not
        games = (f"{v['games']} players' games (both seats of {v['games'] // 2} self-play games), {v['games_won']} won"
                 if results.get("two_player") else f"{v['games']} games, {v['games_won']} won")
        lines += ["", f"**Rewards and gradients, seed {seed}** (iteration-1 training set, {v['samples']} samples of "
                  f"{games}):", "",
                  "| weighting | reward variance | tr Cov of the per-sample gradient | signal-to-noise |", "|---|---|---|---|"]
        for kind in ["raw_step_return", "aggregated_reward", *[f"method_{m}" for m in v["methods"]]]:
            snr = v.get(f"snr_{kind}")
            lines.append(f"| {kind} | {v[f'reward_variance_{kind}']:.4g} | {v[f'trace_cov_{kind}']:.4g} | "
                         f"{'–' if snr is None else f'{snr:.4g}'} |")
    return lines


def behaviour_lines(results: dict[str, Any]) -> list[str]:
    """The clusters against the behavioural intentions."""
    lines: list[str] = []
    if results.get("behaviour"):
        lines += ["", "**The clusters against the behavioural intentions** (utterances alike when the game's offline "
                  "oracle answers them alike for every target; docs/method.md §4): ARI and NMI of the steps' labels "
                  "against them, and how far R̃ is from R̃ under them, mean (R̃_k − R̃_b)² = bias² (clusters merging "
                  "intentions) + variance within (clusters splitting them).", "",
                  "| collection | behavioural intentions | k | ARI | NMI | bias² | variance within | sum |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, b in results["behaviour"].items():
            for label, k, found in (("chosen", b["chosen_k"], b["at_chosen_k"]), ("closest", b["closest_k"], b["at_closest_k"])):
                lines.append(f"| {name} ({b['steps']} steps) | {b['intentions']} | {k} ({label}) | {found['ari']:.3f} | "
                             f"{found['nmi']:.3f} | {found['bias_squared']:.4g} | {found['variance_within']:.4g} | "
                             f"{found['mse']:.4g} |")
    return lines


def recovery_lines(results: dict[str, Any]) -> list[str]:
    """Intention recovery on the expert's games."""
    lines: list[str] = []
    rec = results.get("intention_recovery")
    if rec and rec.get("ari"):
        ks, chosen = rec["ks"], rec["chosen_k"]
        k = next(iter(chosen.values())) if isinstance(chosen, dict) and len(chosen) == 1 else chosen
        at = ks.index(k) if isinstance(k, int) and k in ks else None
        best = max(range(len(rec["ari"])), key=lambda i: rec["ari"][i])
        lines += ["", f"**Intention recovery** on the expert's games ({rec['steps']} steps, {rec['intentions']} true "
                  f"intentions; adjusted Rand index and NMI of the labels against them): chosen k = {k}"
                  + (f", ARI {rec['ari'][at]:.3f}, NMI {rec['nmi'][at]:.3f}" if at is not None else "")
                  + f"; best ARI {rec['ari'][best]:.3f} (NMI {rec['nmi'][best]:.3f}) at k = {ks[best]}."]
    return lines


def runs_lines(t: dict[str, Any]) -> list[str]:
    """A paired test over training runs (``t["runs"]``, :func:`aria.statistics.pool_runs`) and the
    verdict its rule reads; nothing for results written before runs were pooled."""
    r = t.get("runs")
    if not r:
        return []
    pts = lambda x: f"{100 * x:+.1f}"  # noqa: E731
    per = "; ".join(f"seed {x['seed']} {pts(x['difference'])} ({pts(x['difference_ci95'][0])} to "
                    f"{pts(x['difference_ci95'][1])}, p = {x['p_value']:.2g})" for x in r["per_seed"])
    lines = [f"**Over training runs** (each seed trains both arms on its own collection; a claim about the method "
             f"pools runs, not games), per seed: {per}."]
    re, h = r["random_effects"], r["heterogeneity"]
    if re is None:
        lines.append("One training run an arm: no interval for the method (the between-run variance cannot be "
                     "estimated from one run); the test above compares two trained models.")
    else:
        lines.append(f"Runs as a random effect: {pts(re['difference'])} points (95% CI {pts(re['ci95'][0])} to "
                     f"{pts(re['ci95'][1])}, Hartung-Knapp, t with {re['df']} df, p = {re['p_value']:.2g}; "
                     f"DerSimonian-Laird's normal interval {pts(re['ci95_normal'][0])} to {pts(re['ci95_normal'][1])}); "
                     f"between-run spread τ = {100 * h['tau2'] ** 0.5:.1f} points, I² = {100 * h['i2']:.0f}% "
                     f"(Q = {h['q']:.2f}, p = {h['p_value']:.2g}); the stratified exact test of the pooled pairs "
                     f"p = {r['pairs_pooled']['p_value']:.2g}.")
    lines.append(f"Verdict (report.verdict_on = {t['verdict_on']}, fixed before the run): **{t['verdict']}**.")
    return lines


def minutes(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s"


def render_summary(results: dict[str, Any]) -> str:
    """A run's result in a few lines, as the README shows the main job's: where and how long, each
    arm's success, its gain over the model it started from (paired by target) with the interval
    and the difference those pairs detect, whether it moved, then the paired tests between arms."""
    run = results.get("run") or {}
    wall = "wall time not recorded" if run.get("wall_seconds") is None else \
        f"{minutes(run['wall_seconds'])} wall{' over several runs' if run.get('resumed') else ''}"
    lines = [f"`{results['name']}` on {results['game']}, {results['eval_games']} evaluation games an arm on the same "
             f"targets; {run.get('cpu', 'CPU not recorded')}, {wall}:", "",
             "| arm | success (95% CI) | gain over its start, paired (95% CI) | its pairs detect | token KL | moved |",
             "|---|---|---|---|---|---|"]
    ci = lambda r: f"{r['wins']} / {r['games']} ({percent(r['ci95'][0])}–{percent(r['ci95'][1])}%)"  # noqa: E731
    points = lambda x: f"{100 * x:+.1f}"  # noqa: E731
    for r in results["pooled"]:
        if r["iteration"] == 0:
            lines.append(f"| {r['method']} | {ci(r)} | – | – | – | – |")
    for r in results["arms"]:
        if r["iteration"] == 0:
            continue
        p, m = r.get("against_parent"), r.get("movement")
        gain = "–" if p is None else f"{points(p['difference'])} ({points(p['difference_ci95'][0])} to {points(p['difference_ci95'][1])})"
        detects = "–" if p is None else "no gain at 80% power" if p.get("detectable_difference") is None else \
            f"{100 * p['detectable_difference']:.1f} points"  # too few discordant pairs for any
        name = r["method"] + (f" (seed {r['seed']})" if len({a["seed"] for a in results["arms"]}) > 1 else "") + \
            (f", iteration {r['iteration']}" if max(a["iteration"] for a in results["arms"]) > 1 else "")
        moved = "not measured" if m is None else ("yes" if m["moved"] else "**no**")
        kl = "–" if m is None else f"{m['token_kl']:.3f}"
        lines.append(f"| {name} | {ci(r)} | {gain} | {detects} | {kl} | {moved} |")
    for t in results["paired_tests"]:
        verdict = t.get("verdict", "significant" if t["p_value"] < ALPHA else "not significant")
        lines += ["", f"{t['first']} against {t['second']}, paired on {t['pairs']} targets: {points(t['difference'])} points "
                  f"(95% CI {points(t['difference_ci95'][0])} to {points(t['difference_ci95'][1])}), exact McNemar "
                  f"p = {t['p_value']:.2g}" + (f": {verdict}." if "runs" not in t else ".")]
        if "runs" in t:
            re = t["runs"]["random_effects"]
            lines.append("Over training runs: " + ("one run an arm, no interval for the method" if re is None else
                         f"{points(re['difference'])} points (95% CI {points(re['ci95'][0])} to {points(re['ci95'][1])}, "
                         f"{t['runs']['runs']} runs, p = {re['p_value']:.2g})") + f"; verdict ({t['verdict_on']}): {verdict}.")
    return "\n".join(lines) + "\n"


def render_stage_times(results: dict[str, Any]) -> str:
    """Each stage's time of the run that wrote ``results`` (:func:`run_record`), in the order they ran."""
    run = results.get("run") or {}
    stages = run.get("stage_seconds") or {}
    lines = [f"Stages on {run.get('cpu', 'a CPU not recorded')}:", "", "| stage | time |", "|---|---|"]
    lines += [f"| {name} | {minutes(seconds)} |" for name, seconds in stages.items()]
    lines.append(f"| all stages | {minutes(sum(stages.values()))} |")
    if run.get("wall_seconds") is not None:
        lines.append(f"| the command, start to end{' (over several runs)' if run.get('resumed') else ''} | "
                     f"{minutes(run['wall_seconds'])} |")
    return "\n".join(lines) + "\n"


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
    """Where and how long: the CPU (:func:`aria.llm.hardware.describe`), each stage's seconds (the
    run folder's ``stage_times.json``; a stage resumed over several runs counts them all), and, from
    the command that ran the stages, its wall time and whether it continued an earlier run's stages."""

    times_path = Path(cfg.run_dir) / "stage_times.json"
    stages = {name: round(t["seconds"], 1) for name, t in read_json(times_path).items() if "seconds" in t} \
        if times_path.is_file() else {}
    machine = describe()
    return {"cpu": label(machine), "machine": machine, "stage_seconds": stages,
            "wall_seconds": None if wall_seconds is None else round(wall_seconds, 1), "resumed": resumed}


def write_results(cfg: ExperimentSettings, run: dict[str, Any] | None = None) -> Path:
    """``results.json``, ``table.md`` and the plot (module doc); ``run`` (:func:`run_record`) says
    where and how long the run that wrote them took."""
    out = Path(cfg.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = {**collect_results(cfg), "run": run or run_record(cfg)}
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "table.md", render_table(results))
    if results["pooled"]:
        plot(results, out / "success_vs_iteration.png")
    return out
