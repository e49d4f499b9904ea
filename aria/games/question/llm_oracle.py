"""An oracle answered by a language model behind an OpenAI-compatible endpoint (``oracle=llm``).

The model is told the hidden target (and, for Guess My City, its country) and the agent's
question, and answers greedily (temperature 0). Its free-text reply is then forced into the
game's answer set, so a chatty model cannot break the game:

- Twenty Questions: the first word decides, via :func:`~aria.games.question.oracle.normalize_yes_no`
  ("Yes, it is a fruit." -> "Yes.", anything that is not yes/no -> the invalid answer).
- Guess My City: the first line of the reply, with every mention of the city (or one of its
  other names) replaced by "my city", so the oracle can never give the answer away.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from aria.games.question.game import load_targets
from aria.games.question.oracle import OracleRequest, normalize_yes_no
from aria.games.question.text import contains_phrase, normalize
from aria.llm.base import Completion
from aria.llm.endpoint import EndpointChatModel

TWENTY_QUESTIONS = "twenty_questions"
GUESS_MY_CITY = "guess_my_city"
CITY_REDACTION = "my city"

# Per-game prompt templates. Placeholders: {target}, {question}, and the target's group under
# two names, {category} (Twenty Questions) and {country} (Guess My City).
DEFAULT_PROMPTS: dict[str, dict[str, str]] = {
    TWENTY_QUESTIONS: {
        "system": (
            "You are the answerer in a game of Twenty Questions. You are thinking of a hidden object "
            "and the player asks questions to guess it. Answer every yes/no question truthfully about "
            'the hidden object with exactly "Yes." or "No.". If the question cannot be answered with '
            'yes or no, answer exactly "Invalid Question.". Never write anything else.'
        ),
        "user": 'The hidden object is "{target}".\nQuestion: {question}\nAnswer:',
    },
    GUESS_MY_CITY: {
        "system": (
            "You are the answerer in a game of Guess My City. You are thinking of a city and the "
            "player asks questions to guess it. Answer each question truthfully about your city in "
            "one short sentence. Never say the name of the city, not even in part; refer to it as "
            '"my city". If the player guesses the city correctly, say that they guessed it.'
        ),
        "user": "My city is {target}, in {country}.\nQuestion: {question}\nAnswer:",
    },
}


def merge_prompts(overrides: Mapping[str, Mapping[str, str]] | None) -> dict[str, dict[str, str]]:
    """The default templates with ``overrides`` (game -> {system, user}) laid over them, key by key."""
    prompts = {game: dict(pair) for game, pair in DEFAULT_PROMPTS.items()}
    for game, pair in (overrides or {}).items():
        prompts.setdefault(game, {}).update(dict(pair))
    return prompts


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, stripped ('' when there is none)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def redact_names(text: str, names: Sequence[str], replacement: str = CITY_REDACTION) -> str:
    """Replace every whole-word, case- and accent-insensitive mention of any of ``names``.

    Words are compared after :func:`~aria.games.question.text.normalize`, so "SÃO PAULO's" matches
    "Sao Paulo" and the span "SÃO PAULO" is replaced, keeping the "'s".
    """
    if not any(contains_phrase(text, name) for name in names):
        return text
    words = list(re.finditer(r"[^\W_]+", text))
    normalized = [normalize(word.group()) for word in words]
    phrases = sorted({tuple(normalize(name).split()) for name in names} - {()}, key=len, reverse=True)
    pieces, cursor, i = [], 0, 0
    while i < len(words):
        length = next((len(p) for p in phrases if tuple(normalized[i : i + len(p)]) == p), 0)
        if length:
            pieces += [text[cursor : words[i].start()], replacement]
            cursor = words[i + length - 1].end()
            i += length
        else:
            i += 1
    return "".join(pieces) + text[cursor:]


class LLMOracle:
    """Answers questions with an LLM served by an OpenAI-compatible endpoint, greedily.

    Built for one game: ``game_cfg`` is that game's config (``config/game/<name>.yaml``); its
    target list supplies each target's country / category and other names. ``prompts`` overrides
    the templates per game (see :data:`DEFAULT_PROMPTS`).
    """

    name = "llm"
    concurrent = True  # one request per question to an endpoint, which batches them

    def __init__(
        self,
        game_cfg: Mapping[str, Any],
        base_url: str,
        model: str,
        api_key: str | None = "EMPTY",
        timeout_s: float = 60,
        max_retries: int = 3,
        retry_base_delay_s: float = 0.5,
        concurrency: int = 16,
        max_tokens: int = 64,
        prompts: Mapping[str, Mapping[str, str]] | None = None,
    ):
        self.game = str(game_cfg["name"])
        self.family = str(game_cfg.get("family") or self.game)  # a testbed asks with its family's prompt
        self.invalid_answer = str(game_cfg["invalid_answer"])
        prompt = merge_prompts(prompts).get(self.family)
        if not prompt or not {"system", "user"} <= set(prompt):
            raise ValueError(
                f"no oracle prompt (system and user) for game {self.family!r}; set oracle.prompts.{self.family}"
            )
        self.prompt = prompt
        targets = load_targets(game_cfg)
        self._group = {t.name: t.group for t in targets}
        self._names = {t.name: t.names for t in targets}
        self.settings = {"name": self.name, "model": model, "base_url": base_url, "max_tokens": max_tokens,
                         "prompts": prompts}
        self.model = EndpointChatModel(
            base_url=base_url,
            model=model,
            api_key=api_key,
            temperature=0.0,
            max_tokens=max_tokens,
            timeout_s=timeout_s,
            max_retries=max_retries,
            retry_base_delay_s=retry_base_delay_s,
            concurrency=concurrency,
        )

    def messages(self, request: OracleRequest) -> list[dict[str, str]]:
        """The chat sent for one question: the game's system prompt and the filled-in user turn."""
        group = self._group.get(request.target, "")
        user = self.prompt["user"].format(
            target=request.target, question=request.question, category=group, country=group
        )
        return [{"role": "system", "content": self.prompt["system"]}, {"role": "user", "content": user}]

    def answer(self, requests: Sequence[OracleRequest]) -> list[Completion]:
        """One answer per request, in order, normalised to the game's answer set."""
        for request in requests:
            if request.game != self.game:
                raise ValueError(f"this oracle was built for {self.game!r}, got a {request.game!r} request")
        replies = self.model.generate([self.messages(r) for r in requests])
        return [self._postprocess(reply, request) for reply, request in zip(replies, requests)]

    def _postprocess(self, reply: Completion, request: OracleRequest) -> Completion:
        """Map the model's reply into the game's answer set; errors pass through unchanged."""
        if not reply.ok:
            return reply
        if self.family == TWENTY_QUESTIONS:
            return Completion(text=normalize_yes_no(reply.text, self.invalid_answer))
        line = first_line(reply.text)
        if not line:
            return Completion(text=self.invalid_answer)
        return Completion(text=redact_names(line, self._names.get(request.target, (request.target,))))
