"""A scripted OpenAI-compatible server on 127.0.0.1 for the tests (real HTTP, a daemon thread).

It stands in for vLLM or OpenAI, which cannot run in every test: ``/v1/models``,
``/v1/chat/completions`` (replies from :class:`Script`) and ``/v1/embeddings`` (a deterministic
vector per text). Every request's body and ``Authorization`` header are kept, so a test can check
what a client sent.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

MODEL = "test-model"


def last_user(body: dict) -> str:
    return [m["content"] for m in body["messages"] if m["role"] == "user"][-1]


@dataclass
class Script:
    """What the server does with the n-th chat request (0-based) and its JSON body."""

    reply: Callable[[dict], str] = lambda body: "echo: " + last_user(body)
    status: Callable[[int, dict], int] = lambda n, body: 200
    delay_s: float = 0.0
    models: tuple[str, ...] = (MODEL,)
    root: str | None = None  # the model folder vLLM reports as each model's ``root``
    page: str | None = None  # answer every chat request with this HTML page (status 200), as a proxy's login page


@dataclass
class FakeServer:
    url: str
    script: Script = field(default_factory=Script)
    requests: list[dict] = field(default_factory=list)
    authorizations: list[str] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: Callable[[], None] = lambda: None


def _handler(state: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": "test_error", "code": status}})

        def do_GET(self) -> None:
            state.authorizations.append(self.headers.get("Authorization", ""))
            if self.path != "/v1/models":
                return self._error(404, f"no route {self.path}")
            models = [{"id": m, "object": "model", "created": 0, "owned_by": "test", "root": state.script.root}
                      for m in state.script.models]
            self._send(200, {"object": "list", "data": models})

        def do_POST(self) -> None:
            state.authorizations.append(self.headers.get("Authorization", ""))
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/v1/embeddings":
                data = [{"object": "embedding", "index": i,
                         "embedding": [b / 255 + 0.01 for b in hashlib.sha256(t.encode()).digest()[:8]]}
                        for i, t in enumerate(body["input"])]
                return self._send(200, {"object": "list", "data": data, "model": body["model"],
                                        "usage": {"prompt_tokens": 0, "total_tokens": 0}})
            if self.path != "/v1/chat/completions":
                return self._error(404, f"no route {self.path}")
            with state.lock:
                n = len(state.requests)
                state.requests.append(body)
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            try:
                time.sleep(state.script.delay_s)
                self._respond(n, body)
            finally:
                with state.lock:
                    state.in_flight -= 1

        def _respond(self, n: int, body: dict) -> None:
            if body["model"] not in state.script.models:
                return self._error(404, f"model {body['model']} does not exist")
            if state.script.page is not None:
                data = state.script.page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                return self.wfile.write(data)
            status = state.script.status(n, body)
            if status != 200:
                return self._error(status, f"scripted failure {status}")
            message = {"role": "assistant", "content": state.script.reply(body)}
            self._send(200, {
                "id": f"cmpl-{n}", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            })

    return Handler


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that timed out closed its socket; the late reply's broken pipe is expected."""


def start_server(script: Script | None = None) -> FakeServer:
    """Start a server in a daemon thread; call ``.stop()`` when done."""
    state = FakeServer(url="", script=script or Script())
    httpd = QuietServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()

    def stop() -> None:
        httpd.shutdown()
        httpd.server_close()

    state.stop = stop
    return state
