"""The reward-model scoring service against a client that is careless or hostile (aria/trainers/reward_service.py).

Requests are raw HTTP (http.client) so that a test can send what a well-behaved client never
would: a body far larger than allowed, a Content-Length of 10**15 or of -1, no token, paths
outside the service's folder, and a causal-LM folder that has no trained score head.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from aria.trainers.reward_service import HttpScorer, InProcessScorer, ScoringError, make_server

TOKEN = "reward-token-0123456789"
SAMPLE = {"observation": "Let's play. Question: Is it an animal?", "action": "Question: Is it a fruit?"}


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory, tiny_model_dir) -> Path:
    from aria.trainers.reward_model import load_reward_model

    torch.manual_seed(0)
    tokenizer, model = load_reward_model(str(tiny_model_dir))
    folder = tmp_path_factory.mktemp("served") / "rm"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def service(reward_model):
    server = make_server(InProcessScorer(reward_model, 512), port=0, token=TOKEN, load_root=reward_model.parent,
                         max_body_bytes=4096, request_timeout=2.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def raw(server, method: str, path: str, body: bytes = b"", headers: dict | None = None, length: str | None = None,
        timeout: float = 10.0) -> tuple[int, dict]:
    """One request with exactly the given headers; ``length`` overrides Content-Length."""
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=timeout)
    conn.putrequest(method, path)
    for key, value in {"Authorization": f"Bearer {TOKEN}", **(headers or {})}.items():
        if value is not None:
            conn.putheader(key, value)
    conn.putheader("Content-Length", length if length is not None else str(len(body)))
    conn.endheaders()
    if body:
        conn.send(body)
    answer = conn.getresponse()
    data = json.loads(answer.read() or b"{}")
    conn.close()
    return answer.status, data


def test_default_bind_is_this_machine_only(reward_model):
    server = make_server(InProcessScorer(reward_model, 512), port=0)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.server_close()


def test_bearer_token(service, caplog):
    body = json.dumps({"samples": [SAMPLE]}).encode()
    assert raw(service, "POST", "/score", body, {"Authorization": None})[0] == 401
    assert raw(service, "POST", "/score", body, {"Authorization": "Bearer wrong"})[0] == 401
    assert raw(service, "GET", "/health", headers={"Authorization": None})[0] == 401
    status, data = raw(service, "POST", "/score", body)
    assert status == 200 and len(data["scores"]) == 1
    url = f"http://127.0.0.1:{service.server_address[1]}"
    assert len(HttpScorer(url, retries=0, token=TOKEN).score([SAMPLE])) == 1
    with pytest.raises(ScoringError, match="401"):
        HttpScorer(url, retries=0).score([SAMPLE])
    assert TOKEN not in caplog.text


def test_oversized_and_lying_bodies_are_refused_before_reading(service):
    start = time.monotonic()
    # 400 MB announced (and not sent): refused at once instead of read into memory
    assert raw(service, "POST", "/score", length=str(400 * 2**20))[0] == 413
    assert raw(service, "POST", "/score", length=str(10**15))[0] == 413  # was a 500 MemoryError
    assert raw(service, "POST", "/score", length="-1")[0] == 400          # was a read until the client hung up
    assert raw(service, "POST", "/score", length="ten")[0] == 400
    assert time.monotonic() - start < 5
    # A body larger than the limit that is really sent
    assert raw(service, "POST", "/score", json.dumps({"samples": [SAMPLE] * 100}).encode())[0] == 413


def test_a_client_that_stalls_is_dropped(service):
    conn = http.client.HTTPConnection("127.0.0.1", service.server_address[1], timeout=10)
    conn.putrequest("POST", "/score")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Content-Length", "1000")
    conn.endheaders()
    conn.send(b'{"samples": [')  # and then nothing
    start = time.monotonic()
    answer = conn.getresponse()
    assert answer.status == 408 and "did not arrive in time" in json.loads(answer.read())["error"]
    assert time.monotonic() - start < 8  # dropped after request_timeout (2 s), not left waiting
    conn.close()


def test_load_stays_below_its_root_and_reveals_no_paths(service, reward_model, tmp_path, tiny_model_dir):
    for path in ("/etc", "/no/such/model", str(reward_model.parent / ".." / "..")):
        status, data = raw(service, "POST", "/load", json.dumps({"path": path}).encode())
        assert status == 403 and "outside" in data["error"] and path not in data["error"]
    # Inside the root but not a model: the same answer whether or not the folder exists.
    answers = set()
    for missing in ("nothing-here", "rm/tokenizer_config.json"):
        status, data = raw(service, "POST", "/load", json.dumps({"path": str(reward_model.parent / missing)}).encode())
        answers.add((status, data["error"]))
    assert len(answers) == 1 and next(iter(answers))[0] == 400 and str(reward_model.parent) not in str(answers)
    status, data = raw(service, "POST", "/load", json.dumps({"path": str(reward_model)}).encode())
    assert status == 200 and data == {"model": "rm"}


def test_a_folder_without_a_trained_score_head_is_refused(reward_model, tiny_model_dir, tmp_path):
    import shutil

    with pytest.raises(ValueError, match="no trained score head"):
        InProcessScorer(tiny_model_dir, 512)  # a causal LM: its head would be random
    causal = reward_model.parent / "causal"
    shutil.copytree(tiny_model_dir, causal, dirs_exist_ok=True)
    server = make_server(InProcessScorer(reward_model, 512), port=0, load_root=reward_model.parent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, data = raw(server, "POST", "/load", json.dumps({"path": str(causal)}).encode())
        assert status == 400 and "trained score head" in data["error"]
        assert raw(server, "GET", "/health")[1]["model"] == "rm"  # still serving the old one
    finally:
        server.shutdown()
        server.server_close()


def test_load_is_off_without_a_root(reward_model):
    server = make_server(InProcessScorer(reward_model, 512), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, data = raw(server, "POST", "/load", json.dumps({"path": str(reward_model)}).encode())
        assert status == 403 and "loading is off" in data["error"]
    finally:
        server.shutdown()
        server.server_close()
