"""The test command from a fresh clone, as CI runs it: this checkout's HEAD cloned into a scratch
folder, then ``bash .ci/run`` there (install, then the README's test command); the wall time of
the whole and of the tests (pytest's own summary line), the tests' count and the machine.

    python benchmarks/fresh_clone.py [--note "what else ran"]

Run it with nothing else on the cores: the figure is the suite's time on this kind of CPU, which
docs/testing.md's table shows (the newest run on each kind, one file each:
benchmarks/results/fresh_clone_<kind>.json). The clone's install points the editable ``aria``
package at the scratch folder; the script points it back at this checkout when it ends.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aria.llm.hardware import describe, label

REPO = Path(__file__).resolve().parents[1]

#: pytest's last line: "1254 passed, 3 warnings in 606.12s (0:10:06)"
SUMMARY = re.compile(r"(\d+) passed.* in ([\d.]+)s")


def kind(machine: dict) -> str:
    """The file name's kind of CPU: amx, avx512_bf16 or avx2."""
    flags = machine["flags"]
    return "amx" if any(f.startswith("amx") for f in flags) else "avx512_bf16" if "avx512_bf16" in flags else "avx2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--note", default="", help="what else ran on the machine")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/fresh_clone_<kind>.json")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    scratch = Path(tempfile.mkdtemp(prefix="fresh-clone-"))
    try:
        subprocess.run(["git", "clone", "-q", str(REPO), str(scratch / "repo")], check=True)
        start = time.monotonic()
        done = subprocess.run(["bash", ".ci/run"], cwd=scratch / "repo", capture_output=True, text=True,
                              env={**os.environ, "CI": "true", "PYTHON": sys.executable},
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal,
        # even when this script runs as a background job (which inherits Ctrl-C ignored, and the
        # tests that send one to a command would wait for nothing)
        wall = time.monotonic() - start
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        back = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO)],
                              capture_output=True, text=True)
        if back.returncode != 0:
            print(f"warning: `pip install --no-deps -e {REPO}` failed; the package may still point at the deleted "
                  f"clone:\n{back.stderr[-1000:]}", file=sys.stderr)
    last = next((line for line in reversed(done.stdout.splitlines()) if SUMMARY.search(line)), "")
    found = SUMMARY.search(last)
    if done.returncode != 0 or found is None:
        sys.stdout.write(done.stdout[-4000:] + done.stderr[-2000:])
        raise SystemExit(f"the test command failed (exit {done.returncode}): nothing written")
    machine = describe()
    report = {"machine": machine, "note": args.note, "commit": commit, "date": datetime.date.today().isoformat(),
              "tests": int(found.group(1)), "tests_seconds": round(float(found.group(2)), 1),
              "wall_seconds": round(wall, 1), "summary_line": last.strip()}
    out = args.out or REPO / "benchmarks" / "results" / f"fresh_clone_{kind(machine)}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{label(machine)}: {report['tests']} tests in {report['tests_seconds']} s, "
          f"{report['wall_seconds']} s with the install -> {out}")


if __name__ == "__main__":
    main()
