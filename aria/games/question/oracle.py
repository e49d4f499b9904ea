"""The oracle interface and its registry.

An oracle answers the agent's questions about a hidden target. Oracles are registered by name
and chosen by config (``oracle=knowledge_base`` | ``llm`` | ``flan_t5``), never by ``if`` chains
in the rollout code. Every oracle answers a *batch* of questions (one per live game) so that
remote oracles can send them concurrently.

The registry holds import paths, resolved when an oracle is built: the oracle modules import
this one for :class:`OracleRequest`, and this one imports none of them (no import cycle, and
naming ``flan_t5`` does not load torch until it is used).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from aria.io import ConfigError
from aria.llm.base import Completion
from aria.registry import check_options, load_object


@dataclass(frozen=True)
class OracleRequest:
    """One question to answer: which game, which hidden target, and the agent's question."""

    game: str  # "twenty_questions" | "guess_my_city"
    target: str
    question: str


class Oracle(Protocol):
    name: str

    def answer(self, requests: Sequence[OracleRequest]) -> list[Completion]:
        """One answer per request, normalised to the game's answer set; failures as errors."""
        ...


#: name -> "module:Class" (built in) or a class (registered with :func:`register_oracle`). The class
#: takes ``game_cfg`` and the config's other keys as keyword arguments.
ORACLES: dict[str, str | Callable[..., Oracle]] = {
    "knowledge_base": "aria.games.question.knowledge_base:KnowledgeBaseOracle",  # fact tables, offline
    "llm": "aria.games.question.llm_oracle:LLMOracle",  # an LLM behind an OpenAI-compatible server
    "flan_t5": "aria.games.question.flan_t5_oracle:FlanT5Oracle",  # a local seq2seq model
}


def register_oracle(name: str):
    """Class decorator for an oracle of your own: make it constructible by name from config."""
    def wrap(cls):
        ORACLES[name] = cls
        return cls

    return wrap


def check_oracle(cfg: Mapping[str, Any]) -> Callable[..., Oracle]:
    """The factory of the oracle ``cfg`` names, its options checked before anything loads (an
    unknown name, a key it does not take, a value out of range: a ``ConfigError`` naming
    ``oracle.<key>``, :func:`aria.registry.check_options`)."""
    options = dict(cfg)
    name = options.pop("name", None)
    if name not in ORACLES:
        raise ConfigError(f"oracle.name: unknown oracle {name!r} (known: {', '.join(sorted(ORACLES))})")
    factory = ORACLES[name]
    if isinstance(factory, str):
        factory = load_object(factory)
    check_options(factory, options, "oracle", f"the {name} oracle")
    return factory


def build_oracle(cfg: Mapping[str, Any], game_cfg: Mapping[str, Any]) -> Oracle:
    """Instantiate the oracle named by ``cfg["name"]`` with the rest of ``cfg`` as options.

    ``game_cfg`` is the game's config (its data files and answer strings), which the
    knowledge-base oracle needs and the others may use for their answer sets.
    """
    factory = check_oracle(cfg)
    return factory(game_cfg=dict(game_cfg), **{k: v for k, v in cfg.items() if k != "name"})


def normalize_yes_no(text: str, invalid: str = "Invalid Question.") -> str:
    """Map a free-text reply to Twenty Questions' answer set: "Yes.", "No." or ``invalid``.

    The first word decides ("Yes, it is." -> "Yes."); anything else is ``invalid``.
    """
    words = (text or "").strip().lstrip("\"'*").lower().split()
    first = words[0].strip(".,!:;\"'*") if words else ""
    if first == "yes":
        return "Yes."
    if first == "no":
        return "No."
    return invalid
