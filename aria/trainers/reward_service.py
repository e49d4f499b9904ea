"""Scoring (observation, action) pairs with the pointwise reward model (``docs/method.md`` §5).

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

* ``GET /health`` -> ``{"model": <folder name>, "scored": <samples scored so far>}``
* ``POST /score`` ``{"samples": [{"observation": str, "action": str}, ...]}`` -> ``{"scores": [float, ...]}``
* ``POST /load`` ``{"path": <folder>}`` -> ``{"model": <folder name>}``

A bad request gets status 400 and ``{"error": ...}`` naming the sample and field; the client
retries only transport errors and 5xx answers, with backoff, then raises
:class:`ScoringError` naming the URL.

The service trusts no client: it binds 127.0.0.1 unless told otherwise; with a token (read from
an environment variable, never logged) every request needs ``Authorization: Bearer <token>``
(401 otherwise); ``/load`` loads only folders below ``load_root`` (403 outside it, and off without
one) and only trained reward models (a folder without a trained score head is refused); a body
must state its ``Content-Length`` (411), which must lie within ``max_body_bytes`` (413) before a
byte is read, and a client that stops sending is dropped after ``request_timeout`` seconds.
Errors name the request's problem but never a path on the server or an exception's text; those
go to the service's log.
"""
from __future__ import annotations

import hmac
import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import requests
from safetensors import safe_open

from aria.io import ConfigError, atomic_folder
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): accelerate, peft, torch, transformers

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


def _adapter_has_head(model_dir: Path) -> bool:
    """A LoRA reward model's adapter saves its trained head in full beside the LoRA matrices."""
    weights = model_dir / "adapter_model.safetensors"
    if not weights.is_file():
        return False
    with safe_open(str(weights), framework="pt") as handle:
        return any("lora_" not in key for key in handle.keys())


