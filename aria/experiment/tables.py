"""Tables of README and docs/ rendered from committed runs, so that the text cannot drift from the data.

A Markdown file holds a rendered block between two markers::

    <!-- rendered: aggregation -->
    ...
    <!-- /rendered: aggregation -->

and :data:`BLOCKS` names the function that writes each block from the committed files under
``results/experiments/`` (each run's ``results.json``, and ``outcomes.json`` where a run's
results predate the per-game outcomes). A block ``SECTION:FOLDER`` is one section of a run's own
table (:data:`SECTIONS`, the functions that write ``table.md``; ``reevaluated`` shows models played
again with more games by ``scripts/reevaluate.py``) from ``FOLDER``'s results.json. ``python scripts/render_docs.py`` rewrites every block in
place; ``--check`` (and ``tests/test_docs.py``) fails naming the file and block whose text is not
its rendering. A figure typed into a block is overwritten; one typed outside a block is not
checked, so results belong in blocks. The ``benchmarks`` block of docs/benchmarks.md is the
summary of the committed benchmark reports under ``benchmarks/results/``, each row written by the
``headline`` function of the script that wrote the report (:data:`BENCHMARK_ROWS`).
"""
from __future__ import annotations

import functools
import math
import importlib.util
import re
from pathlib import Path
from typing import Any, Callable

from aria.experiment import report
from aria.io import DataError, read_json
from aria.llm.hardware import label
from aria.power import runs_detectable_difference, runs_needed
from aria.statistics import mcnemar, pool_runs, runs_sensitivity, sensitivity, wilson_interval

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "experiments"
BENCHMARK_RESULTS = REPO / "benchmarks" / "results"
#: The Markdown files that may hold rendered blocks.
DOCUMENTS = ("README.md", "docs/experiments.md", "docs/benchmarks.md", "docs/testing.md", "docs/pipeline.md")
MARK = re.compile(r"<!-- rendered: (?P<name>[\w:-]+) -->\n(?P<body>.*?)<!-- /rendered: (?P=name) -->", re.S)


def seed_tests(folder: str, first: str, second: str, iteration: int = 1) -> list[dict[str, Any]]:
    """One paired test a seed (a training run of both arms) of a committed run: from the arms'
    ``won`` strings of ``results.json`` (games in ``outcome_keys`` order; none where no seed has both
    arms yet), or, for a run reported before those strings, from its ``outcomes.json`` (keyed by game)."""
    results = read_json(RESULTS / folder / "results.json")
    if any("won" in a for a in results["arms"]):  # a run reported with per-game outcomes: the seeds with both arms so far
        won = {(a["method"], a["seed"]): a["won"] for a in results["arms"] if a["iteration"] == iteration and "won" in a}
        seeds = sorted({s for m, s in won if m == first} & {s for m, s in won if m == second})
        return [{"seed": s, **mcnemar([c == "1" for c in won[(first, s)]], [c == "1" for c in won[(second, s)]])}
                for s in seeds]
    arms = read_json(RESULTS / folder / "outcomes.json")["arms"]
    names = {seed: [f"{m}, seed {seed}, iteration {iteration}" for m in (first, second)]
             for seed in sorted({a["seed"] for a in results["arms"]})}
    return [{"seed": seed, **paired_outcomes(arms, *pair)} for seed, pair in names.items() if all(n in arms for n in pair)]


def paired_outcomes(arms: dict[str, dict], first: str, second: str) -> dict[str, Any]:
    """The exact McNemar test of two arms of an ``outcomes.json`` (their games paired by key), with
    what its pairs detect (:func:`aria.statistics.sensitivity`)."""
    a, b = arms[first]["outcomes"], arms[second]["outcomes"]
    keys = sorted(set(a) & set(b))
    test = mcnemar([bool(a[k][0]) for k in keys], [bool(b[k][0]) for k in keys])
    return {**test, **sensitivity(test)}


def _points(x: float) -> str:
    return f"{100 * x:+.1f}".replace("-", "−")


def _interval(pair: list[float]) -> str:
    return f"{_points(pair[0])} to {_points(pair[1])}"


