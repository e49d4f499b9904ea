"""Scoring (observation, action) pairs with the pointwise reward model (spec ``aria_method.md`` §5).

Online ARIA uses the reward model's score of every step as that step's advantage. Where the
scoring runs is a config choice (``reward_model.serve.name`` in ``config/onlinereinforce_llm.yaml``),
registered by name in :data:`SCORERS`:

* ``in_process`` (default): the reward model sits in the trainer's own process
  (:class:`InProcessScorer`).
* ``http``: the reward model sits in a small scoring service, as in the original, where it had a
  GPU of its own (:class:`HttpScorer` is the client; ``scripts/serve_reward_model.py`` starts
  the service, :func:`make_server` is the service). The trainer tells the service to load a
  refreshed reward model through ``POST /load``.

Every scorer has ``score(samples) -> np.ndarray`` ([N] float64, one score per
``{"observation", "action"}`` sample, in order) and ``load(model_dir)``.

The service speaks JSON over HTTP:

* ``GET /health`` -> ``{"model": <folder>, "scored": <samples scored so far>}``
* ``POST /score`` ``{"samples": [{"observation": str, "action": str}, ...]}`` -> ``{"scores": [float, ...]}``
* ``POST /load`` ``{"path": <folder>}`` -> ``{"model": <folder>}``

A bad request gets status 400 and ``{"error": ...}`` naming the sample and field; the client
retries only transport errors and 5xx answers, with backoff, then raises
:class:`ScoringError` naming the URL.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

log = logging.getLogger(__name__)


class ScoringError(RuntimeError):
    """The scoring service could not be reached or refused a request (after retries)."""


def check_pairs(samples: Any) -> list[dict]:
    """The samples of a scoring request, checked: a list of objects with string ``observation``
    and ``action`` (the first problem is named by index and field)."""
    if not isinstance(samples, list):
        raise ValueError("samples: expected a list of {observation, action} objects")
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise ValueError(f"samples[{i}]: expected an object")
        for key in ("observation", "action"):
            if not isinstance(sample.get(key), str):
                raise ValueError(f"samples[{i}].{key}: missing or not a string")
    return samples


def load_scoring_model(model_dir: str | Path, dtype: str = "float32", device: str = "cpu"):
    """(tokenizer, model) of a trained reward model in eval mode: a full sequence-classification
    folder, or a LoRA adapter folder (merged into its base for scoring)."""
    from aria.trainers.reward_model import load_reward_model

    model_dir = Path(model_dir)
    config_path = model_dir / "adapter_config.json"
    if config_path.is_file():
        from peft import PeftModel

        base = json.loads(config_path.read_text())["base_model_name_or_path"]
        tokenizer, model = load_reward_model(base, dtype)
        model = PeftModel.from_pretrained(model, model_dir).merge_and_unload()
        from transformers import AutoTokenizer

        if (model_dir / "tokenizer_config.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
    else:
        tokenizer, model = load_reward_model(str(model_dir), dtype)
    model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model.to(device).eval().requires_grad_(False)


def merge_if_adapter(model_dir: str | Path) -> Path:
    """Make ``model_dir`` a full reward-model folder: a LoRA adapter there is merged into its base
    (the adapter moves to ``<model_dir>.adapter``); a full folder is left as it is. A full folder
    can start the next refresh and be served without peft."""
    import shutil

    model_dir = Path(model_dir)
    if not (model_dir / "adapter_config.json").is_file():
        return model_dir
    tokenizer, model = load_scoring_model(model_dir)
    tmp = model_dir.with_name(model_dir.name + ".merged.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    adapter = model_dir.with_name(model_dir.name + ".adapter")
    shutil.rmtree(adapter, ignore_errors=True)
    model_dir.rename(adapter)
    tmp.rename(model_dir)
    return model_dir


class InProcessScorer:
    """The reward model in this process.

    Args:
        model_dir: a trained reward model folder (``train_rm.py``'s ``final/``), or None to start
            without one (call :meth:`load` before :meth:`score`).
        max_prompt_tokens: observations are truncated on the left, as in training.
        batch_size: samples per forward pass (sorted by length, so little padding).
        dtype, device: where and how the model runs.
    """

    def __init__(self, model_dir: str | Path | None = None, max_prompt_tokens: int = 512, batch_size: int = 16,
                 dtype: str = "float32", device: str = "cpu"):
        self.max_prompt_tokens, self.batch_size, self.dtype, self.device = max_prompt_tokens, batch_size, dtype, device
        self.model_dir: str | None = None
        self.tokenizer = self.model = None
        if model_dir is not None:
            self.load(model_dir)

    def load(self, model_dir: str | Path) -> None:
        self.tokenizer, self.model = load_scoring_model(model_dir, self.dtype, self.device)
        self.model_dir = str(model_dir)

    def score(self, samples: Sequence[dict]) -> np.ndarray:
        from aria.policy import encode_sample
        from aria.trainers.reward_model import score_encoded

        if self.model is None:
            raise ScoringError("no reward model loaded yet")
        if not samples:
            return np.zeros(0)
        # append_eos=False: the head reads the action's last token, as the reward-model trainer encodes it
        encoded = [encode_sample(self.tokenizer, s["observation"], s["action"], self.max_prompt_tokens, False)
                   for s in samples]
        return score_encoded(self.model, encoded, self.tokenizer.pad_token_id, self.batch_size, self.device)


class HttpScorer:
    """Client of the scoring service (module doc).

    Args:
        url: the service's root, e.g. ``http://127.0.0.1:8100``.
        timeout: seconds per request.
        retries: further attempts after a transport error or a 5xx answer, with exponential backoff.
        batch_size: samples per ``/score`` request.
    """

    def __init__(self, url: str, timeout: float = 300.0, retries: int = 3, backoff: float = 1.0, batch_size: int = 256):
        import requests

        self.url = url.rstrip("/")
        self.timeout, self.retries, self.backoff, self.batch_size = timeout, retries, backoff, batch_size
        self._session = requests.Session()

    def _request(self, method: str, route: str, body: dict | None = None) -> dict:
        import requests

        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                answer = self._session.request(method, self.url + route, json=body, timeout=self.timeout)
            except requests.RequestException as err:
                last = f"{type(err).__name__}: {err}"
                continue
            if answer.status_code >= 500:
                last = f"HTTP {answer.status_code}: {answer.text[:300]}"
                continue
            try:
                data = answer.json()
            except ValueError:
                raise ScoringError(f"{self.url}{route}: HTTP {answer.status_code}, not JSON: {answer.text[:300]!r}") from None
            if answer.status_code != 200:
                raise ScoringError(f"{self.url}{route}: HTTP {answer.status_code}: {data.get('error', data)}")
            return data
        raise ScoringError(f"{self.url}{route}: no answer after {self.retries + 1} attempt(s): {last}")

    def load(self, model_dir: str | Path) -> None:
        self._request("POST", "/load", {"path": str(Path(model_dir).resolve())})

    def health(self) -> dict:
        return self._request("GET", "/health")

    def score(self, samples: Sequence[dict]) -> np.ndarray:
        pairs = [{"observation": s["observation"], "action": s["action"]} for s in samples]
        scores: list[float] = []
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start : start + self.batch_size]
            got = self._request("POST", "/score", {"samples": chunk})["scores"]
            if len(got) != len(chunk):
                raise ScoringError(f"{self.url}/score: {len(got)} scores for {len(chunk)} samples")
            scores += got
        return np.asarray(scores, dtype=np.float64)


def _in_process(serve: dict, reward_model: dict, device: str) -> InProcessScorer:
    return InProcessScorer(None, reward_model["max_prompt_tokens"], reward_model["score_batch_size"],
                           reward_model.get("dtype", "float32"), device)


def _http(serve: dict, reward_model: dict, device: str) -> HttpScorer:
    return HttpScorer(serve["url"], serve.get("timeout", 300.0), serve.get("retries", 3),
                      batch_size=reward_model["score_batch_size"])


#: Where the reward model runs, by name (config ``reward_model.serve.name``).
SCORERS: dict[str, Callable[[dict, dict, str], Any]] = {"in_process": _in_process, "http": _http}


def build_scorer(reward_model: dict, device: str = "cpu"):
    """The scorer named by ``reward_model["serve"]["name"]`` (no model loaded yet)."""
    serve = dict(reward_model["serve"])
    if serve["name"] not in SCORERS:
        raise KeyError(f"unknown reward-model serving {serve['name']!r}; registered: {sorted(SCORERS)}")
    return SCORERS[serve["name"]](serve, reward_model, device)


# ---- the service ---------------------------------------------------------------------------------
def make_server(scorer: InProcessScorer, host: str = "127.0.0.1", port: int = 8100) -> ThreadingHTTPServer:
    """An HTTP server around ``scorer`` (module doc); call ``serve_forever()`` on it. Requests are
    scored one at a time (one model, one lock)."""
    lock = threading.Lock()
    counter = {"scored": 0}

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError as err:
                raise ValueError(f"request body is not JSON: {err}") from None
            if not isinstance(body, dict):
                raise ValueError("request body: expected a JSON object")
            return body

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.rstrip("/") == "/health":
                self._reply(200, {"model": scorer.model_dir, "scored": counter["scored"]})
            else:
                self._reply(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            try:
                body = self._body()
                if self.path.rstrip("/") == "/score":
                    samples = check_pairs(body.get("samples"))
                    with lock:
                        scores = scorer.score(samples)
                        counter["scored"] += len(samples)
                    self._reply(200, {"scores": [float(s) for s in scores]})
                elif self.path.rstrip("/") == "/load":
                    path = body.get("path")
                    if not isinstance(path, str) or not Path(path).is_dir():
                        raise ValueError(f"path: not a folder: {path!r}")
                    with lock:
                        scorer.load(path)
                    self._reply(200, {"model": scorer.model_dir})
                else:
                    self._reply(404, {"error": f"no route {self.path}"})
            except (ValueError, ScoringError) as err:
                self._reply(400, {"error": str(err)})
            except Exception as err:  # a broken model must answer, not hang the client
                log.exception("scoring failed")
                self._reply(500, {"error": f"{type(err).__name__}: {err}"})

        def log_message(self, format: str, *args) -> None:  # one line per request is noise at this rate
            log.debug(format, *args)

    return ThreadingHTTPServer((host, port), Handler)
