"""Batched rollout collection: reward/turn accounting, real tiny model, resume after a kill, failures."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


from aria.games.question.game import target_schedule
from aria.games.question.oracle import build_oracle
from aria.games.question.play import game_id, play_games
from aria.llm.local import LocalChatModel
from aria.trajectories import read_trajectories
from conftest import ScriptedPolicy

REPO = Path(__file__).resolve().parents[1]


def test_reward_and_turn_accounting(tmp_path, twenty_questions, game_configs):
    oracle = build_oracle({"name": "knowledge_base"}, game_configs["twenty_questions"])
    target_of = {}
    for i, t in enumerate(target_schedule(twenty_questions.targets, 3, seed=7)):
        target_of[game_id("twenty_questions", 7, i)] = t.name
    ids = list(target_of)
    script = {
        ids[0]: ["Question: Is it alive?", "no question here", f"Question: Is it a {target_of[ids[0]]}?"],
        ids[1]: ["Question: Is it man-made?"],  # never guesses: plays all 20 turns
        ids[2]: [f"Question: Is it a {target_of[ids[2]]}?"],
    }
    policy = ScriptedPolicy(script)
    out = tmp_path / "games.jsonl"
    summary = play_games(twenty_questions, policy, oracle, out, num_games=3, seed=7, batch_size=2, progress=False)
    records = {r["game_id"]: r for r in read_trajectories(out)}
    assert summary.played == 3 and summary.failed == 0 and summary.counts["successes"] == 2

    won_third = records[ids[0]]
    assert [t["reward"] for t in won_third["turns"]] == [-1.0, -1.0, 0.0]
    assert won_third["turns"][1]["question"] is None
    assert won_third["turns"][1]["observation"] == "Invalid Question."
    assert won_third["turns"][2]["observation"] == "Yes."
    assert (won_third["num_turns"], won_third["success"], won_third["final_reward"], won_third["env_return"]) == (3, True, 1.0, -2.0)

    lost = records[ids[1]]
    assert lost["num_turns"] == 20 and lost["success"] is False and lost["final_reward"] == 0.0
    assert lost["env_return"] == -20.0

    first_turn_win = records[ids[2]]
    assert [t["reward"] for t in first_turn_win["turns"]] == [0.0]
    # Batching: never more than batch_size games per policy call, and finished slots refilled.
    assert max(policy.calls) == 2 and policy.calls[:2] == [2, 2]


def test_batched_play_with_a_real_tiny_model(tmp_path, tiny_model_dir, guess_my_city, game_configs):
    policy = LocalChatModel(str(tiny_model_dir), max_new_tokens=8, temperature=1.0, seed=0)
    oracle = build_oracle({"name": "knowledge_base"}, game_configs["guess_my_city"])
    out = tmp_path / "gmc.jsonl"
    summary = play_games(guess_my_city, policy, oracle, out, num_games=5, seed=1, batch_size=3, progress=False)
    records = list(read_trajectories(out))
    assert len(records) == summary.played == 5
    assert {r["game_id"] for r in records} == {game_id("guess_my_city", 1, i) for i in range(5)}
    for record in records:
        assert 1 <= record["num_turns"] <= 20 and record["status"] == "finished"
        assert record["model"] == tiny_model_dir.name
    assert summary.turns == sum(r["num_turns"] for r in records)


def _collect_command(out: Path, model_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, str(REPO / "scripts" / "collect_games.py"), f"out={out}", "policy=local", f"policy.model_path={model_dir}",
        "policy.max_new_tokens=8", "progress=false", *extra,
    ]


def test_resume_after_an_interrupted_run(tmp_path, tiny_model_dir):
    out = tmp_path / "games.jsonl"
    # 5 questions a game (a random tiny model plays every game to the limit): resume is the subject
    cmd = _collect_command(out, tiny_model_dir, "num_games=12", "batch_size=2", "seed=3", "game.max_turns=5")
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = out.read_text()
    done_before = [json.loads(line)["game_id"] for line in before.splitlines() if line.strip()]
    assert 2 <= len(done_before) < 12

    # the re-run in this process: its subject is what it reads back, not how a process ends
    from in_process import run_script

    result = run_script(*cmd[1:], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    ids = [r["game_id"] for r in read_trajectories(out)]
    assert sorted(ids) == sorted(game_id("twenty_questions", 3, i) for i in range(12))  # none lost, none twice
    assert out.read_text().startswith(before)  # games finished before the kill are kept as they were
    assert f"({12 - len(done_before)} played now" in result.stdout


class _FlakyChatServer(BaseHTTPRequestHandler):
    """OpenAI-compatible chat endpoint that fails its first ``fail_first`` requests with HTTP 500."""

    fail_first = 0
    attempts = 0
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 (http.server naming)
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            type(self).attempts += 1
            fail = type(self).attempts <= self.fail_first
        if fail:
            self.send_response(500)
            self.end_headers()
            return
        body = json.dumps({
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Question: Is it man-made?"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_failing_endpoint_marks_the_game_failed_and_the_batch_goes_on(tmp_path):
    _FlakyChatServer.fail_first = 3  # the first request and both its retries
    _FlakyChatServer.attempts = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyChatServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "games.jsonl"
        cmd = [
            sys.executable, str(REPO / "scripts" / "collect_games.py"), "policy=endpoint", f"out={out}",
            f"policy.base_url=http://127.0.0.1:{server.server_address[1]}/v1", "policy.model=m",
            "policy.max_retries=2", "policy.retry_base_delay_s=0.01", "policy.concurrency=1",
            "num_games=3", "batch_size=3", "progress=false",
        ]
        result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 1
        assert "1 game(s) failed" in result.stderr
        records = list(read_trajectories(out))
        failed = [r for r in records if r["status"] == "failed"]
        assert len(records) == 3 and len(failed) == 1
        assert "policy:" in failed[0]["errors"][0] and "500" in failed[0]["errors"][0]
        assert all(r["num_turns"] == 20 for r in records if r["status"] == "finished")  # the others played on

        # Re-running retries only the failed game; the server now answers every request.
        finished_before = {r["game_id"]: r for r in records if r["status"] == "finished"}
        retry = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        server.shutdown()
    assert retry.returncode == 0, retry.stderr
    assert "(1 played now, 0 failed)" in retry.stdout
    after = {r["game_id"]: r for r in read_trajectories(out)}
    assert len(after) == 3 and all(r["status"] == "finished" for r in after.values())
    assert all(after[k] == v for k, v in finished_before.items())