def _row(label: str, tests: list[dict[str, Any]], verdict: str) -> str:
    pooled = pool_runs(tests)
    pairs, method = pooled["pairs_pooled"], pooled["random_effects"]
    per_run = ", ".join(_points(t["difference"]) for t in tests)
    n = sum(t["pairs"] for t in tests)
    p = lambda x: f"{x:.2g}"  # noqa: E731
    if method is None:
        method_cell, spread, detects = "– (one run)", "–", "–"
    else:
        method_cell = f"{_points(method['difference'])} ({_interval(method['ci95'])}), p = {p(method['p_value'])}"
        tau2 = pooled["heterogeneity"]["tau2"]
        spread = f"{100 * tau2 ** 0.5:.1f}"
        found = runs_sensitivity(tests, tau2)  # at their own spread and discordant share, as the runner's results.json
        detects = "no difference" if found is None else f"{100 * found:.1f}"
    return (f"| {label} | {len(tests)} | {per_run} | {_points(pairs['difference'])} ({_interval(pairs['ci95'])}), "
            f"{n:,} pairs, p = {p(pairs['p_value'])} | {method_cell} | {spread} | {detects} | {verdict} |")


#: The committed comparisons of ARIA against its ablation: (game, folder) in the order shown. A folder
#: not committed yet (a run still going) is a row saying so.
COMPARISONS = (("Twenty Questions", "powered"), ("Twenty Questions", "grouping"), ("Twenty Questions", "replicated"),
               ("Guess My City", "powered_gmc"), ("Bargaining", "bargaining_powered"), ("Negotiation", "negotiation"))
#: Runs pooled after the fact, with no rule fixed before them: (label, folders), shown after the last of its folders.
POOLED_AFTER_THE_FACT = (("Twenty Questions, `powered` and `grouping` pooled (after the fact; code 84 commits apart)",
                          ("powered", "grouping")),)


def planned_verdict(folder: str, first: str = "aria", second: str = "no_aggregation") -> str:
    """The verdict of ``first`` against ``second`` under the rule its run's preset fixed before it ran."""
    tests = read_json(RESULTS / folder / "results.json")["paired_tests"]
    for t in tests:
        if (t["first"], t["second"], t["iteration"]) == (first, second, 1):
            return t["verdict"]
    raise DataError(f"results/experiments/{folder}/results.json", None, "paired_tests",
                    f"no paired test of {first} against {second} at iteration 1")


def aggregation() -> str:
    """ARIA against its ablation, every committed comparison: per training run, the pairs pooled as
    one run (two fixed models a seed), and the method over runs (aria.statistics.pool_runs)."""
    lines = ["| game, run | training runs | ARIA − ablation per run, points | pairs pooled (95% CI), stratified exact p "
             "| over runs: the method (95% CI, Hartung-Knapp) | between-run spread τ, points "
             "| the runs detect, points (80% power, at their τ and discordant share) | verdict of the rule fixed before the run |",
             "|---|---|---|---|---|---|---|---|"]
    tests = {}
    for game, folder in COMPARISONS:
        if not (RESULTS / folder / "results.json").is_file():
            lines.append(f"| {game}, `{folder}` | not committed yet: [its plan](docs/experiments.md#training-runs-as-the-unit) "
                         "| | | | | | |")
            continue
        found = seed_tests(folder, "aria", "no_aggregation")
        if not found:  # a run committed part-way: what it has is in its own table
            lines.append(f"| {game}, [`{folder}`](results/experiments/{folder}/table.md) | none yet with both arms "
                         "evaluated | | | | | | |")
            continue
        tests[folder] = found
        lines.append(_row(f"{game}, [`{folder}`](results/experiments/{folder}/table.md)", found,
                          planned_verdict(folder)))
        for pooled_label, folders in POOLED_AFTER_THE_FACT:
            if folders[-1] == folder and all(f in tests for f in folders):
                lines.append(_row(pooled_label, [t for f in folders for t in tests[f]], "– (no rule was fixed for it)"))
    return "\n".join(lines) + "\n" + design_footer(tests)


