"""A :class:`~aria.llm.base.ChatModel` over any OpenAI-compatible chat-completions endpoint.

Used for the policy during evaluation (a vLLM server) and for LLM oracles. Each conversation is
one HTTP request; a thread pool sends ``concurrency`` of them at once. Transient failures
(connection errors, timeouts, HTTP 429 and 5xx) are retried a bounded number of times with
exponential backoff and jitter; anything else (HTTP 400, 404, ...) is a bug in the request and
is not retried. A request that still fails comes back as ``Completion(text=None, error=...)``,
never as an exception, so one bad request cannot take down the rest of a batch.
"""
from __future__ import annotations

import logging
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import openai

from aria.io import ConfigError
from aria.llm.base import Completion, Message, OutputFormat

_MAX_ERROR_CHARS = 300


def quiet_http_logs() -> None:
    """The openai client's HTTP layer logs a line per request at INFO (httpx; httpx2 from openai 3),
    which a Hydra app's INFO logging prints: thousands of lines per collection."""
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _default_api_key(api_key: str | None) -> str:
    """``api_key`` if given, else ``$OPENAI_API_KEY``, else ``"EMPTY"`` (what vLLM accepts). A key
    that is not a string (``api_key=[sk-...]`` reads as a list) is refused without its value, where
    the client would have sent its text form."""
    if api_key is not None and not isinstance(api_key, str):
        raise ConfigError(f"api_key: expected a string (the key itself), got a {type(api_key).__name__}: "
                          "give the key as a plain value, or in $OPENAI_API_KEY")
    if api_key is not None:
        return api_key
    return os.environ.get("OPENAI_API_KEY", "EMPTY")