def load_scoring_model(model_dir: str | Path, dtype: str = "float32", device: str = "cpu"):
    """(tokenizer, model) of a trained reward model in eval mode: a full sequence-classification
    folder, or a LoRA adapter folder (merged into its base for scoring). A folder without a
    trained score head (a causal LM) is refused with a ``ValueError``. ``dtype="auto"``:
    bfloat16 where ``device`` computes it natively, else float32 (:func:`aria.llm.local.resolve_dtype`)."""
    from aria.llm.local import resolve_dtype
    from aria.trainers.reward_model import load_reward_model

    dtype = str(resolve_dtype(dtype, str(device))).removeprefix("torch.")
    model_dir = Path(model_dir)
    config_path = model_dir / "adapter_config.json"
    if config_path.is_file():
        from peft import PeftModel

        from aria.llm.policy import peft_quietly

        if not _adapter_has_head(model_dir):
            raise ValueError("the adapter holds no trained score head (saved without modules_to_save?)")
        base = json.loads(config_path.read_text())["base_model_name_or_path"]
        tokenizer, model = load_reward_model(base, dtype, setting=f"{config_path}: base_model_name_or_path", head_follows=True)
        with peft_quietly():
            model = PeftModel.from_pretrained(model, model_dir).merge_and_unload()
        from transformers import AutoTokenizer

        if (model_dir / "tokenizer_config.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
    else:
        tokenizer, model = load_reward_model(str(model_dir), dtype, require_head=True, setting="the reward model")
    model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model.to(device).eval().requires_grad_(False)


def merge_if_adapter(model_dir: str | Path) -> Path:
    """Make ``model_dir`` a full reward-model folder: a LoRA adapter there is merged into its base
    (the adapter moves to ``<model_dir>.adapter``); a full folder is left as it is. A full folder
    can start the next refresh and be served without peft."""
    from aria.llm.policy import ENCODING_FILE

    model_dir = Path(model_dir)
    if not (model_dir / "adapter_config.json").is_file():
        return model_dir
    tokenizer, model = load_scoring_model(model_dir)
    with atomic_folder(model_dir, keep_old_as=model_dir.with_name(model_dir.name + ".adapter")) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if (model_dir / ENCODING_FILE).is_file():
            shutil.copy2(model_dir / ENCODING_FILE, tmp / ENCODING_FILE)
    return model_dir


#: How far a bfloat16 score may be from the float32 score of the same model and sample: bfloat16
#: keeps 8 bits of mantissa, so every matrix product is off by about 2^-8 relatively
#: (tests/test_reward_model.py checks it on a random tiny model; absolute, for scores of order 1).
BF16_SCORE_TOLERANCE = 0.05

#: How :class:`InProcessScorer` lays samples out for the model (config ``reward_model.score_packing``).
PACKINGS = ("prefix_tree", "padded")


class InProcessScorer:
    """The reward model in this process.

    Args:
        model_dir: a trained reward model folder (``train_rm.py``'s ``final/``), or None to start
            without one (call :meth:`load` before :meth:`score`).
        max_prompt_tokens: observations are truncated on the left to this many tokens for a model
            folder without a saved encoding (:class:`aria.llm.policy.Encoding`); a saved one is used as it is.
        batch_size: samples per forward pass of ``packing="padded"`` (sorted by length, so little padding).
        dtype, device: where and how the model runs; ``dtype="auto"`` is bfloat16 where the
            device computes it natively (scores then differ from float32 by at most
            :data:`BF16_SCORE_TOLERANCE`, tested), else float32.
        packing: ``prefix_tree`` (default): the steps of a game share their history's tokens in
            one pass (:func:`aria.trainers.reward_model.score_prefix_trees`, same scores up to
            float rounding); ``padded``: every sample on its own row of a padded batch. A model
            that cannot be driven the first way (checked on two samples at every load) is
            scored the second way, with a warning.
        pack_tokens: the most tokens of one prefix-tree pass (its attention is dense, so
            quadratic in this).
    """

    def __init__(self, model_dir: str | Path | None = None, max_prompt_tokens: int = 512, batch_size: int = 16,
                 dtype: str = "float32", device: str = "cpu", packing: str = "prefix_tree", pack_tokens: int = 2048):
        if packing not in PACKINGS:
            raise ValueError(f"unknown packing {packing!r}; expected one of {PACKINGS}")
        self.max_prompt_tokens, self.batch_size, self.dtype, self.device = max_prompt_tokens, batch_size, dtype, device
        self.packing, self.pack_tokens = packing, pack_tokens
        self.model_dir: str | None = None
        self.tokenizer = self.model = self.encoding = None
        self.prefix_trees = False  # whether this model is scored in prefix trees (set at load)
        if model_dir is not None:
            self.load(model_dir)

    def load(self, model_dir: str | Path) -> None:
        from aria.llm.policy import Encoding

        self.tokenizer, self.model = load_scoring_model(model_dir, self.dtype, self.device)
        # Samples are encoded as the model was trained (its saved encoding); a folder written
        # before encodings were saved gets the reward-model trainer's defaults of that time. A
        # prompt over the cutoff is cut on the left, not refused: it scores a policy's steps, and a
        # policy plays a prompt longer than its own cutoff cut there too.
        saved = Encoding.saved_in(Path(model_dir), Encoding(self.max_prompt_tokens, append_eos=False))
        self.encoding = replace(saved, over_long="cut_left")
        self.model_dir = str(model_dir)
        self.prefix_trees = self.packing == "prefix_tree" and self._prefix_trees_score_alike()

    def _prefix_trees_score_alike(self) -> bool:
        """Whether this model scores two samples with a shared prefix the same in a prefix tree as
        in a padded batch: an architecture that ignores custom masks or position ids would not."""
        import torch

        from aria.trainers.reward_model import can_score_prefix_trees, score_encoded, score_prefix_trees

        if not can_score_prefix_trees(self.model):
            log.warning("%s: no score head named 'score' on a base model; scoring padded batches", self.model_dir)
            return False
        history = "Question: Is it an animal?\nAnswer: No.\n"
        probe = [self.encoding.encode(self.tokenizer, history * 2 + "Ask.", "Is it a tool?"),
                 self.encoding.encode(self.tokenizer, history * 3 + "Ask.", "Is it a fruit?")]
        padded = score_encoded(self.model, probe, self.tokenizer.pad_token_id, 2, self.device)
        tree = score_prefix_trees(self.model, probe, self.pack_tokens, self.device, self.tokenizer.pad_token_id)
        bf16 = next(self.model.parameters()).dtype != torch.float32
        tolerance = BF16_SCORE_TOLERANCE if bf16 else 1e-3
        if np.abs(tree - padded).max() > tolerance * max(1.0, np.abs(padded).max()):
            log.warning("%s: prefix-tree scores differ from padded ones (%s vs %s); scoring padded batches",
                        self.model_dir, tree.tolist(), padded.tolist())
            return False
        return True

    def score(self, samples: Sequence[dict]) -> np.ndarray:
        from aria.trainers.reward_model import score_encoded, score_prefix_trees

        if self.model is None:
            raise ScoringError("no reward model loaded yet")
        if not samples:
            return np.zeros(0)
        encoded = [self.encoding.encode(self.tokenizer, s["observation"], s["action"]) for s in samples]
        if self.prefix_trees:
            return score_prefix_trees(self.model, encoded, self.pack_tokens, self.device, self.tokenizer.pad_token_id)
        return score_encoded(self.model, encoded, self.tokenizer.pad_token_id, self.batch_size, self.device)


class HttpScorer:
    """Client of the scoring service (module doc).

    Args:
        url: the service's root, e.g. ``http://127.0.0.1:8100``.
        timeout: seconds per request.
        retries: further attempts after a transport error or a 5xx answer, with exponential backoff.
        batch_size: samples per ``/score`` request.
    """

    def __init__(self, url: str, timeout: float = 300.0, retries: int = 3, backoff: float = 1.0, batch_size: int = 256,
                 token: str | None = None):
        self.url = url.rstrip("/")
        self.timeout, self.retries, self.backoff, self.batch_size = timeout, retries, backoff, batch_size
        self._session = requests.Session()
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"

    def _request(self, method: str, route: str, body: dict | None = None) -> dict:
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
                           reward_model["dtype"], device, reward_model["score_packing"], reward_model["score_pack_tokens"])