def design_footer(tests: dict[str, list[dict[str, Any]]]) -> str:
    """What the method-level test of Twenty Questions can see at the spread its first committed runs
    showed (the after-the-fact pool of :data:`POOLED_AFTER_THE_FACT`), or nothing without them."""
    folders = POOLED_AFTER_THE_FACT[0][1]
    if not all(f in tests for f in folders):
        return ""
    runs = [t for f in folders for t in tests[f]]
    tau2 = pool_runs(runs)["heterogeneity"]["tau2"]
    share = sum(t["first_only"] + t["second_only"] for t in runs) / sum(t["pairs"] for t in runs)
    return (f"\nAt the spread the three Twenty Questions runs of `powered` and `grouping` show (τ = "
            f"{100 * tau2 ** 0.5:.1f} points) and their discordant share ({100 * share:.0f}%), the method-level test "
            f"of 2 runs of 600 pairs an arm detects {_detects(2, share, tau2)}, 3 runs {_detects(3, share, tau2)}; "
            f"5 points need {runs_needed(600, share, 0.05, tau2)} runs an arm (80% power, 5% level; aria/power.py).\n")


def _detects(runs: int, share: float, tau2: float) -> str:
    found = runs_detectable_difference(runs, 600, share, tau2)
    return "no difference at all" if found is None else f"{100 * found:.1f} points"


def arms() -> str:
    """The two arms of each committed comparison: success over the seeds, each seed's gain over
    the model it started from (paired), token KL and the movement verdict of its preset's rule."""
    lines = ["| game, run | arm | won / games | gain over its start per seed, points (95% CI) | token KL per seed | moved |",
             "|---|---|---|---|---|---|"]
    for game, folder in COMPARISONS:
        path = RESULTS / folder / "results.json"
        if not path.is_file():
            continue
        results = read_json(path)
        for row in results["pooled"]:
            if row["iteration"] == 0:
                lines.append(f"| {game}, `{folder}` | {row['method']} | {row['wins']} / {row['games']} "
                             f"({100 * row['success']:.1f}%) | – | – | – |")
        for method in ("aria", "no_aggregation"):
            total = next((r for r in results["pooled"] if r["method"] == method and r["iteration"] == 1), None)
            if total is None:  # a run committed part-way: this arm not evaluated yet
                continue
            seeds = [a for a in results["arms"] if a["method"] == method and a["iteration"] == 1]
            gains = "; ".join(f"{_points(a['against_parent']['difference'])} ({_interval(a['against_parent']['difference_ci95'])})"
                              if "against_parent" in a else "–" for a in seeds)
            kl = ", ".join(f"{a['movement']['token_kl']:.3f}" if "movement" in a else "–" for a in seeds)
            moved = ", ".join(("yes" if a["movement"]["moved"] else "**no**") if "movement" in a else "not measured yet"
                              for a in seeds)
            lines.append(f"| | `{method}` | {total['wins']} / {total['games']} ({100 * total['success']:.1f}%) | {gains} | "
                         f"{kl} | {moved} |")
    return "\n".join(lines) + "\n"


