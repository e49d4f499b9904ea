"""What every text-generation backend provides.

A backend takes a batch of chat conversations (lists of ``{"role", "content"}`` messages) and
returns one :class:`Completion` per conversation. A request that fails after the backend's own
retries comes back as a completion with ``error`` set instead of raising, so one bad request
never takes down the other games in a batch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}

#: The kinds of constraint a reply can be generated under.
FORMAT_KINDS = ("json_schema", "regex")


@dataclass(frozen=True)
class OutputFormat:
    """A constraint on one reply: a JSON schema or a regular expression it must match.

    Backends enforce it while generating (structured outputs): the local model through a
    grammar-constrained decoding library (:mod:`aria.llm.constrained`), an OpenAI-compatible
    server through ``response_format`` / vLLM's ``structured_outputs``. ``spec`` is the schema as
    JSON text, keys in the schema's order (constrained decoders write properties in that order),
    so schemas built alike are equal formats and share one compiled grammar.
    """

    kind: str
    spec: str

    def __post_init__(self) -> None:
        if self.kind not in FORMAT_KINDS:
            raise ValueError(f"unknown output format {self.kind!r} (known: {', '.join(FORMAT_KINDS)})")

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any]) -> "OutputFormat":
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def regex(cls, pattern: str) -> "OutputFormat":
        return cls("regex", pattern)

    @property
    def schema(self) -> dict:
        if self.kind != "json_schema":
            raise ValueError("a regex format has no JSON schema")
        return json.loads(self.spec)


def concurrent(player: Any) -> bool:
    """Whether ``player`` (a chat model, oracle or scripted player) serves each game's requests on
    their own from any thread (:class:`ChatModel`, ``concurrent``)."""
    return bool(getattr(player, "concurrent", False))


@dataclass(frozen=True)
class Completion:
    """One generated reply, or the error that prevented it."""

    text: str | None
    error: str | None = None
    intention: str | None = None  # what the player meant, where it knows (the scripted expert)

    @property
    def ok(self) -> bool:
        return self.error is None and self.text is not None


class ChatModel(Protocol):
    """A batched chat-completion backend (local transformers model or OpenAI-compatible endpoint).

    ``concurrent`` (optional, default False): requests of different games may be sent one at a
    time from many threads and lose nothing by it (a server batches what is in flight), so the
    scheduler plays each game on its own (:mod:`aria.scheduler`); False for a model that
    computes a batch of games in one pass.
    """

    name: str

    def generate(self, conversations: Sequence[list[Message]], keys: Sequence[str] | None = None,
                 formats: Sequence[OutputFormat | None] | None = None) -> list[Completion]:
        """One completion per conversation.

        ``keys`` (optional) names the game each conversation belongs to; a backend may keep
        state per key between calls (the local model keeps each game's prompt KV cache, since
        the next turn's prompt extends this one) until :meth:`release` is called for it.
        ``formats`` (optional) constrains each reply (None: free text). Callers pass it only when
        some reply is constrained, so a backend without structured outputs still plays free text.
        """
        ...

    def release(self, key: str) -> None:
        """Forget any state kept for ``key`` (its game has ended)."""
        ...
