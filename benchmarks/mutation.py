"""Mutation testing of the method's core with mutmut: how many small deliberate bugs the suite catches.

mutmut (a maintained mutation tool) rewrites the files listed under ``only_mutate`` in
``setup.cfg`` one small change at a time (an operator, a constant, a comparison, an argument
dropped) and runs, for each change ("mutant"), the in-process tests that call the changed
function. A mutant is *killed* when some test fails, *survived* when all pass. The core is
``aria/intention/`` (aggregate, select, corpus), the pure losses (``aria/trainers/losses.py``),
the log-prob code (``aria/llm/policy.py``), the two-player payoffs (``aria/games/two_player/glee.py``) and the
evaluation statistics (``aria/statistics.py``).

This script runs mutmut in a scratch copy of the repository (so ``mutants/`` never lands in the
working tree), then writes killed / total per file and every surviving mutant's diff to JSON.
``--tests-from REV`` replaces the copy's ``tests/`` with the tests of a git revision: the same
mutants, judged by an older suite (the "before" figure of docs/testing.md). Tests marked
``subprocess`` are left out in both cases (mutants live in this process only); for an older suite
the same test ids are deselected, and ``--extra-tests`` adds the ids of its pure tests that lived
in files outside the selection.

    python benchmarks/mutation.py                      # -> benchmarks/results/mutation.json
    python benchmarks/mutation.py --label before --tests-from e5d5418 --extra-tests \
        tests/test_offline_trainer.py::test_loss_by_hand tests/test_reward_model.py::test_weighted_mse_by_hand \
        tests/test_online.py::test_advantages_by_hand   # -> benchmarks/results/mutation_before.json

The scratch folder is kept (``--work``), and mutmut keeps each mutant's result there: running
the same command again resumes. Not part of the test command: about an hour on 2 cores.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def copy_repository(work: Path, tests_from: str | None) -> None:
    """The tracked files of the working tree (committed or not) into ``work``; optionally the
    ``tests/`` of another revision."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / name)
    if tests_from:
        shutil.rmtree(work / "tests")
        archive = subprocess.run(["git", "archive", tests_from, "tests"], cwd=REPO, capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(work, filter="data")


def subprocess_test_ids(tests_dir: Path) -> list[str]:
    """Node ids of this suite's tests marked ``subprocess`` (relative to the repository root)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "subprocess", "-p", "no:cacheprovider",
                           str(tests_dir)], cwd=REPO, capture_output=True, text=True)
    return [line.strip() for line in done.stdout.splitlines() if "::" in line]


def summarize(work: Path) -> dict:
    """Per file and overall counts of mutmut's verdicts, and each survivor's diff, read through
    mutmut's own result store (run inside ``work``)."""
    code = r"""
import json, sys
from collections import Counter
from mutmut.__main__ import SourceFileMutationData, walk_mutatable_files, get_diff_for_mutant
from mutmut.stats import status_by_exit_code
files, survivors = {}, []
for path in walk_mutatable_files():
    m = SourceFileMutationData(path=path)
    m.load()
    counts = Counter(status_by_exit_code[v] for v in m.exit_code_by_key.values())
    files[str(path)] = dict(counts)
    for key, value in sorted(m.exit_code_by_key.items()):
        status = status_by_exit_code[value]
        if status != "killed":
            survivors.append({"mutant": key, "file": str(path), "status": status, "diff": get_diff_for_mutant(key, path=path)})
json.dump({"files": files, "not_killed": survivors}, sys.stdout)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    totals: dict[str, int] = {}
    for counts in result["files"].values():
        for status, n in counts.items():
            totals[status] = totals.get(status, 0) + n
    total = sum(totals.values())
    result["totals"] = {"killed": totals.get("killed", 0), "total": total, **totals,
                        "score": round(totals.get("killed", 0) / total, 4) if total else None}
    return result


def headline(report: dict, before: dict | None = None) -> list[dict]:
    """docs/benchmarks.md's summary row of a report, against the older suite's report ``before`` where given."""
    totals = report["totals"]
    against = "" if before is None else (f", against {before['totals']['score']:.1%} by the tests of "
                                         f"{before['tests_from']}")
    return [{"compares": "mutants of the method's core (mutmut): the suite now" +
                         ("" if before is None else " against an older suite"),
             "result": f"{totals['score']:.1%} of {totals['total']:,} mutants killed{against}"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests-from", help="git revision whose tests/ judge the mutants (default: the working tree's)")
    parser.add_argument("--label", default=None, help="result name: benchmarks/results/mutation[_LABEL].json")
    parser.add_argument("--work", type=Path, default=None, help="scratch copy (default /tmp/aria-mutation[-LABEL]); kept for resuming")
    parser.add_argument("--extra-tests", nargs="*", default=[],
                        help="more test ids for the selection (an older suite's pure tests that lived in other files)")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--fresh", action="store_true", help="delete the scratch copy first (no resume)")
    args = parser.parse_args()
    suffix = f"_{args.label}" if args.label else ""
    work = args.work or Path(f"/tmp/aria-mutation{suffix.replace('_', '-')}")
    if args.fresh and work.exists():
        shutil.rmtree(work)
    if not (work / "setup.cfg").is_file():
        work.mkdir(parents=True, exist_ok=True)
        copy_repository(work, args.tests_from)
        cfg = (work / "setup.cfg").read_text()
        if args.tests_from:  # an older suite: its files among the selection, the same exclusions
            lines = cfg.split("\n")
            cfg = "\n".join(line for line in lines if not (line.strip().startswith("tests/") and not (work / line.strip()).is_file()))
            ids = [i for i in subprocess_test_ids(REPO / "tests") if (work / i.split("::")[0]).is_file()]
            cfg = cfg.replace("pytest_add_cli_args =\n", "pytest_add_cli_args =\n" + "".join(f"    --deselect\n    {i}\n" for i in ids))
        selection = "pytest_add_cli_args_test_selection =\n"
        cfg = cfg.replace(selection, selection + "".join(f"    {t}\n" for t in args.extra_tests))
        (work / "setup.cfg").write_text(cfg)
    # mutmut puts mutants/ first on the path itself; only the preloading plugin's folder goes on PYTHONPATH.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO / "benchmarks"), "PYTEST_PLUGINS": "mutation_preload"}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", str(args.max_children)], cwd=work, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"mutmut run failed with exit status {done.returncode} (scratch copy kept in {work})")
    result = {"tool": "mutmut " + subprocess.run([sys.executable, "-m", "pip", "show", "mutmut"], capture_output=True,
                                                    text=True).stdout.split("Version: ")[1].split()[0],
              "code_commit": commit, "tests_from": args.tests_from or "working tree",
              "seconds_this_invocation": round(seconds, 1), "max_children": args.max_children, **summarize(work)}
    out = REPO / "benchmarks" / "results" / f"mutation{suffix}.json"
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    t = result["totals"]
    print(f"{t['killed']}/{t['total']} mutants killed ({t['score']:.1%}); not killed: "
          f"{ {k: v for k, v in t.items() if k not in ('killed', 'total', 'score')} } -> {out}")


if __name__ == "__main__":
    main()
