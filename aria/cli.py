"""How every command ends when it cannot go on: one line, a known exit status, no traceback.

* Bad input (a file's problem named by file, line and field: :class:`~aria.io.DataError`), bad
  settings (:class:`ConfigError`), a file made under other settings, an input that is not what
  the step before used, or a folder another run holds (:class:`~aria.io.InUse`):
  ``error: <one line>`` and exit status 2, before any model is loaded where the check allows it.
* A path it cannot write (a full disk, a read-only or forbidden folder, a file where a folder
  should be): ``error: <path>: <why>: <what to do>`` and exit status 2. Every writer writes whole
  files (a temporary file renamed) or whole games (a torn last line is dropped on resume), so
  nothing half-written is trusted by the re-run.
* Ctrl-C: ``interrupted: <what was kept>; re-run the same command to resume`` and exit status 130
  (the shell's code for SIGINT). The work that finished is on disk already: every writer of this
  project writes whole games, whole files and whole checkpoints. SIGTERM (``kill``, a cluster
  scheduler's stop) ends the command the same way, with exit status 143, so that the servers it
  started are stopped by it and not left to their watchdog. A command started in the background
  of a script keeps the SIGINT the shell set it to ignore: a Ctrl-C meant for the script does
  not stop it (tests/test_vllm_integration.py).
"""
from __future__ import annotations

import argparse
import errno
import os
import shlex
import signal
import sys
import textwrap
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, MissingConfigException

from aria.io import ConfigError, DataError, InUse, StaleInput
from aria.resources import config_dir, hydra_message
from aria.secrets import RedactingStream, command_line_secrets, redact_text, secret_values
from aria.settings import out_of_bounds
from aria.trajectories import ResumeMismatch
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): torch

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


def number(kind: type = int, **rules: float) -> Callable[[str], Any]:
    """An argparse ``type``: a ``kind`` (int or float) within ``rules`` (those of
    :func:`aria.settings.bounded`: ``ge``, ``gt``, ``le``, ``lt``). Out of range, argparse's own
    one line with the usage and exit status 2, before anything loads."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if problem := out_of_bounds(value, rules):
            raise argparse.ArgumentTypeError(f"expected {problem}, got {text}")
        return value

    return parse


def torch_device(text: str) -> str:
    """An argparse ``type``: a device torch knows (``cpu``, ``cuda``, ``cuda:1``)."""
    import torch

    try:
        torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected a torch device (cpu, cuda, cuda:1), got {text!r}") from None
    return text


def _expected_errors() -> tuple[type[BaseException], ...]:
    return DataError, ConfigError, ResumeMismatch, StaleInput, InUse, FileNotFoundError


class _Stopped(KeyboardInterrupt):
    """SIGTERM, raised where the command is, as Ctrl-C is: ``finally`` blocks stop its servers."""


def _on_sigterm(signum, frame):
    raise _Stopped()


def command_line(argv: list[str] | None = None) -> str:
    """This process's command line as a record may keep it: ``python`` and its arguments, every
    secret of them and of the environment redacted (:mod:`aria.secrets`)."""
    argv = sys.argv if argv is None else argv
    return redact_text(shlex.join(["python", *argv]), command_line_secrets(argv[1:]) + secret_values())


def protect_terminal(argv: list[str] | None = None) -> None:
    """Redact, from everything this process prints, the secrets given on its command line
    (:func:`aria.secrets.command_line_secrets`) and in its environment: Hydra's own messages (its
    errors, "Error executing job with overrides: [...]", its "use +key=value" hints) repeat the
    command line. Every command calls it first, before Hydra reads the command line; from then on
    a Ctrl-C before the command's work is one line too."""
    secrets = command_line_secrets(sys.argv[1:] if argv is None else argv)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, RedactingStream):
            setattr(sys, name, RedactingStream(stream, secrets))
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _interrupted_before_the_command


def _interrupted_before_the_command(kind, value, traceback) -> None:
    """A Ctrl-C between :func:`protect_terminal` and :func:`command` (Hydra composing the
    settings, the checks before any work): one line, not Python's traceback; Python still exits
    130. (One in the imports above a script's first line stays Python's: nothing is written there.)"""
    if issubclass(kind, KeyboardInterrupt):
        print("interrupted: before any work; nothing was written", file=sys.stderr)
        return
    sys.__excepthook__(kind, value, traceback)


def hydra_command(config_name: str, run: Callable[[Any], Any]) -> None:
    """A trainer script's whole ``__main__``: no secret of the command line reaches the terminal
    (:func:`protect_terminal`), an unknown option or key is one line and exit 2 before Hydra
    (:func:`check_command_line`), then ``run`` on the config Hydra composes from
    ``config/<config_name>.yaml`` (:func:`aria.resources.config_dir`, so ``ARIA_CONFIG_DIR`` applies as
    everywhere in the package) and the command line. Hydra names the job after ``run``'s module (its
    ``--help`` says ``launch``); no output folder or log file is named after it."""
    protect_terminal()
    check_command_line(config_name)
    hydra.main(config_path=str(config_dir()), config_name=config_name, version_base="1.3")(run)()


def help_first(argv: list[str] | None = None) -> bool:
    """On ``--help``, print what the command does (its script's or module's docstring) before
    Hydra lists its settings (config/hydra/help/aria.yaml); whether ``--help`` was asked."""
    args = sys.argv[1:] if argv is None else argv
    if "--help" not in args and "-h" not in args:
        return False
    print(textwrap.dedent(getattr(sys.modules["__main__"], "__doc__", None) or "").strip() + "\n")
    return True