def _http(serve: dict, reward_model: dict, device: str) -> HttpScorer:
    token_env = serve["token_env"]
    return HttpScorer(serve["url"], serve["timeout"], serve["retries"],
                      batch_size=reward_model["score_batch_size"], token=os.environ.get(token_env) if token_env else None)


#: Where the reward model runs, by name (config ``reward_model.serve.name``).
SCORERS: dict[str, Callable[[dict, dict, str], Any]] = {"in_process": _in_process, "http": _http}


def build_scorer(reward_model: dict, device: str = "cpu"):
    """The scorer named by ``reward_model["serve"]["name"]`` (no model loaded yet)."""
    serve = dict(reward_model["serve"])
    if serve["name"] not in SCORERS:
        raise ConfigError(f"reward_model.serve.name: unknown {serve['name']!r} (known: {', '.join(sorted(SCORERS))})")
    return SCORERS[serve["name"]](serve, reward_model, device)


# ---- the service ---------------------------------------------------------------------------------
class _Refused(Exception):
    """A request the service will not serve: HTTP status and the message the client sees."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def make_server(scorer: InProcessScorer, host: str = "127.0.0.1", port: int = 8100, token: str | None = None,
                load_root: str | Path | None = None, max_body_bytes: int = 16 * 2**20,
                request_timeout: float = 60.0) -> ThreadingHTTPServer:
    """An HTTP server around ``scorer`` (module doc); call ``serve_forever()`` on it. Requests are
    scored one at a time (one model, one lock).

    Args:
        token: the bearer token every request must carry (None: no check).
        load_root: ``/load`` serves only folders below it (None: ``/load`` is off).
        max_body_bytes: the largest request body read.
        request_timeout: seconds a client may take to send its request.
    """
    service = _Service(scorer, token, Path(load_root).resolve() if load_root is not None else None, max_body_bytes)
    # a handler class per server: http.server builds one handler per request from the class alone
    handler = type("Handler", (ScoringHandler,), {"service": service, "timeout": request_timeout})
    return ThreadingHTTPServer((host, port), handler)


@dataclass
class _Service:
    """What every request of one server shares: the scorer behind its lock, and the server's settings."""
    scorer: InProcessScorer
    token: str | None
    root: Path | None  # /load serves only folders below it (None: /load is off)
    max_body_bytes: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    scored: int = 0

    def model_name(self) -> str | None:
        return Path(self.scorer.model_dir).name if self.scorer.model_dir else None