def holm(p_values: list[float], alpha: float = 0.05) -> list[bool]:
    """Holm's step-down rejections of ``p_values`` at family-wise level ``alpha``, in their order."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (len(p_values) - rank):
            break
        rejected[i] = True
    return rejected


def grouping() -> str:
    """The grouping run's arms (one collection, seed 0): success, the planned paired tests against
    ``no_aggregation`` (bold where Holm's correction over the run's planned tests keeps them), and
    how much of the games' outcome each scheme's weights keep (grouping_schemes_s0_outcome.json)."""
    results = read_json(RESULTS / "grouping" / "results.json")
    schemes = read_json(RESULTS / "grouping" / "grouping_schemes_s0_outcome.json")["schemes"]
    tests = results["paired_tests"]
    kept = dict(zip(((t["first"], t["second"]) for t in tests), holm([t["p_value"] for t in tests])))
    won = {r["method"]: r for r in results["pooled"] if r["iteration"] == 1}
    label = {"no_aggregation": "`no_aggregation` (R_t)", "aria_behavioural": "`aria_behavioural` (exact partition)",
             "aria": "`aria` (clusters, k = {k})", "aria_window2": "`aria_window2` (last 2 turns)"}
    k = "/".join(map(str, sorted(set(read_json(RESULTS / "grouping" / "grouping_schemes_s0_outcome.json")["chosen_k"].values()))))
    lines = [f"| arm | won of {results['eval_games']} | vs `no_aggregation` (95% CI), exact McNemar p | corr(weight, game won) "
             "| weight on a winning guess |", "|---|---|---|---|---|"]
    for method in ("no_aggregation", "aria_behavioural", "aria", "aria_window2"):
        test = next((t for t in tests if (t["first"], t["second"]) == (method, "no_aggregation")), None)
        versus = "–" if test is None else (f"{_points(test['difference'])} ({_interval(test['difference_ci95'])}), "
                                           f"{test['p_value']:.2g}")
        if test is not None and kept[(method, "no_aggregation")]:
            versus = f"**{versus}**"
        scheme = schemes[method]
        lines.append(f"| {label[method].format(k=k)} | {won[method]['wins']} | {versus} | {scheme['outcome_correlation']:.3f} "
                     f"| {scheme['won_last_step']:.2f} |")
    return "\n".join(lines) + "\n"


#: The grouping schemes' names as the docs' tables give them.
SCHEME_LABELS = {"aria": "`aria` (k = {k})", "aria_window2": "`aria_window2`", "aria_behavioural": "`aria_behavioural` ({b})",
                 "aria_behavioural_window2": "behavioural, last 2 turns", "gigpo": "`gigpo`", "gigpo_similar": "`gigpo_similar`",
                 "no_aggregation": "`no_aggregation` (R_t)"}


def _exact(x: float | None, spec: str, zero: str = "0") -> str:
    """A cell of a scheme's table: "–" where a scheme has no such figure, 0 and 1 as themselves."""
    return "–" if x is None else zero if abs(x) < 1e-15 else "1" if x == 1 else format(x, spec)


def _per_mille(x: float, ci: list[float]) -> str:
    signed = lambda v: f"{1000 * v:+.2f}".replace("-", "−")  # noqa: E731
    return f"{signed(x)} ({signed(ci[0])} to {signed(ci[1])})"