def _one_line(text: str, limit: int = _MAX_ERROR_CHARS) -> str:
    """Collapse whitespace so an error message fits on one log line, cut to ``limit`` chars."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _describe(err: BaseException) -> str:
    """A short description of a client error: type, HTTP status if any, message and cause."""
    status = getattr(err, "status_code", None)
    prefix = f"{type(err).__name__} (HTTP {status})" if status is not None else type(err).__name__
    cause = f" ({type(err.__cause__).__name__}: {err.__cause__})" if err.__cause__ is not None else ""
    return _one_line(f"{prefix}: {err}{cause}")


def is_retryable(err: BaseException) -> bool:
    """True for transient failures: connection errors, timeouts, HTTP 429 and HTTP 5xx."""
    if isinstance(err, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(err, openai.APIStatusError):
        return err.status_code == 429 or err.status_code >= 500
    return False


class EndpointChatModel:
    """Batched chat completions from an OpenAI-compatible server (vLLM, OpenAI, ...).

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the served model name sent with every request (also this backend's ``name``).
        api_key: bearer token; ``None`` means ``$OPENAI_API_KEY`` or ``"EMPTY"``.
        temperature, top_p, max_tokens, seed, stop: sampling options passed through
            (``None`` leaves the server's default).
        timeout_s: per-attempt HTTP timeout in seconds.
        max_retries: extra attempts after the first for transient failures.
        retry_base_delay_s: backoff before retry ``k`` (0-based) is about ``base * 2**k``.
        concurrency: requests in flight at once.
        gone: for a server this process started, what ended it (None while it runs; e.g.
            :meth:`aria.llm.served.EngineWatch.reason`): a request that fails then is not retried,
            and its error says why.
    """

    #: each request is its own HTTP call; the server batches what is in flight (aria.scheduler)
    concurrent = True

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 1.0,
        top_p: float | None = None,
        max_tokens: int | None = None,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        retry_base_delay_s: float = 0.5,
        concurrency: int = 16,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        gone: Callable[[], str | None] | None = None,
    ):
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.name = model
        self.base_url = base_url
        self.max_retries = int(max_retries)
        self.retry_base_delay_s = float(retry_base_delay_s)
        self._gone = gone or (lambda: None)
        # Retries are ours (bounded, with jitter), so the client's own are switched off.
        self._client = openai.OpenAI(
            base_url=base_url, api_key=_default_api_key(api_key), timeout=timeout_s, max_retries=0
        )
        self._options = self._sampling_options(temperature, top_p, max_tokens, seed, stop)
        quiet_http_logs()
        # What produced a game (recorded beside resumable transcripts; no key).
        self.settings = {"engine": "endpoint", "base_url": base_url, **self._options}
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="endpoint")
        # What generation cost so far: reply tokens as the server counts them, and the wall seconds
        # during which at least one generate call was in flight (games call it from their own
        # threads at once: a sum over calls counted the same second once per game).
        self.generated_tokens, self.generation_seconds = 0, 0.0
        self._usage_lock = threading.Lock()
        self._in_flight, self._busy_since = 0, 0.0

    def _sampling_options(
        self,
        temperature: float,
        top_p: float | None,
        max_tokens: int | None,
        seed: int | None,
        stop: Sequence[str] | None,
    ) -> dict[str, Any]:
        """The request's sampling fields; unset ones are left out so the server's defaults apply."""
        options: dict[str, Any] = {"model": self.name, "temperature": float(temperature)}
        optional = {"top_p": top_p, "max_tokens": max_tokens, "seed": seed, "stop": list(stop) if stop else None}
        options.update({key: value for key, value in optional.items() if value is not None})
        return options

    def generate(self, conversations: Sequence[list[Message]], keys: Sequence[str] | None = None,
                 formats: Sequence[OutputFormat | None] | None = None) -> list[Completion]:
        """One completion per conversation, in input order; ``keys`` is unused (no server-side state).

        ``formats`` constrains replies through the server's structured outputs: a JSON schema as
        the OpenAI API's ``response_format`` (vLLM), a regex as vLLM's
        ``structured_outputs`` request field.
        """
        if formats is None:
            formats = [None] * len(conversations)
        if len(formats) != len(conversations):
            raise ValueError(f"{len(formats)} formats for {len(conversations)} conversations")
        with self._usage_lock:
            if self._in_flight == 0:
                self._busy_since = time.perf_counter()
            self._in_flight += 1
        try:
            return list(self._pool.map(self._complete, conversations, formats))
        finally:
            with self._usage_lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self.generation_seconds += time.perf_counter() - self._busy_since

    def release(self, key: str) -> None:
        """Nothing to forget: the endpoint keeps no per-game state on this side."""

    def server_lost(self) -> str | None:
        """What ended the server this process started for this policy (``gone``); None while it
        serves, and always None for a server this process did not start."""
        return self._gone()

    def _complete(self, messages: list[Message], fmt: OutputFormat | None = None) -> Completion:
        """Send one request, retrying transient failures; never raises."""
        attempts = 0
        while True:
            try:
                return self._request(messages, fmt)
            except Exception as err:  # every failure becomes an error completion
                attempts += 1
                ended = self._gone()
                if attempts > self.max_retries or not is_retryable(err) or ended:
                    return Completion(
                        text=None,
                        error=f"chat completion failed after {attempts} attempt(s) at {self.base_url} "
                        f"(model {self.name!r}): {_describe(err)}" + (f"; {ended}" if ended else ""),
                    )
                time.sleep(self._backoff(attempts - 1))

    def _request(self, messages: list[Message], fmt: OutputFormat | None = None) -> Completion:
        """One HTTP request; an empty reply is reported as an error, not retried."""
        response = self._client.chat.completions.create(messages=messages, **self._options, **structured_request(fmt))
        if not hasattr(response, "choices"):  # the client hands back a body it could not parse (an HTML page)
            return Completion(text=None, error=f"not a chat completion from {self.base_url} (model {self.name!r}): "
                                               f"{str(response)[:120]!r}")
        content = response.choices[0].message.content if response.choices else None
        if response.usage is not None:
            with self._usage_lock:
                self.generated_tokens += response.usage.completion_tokens or 0
        if content is None:
            return Completion(text=None, error=f"empty reply from {self.base_url} (model {self.name!r})")
        return Completion(text=content)

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter: between half and all of ``base * 2**attempt`` seconds."""
        return self.retry_base_delay_s * (2**attempt) * random.uniform(0.5, 1.0)


def structured_request(fmt: OutputFormat | None) -> dict[str, Any]:
    """The request fields that constrain a reply to ``fmt`` (none for free text): vLLM's structured
    outputs. (OpenAI's strict schemas need an object at the root, which a two-player turn's
    ``anyOf`` schema is not: constrained replies are for vLLM servers.)"""
    if fmt is None:
        return {}
    if fmt.kind == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": fmt.schema,
                                                                            "strict": True}}}
    return {"extra_body": {"structured_outputs": {"regex": fmt.spec}}}


def check_server(
    base_url: str, api_key: str | None = None, model: str | None = None, timeout_s: float = 10.0
) -> list[str]:
    """Fail fast before a long run: the server answers ``GET /models`` and serves ``model``.

    Returns the served model ids. Raises ``RuntimeError`` naming the URL and what came back.
    """
    url = f"{base_url.rstrip('/')}/models"
    client = openai.OpenAI(base_url=base_url, api_key=_default_api_key(api_key), timeout=timeout_s, max_retries=0)
    try:
        served = [entry.id for entry in client.models.list()]
    except Exception as err:
        raise RuntimeError(f"cannot list models at {url}: {_describe(err)}; is the server running?") from err
    if model is not None and model not in served:
        raise RuntimeError(f"model {model!r} is not served at {url}; the server serves {served}")
    return served
