"""A command's script run in the test's own process, as ``python SCRIPT ARGS...`` runs it.

For tests whose subject is what a command prints, writes and returns for bad input: the script
runs whole (its Hydra entry point, ``aria.cli.command`` and the exit status), in a process that
has already imported torch and transformers, which a new process on 2 cores spends 5-8 s on.
How a command ends as a process (signals, Ctrl-C, a killed runner, servers it started) and at
least one case of each command stay in subprocesses, where they are what a user runs.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import runpy
import subprocess
import sys
from pathlib import Path


def run_script(script: str | Path, *args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` with ``args`` as its command line; its exit status, stdout and stderr.

    An exception the command does not turn into an exit status propagates (a subprocess would
    print its traceback and exit 1), so the test fails with the traceback."""
    from hydra.core.global_hydra import GlobalHydra

    from aria import io as aria_io

    held_before = set(aria_io._HELD)  # noqa: SLF001 - what the command holds goes at its end, as at a process's exit
    out, err = io.StringIO(), io.StringIO()
    argv, here = sys.argv, os.getcwd()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # Hydra's logging set-up points them at `out`
    code = 0
    GlobalHydra.instance().clear()
    try:
        sys.argv = [str(script), *args]
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv = argv
        os.chdir(here)
        root.handlers[:], root.level = handlers, level
        GlobalHydra.instance().clear()
        for key in set(aria_io._HELD) - held_before:  # noqa: SLF001
            aria_io._let_go(key)  # noqa: SLF001
        if "accelerate.state" in sys.modules:  # one per process: the next command chooses its own
            sys.modules["accelerate.state"].AcceleratorState._reset_state(reset_partial_state=True)
    return subprocess.CompletedProcess([str(script), *args], code, out.getvalue(), err.getvalue())