def grouping_schemes() -> str:
    """The grouping run's own collection under every grouping scheme (scripts/grouping_schemes.py's
    committed report, grouping_schemes_s0.json): sharing, variance and bias of the weights, and the
    bias-corrected gradient SNR with its bootstrap interval and its difference from R_t's."""
    found = read_json(RESULTS / "grouping" / "grouping_schemes_s0.json")
    k = "/".join(map(str, sorted(set(found["chosen_k"].values()))))
    b = "/".join(map(str, found["behavioural_intentions"].values()))
    lines = ["| scheme | steps sharing | turn 0 / 1 / 2 / 3 / 4 / 5+ | mean group size | Var(group mean)/Var(R) | bias² "
             "| variance within | SNR × 10³ corrected (95% CI) | its difference from R_t's |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in found["schemes"].items():
        turns = r["shared_by_turn"].values()
        shared = "0 at every turn" if not any(turns) else " / ".join(f"{100 * v:.0f}" for v in turns) + "%"
        bias = "0 (the reference)" if name == "aria_behavioural" else _exact(r.get("bias_squared"), ".4f")
        difference = "–" if name == "no_aggregation" else _per_mille(r["snr_difference"], r["snr_difference_ci95"])
        lines.append(f"| {SCHEME_LABELS[name].format(k=k, b=b)} | "
                     f"{_exact(r['shared'], '.1%', zero='0%')} | {shared} | {_exact(r['mean_group_size'], '.3g')} | "
                     f"{_exact(r['variance_ratio'], '.3f')} | {bias} | {_exact(r.get('variance_within'), '.4f')} | "
                     f"{_per_mille(r['snr_corrected'], r['snr_corrected_ci95'])} | {difference} |")
    return "\n".join(lines) + "\n"


def grouping_outcome() -> str:
    """How much of the games' outcome each grouping scheme's weights keep (grouping_schemes_s0_outcome.json),
    highest first, beside the success of the arm the grouping run trained on them."""
    found = read_json(RESULTS / "grouping" / "grouping_schemes_s0_outcome.json")
    pooled = read_json(RESULTS / "grouping" / "results.json")["pooled"]
    won = {r["method"]: r["wins"] for r in pooled if r["iteration"] == 1}
    start = next(r["wins"] for r in pooled if r["iteration"] == 0)
    k = "/".join(map(str, sorted(set(found["chosen_k"].values()))))
    label = {**SCHEME_LABELS, "gigpo": "`gigpo` (advantages)", "gigpo_similar": "`gigpo_similar` (advantages)",
             "aria_behavioural": "`aria_behavioural`"}
    lines = ["| scheme | corr(weight, final reward: 1 won, 0 lost) | weight on won games' last step | the arm trained on it: "
             "won of 600 |", "|---|---|---|---|"]
    for name, r in sorted(found["schemes"].items(), key=lambda item: -item[1]["outcome_correlation"]):
        last = "–" if r["won_last_step"] is None else f"{r['won_last_step']:.3f}"
        arm = "–" if name not in won else f"{won[name]}" + (f" (the warm start: {start})" if won[name] < start else "")
        lines.append(f"| {label[name].format(k=k)} | {r['outcome_correlation']:.3f} | {last} | {arm} |")
    return "\n".join(lines) + "\n"


def powered_other_arms() -> str:
    """The powered run's seed-0-only arms (its committed outcomes.json, paired by target): success,
    the gain over the warm start, movement, and the tests against both arms of the comparison (bold
    at p < 0.05) with the difference each pair of arms detects."""
    arms = read_json(RESULTS / "powered" / "outcomes.json")["arms"]
    measured = {(a["method"], a["seed"]): a["movement"] for a in read_json(RESULTS / "powered" / "results.json")["arms"]
                if a["iteration"] == 1}
    cell = lambda t: f"{_points(t['difference'])} ({_interval(t['difference_ci95'])})"  # noqa: E731
    lines = ["| arm | wins / 600 | vs warm start (95% CI) | token KL | Δ log-prob won / lost | vs `no_aggregation` (95% CI), p "
             "| vs `aria` k = 8 (95% CI), p | these pairs detect |", "|---|---|---|---|---|---|---|---|"]
    for method in ("aria_k20", "filtered_bc"):
        key = f"{method}, seed 0, iteration 1"
        wins, n = arms[key]["wins"], arms[key]["games"]
        low, high = wilson_interval(wins, n)
        versus = [paired_outcomes(arms, key, f"{other}, seed 0, iteration 1") for other in ("no_aggregation", "aria")]
        tests = [f"{cell(t)}, {t['p_value']:.2g}" for t in versus]
        tests = [f"**{text}**" if t["p_value"] < 0.05 else text for text, t in zip(tests, versus)]
        m = measured[(method, 0)]
        logprob = f"{m['logprob_change_won']:.2f} / {m['logprob_change_lost']:.2f}".replace("-", "−")
        detects = " / ".join(f"{100 * t['detectable_difference']:.1f}" for t in versus)
        lines.append(f"| `{method}` | {wins} ({100 * wins / n:.1f}%, {100 * low:.1f}-{100 * high:.1f}) | "
                     f"{cell(paired_outcomes(arms, key, 'warm start, iteration 0'))} | {m['token_kl']:.3f} | {logprob} | {tests[0]} | "
                     f"{tests[1]} | {detects} points |")
    return "\n".join(lines) + "\n"


def grad_variance() -> str:
    """docs/pipeline.md's gradient-noise table: each weighting's trace of the per-sample gradient
    covariance, its ratio to the raw return's, and the signal-to-noise ratio, from the committed
    report of scripts/grad_variance.py (benchmarks/results/grad_variance_twenty_questions_subset.json)."""
    result = read_json(BENCHMARK_RESULTS / "grad_variance_twenty_questions_subset.json")["result"]
    raw = result["trace_cov_raw_step_return"]

    def three_digits(x: float) -> str:  # 6.97, 102.4: three significant digits, one decimal at least
        return f"{x:.{max(1, 2 - math.floor(math.log10(abs(x))))}f}"
    rows = [("raw return R_t (`no_aggregation`)", "raw_step_return"), ("aggregated R̃_t (`aria`)", "aggregated_reward"),
            ("GiGPO advantages (`gigpo`)", "method_gigpo")]
    lines = ["| weights | tr Cov of the per-sample gradient | ratio to raw | signal-to-noise |", "|---|---|---|---|"]
    for name, key in rows:
        trace = result[f"trace_cov_{key}"]
        lines.append(f"| {name} | {three_digits(trace)} | {trace / raw:.3g} | {result[f'snr_{key}']:.3g} |")
    return "\n".join(lines) + "\n"


#: docs/benchmarks.md's summary, in the page's order: (the benchmark, the link to its section, the script of
#: ``benchmarks/`` whose ``headline`` summarises the reports, or ``script:function``, and the reports under
#: ``benchmarks/results/`` given to it). Entries of one benchmark measured on one machine share a row. Only
#: current comparisons: a superseded report (an older run, another day's machine) is no row, unless it is the
#: baseline the current one is compared with.
BENCHMARK_ROWS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("Generation engines", "#generation-engines", "generation_engines", ("generation_engines.json",)),
    ("Generation engines", "#generation-engines", "generation_engines", ("generation_engines_compiled.json",)),
    ("Evaluation through vLLM", "#evaluation-through-vllm-only-new-tokens", "served_evaluation", ("served_evaluation.json",)),
    ("Evaluation through vLLM", "#evaluation-through-vllm-only-new-tokens", "served_evaluation",
     ("served_evaluation_avx2.json",)),
    ("LoRA serving", "#lora-adapters-served-on-their-base", "lora_serving", ("lora_serving.json",)),
    ("Shared CPU", "#training-on-a-shared-cpu", "shared_cpu", ("shared_cpu.json",)),
    ("Shared CPU", "#training-on-a-shared-cpu", "shared_cpu", ("shared_cpu_passive.json",)),
    ("Shared CPU", "#training-on-a-shared-cpu", "shared_cpu", ("shared_cpu_serving.json",)),
    ("Shared CPU", "#training-on-a-shared-cpu", "shared_cpu", ("shared_cpu_idle.json",)),
    ("Training packing", "#training-in-prefix-tree-packs", "training_packing", ("training_packing_avx2.json",)),
    ("Training packing", "#training-in-prefix-tree-packs", "training_packing", ("training_packing_avx2_bargaining.json",)),
    ("Whole histories", "#whole-histories-guess-my-city-as-played", "training_packing:headline_cutoffs",
     ("whole_histories_gmc_before.json", "whole_histories_gmc.json")),
    ("Movement", "#movement-in-whole-games", "movement_layout", ("movement_layout.json",)),
    ("Reward-model scoring", "#reward-model-scoring", "reward_scoring", ("reward_scoring.json",)),
    ("Batched rollouts", "#batched-rollouts", "rollout_batched_vs_sequential", ("rollout_batched_vs_sequential.json",)),
    ("Intention pipeline", "#intention-pipeline-sweep", "intention_sweep", ("intention_sweep_realistic.json",)),
    ("Intention pipeline", "#intention-pipeline-sweep", "intention_sweep", ("intention_sweep.json",)),
    ("Offline trainer", "#offline-trainer-against-a-bare-loop", "offline_trainer_vs_bare", ("offline_trainer_vs_bare.json",)),
    ("On a GPU", "#on-a-gpu", "gpu_paths", ("gpu_paths_h200.json",)),
    ("On a GPU", "#on-a-gpu", "training_packing", ("training_packing_h200_135m.json",)),
    ("On a GPU", "#on-a-gpu", "training_packing", ("training_packing_h200_1.7b.json",)),
    ("On a GPU", "#on-a-gpu", "gpu_paths", ("gpu_paths_deepspeed_h200.json",)),
    ("On a GPU", "#on-a-gpu", "gpu_paths", ("gpu_paths_archer_h200.json",)),
    ("On a GPU", "#on-a-gpu", "gpu_paths", ("gpu_paths_archer_speed_h200.json",)),
    ("Constrained decoding", "games.md#two-player-games-bargaining-and-negotiation", "constrained_decoding",
     ("constrained_decoding.json",)),
    ("Scripted expert", "experiments.md#the-testbed", "expert_games", ("expert_games.json",)),
    ("Deliberate bugs", "testing.md#testing-the-tests", "deliberate_bugs", ("deliberate_bugs.json",)),
    ("Mutation testing", "testing.md#mutation-testing", "mutation", ("mutation.json", "mutation_before.json")),
    ("The suite's CPU", "testing.md#running-the-tests", "suite_cpu", ("suite_cpu.json",)),
    ("Start-up", "#start-up-slow-libraries-imported-where-used", "import_time", ("import_time.json",)),
)

