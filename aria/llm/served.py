"""A model played through a vLLM server that this process starts and stops (``policy=vllm``).

Measured on a 2-core AVX2 CPU, vLLM generated 1.4-1.65x the tokens/s of the in-process policy at
16-48 games at once (``benchmarks/generation_engines.py``, docs/benchmarks.md "Generation engines"), but its
server takes about 50 s to start. So for a collection of more than a few thousand tokens, the
default collection policy serves the model with vLLM (:func:`start_server`, i.e.
``scripts/serve_vllm.sh``) on a free port of 127.0.0.1 when the first turn is asked for, plays
through :class:`aria.llm.endpoint.EndpointChatModel`, and stops the server when it is closed or
the process exits. Nothing is started when every game is already in the file.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Sequence

from aria.io import model_digest, read_json
from aria.llm.base import Completion, Message, OutputFormat
from aria.llm.embedded import resolve_model_path
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): openai

#: The server script shipped in the package (scripts/serve_vllm.sh runs the same file).
SERVE_SCRIPT = Path(__file__).with_name("serve_vllm.sh")


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


#: The LoRA ranks a vLLM server can be set up for (its ``--max-lora-rank``).
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def start_server(model_dir: Path, name: str, port: int, log: Path | None = None, eager: bool | None = None,
                 dtype: str | None = None, block_size: int | None = None,
                 adapters: Mapping[str, Path] | None = None, reloadable: bool = False) -> dict:
    """``scripts/serve_vllm.sh MODEL_DIR PORT``: returns its BASE_URL, MODEL_NAME and PID once the
    server answers (RuntimeError with the end of its log otherwise). ``eager``, ``dtype`` and
    ``block_size`` set the CPU build's ``VLLM_EAGER``, ``VLLM_DTYPE`` and ``VLLM_BLOCK_SIZE``
    (None: the script's defaults). ``adapters`` (name: a peft LoRA folder trained on ``model_dir``)
    are served on the model, a request naming one as its model (``VLLM_LORA_MODULES``).
    ``reloadable`` lets :func:`reload_weights` swap the served weights for another model's of the
    same architecture (vLLM's development endpoints, ``VLLM_SERVER_DEV_MODE=1``, on 127.0.0.1)."""
    # The server is stopped when this process ends, even by SIGKILL (the script's watcher).
    env = {**os.environ, "SERVED_MODEL_NAME": name, "VLLM_PARENT_PID": str(os.getpid())}
    if adapters:
        if any(" " in str(folder) or " " in adapter or "=" in adapter for adapter, folder in adapters.items()):
            raise ValueError(f"adapters: names and folders without spaces (and names without '='), got {dict(adapters)}")
        rank = max(int(read_json(Path(folder) / "adapter_config.json")["r"]) for folder in adapters.values())
        env["VLLM_LORA_MODULES"] = " ".join(f"{adapter}={Path(folder).resolve()}" for adapter, folder in adapters.items())
        env["VLLM_MAX_LORA_RANK"] = str(next(r for r in VLLM_LORA_RANKS if r >= rank))
    if reloadable:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if log is not None:
        env["VLLM_LOG"] = str(log)
    if eager is not None:
        env["VLLM_EAGER"] = "1" if eager else "0"
    if dtype is not None:
        env["VLLM_DTYPE"] = dtype
    if block_size is not None:
        env["VLLM_BLOCK_SIZE"] = str(block_size)
    started = subprocess.run(["bash", str(SERVE_SCRIPT), str(model_dir), str(port)],
                             env=env, capture_output=True, text=True)
    if started.returncode != 0:
        raise RuntimeError(f"vLLM did not start for {model_dir}:\n{started.stderr[-2000:]}")
    return dict(line.split("=", 1) for line in started.stdout.split())


def reload_weights(base_url: str, model_dir: Path, timeout_s: float = 600.0) -> None:
    """Serve ``model_dir``'s weights in place of the running server's, without a restart (about
    30 s saved on 2 CPU cores): vLLM's ``reload_weights`` on its workers (``/collective_rpc``), then
    its prefix cache emptied, since cached blocks hold keys and values of the old weights. The
    server must be started ``reloadable`` and the model must have the served one's architecture
    and shapes (a trained copy of it); the served name stays. RuntimeError with the server's reply
    if either call fails."""
    root = base_url.rstrip("/").removesuffix("/v1")
    calls = [("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(Path(model_dir).resolve())}}),
             ("/reset_prefix_cache", None)]
    for path, body in calls:
        request = urllib.request.Request(root + path, data=json.dumps(body).encode() if body else b"", method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as reply:
                reply.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"vLLM at {root} did not reload {model_dir} ({path}: HTTP {e.code} "
                               f"{e.read()[-500:].decode(errors='replace')})") from None
        except OSError as e:
            raise RuntimeError(f"vLLM at {root} did not reload {model_dir} ({path}: {e})") from None


def server_metrics(base_url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """The server's own Prometheus counters (``GET /metrics``), every ``vllm:`` sample summed over
    its labels, by name: ``vllm:prompt_tokens_total``, ``vllm:prefix_cache_queries_total`` and
    ``vllm:prefix_cache_hits_total`` (tokens), ``vllm:generation_tokens_total``,
    ``vllm:num_requests_running``, ..."""
    root = base_url.rstrip("/").removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:"):
            name_labels, _, value = line.rpartition(" ")
            try:
                out[name_labels.split("{")[0]] = out.get(name_labels.split("{")[0], 0.0) + float(value)
            except ValueError:
                pass
    return out


def stop_server(pid: str) -> None:
    subprocess.run(["bash", str(SERVE_SCRIPT), "stop", str(pid)], capture_output=True)


def process_tree(pid: int) -> set[int]:
    """``pid`` and every process below it, from ``/proc`` (empty where there is none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":  # a zombie has ended
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    if not Path(f"/proc/{pid}").exists():
        return set()
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        todo += children.get(p, [])
    return found


class EngineWatch:
    """Notices within seconds that a server we started lost its API server or an engine process.

    An engine that dies under a live API server can leave a server that accepts requests and
    never answers them, and every game in flight waits for its request timeout (minutes). (vLLM
    0.32 on CPU stops its API server by itself 3.5-7 s after an engine process dies; the watch is
    the net for the cases and versions where it does not.) The watch looks every ``poll_s``
    seconds, and whenever a request fails (:meth:`reason`), at the processes the server had once
    ready; when one is gone it stops the server, so every request in flight fails at once, and
    :meth:`reason` says why, for the games' errors.
    """

    def __init__(self, pid: str | int, poll_s: float = 2.0):
        self.pid, self.poll_s = int(pid), poll_s
        self._started_with = process_tree(self.pid)
        self._reason: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"engine-watch-{pid}", daemon=True)
        self._thread.start()

    def reason(self) -> str | None:
        """None while the server is whole; else what ended it (looked at now)."""
        return self._look()

    def _look(self) -> str | None:
        stop = False
        with self._lock:
            if self._reason is None and not self._stop.is_set():
                gone = self._started_with - process_tree(self.pid)
                engines = sorted(gone - {self.pid})
                if self.pid in gone:
                    self._reason = (f"the vLLM server's process {self.pid} exited"
                                    + (f" with its engine process(es) {engines}" if engines else ""))
                elif engines:
                    self._reason = f"the vLLM engine process(es) {engines} of server {self.pid} died; the server was stopped"
                    stop = True
            reason = self._reason
        if stop:  # in the background: the stop waits up to 30 s for the server's processes to end
            threading.Thread(target=stop_server, args=(str(self.pid),), name=f"engine-watch-stop-{self.pid}", daemon=True).start()
        return reason

    def _run(self) -> None:
        if self._stop.wait(self.poll_s):
            return
        with self._lock:
            self._started_with &= process_tree(self.pid)  # only what lasts: not a helper of the start
        while not self._stop.wait(self.poll_s):
            if self._look() is not None:
                return

    def stop(self) -> None:
        """Stop watching (before the server is stopped on purpose)."""
        self._stop.set()


class ServedChatModel:
    """The model at ``model_path`` behind a vLLM server of its own (module doc).

    Args:
        model_path: a Hugging Face model folder, or ``embedded``.
        temperature, top_p, max_tokens, seed: sampling, as :class:`EndpointChatModel` sends it.
        concurrency: requests in flight (the batch of games played at once).
        timeout_s, max_retries: per request, as :class:`EndpointChatModel`.
        log: the server's log file (default: ``/tmp/vllm-<port>.log``).
    """

    concurrent = True  # requests go to the server one by one, which batches them (aria.scheduler)

    def __init__(self, model_path: str = "embedded", temperature: float = 1.0, top_p: float | None = 1.0,
                 max_tokens: int = 48, concurrency: int = 16, timeout_s: float = 120.0, max_retries: int = 3,
                 seed: int | None = None, log: str | None = None):

        self.model_dir = resolve_model_path(model_path)
        self.name = f"vllm:{self.model_dir.name}"
        self._options = {"temperature": temperature, "top_p": top_p, "max_tokens": max_tokens, "seed": seed,
                         "concurrency": concurrency, "timeout_s": timeout_s, "max_retries": max_retries}
        # What produced a game: the model (its weights too: trained models are all ".../model" or
        # ".../final") and sampling, not the port of one run.
        self.settings = {"engine": "vllm", "model_path": str(self.model_dir), "weights": model_digest(self.model_dir),
                         **{k: self._options[k] for k in ("temperature", "top_p", "max_tokens", "seed")}}
        self._log = Path(log) if log else None
        self._endpoint = None
        self._pid: str | None = None
        self._lock = threading.Lock()

    def _started(self):
        with self._lock:
            if self._endpoint is None:
                from aria.llm.endpoint import EndpointChatModel

                info = start_server(self.model_dir, "policy", free_port(), self._log)
                self._pid, self._watch = info["PID"], EngineWatch(info["PID"])
                atexit.register(self.close)
                self._endpoint = EndpointChatModel(info["BASE_URL"], info["MODEL_NAME"], **self._options,
                                                   gone=self._watch.reason)
        return self._endpoint

    def generate(self, conversations: Sequence[list[Message]], keys: Sequence[str] | None = None,
                 formats: Sequence[OutputFormat | None] | None = None) -> list[Completion]:
        return self._started().generate(conversations, keys, formats)

    @property
    def generated_tokens(self) -> int:
        return self._endpoint.generated_tokens if self._endpoint is not None else 0

    @property
    def generation_seconds(self) -> float:
        return self._endpoint.generation_seconds if self._endpoint is not None else 0.0

    def release(self, key: str) -> None:
        """Nothing to forget: the server keeps no per-game state for us."""

    def close(self) -> None:
        """Stop the server (if one was started); a later turn starts a new one."""
        with self._lock:
            if self._pid is not None:
                self._watch.stop()
                stop_server(self._pid)
                self._pid, self._endpoint = None, None
