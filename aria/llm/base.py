"""What every text-generation backend provides.

A backend takes a batch of chat conversations (lists of ``{"role", "content"}`` messages) and
returns one :class:`Completion` per conversation. A request that fails after the backend's own
retries comes back as a completion with ``error`` set instead of raising, so one bad request
never takes down the other games in a batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

Message = dict  # {"role": "system" | "user" | "assistant", "content": str}


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
    """A batched chat-completion backend (local transformers model or OpenAI-compatible endpoint)."""

    name: str

    def generate(self, conversations: Sequence[list[Message]], keys: Sequence[str] | None = None) -> list[Completion]:
        """One completion per conversation.

        ``keys`` (optional) names the game each conversation belongs to; a backend may keep
        state per key between calls (the local model keeps each game's prompt KV cache, since
        the next turn's prompt extends this one) until :meth:`release` is called for it.
        """
        ...

    def release(self, key: str) -> None:
        """Forget any state kept for ``key`` (its game has ended)."""
        ...
