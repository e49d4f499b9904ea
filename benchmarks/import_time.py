"""What importing the slow libraries where they are used buys: each command rejecting a bad
setting (one line, exit 2) as shipped, against the same command with those libraries imported
first; and each library's own import time in a fresh interpreter.

    python benchmarks/import_time.py [--repeats 5]

The package imports a library inside a function only where that keeps a library measured here at
:data:`SLOW` seconds or more (beyond the libraries it loads itself) out of the file's import:
tests/test_imports.py reads the report and fails on any other function-level import. Writes
benchmarks/results/import_time.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from aria.llm.hardware import describe

REPO = Path(__file__).resolve().parents[1]

#: The libraries aria imports where they are used. A dotted name counts for what it imports first
#: (``scipy.stats``), so the bare package can be fast and stay at the top of a file.
LIBRARIES = ("torch", "transformers", "accelerate", "peft", "sentence_transformers", "sklearn", "scipy.stats",
             "scipy.cluster.hierarchy", "matplotlib", "matplotlib.pyplot", "openai", "safetensors.torch",
             "llguidance.hf")

#: Seconds a library must add to a command's start to be imported where it is used.
SLOW = 0.1

#: Commands and a setting each rejects (a value out of its bounds): the same work both ways.
COMMANDS = (
    ("scripts/run_offline.py", "train.epochs=-1"),
    ("scripts/run_online.py", "online.iterations=-1"),
    ("scripts/train_rm.py", "train.epochs=-1"),
    ("scripts/collect_games.py", "num_games=-1"),
    ("evaluation/evaluate.py", "num_games=-1"),
    ("reward_aggregation/1_embed_and_cluster.py", "clustering.k_min=0"),
    ("scripts/run_experiment.py", "experiment=small", "collect.games=-1"),
)


def seconds(code: str, repeats: int) -> tuple[float, subprocess.CompletedProcess]:
    """The median wall time of ``python -c code`` in a fresh interpreter, and its last run."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times), done


def loaded_with(name: str) -> list[str]:
    """The other :data:`LIBRARIES` that importing ``name`` loads (``safetensors.torch`` loads torch):
    a file that already imports those at its top gains nothing by deferring ``name``."""
    code = (f"import json, sys; import {name}; "
            f"print(json.dumps([m for m in {list(LIBRARIES)!r} if m != {name!r} and m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def run_command(argv: tuple[str, ...], first: tuple[str, ...] = ()) -> str:
    """``argv`` run as its script's ``__main__``, after importing ``first``."""
    return "; ".join([*(f"import {name}" for name in first), "import runpy, sys", f"sys.argv = {list(argv)!r}",
                      f"runpy.run_path({argv[0]!r}, run_name='__main__')"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/import_time.json")
    parser.add_argument("--note", default="", help="what else ran on the machine")
    args = parser.parse_args()

    bare, _ = seconds("pass", args.repeats)
    libraries, loads, beyond = {}, {}, {}
    for name in LIBRARIES:
        wall, done = seconds(f"import {name}", args.repeats)
        if done.returncode != 0:
            raise SystemExit(f"import {name} failed: {done.stderr.strip().splitlines()[-1]}")
        libraries[name] = round(wall - bare, 3)
        loads[name] = loaded_with(name)
        if loads[name]:  # what it costs beyond the libraries it loads (safetensors.torch: little beyond torch)
            first = f"import {', '.join(loads[name])}"
            after, _ = seconds(f"{first}; import {name}", args.repeats)
            before, _ = seconds(first, args.repeats)
            beyond[name] = round(max(after - before, 0.0), 3)
        else:
            beyond[name] = libraries[name]
        print(f"{name:26} {libraries[name]:6.2f} s, {beyond[name]:6.2f} s beyond what it loads "
              f"({', '.join(loads[name]) or 'nothing else measured'})")

    commands = []
    for argv in COMMANDS:
        shipped, done = seconds(run_command(argv), args.repeats)
        eager, eager_done = seconds(run_command(argv, LIBRARIES), args.repeats)
        line = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        if done.returncode != 2 or eager_done.returncode != 2 or eager_done.stderr.strip().splitlines()[-1] != line:
            raise SystemExit(f"{' '.join(argv)}: expected exit 2 with one line both ways, got {done.returncode} "
                             f"{line!r} and {eager_done.returncode}")
        commands.append({"command": " ".join(argv), "line": line, "shipped_s": round(shipped, 3),
                         "eager_s": round(eager, 3)})
        print(f"{' '.join(argv):60} {shipped:5.2f} s shipped, {eager:5.2f} s eager")

    report = {"machine": describe(), "note": args.note, "repeats": args.repeats, "slow": SLOW,
              "python_start_s": round(bare, 3), "libraries": libraries, "loads": loads,
              "beyond_loads": beyond, "commands": commands}
    args.out.write_text(json.dumps(report, indent=1) + "\n")


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary row of a report."""
    rows = report["commands"]
    shipped = statistics.median(r["shipped_s"] for r in rows)
    eager = statistics.median(r["eager_s"] for r in rows)
    fastest = min(report["libraries"], key=report["libraries"].get)
    slowest = max(report["libraries"], key=report["libraries"].get)
    return [{"compares": f"a bad setting's exit 2 in {len(rows)} commands: the slow libraries imported where used "
                         "(as shipped) against imported first",
             "result": f"median {shipped:.2f} s against {eager:.2f} s ({eager / shipped:.1f}x); the libraries "
                       f"{report['libraries'][fastest]:.2f} s ({fastest}) to {report['libraries'][slowest]:.2f} s "
                       f"({slowest}) each"}]


if __name__ == "__main__":
    main()