class ScoringHandler(BaseHTTPRequestHandler):
    """The routes of the module doc; ``service`` and ``timeout`` (applied to the socket: a stalled
    client is dropped) are set per server by :func:`make_server`."""
    service: _Service

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorize(self) -> None:
        token = self.service.token
        if token is not None and not hmac.compare_digest(self.headers.get("Authorization", ""), f"Bearer {token}"):
            raise _Refused(401, "unauthorized: send Authorization: Bearer <token>")

    def _body(self) -> dict:
        raw = self.headers.get("Content-Length")
        if raw is None:
            raise _Refused(411, "Content-Length required")
        try:
            length = int(raw)
        except ValueError:
            raise _Refused(400, "Content-Length is not a number") from None
        if length < 0:
            raise _Refused(400, "Content-Length is negative")
        if length > self.service.max_body_bytes:
            self.close_connection = True  # the body is not read
            raise _Refused(413, f"request body of {length} bytes is over the limit of {self.service.max_body_bytes}")
        try:
            data = self.rfile.read(length)
        except (TimeoutError, OSError):
            self.close_connection = True
            raise _Refused(408, "the request body did not arrive in time") from None
        try:
            body = json.loads(data or b"{}")
        except ValueError as err:
            raise _Refused(400, f"request body is not JSON: {err}") from None
        if not isinstance(body, dict):
            raise _Refused(400, "request body: expected a JSON object")
        return body

    def _load(self, path: Any) -> None:
        root = self.service.root
        if root is None:
            raise _Refused(403, "loading is off: start the service with a load root (--load-root)")
        if not isinstance(path, str):
            raise _Refused(400, "path: expected a string")
        folder = Path(path).resolve()
        if folder != root and root not in folder.parents:
            raise _Refused(403, "path: outside the folder this service may load from")
        try:
            with self.service.lock:
                self.service.scorer.load(folder)
        except Exception:  # noqa: BLE001 - the client learns that it failed, the log says why
            log.exception("loading a reward model failed")
            raise _Refused(400, "path: not a trained reward-model folder this service can load "
                                "(a folder with a trained score head)") from None

    def _route(self, method: str) -> None:
        service = self.service
        try:
            self._authorize()
            route = self.path.rstrip("/")
            if method == "GET" and route == "/health":
                return self._reply(200, {"model": service.model_name(), "scored": service.scored})
            if method == "POST" and route == "/score":
                samples = check_pairs(self._body().get("samples"))
                with service.lock:
                    scores = service.scorer.score(samples)
                    service.scored += len(samples)
                return self._reply(200, {"scores": [float(s) for s in scores]})
            if method == "POST" and route == "/load":
                self._load(self._body().get("path"))
                return self._reply(200, {"model": service.model_name()})
            raise _Refused(404, f"no route {method} {self.path[:100]}")
        except _Refused as err:
            self._reply(err.status, {"error": str(err)})
        except ValueError as err:  # a bad sample: check_pairs names index and field
            self._reply(400, {"error": str(err)})
        except ScoringError as err:
            self._reply(400, {"error": str(err)})
        except Exception:  # a broken model must answer, not hang the client; the details stay in the log
            log.exception("scoring failed")
            self._reply(500, {"error": "internal error while scoring (see the service's log)"})

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def log_message(self, format: str, *args) -> None:  # one line per request is noise at this rate
        log.debug(format, *args)
