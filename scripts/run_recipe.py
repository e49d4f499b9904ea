#!/usr/bin/env python3
"""Run a documented recipe as written: the README's pipeline block, command by command, each timed.

    python scripts/run_recipe.py WORKDIR                 # the README's "The pipeline, one command per stage"
    python scripts/run_recipe.py WORKDIR --append scripts/run_offline.py=model.path=/tmp/tiny

WORKDIR gets links to the repository's folders the commands read (scripts/, config/, ...), so that
what they write (data/, outputs/, results/) lands there and not in the checkout. The commands run
in one bash shell in WORKDIR, in the README's order, each one's output in WORKDIR/recipe-logs/;
the first that fails stops the run. A vLLM server the recipe starts is stopped when the shell
ends, however it ends (``VLLM_PARENT_PID``). ``--append PROGRAM=ARGS`` adds arguments to every
command of one program (the tests give tiny models that way). Writes WORKDIR/recipe.json: each
command with its README line, exit status and seconds, and the CPU.

The same parser reads every bash block of the docs (``documented_commands``): the tests check
that each documented command names a program that exists, with settings its config knows.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from aria.cli import protect_terminal

REPO = Path(__file__).resolve().parent.parent
#: The recipe: the README's section of this name, its first bash block.
RECIPE_SECTION = "The pipeline, one command per stage"
#: What the recipe's commands read from the checkout (the rest they write).
LINKED = ("scripts", "config", "reward_aggregation", "clustering", "evaluation", "dataset", "aria")


@dataclass
class Command:
    file: str  # the document, relative to the repository
    line: int  # its first line there
    text: str  # as written, continuation lines joined

    @property
    def program(self) -> str | None:
        """The script the command runs (``scripts/run_offline.py``, ``evaluation/eval.sh``), or
        None for a shell built-in such as a variable assignment."""
        inner = re.search(r'\$\((.*)\)', self.text)  # eval "$(scripts/serve_vllm.sh ...)"
        words = shlex.split(inner.group(1) if inner and self.text.startswith("eval") else self.text)
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):  # VAR=value cmd
            words.pop(0)
        if words[:2] == ["accelerate", "launch"]:
            words = [w for w in words[2:] if w.endswith((".py", ".sh"))][:1]
        elif words and words[0] in ("python", "python3", "bash"):
            words = words[1:]
        return words[0] if words and words[0].endswith((".py", ".sh")) else None


def bash_blocks(path: Path) -> list[tuple[int, str, str]]:
    """Every ```bash block of a Markdown file: (first line of its body, the heading it is under, body)."""
    blocks, heading, body, start = [], "", None, 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if body is None:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            elif line.strip() == "```bash":
                body, start = [], number + 1
        elif line.strip() == "```":
            blocks.append((start, heading, "\n".join(body)))
            body = None
        else:
            body.append(line)
    return blocks


def commands(file: str, start: int, body: str) -> list[Command]:
    """The commands of a block: comments dropped, a line ending in ``\\`` joined to the next."""
    found, pending, first = [], "", 0
    for offset, line in enumerate(body.splitlines()):
        text = re.sub(r"(^|\s)#.*$", "", line).rstrip() if not line.lstrip().startswith("#") else ""
        if not pending:
            first = start + offset
        if text.endswith("\\"):
            pending += text[:-1].strip() + " "
            continue
        text = (pending + text.strip()).strip()
        pending = ""
        if text:
            found.append(Command(file, first, text))
    return found


def documented_commands(repo: Path = REPO) -> list[Command]:
    """Every command of every bash block in README.md and docs/*.md."""
    documents = [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
    return [c for doc in documents for start, _, body in bash_blocks(doc)
            for c in commands(str(doc.relative_to(repo)), start, body)]


def recipe(repo: Path = REPO) -> list[Command]:
    """The README's recipe: the commands of the first bash block under :data:`RECIPE_SECTION`."""
    for start, heading, body in bash_blocks(repo / "README.md"):
        if heading == RECIPE_SECTION:
            return commands("README.md", start, body)
    raise SystemExit(f"error: README.md has no bash block under '## {RECIPE_SECTION}'")


def shell_script(steps: list[Command], appended: dict[str, str], logs: Path) -> str:
    """One bash script that runs ``steps`` in order, each with its program's ``appended``
    arguments, its output in ``logs/NN.log``, and a marker line with its status and seconds."""
    lines = ["export VLLM_PARENT_PID=$$  # a server started here stops when this shell ends"]
    for i, step in enumerate(steps):
        text = step.text + (" " + appended[step.program] if step.program in appended else "")
        lines += [f"__start=$(date +%s.%N)",
                  f"{{ {text} ; }} > {shlex.quote(str(logs / f'{i:02d}.log'))} 2>&1 < /dev/null",
                  "__rc=$?",
                  f'echo "@@ {i} $__rc $__start $(date +%s.%N)"',
                  '[ "$__rc" -eq 0 ] || exit "$__rc"']
    return "\n".join(lines) + "\n"


def link_checkout(workdir: Path, repo: Path = REPO) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        link = workdir / name
        if not link.exists():
            link.symlink_to(repo / name, target_is_directory=True)


def run(workdir: Path, steps: list[Command], appended: dict[str, str], env: dict | None = None) -> list[dict]:
    """Run ``steps`` in ``workdir`` (:func:`shell_script`); each step's status and seconds, up to the first that failed."""
    logs = workdir / "recipe-logs"
    logs.mkdir(parents=True, exist_ok=True)
    link_checkout(workdir)
    done = subprocess.run(["bash", "-c", shell_script(steps, appended, logs)], cwd=workdir, env=env,
                          capture_output=True, text=True)
    results = []
    for line in done.stdout.splitlines():
        if line.startswith("@@ "):
            _, index, rc, began, ended = line.split()
            step = steps[int(index)]
            results.append({**asdict(step), "program": step.program, "rc": int(rc),
                            "seconds": round(float(ended) - float(began), 1),
                            "log": str(logs / f"{int(index):02d}.log")})
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--append", action="append", default=[], metavar="PROGRAM=ARGS",
                        help="arguments added to every command of PROGRAM (as the README names it)")
    args = parser.parse_args(argv)
    appended = {}
    for item in args.append:
        program, sep, extra = item.partition("=")
        if not sep:
            parser.error(f"--append: expected PROGRAM=ARGS, got {item!r}")
        appended[program] = extra
    steps = recipe()
    start = time.perf_counter()
    results = run(args.workdir.resolve(), steps, appended, dict(os.environ))
    sys.path.insert(0, str(REPO))
    from aria.llm.hardware import describe, label

    record = {"cpu": label(describe()), "wall_seconds": round(time.perf_counter() - start, 1), "steps": results}
    (args.workdir / "recipe.json").write_text(json.dumps(record, indent=1) + "\n")
    for r in results:
        print(f"{r['rc']:>3}  {r['seconds']:>7.1f} s  README.md:{r['line']}  {r['text']}")
    failed = len(results) < len(steps) or any(r["rc"] for r in results)
    print(f"{'stopped' if failed else 'done'}: {len(results)} of {len(steps)} commands, {record['wall_seconds']} s on {record['cpu']}"
          + (f"; the failed command's output: {results[-1]['log']}" if failed and results else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    sys.exit(main())