#: The reports of ``benchmarks/results/`` that are no row of the summary, and why.
BENCHMARK_REPORTS_NOT_ROWS = {
    "training_packing.json": "the first CPU run of trees against rows, before micro-batches were laid out by cost; "
                             "training_packing_avx2*.json measure the code now",
    "training_packing_avx2_gmc.json": "Guess My City with prompts cut at 512, the preset before whole histories",
    "whole_histories_gmc_dense.json": "another tree attention: a row of the whole-history table",
    "whole_histories_gmc_trunk.json": "another tree attention: a row of the whole-history table",
    "whole_histories_gmc_trunk_bf16.json": "another tree attention in bf16: a row of the whole-history table",
    "whole_histories_gmc_bf16.json": "the default in bf16: a row of the whole-history table",
    "grad_variance_twenty_questions_subset.json": "written by scripts/grad_variance.py, no script of benchmarks/: "
                                                  "docs/pipeline.md's own table (grad_variance)",
    **{f"fresh_clone_{kind}.json": "the test command's time on a kind of CPU: docs/testing.md's own table"
       for kind in ("avx2", "avx512_bf16", "amx")},
}


@functools.cache
def benchmark_script(name: str):
    """The script ``benchmarks/NAME.py`` as a module, loaded by its path: the folder is no package."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recorded_machine(report: dict[str, Any]) -> str:
    """The machine as a benchmark's report names it: its GPU, else its CPU (:func:`aria.llm.hardware.label`),
    else "not recorded" (older reports kept only Python's and torch's threads)."""
    machine = report.get("machine", {})
    gpu = report.get("gpu") or machine.get("gpu")
    if gpu:
        return f"{gpu} GPU" + (f" (host: {machine['cpu_model']}, {machine['cores']} cores)" if "cpu_model" in machine else "")
    if "cpu_model" in machine:
        return label(machine)
    threads = machine.get("threads") or machine.get("torch_threads")
    return "not recorded" + (f" ({threads} threads)" if threads else "")


def benchmarks(results: Path = BENCHMARK_RESULTS) -> str:
    """docs/benchmarks.md's summary table: a row per benchmark and machine (:data:`BENCHMARK_ROWS`), its cells
    the headlines of its scripts from the reports in ``results``, one a line."""
    rows: list[dict[str, Any]] = []
    for title, where, script, files in BENCHMARK_ROWS:
        name, _, function = script.partition(":")
        reports = [read_json(results / file) for file in files]
        machine = " / ".join(dict.fromkeys(recorded_machine(r) for r in reports))  # each machine once
        if not rows or (rows[-1]["title"], rows[-1]["machine"]) != (title, machine):
            rows.append({"title": title, "where": where, "machine": machine, "compares": [], "results": [], "files": []})
        row = rows[-1]
        for item in getattr(benchmark_script(name), function or "headline")(*reports):
            if item["compares"] not in row["compares"]:  # several results of one comparison share its words
                row["compares"].append(item["compares"])
            row["results"].append(item["result"])
        row["files"] += files
    lines = ["| benchmark | what it compares | result | machine | from |", "|---|---|---|---|---|"]
    for row in rows:
        sources = ", ".join(f"[`{file}`](../benchmarks/results/{file})" for file in row["files"])
        cells = (f"[{row['title']}]({row['where']})", "<br>".join(row["compares"]), "<br>".join(row["results"]),
                 row["machine"], sources)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def fresh_clones(results: Path = BENCHMARK_RESULTS) -> str:
    """docs/testing.md's table: the newest run of the test command from a fresh clone on each kind
    of CPU (``benchmarks/fresh_clone.py`` writes one file a kind)."""
    lines = ["| CPU | date, commit | tests passed | tests' time | with the install |", "|---|---|---|---|---|"]
    for path in sorted(results.glob("fresh_clone_*.json")):
        run = read_json(path)
        lines.append(f"| {label(run['machine'])} | {run['date']}, {run['commit']} | {run['tests']} | "
                     f"{report.minutes(run['tests_seconds'])} | {report.minutes(run['wall_seconds'])} |")
    return "\n".join(lines) + "\n"


#: Every block a document may hold, by name.
BLOCKS: dict[str, Callable[[], str]] = {"aggregation": aggregation, "arms": arms, "grouping": grouping,
                                        "grouping_schemes": grouping_schemes, "grouping_outcome": grouping_outcome,
                                        "powered_other_arms": powered_other_arms, "grad_variance": grad_variance,
                                        "benchmarks": benchmarks, "fresh_clones": fresh_clones}


def reevaluated_lines(results: dict[str, Any]) -> list[str]:
    """Models evaluated again with more games (``scripts/reevaluate.py``): each model's success,
    then the comparisons its results.json names, paired by game (the same target)."""
    e = results["eval"]
    lines = [f"Each model played {results['games']} games of the `{results['preset']}` preset's evaluation "
             f"({results['game']}, seed {e['seed']}, temperature {e['temperature']:g}, {results['engine']}) on "
             f"{results['cpu']}; the same targets for every model, so any two are paired game by game.", "",
             "| model | where it came from | won | success (95% CI) |", "|---|---|---|---|"]
    models = {m["name"]: m for m in results["models"]}
    for m in results["models"]:
        wins, n = m["won"].count("1"), len(m["won"])
        low, high = wilson_interval(wins, n)
        about = m["about"].replace("|", "\\|")  # a table cell: a "|" of the text would split it
        lines.append(f"| {m['name']} | {about} | {wins} / {n} | {100 * wins / n:.1f}% ({100 * low:.1f}–{100 * high:.1f}) |")
    lines += ["", "| first − second | pairs | won by the first only / the second only | difference, points (95% CI) "
              "| exact McNemar p |", "|---|---|---|---|---|"]
    for first, second in results["compare"]:
        a, b = ({g: w == "1" for g, w in zip(models[name]["game_ids"], models[name]["won"])} for name in (first, second))
        keys = sorted(set(a) & set(b))
        t = mcnemar([a[k] for k in keys], [b[k] for k in keys])
        lines.append(f"| {first} − {second} | {t['pairs']} | {t['first_only']} / {t['second_only']} | "
                     f"{_points(t['difference'])} ({_interval(t['difference_ci95'])}) | {t['p_value']:.3g} |")
    return lines


#: The sections of a run's table a document may show, ``SECTION:FOLDER``.
SECTIONS: dict[str, Callable[[dict], list[str]]] = {
    "pooled": report.pooled_lines, "preflight": report.preflight_lines, "movement": report.movement_lines,
    "paired": report.paired_lines, "reevaluated": reevaluated_lines,
    "stages": report.stage_lines}


def block(name: str, source: str = "", line: int | None = None) -> str:
    """The text of block ``name`` (of document ``source``, its marker on ``line``): a named block, or a
    section of a committed run's table."""
    if name in BLOCKS:
        return BLOCKS[name]()
    section, _, folder = name.partition(":")
    if section in SECTIONS and folder:
        path = RESULTS / folder / "results.json"
        if not path.is_file():
            raise DataError(source or None, line, None,
                            f"rendered block {name!r}: results/experiments/{folder}/results.json is not committed")
        lines = SECTIONS[section](read_json(path))
        while lines and lines[0] == "":
            lines = lines[1:]
        return "\n".join(lines) + "\n"
    raise DataError(source or None, line, None, f"unknown rendered block {name!r} (known: {', '.join(BLOCKS)}, or "
                    f"{'|'.join(SECTIONS)}:FOLDER of results/experiments/)")


def render(text: str, source: str = "") -> str:
    """``text`` with every block rendered anew; a block it cannot render is an error naming ``source``
    and the marker's line."""
    def fill(match: re.Match) -> str:
        text_of = block(match["name"], source, text.count("\n", 0, match.start()) + 1)
        return f"<!-- rendered: {match['name']} -->\n{text_of}<!-- /rendered: {match['name']} -->"
    return MARK.sub(fill, text)


def stale_blocks(root: Path = REPO) -> list[str]:
    """``file: block`` for every block whose committed text is not its rendering."""
    stale = []
    for name in DOCUMENTS:
        text = (root / name).read_text(encoding="utf-8")
        fresh = render(text, name)
        if fresh != text:
            found = {m["name"]: m["body"] for m in MARK.finditer(text)}
            stale += [f"{name}: {block}" for block, body in ((m["name"], m["body"]) for m in MARK.finditer(fresh))
                      if found.get(block) != body]
    return stale
