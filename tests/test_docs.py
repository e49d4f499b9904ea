"""Links in the README and docs lead somewhere on a fresh clone.

Results linked from the README live under ``results/``, which ``.gitignore`` leaves out unless a
file is added on purpose (``git add -f``): a table written on one machine and linked but never
added reads fine there and is a dead link everywhere else. So a relative link must name a file
of the checkout that git does not ignore, and a ``#anchor`` into a Markdown file must name one of
its headings (GitHub's rule: lower case, punctuation dropped, spaces as hyphens).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)


def heading_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def ignored(root: Path, path: Path) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=root).returncode == 0


def broken_links(root: Path, files: list[Path]) -> list[str]:
    """``file: target (why)`` for every relative link of ``files`` that leads nowhere."""
    found = []
    for md in files:
        for match in LINK.finditer(FENCE.sub("", md.read_text(encoding="utf-8"))):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            where = (md.parent / path).resolve() if path else md
            name = f"{md.relative_to(root)}: {target}"
            if not where.exists():
                found.append(f"{name} (no such file)")
            elif ignored(root, where):
                found.append(f"{name} (ignored by git: add it with git add -f, or link something tracked)")
            elif anchor and where.suffix == ".md":
                headings = re.findall(r"^#+\s+(.*)$", FENCE.sub("", where.read_text(encoding="utf-8")), re.M)
                if anchor not in {heading_anchor(h) for h in headings}:
                    found.append(f"{name} (no heading with that anchor)")
    return found


def markdown_files(root: Path) -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=root, capture_output=True, text=True, check=True)
    return [root / name for name in listed.stdout.split()]


needs_git = pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(),
                               reason="needs a git checkout (CI tests a fresh clone)")


@needs_git
def test_every_link_of_the_docs_leads_to_a_tracked_file_and_heading():
    files = markdown_files(REPO)
    assert any(f.name == "README.md" for f in files) and len(files) > 5
    assert broken_links(REPO, files) == []


@needs_git
def test_broken_links_are_found(tmp_path):
    """A missing file, a file git ignores, a missing anchor; a good link and an outside one pass."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("/results/\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table.md").write_text("| a |\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "method.md").write_text("# Method\n## 4. What is R? (the estimator)\n")
    readme = tmp_path / "README.md"
    readme.write_text("[ok](docs/method.md#4-what-is-r-the-estimator) [web](https://example.org/x) "
                      "[gone](docs/missing.md) [kept out](results/table.md) [no anchor](docs/method.md#5-training)\n"
                      "```\n[in code](not/checked.md)\n```\n")
    assert broken_links(tmp_path, [readme]) == [
        "README.md: docs/missing.md (no such file)",
        "README.md: results/table.md (ignored by git: add it with git add -f, or link something tracked)",
        "README.md: docs/method.md#5-training (no heading with that anchor)"]


def benchmark_module(name: str):
    """A benchmark script of ``benchmarks/`` as a module (the folder is no package)."""
    from aria.experiment.tables import benchmark_script

    return benchmark_script(name)


@pytest.mark.parametrize(("script", "report"), [("shared_cpu", "shared_cpu.json"), ("shared_cpu", "shared_cpu_serving.json"),
                                                   ("shared_cpu", "shared_cpu_passive.json"), ("lora_serving", "lora_serving.json"),
                                                   ("movement_layout", "movement_layout.json"), ("shared_cpu", "shared_cpu_idle.json")])
def test_benchmark_tables_in_the_docs_are_rendered_from_the_committed_reports(script, report):
    """docs/benchmarks.md holds each table as the benchmark's own ``render`` writes it from its JSON."""
    from aria.io import read_json

    page = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert benchmark_module(script).render(read_json(REPO / "benchmarks" / "results" / report)) in page


