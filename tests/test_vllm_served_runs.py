"""Commands that start real vLLM CPU servers of their own (collection, the experiment runner) and
stop them however they end: normally, on Ctrl-C, in the background after a SIGINT, a lost server
and a killed runner. Slow (about 5 minutes on 2 AVX2 cores). Kept apart from the tests of one
shared server (test_vllm_integration.py) so that the two files run on two workers side by side:
together in one file they were the suite's longest path (about 9 of its 10.5 minutes there).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aria.llm.embedded import embedded_model_dir
from aria.trajectories import read_trajectories
from vllm_processes import alive, descendants, kill_all, servers_started_by, temp_folder, wait_gone, wait_removed

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def test_collection_by_default_serves_the_model_with_vllm_and_stops_it(tmp_path):
    """``collect_games.py`` without a policy: a vLLM server of its own on a free port, games
    through it, the server gone afterwards, and a producer naming the model, not the port."""
    out = tmp_path / "games.jsonl"
    log = tmp_path / "policy-vllm.log"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts/collect_games.py"), "num_games=2", "batch_size=2",
         "game.max_turns=3", "policy.max_tokens=16", "policy.concurrency=2", f"policy.log={log}", f"out={out}",
         "progress=false"], capture_output=True, text=True, timeout=1200, cwd=tmp_path,
        env={**os.environ, "ARIA_TEST_TAG": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2/2 games done" in done.stdout
    records = list(read_trajectories(out))
    assert len(records) == 2 and all(1 <= r["num_turns"] <= 3 and r["turns"][0]["action"] for r in records)
    producer = json.loads(out.with_name(out.name + ".producer.json").read_text())["producer"]["policy"]
    assert producer["engine"] == "vllm" and producer["model_path"] == str(embedded_model_dir())
    assert producer["max_tokens"] == 16 and "base_url" not in producer
    assert log.is_file() and log.stat().st_size > 0  # the server wrote its log where it was told
    # float32 on any machine: the policy is served as it was trained (serve_vllm.sh's default)
    args = next(line for line in log.read_text().splitlines() if "non-default args" in line)
    assert "'dtype': 'float32'" in args, args
    # Stopped: no vLLM server of this command is left.
    assert not servers_started_by(str(tmp_path))


def served_evaluation(tmp_path: Path, sigint: str = "default") -> tuple[subprocess.Popen, Path, set[int]]:
    """The experiment runner evaluating the embedded model through its own vLLM server, in a
    session of its own: a terminal's foreground job (``sigint="default"``), or a job started in
    the background, which ignores SIGINT (``"ignored"``). Returns once two games are written, with
    the server's processes (the server and its engine)."""
    import signal
    import time

    def as_job() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL if sigint == "default" else signal.SIG_IGN)

    eval_file = tmp_path / "run" / "eval" / "it0.jsonl"
    runner = subprocess.Popen(
        [sys.executable, str(REPO / "scripts/run_experiment.py"), "--config-name", "experiment", "name=served",
         f"run_dir={tmp_path / 'run'}", f"results_dir={tmp_path / 'results'}", "warm_start.enabled=false",
         "methods=[]", "eval.games=200", "eval.max_tokens=16", "eval.batch_size=4", "game.max_turns=4"],
        cwd=tmp_path, start_new_session=True, preexec_fn=as_job, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "ARIA_TEST_TAG": str(tmp_path)})
    deadline = time.monotonic() + 900
    while not (eval_file.is_file() and len(eval_file.read_text().splitlines()) >= 2):
        assert runner.poll() is None, runner.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no evaluation game was written"
        time.sleep(0.5)
    # the server is not the runner's child (the start script that launched it has exited): find it
    # by the environment it inherited
    server = servers_started_by(str(tmp_path))
    assert len(server) == 1, server
    return runner, eval_file, set().union(*(descendants(p) for p in server))


def test_ctrl_c_during_a_served_evaluation_stops_the_run_and_its_server_and_fails_no_game(tmp_path):
    """Ctrl-C (SIGINT to the foreground process group) while the server plays: the run ends
    within seconds with the resume line and exit 130, the server and its engine are gone, and no
    game is recorded as failed because of the interrupt. (This held before the server got a session
    of its own; the run that failed was a background one, which the next test covers.)"""
    import signal
    import time

    runner, eval_file, server = served_evaluation(tmp_path)
    try:
        os.killpg(runner.pid, signal.SIGINT)
        start = time.monotonic()
        _, err = runner.communicate(timeout=120)
        seconds = time.monotonic() - start
        assert runner.returncode == 130, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        assert err.strip().splitlines()[-1].startswith("interrupted: ") and "re-run the same command" in err
        assert seconds < 60, seconds
        assert not wait_gone(server, 45), f"the server outlived the run: {alive(server)}"
    finally:
        kill_all(runner, server)
    records = list(read_trajectories(eval_file))
    assert records and all(r["status"] == "finished" for r in records), [r["errors"] for r in records]
    assert len({r["game_id"] for r in records}) == len(records)


