"""Where the test command's CPU goes: the suite run as the README runs it, each test's CPU seconds
(its worker's and those of the child processes it waited for), summed per file.

    python benchmarks/suite_cpu.py                       # runs the suite, then summarizes
    python benchmarks/suite_cpu.py --from DIR            # summarizes an earlier run's DIR

On two cores shared by three workers a test's wall time depends on what the others do; its CPU
seconds do not (much). The suite can only get shorter by less work once the cores are busy, so
this is the figure to cut. vLLM servers run in sessions of their own and are not waited for:
their CPU is not counted (measure one start with /proc/PID/stat, docs/testing.md).
Writes benchmarks/results/suite_cpu.json.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aria.llm.hardware import describe

REPO = Path(__file__).resolve().parents[1]


def summarize(folder: Path) -> dict:
    rows = [row for path in sorted(folder.glob("cpu-*.json")) for row in json.loads(path.read_text())]
    if not rows:
        raise SystemExit(f"no cpu-*.json in {folder}: was the suite run with ARIA_TEST_CPU_PROFILE={folder}?")
    files: dict[str, dict] = collections.defaultdict(lambda: {"own": 0.0, "children": 0.0, "tests": 0})
    for row in rows:
        entry = files[row["test"].split("::")[0]]
        entry["own"] += row["own"]
        entry["children"] += row["children"]
        entry["tests"] += 1
    total = sum(f["own"] + f["children"] for f in files.values())
    by_file = sorted(({"file": name, **{k: round(v, 1) if isinstance(v, float) else v for k, v in f.items()},
                       "share": round((f["own"] + f["children"]) / total, 4)} for name, f in files.items()),
                     key=lambda f: -(f["own"] + f["children"]))
    slowest = sorted(rows, key=lambda r: -(r["own"] + r["children"]))[:25]
    return {"tests": len(rows), "cpu_seconds": round(total, 1),
            "children_seconds": round(sum(f["children"] for f in files.values()), 1),
            "by_file": by_file, "costliest_tests": [{**r, "own": round(r["own"], 1), "children": round(r["children"], 1),
                                                     "wall": round(r["wall"], 1)} for r in slowest]}


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary row of a report."""
    top = report["by_file"][0]
    return [{"compares": "the test suite's CPU seconds: its workers' own against their child processes', by file",
             "result": f"{report['tests']} tests, {report['cpu_seconds']:.0f} CPU s, "
                       f"{report['children_seconds'] / report['cpu_seconds']:.0%} in child processes; "
                       f"the costliest file {top['file']} ({top['share']:.0%})"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", type=Path, help="summarize this folder of an earlier run")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/suite_cpu.json")
    parser.add_argument("--note", default="", help="what else ran on the machine")
    args = parser.parse_args()
    run = {}
    if args.source is None:
        args.source = Path(tempfile.mkdtemp(prefix="suite-cpu-"))
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", os.environ.get("TEST_WORKERS", "3"),
                               "--dist", "loadfile", "--no-loadscope-reorder", "tests"], cwd=REPO,
                              env={**os.environ, "ARIA_TEST_CPU_PROFILE": str(args.source)})
        run = {"returncode": done.returncode, "wall_seconds": round(time.monotonic() - start, 1)}
    found = {"machine": describe(), "note": args.note, **run, **summarize(args.source)}
    args.out.write_text(json.dumps(found, indent=1) + "\n")
    print(f"{found['tests']} tests, {found['cpu_seconds']} CPU s ({found['children_seconds']} in waited-for children)")
    for f in found["by_file"][:12]:
        print(f"{f['own'] + f['children']:8.1f} s {100 * f['share']:5.1f}%  {f['file']}")


if __name__ == "__main__":
    main()