def test_the_whole_history_table_is_rendered_from_its_two_committed_reports():
    """The Guess My City cutoff comparison: the preset before (its code's run) and whole histories now."""
    from aria.io import read_json

    results = REPO / "benchmarks" / "results"
    table = benchmark_module("training_packing").render_cutoffs(read_json(results / "whole_histories_gmc_before.json"),
                                                                read_json(results / "whole_histories_gmc.json"),
                                                                read_json(results / "whole_histories_gmc_dense.json"),
                                                                read_json(results / "whole_histories_gmc_trunk.json"),
                                                                read_json(results / "whole_histories_gmc_trunk_bf16.json"),
                                                                read_json(results / "whole_histories_gmc_bf16.json"))
    assert table in (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")


def test_the_whole_history_table_says_when_its_check_did_not_check():
    """A check killed for memory, or one whose micro-batches all had loss and gradient 0 (every reward 0),
    is said as such under the table, never shown as agreement."""
    import copy

    from aria.io import read_json

    results = REPO / "benchmarks" / "results"
    before, after = read_json(results / "whole_histories_gmc_before.json"), read_json(results / "whole_histories_gmc.json")
    render = benchmark_module("training_packing").render_cutoffs

    def with_check(check):
        report = copy.deepcopy(after)
        report["checks"]["gmc/reinforce"] = check
        return render(before, report)

    assert "ended with exit -9" in with_check({"failed": -9})
    agreed = {"micro_batches": 2, "loss_abs": 0.0, "loss_rel": 0.0, "grad_norm_rel": 0.0}
    assert "checked nothing" in with_check({**agreed, "zero_micro_batches": 2})
    assert "checked nothing" not in with_check({**agreed, "zero_micro_batches": 1})
    assert "loss 0.0e+00, gradient norm 0.0e+00 apart" in with_check({**agreed, "zero_micro_batches": 0})


def test_the_main_job_in_the_readme_and_the_docs_is_rendered_from_its_committed_results():
    """The README's "What the main job shows" and docs/experiments.md's stage times are the report's
    own renderings of the main job's committed results.json, not figures typed in."""
    from aria.experiment.report import render_stage_times, render_summary
    from aria.io import read_json

    results = read_json(REPO / "results" / "experiments" / "small" / "results.json")
    assert results["name"] == "small" and results["run"]["wall_seconds"] is not None and not results["run"]["resumed"]
    assert render_summary(results) in (REPO / "README.md").read_text(encoding="utf-8")
    assert render_stage_times(results) in (REPO / "docs" / "experiments.md").read_text(encoding="utf-8")


def test_rendered_blocks_are_their_committed_runs_rendering(tmp_path):
    """Every table of README and docs/ between "rendered" markers is aria/experiment/tables.py's rendering
    of the committed runs; a figure typed over one (here the lost folder's -1.7 for the powered run's
    seed 0, whose committed outcomes give -3.7) is named with its file and block."""
    from aria.experiment.tables import DOCUMENTS, render, stale_blocks

    assert stale_blocks() == [], "python scripts/render_docs.py rewrites them"
    assert "<!-- rendered: benchmarks -->" in (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "<!-- rendered: aggregation -->" in readme and "| 2 | −3.7, −0.2 |" in readme
    for name in DOCUMENTS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((REPO / name).read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "README.md").write_text(readme.replace("| 2 | −3.7, −0.2 |", "| 2 | −1.7, −0.2 |"), encoding="utf-8")
    assert stale_blocks(tmp_path) == ["README.md: aggregation"]
    with pytest.raises(ValueError, match="x.md, line 1: unknown rendered block 'nope'"):
        render("<!-- rendered: nope -->\n<!-- /rendered: nope -->", "x.md")


def test_a_run_committed_part_way_is_a_row_saying_so_not_an_error(tmp_path, monkeypatch):
    """A run whose results.json has per-game outcomes but no seed with both arms evaluated yet (a run
    reported part-way) is a row saying so: the legacy outcomes.json it never had is not looked for,
    and a run with per-game outcomes on both arms of a seed is tested on them."""
    from aria.experiment import tables
    from aria.io import atomic_write_json

    def arm(method, seed, won):
        return {"method": method, "seed": seed, "iteration": 1, "won": won}

    atomic_write_json(tmp_path / "partway" / "results.json", {"arms": [arm("aria", 10, "0110")], "paired_tests": []})
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    monkeypatch.setattr(tables, "COMPARISONS", (("Twenty Questions", "partway"),))
    assert tables.seed_tests("partway", "aria", "no_aggregation") == []
    row = tables.aggregation().splitlines()[2]
    assert row.startswith("| Twenty Questions, [`partway`](results/experiments/partway/table.md) | none yet with both arms")

    # its arms: the one evaluated, not yet measured for movement; the one not evaluated left out
    pooled = [{"method": "warm start", "iteration": 0, "wins": 1, "games": 4, "success": 0.25},
              {"method": "aria", "iteration": 1, "wins": 2, "games": 4, "success": 0.5}]
    aria = {**arm("aria", 10, "0110"), "against_parent": {"difference": 0.25, "difference_ci95": [-0.1, 0.5]}}
    atomic_write_json(tmp_path / "partway" / "results.json", {"arms": [aria], "pooled": pooled, "paired_tests": []})
    assert tables.arms().splitlines()[2:] == ["| Twenty Questions, `partway` | warm start | 1 / 4 (25.0%) | – | – | – |",
                                              "| | `aria` | 2 / 4 (50.0%) | +25.0 (−10.0 to +50.0) | – | not measured yet |"]

    atomic_write_json(tmp_path / "partway" / "results.json",
                      {"arms": [arm("aria", 10, "0110"), arm("no_aggregation", 10, "1111"), arm("no_aggregation", 11, "1")]})
    test, = tables.seed_tests("partway", "aria", "no_aggregation")
    assert (test["seed"], test["first_only"], test["second_only"], test["pairs"]) == (10, 0, 2, 4)


def _missing_or_changed(committed, again, where: str = "") -> list[str]:
    """Where ``again`` lacks or changes a value of ``committed`` (a later report may add fields)."""
    if isinstance(committed, dict) and isinstance(again, dict):
        return [p for k, v in committed.items()
                for p in ([f"{where}/{k} missing"] if k not in again else _missing_or_changed(v, again[k], f"{where}/{k}"))]
    if isinstance(committed, list) and isinstance(again, list) and len(committed) == len(again):
        return [p for i, (x, y) in enumerate(zip(committed, again)) for p in _missing_or_changed(x, y, f"{where}[{i}]")]
    return [] if committed == again else [f"{where}: {str(committed)[:60]} -> {str(again)[:60]}"]


@pytest.mark.parametrize("folder", sorted(p.parent.parent.name for p in (REPO / "results" / "experiments").glob("*/run/experiment.json")))
def test_a_committed_run_reported_again_gives_its_committed_results(tmp_path, folder):
    """Each run committed with its copy (results/experiments/NAME/run): report_only on the copy, with
    today's code, gives every figure of its committed results.json (later code may only add): the
    tables rendered from those files cannot hold what the data no longer gives. The run record, where
    and how long, is the run's own and is left out."""
    from aria.experiment import runner
    from aria.io import read_json
    from aria.resources import compose_config

    run = REPO / "results" / "experiments" / folder / "run"
    preset = read_json(run / "experiment.json")["name"]
    cfg = compose_config("experiment", [f"experiment={preset}", f"run_dir={run}", f"results_dir={tmp_path}", "report_only=true"])
    out = runner.run(cfg, [].append)
    committed = read_json(REPO / "results" / "experiments" / folder / "results.json")
    committed.pop("run", None)
    assert _missing_or_changed(committed, read_json(out / "results.json")) == []


def test_what_the_runs_detect_in_the_readme_is_what_each_run_reported():
    """The README's "the runs detect" column (tables.py, from the outcomes) agrees with what each
    run's own report computed at its spread and share (results.json, runs.detectable_difference)."""
    from aria.experiment.tables import COMPARISONS, RESULTS
    from aria.io import read_json

    readme, checked = (REPO / "README.md").read_text(encoding="utf-8"), 0
    for _, folder in COMPARISONS:
        if not (RESULTS / folder / "results.json").is_file():
            continue
        test, = [t for t in read_json(RESULTS / folder / "results.json")["paired_tests"]
                 if (t["first"], t["second"], t["iteration"]) == ("aria", "no_aggregation", 1)]
        if "detectable_difference" not in test.get("runs", {}):  # one run, or reported before the field
            continue
        row, = [line for line in readme.splitlines() if line.startswith("| ") and f"[`{folder}`]" in line]
        found = test["runs"]["detectable_difference"]
        assert row.split(" | ")[6] == ("no difference" if found is None else f"{100 * found:.1f}"), (folder, row)
        checked += 1
    assert checked >= 1  # bargaining_powered (powered_gmc was reported before the field; replicated will add one)


def test_render_docs_check_exits_1_on_a_stale_block_and_rendering_mends_it(tmp_path):
    import sys

    from aria.experiment.tables import DOCUMENTS

    script = [sys.executable, str(REPO / "scripts" / "render_docs.py")]
    done = subprocess.run([*script, "--check"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "", done.stdout + done.stderr
    for name in DOCUMENTS:  # a count changed inside the grouping block only
        text = (REPO / name).read_text(encoding="utf-8")
        start, end = text.find("<!-- rendered: grouping -->"), text.find("<!-- /rendered: grouping -->")
        if start >= 0:
            text = text[:start] + text[start:end].replace("| 311 |", "| 312 |") + text[end:]
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    done = subprocess.run([*script, "--check", "--root", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == "stale: docs/experiments.md: grouping (python scripts/render_docs.py rewrites it)\n"
    subprocess.run([*script, "--root", str(tmp_path)], check=True, capture_output=True)
    for name in DOCUMENTS:
        assert (tmp_path / name).read_text(encoding="utf-8") == (REPO / name).read_text(encoding="utf-8")
    # a block of a run not committed (a section written before its run lands): one line naming both, exit 2
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    (tmp_path / "README.md").write_text(readme + "<!-- rendered: paired:no_such_run -->\n<!-- /rendered: paired:no_such_run -->\n",
                                        encoding="utf-8")
    for check in ([], ["--check"]):
        done = subprocess.run([*script, *check, "--root", str(tmp_path)], capture_output=True, text=True)
        assert (done.returncode, done.stdout) == (2, "") and done.stderr == (
            f"error: README.md, line {readme.count(chr(10)) + 1}: rendered block 'paired:no_such_run': "
            "results/experiments/no_such_run/results.json is not committed\n")


def test_the_benchmark_summary_follows_its_reports(tmp_path):
    """docs/benchmarks.md's summary is computed from the committed reports: in a copy of them with the
    one-at-a-time rollouts twice as slow, the rollout row's speed-up doubles and no other row changes."""
    import json
    import shutil

    from aria.experiment.tables import BENCHMARK_RESULTS, benchmarks

    results = tmp_path / "results"
    shutil.copytree(BENCHMARK_RESULTS, results)
    path = results / "rollout_batched_vs_sequential.json"
    report = json.loads(path.read_text(encoding="utf-8"))
    runs = {r["variant"]: r for r in report["runs"]}
    ratio = runs["batched"]["turns_per_s"] / runs["one_at_a_time"]["turns_per_s"]
    runs["one_at_a_time"]["turns_per_s"] /= 2
    path.write_text(json.dumps(report), encoding="utf-8")

    committed, changed = benchmarks().splitlines(), benchmarks(results).splitlines()
    differ = [(a, b) for a, b in zip(committed, changed) if a != b]
    assert len(committed) == len(changed) and len(differ) == 1
    assert f"batched {ratio:.2f}x the turns/s" in differ[0][0] and f"batched {2 * ratio:.2f}x the turns/s" in differ[0][1]


def test_every_benchmark_report_is_a_summary_row_or_says_why_not():
    """A report added to benchmarks/results/ is summarised in docs/benchmarks.md, or named as superseded."""
    from aria.experiment.tables import BENCHMARK_REPORTS_NOT_ROWS, BENCHMARK_RESULTS, BENCHMARK_ROWS

    in_rows = {file for *_, files in BENCHMARK_ROWS for file in files}
    assert not in_rows & set(BENCHMARK_REPORTS_NOT_ROWS)
    assert {p.name for p in BENCHMARK_RESULTS.glob("*.json")} == in_rows | set(BENCHMARK_REPORTS_NOT_ROWS)


def test_the_fresh_clone_table_reads_each_kind_of_cpu_from_its_report(tmp_path):
    """benchmarks/fresh_clone.py: pytest's own summary line gives the count and the seconds, the CPU's
    flags its file's kind; docs/testing.md's table is the reports', a row each, in minutes."""
    import json

    from aria.experiment.tables import fresh_clones

    script = benchmark_module("fresh_clone")
    found = script.SUMMARY.search("1254 passed, 13 warnings in 606.12s (0:10:06)")
    assert found and found.groups() == ("1254", "606.12")
    assert script.kind({"flags": ["avx", "avx2", "fma"]}) == "avx2"
    assert script.kind({"flags": ["avx2", "avx512_bf16"]}) == "avx512_bf16"
    assert script.kind({"flags": ["amx_bf16", "avx512_bf16"]}) == "amx"
    (tmp_path / "fresh_clone_avx2.json").write_text(json.dumps({
        "machine": {"cpu_model": "AMD EPYC", "cores": 2, "flags": ["avx2"]}, "date": "2026-12-07", "commit": "abc1234",
        "tests": 1260, "tests_seconds": 725.4, "wall_seconds": 744.6}))
    assert fresh_clones(tmp_path).splitlines()[2] == \
        "| AMD EPYC, 2 cores (AVX2 only) | 2026-12-07, abc1234 | 1260 | 12 min 05 s | 12 min 25 s |"