def test_a_background_run_survives_a_sigint_and_a_lost_server_and_a_killed_runner_takes_its_server_with_it(tmp_path):
    """1. A run started in the background ignores SIGINT (as the shell sets it up), and a SIGINT
    to its process group must not reach its server either (before: the server died, the run spent
    300 s per request waiting on it, then recorded every game as failed): the games go on.
    2. Its server killed (an OOM killer's choice): the runner starts another and plays the failed
    games again (``vllm.restarts``; before: every game left failed within seconds and the run
    stopped, hours before anyone looked).
    3. SIGKILL of the runner's own PID (as an OOM killer or a scheduler sends it, not to the
    group): the server it started stops within seconds instead of holding memory and a port
    (before: it ran on, reparented to init)."""
    import signal
    import time

    def finished() -> int:
        return sum(r["status"] == "finished" for r in read_trajectories(eval_file, allow_partial_last_line=True))

    def wait_for(condition, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not condition() and time.monotonic() < deadline:
            assert runner.poll() is None, runner.communicate()[1][-3000:]
            time.sleep(0.5)

    runner, eval_file, server = served_evaluation(tmp_path, sigint="ignored")
    try:
        os.killpg(runner.pid, signal.SIGINT)
        written = finished()
        wait_for(lambda: finished() > written, 120)
        assert runner.poll() is None and alive(server) == server, "the SIGINT stopped the run or its server"
        assert finished() > written

        [api] = servers_started_by(str(tmp_path))
        os.kill(api, signal.SIGKILL)
        assert not wait_gone(server, 45), f"the killed server's engine outlived it: {alive(server)}"
        wait_for(lambda: servers_started_by(str(tmp_path)) - {api}, 600)
        [again] = servers_started_by(str(tmp_path))
        server = descendants(again)
        before = finished()
        wait_for(lambda: finished() > before, 300)
        assert finished() > before, "no game was finished on the new server"

        os.kill(runner.pid, signal.SIGKILL)
        said, err = runner.communicate(timeout=60)
        assert not wait_gone(server, 45), f"the server outlived the run: {alive(server)}"
    finally:
        kill_all(runner, server)
    assert "the vLLM server had ended" in said and "starting it again (1 of vllm.restarts=2)" in said, (said + err)[-3000:]


def test_a_command_killed_while_its_server_starts_takes_the_server_with_it(tmp_path):
    """SIGKILL of a collection whose vLLM server is still loading: the server's watcher stops it
    within seconds, and removes the folder of its IPC sockets, which vLLM leaves behind.
    Before: a loading server ignored SIGTERM and outlived the command by 31 s (the watcher's grace
    meant for a server with requests in flight); its sockets stayed in /tmp (600 in a day here)."""
    import signal
    import time

    runner = subprocess.Popen(
        [sys.executable, str(REPO / "scripts/collect_games.py"), "num_games=2", "game.max_turns=2",
         f"out={tmp_path / 'games.jsonl'}", f"policy.log={tmp_path / 'policy-vllm.log'}", "progress=false"], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "ARIA_TEST_TAG": str(tmp_path)})
    server: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while not servers_started_by(str(tmp_path)):
            assert runner.poll() is None, runner.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no server was started"
            time.sleep(0.2)
        [api] = servers_started_by(str(tmp_path))
        while len(descendants(api)) < 2:  # its engine process started: loading, not yet serving (20-40 s here)
            assert time.monotonic() < deadline, "the server started no engine process"
            time.sleep(0.2)
        sockets = temp_folder(api)
        while not any(p.is_socket() for p in sockets.iterdir()):  # vLLM's own, made where the script said
            assert time.monotonic() < deadline, f"no IPC socket in {sockets}"
            time.sleep(0.2)
        server = descendants(api)
        assert not (tmp_path / "games.jsonl").is_file() or not (tmp_path / "games.jsonl").read_text().strip()
        os.kill(runner.pid, signal.SIGKILL)
        runner.communicate(timeout=60)
        assert not wait_gone(server, 15), f"the server outlived its killed command: {alive(server)}"
        # vLLM removes none of its sockets (not even when stopped cleanly): its watcher removes their folder
        assert wait_removed(sockets, 15), list(sockets.iterdir())
    finally:
        kill_all(runner, server)
