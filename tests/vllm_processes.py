"""Processes of the vLLM tests: free ports, the servers a test's commands started (found by the
environment they inherited), a process and everything below it, and waiting for them to end."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def servers_started_by(tag: str) -> set[int]:
    """The vLLM API servers whose environment carries ``ARIA_TEST_TAG=tag``: the ones a command of
    this test started (they inherit its environment). A server of another run on the machine, such
    as an experiment in the background, is neither counted nor stopped by a test."""
    found = subprocess.run(["pgrep", "-f", "--", "vllm.entrypoints.openai.api_server"], capture_output=True, text=True)
    mine = set()
    for pid in map(int, found.stdout.split()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"ARIA_TEST_TAG={tag}".encode() in environ:
            mine.add(pid)
    return mine


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (from /proc)."""
    from aria.llm.served import process_tree

    return process_tree(pid)


def alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


def kill_all(runner: subprocess.Popen, server: set[int]) -> None:
    """Whatever a failed test leaves running: the runner's process group and the server."""
    if runner.poll() is None:  # its group where it leads one (a runner in a session of its own), else itself
        if os.getpgid(runner.pid) == runner.pid:
            os.killpg(runner.pid, signal.SIGKILL)
        else:
            runner.kill()
    for pid in alive(server):
        os.kill(pid, signal.SIGKILL)


def wait_gone(pids: set[int], seconds: float) -> set[int]:
    """Those of ``pids`` still alive after at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive(pids)


def temp_folder(pid: int) -> Path:
    """The temporary folder of a server started by serve_vllm.sh (its environment's ``TMPDIR``,
    where vLLM makes its IPC sockets): one of its own, which the script removes with the server."""
    environ = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
    folder = Path(environ[b"TMPDIR"].decode())
    assert folder.name.startswith("aria-vllm."), folder  # not the shared temp folder
    return folder


def wait_removed(path: Path, seconds: float) -> bool:
    """Whether ``path`` is gone within ``seconds``."""
    deadline = time.monotonic() + seconds
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return not path.exists()