def check_command_line(config_name: str, argv: list[str] | None = None) -> None:
    """Compose the command's config (``config/<config_name>.yaml``, or the ``--config-name`` given)
    from its command line as Hydra will, before Hydra does: an unknown option of a config group
    (``experiment=nope``), a key the config lacks or an override Hydra cannot parse is one line,
    exit 2 (Hydra's own message is 2-16 lines, exit 1). Hydra's flags (``--help``, ``--cfg``,
    ``--multirun``, ...) are left to Hydra; ``--help`` first prints the script's docstring (what it
    does, how it is run), before Hydra's list of settings (config/hydra/help/aria.yaml)."""
    args = sys.argv[1:] if argv is None else argv
    if help_first(args):
        return
    name, overrides, i = config_name, [], 0
    while i < len(args):
        if args[i] in ("--config-name", "-cn") and i + 1 < len(args):
            name, i = args[i + 1], i + 2
            continue
        if args[i].startswith("--config-name="):
            name = args[i].split("=", 1)[1]
        elif args[i].startswith("-"):
            return
        else:
            overrides.append(args[i])
        i += 1
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            compose(config_name=name, overrides=overrides)
    except MissingConfigException as err:
        text = str(err)
        first = text.splitlines()[0]
        known = [line.strip() for line in text.split("Available options in", 1)[-1].split("Config search path")[0]
                 .splitlines()[1:] if line.strip()] if "Available options in" in text else []
        print(f"error: {first}" + (f" (known: {', '.join(known)})" if known else ""), file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except (HydraException, ValueError) as err:  # (Hydra raises a ValueError for an override such as "=2")
        print(f"error: {hydra_message(err)}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    finally:
        GlobalHydra.instance().clear()


@contextmanager
def command(kept: Callable[[], str] | None = None) -> Iterator[None]:
    """Run a command's body; ``kept`` says what a Ctrl-C leaves on disk ("12 games in out.jsonl")."""
    previous = None
    if threading.current_thread() is threading.main_thread():  # signal handlers belong to the main thread
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    except KeyboardInterrupt as stop:
        try:
            what = kept() if kept else "the finished work"
        except Exception:  # noqa: BLE001 - the summary must not turn a Ctrl-C into a traceback
            what = "the finished work"
        print(f"interrupted: {what} kept; re-run the same command to resume", file=sys.stderr)
        sys.exit(EXIT_TERMINATED if isinstance(stop, _Stopped) else EXIT_INTERRUPTED)
    except _expected_errors() as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except openai_errors() as err:  # an endpoint (an embedder, an oracle) kept failing after its retries
        request = getattr(err, "request", None)
        where = f"endpoint {request.url}" if request is not None else "an endpoint"
        print(f"error: {where}: {type(err).__name__}: {' '.join(str(err).split())[:300]} (finished work is kept; "
              "re-run the same command to resume)", file=sys.stderr)
        sys.exit(1)
    except Exception as err:  # noqa: BLE001 - only a path the user can fix ends here; the rest is re-raised
        line = unusable_path(err)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


#: What to do about a path the command cannot write, by ``errno``.
_PATH_ADVICE = {
    errno.ENOSPC: "free some space, then re-run the same command to resume (finished work is kept)",
    errno.EDQUOT: "free some space in your quota, then re-run the same command to resume (finished work is kept)",
    errno.EROFS: "give a folder on a writable file system (run_dir=..., results_dir=..., out=...)",
    errno.EACCES: "give a folder you can write, or change its permissions",
    errno.EPERM: "give a folder you can write, or change its permissions",
    errno.EEXIST: "a file stands where a folder is needed: give another path, or move the file",
    errno.ENOTDIR: "a file stands where a folder is needed: give another path, or move the file",
    errno.EISDIR: "a folder stands where a file is needed: give another path",
}


#: How libraries that write files without raising ``OSError`` (safetensors, torch.save) say the
#: disk is full.
_DISK_FULL_WORDS = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")


def unusable_path(err: BaseException) -> str | None:
    """One line for an error about a path the user can fix (a full disk, a read-only or
    forbidden folder, a file where a folder should be), else None: every other error (a refused
    connection, a bug) is not the user's path and keeps its traceback."""
    for cause in (err, err.__cause__, err.__context__):
        if isinstance(cause, OSError) and cause.errno in _PATH_ADVICE:
            where = f"{cause.filename}: " if cause.filename else ""
            return f"{where}{cause.strerror or os.strerror(cause.errno)}: {_PATH_ADVICE[cause.errno]}"
    text = str(err)
    if any(words in text for words in _DISK_FULL_WORDS):
        return f"No space left on device ({type(err).__name__}: {' '.join(text.split())[:200]}): {_PATH_ADVICE[errno.ENOSPC]}"
    return None


def games_in(path: str | Path) -> str:
    """'<n> finished games in <path>' (for :func:`command`'s ``kept``)."""
    path = Path(path)
    n = sum(1 for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()) \
        if path.is_file() else 0
    return f"{n} finished game(s) in {path}"


def checkpoints_in(output_dir: str | Path) -> str:
    """'checkpoints up to step <n> in <dir>' (for :func:`command`'s ``kept``)."""
    folder = Path(output_dir) / "checkpoints"
    steps = sorted(int(p.name.split("-")[1]) for p in folder.glob("step-*") if not p.name.endswith(".tmp")) \
        if folder.is_dir() else []
    return f"checkpoints up to step {steps[-1]} in {folder}" if steps else f"no checkpoint yet in {folder}"


def openai_errors() -> tuple[type[BaseException], ...]:
    """openai's error class once something has imported openai (nothing raised one before): the
    steps that never call an endpoint do not pay for importing it (about 1 s a command)."""
    module = sys.modules.get("openai")
    return (module.OpenAIError,) if module is not None else ()
