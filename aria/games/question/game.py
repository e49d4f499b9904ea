"""Single-agent question games: Twenty Questions and Guess My City (docs/method.md §6).

Both games share one shape: a hidden target, up to ``max_turns`` questions from the agent, an
oracle that answers each, reward −1 per turn and 0 on the winning turn. What differs between
them (target list, prompt wording, answer set, which phrases do not count as guesses) is data,
loaded from ``config/game/<name>.yaml`` and the files in ``dataset/``; the only game-specific
code is the oracle's question understanding (:mod:`aria.games.question.knowledge_base`).

Prompt format. The policy sees the original's prompt: an introduction, then (once there is
history) ``"Here is the game history:\\n"`` followed by one ``"Question: q\\nAnswer: a\\n\\n"``
block per turn, then the closing request. ``tests/test_games.py`` re-renders the original's
released training samples with this code and compares them character for character.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from aria.games.common.base import load_game_config
from aria.games.question.text import PhraseIndex, extract_question
from aria.io import DataError
from aria.io import json_digest as digest
from aria.io import read_json
from aria.resources import dataset_file


@dataclass(frozen=True)
class Target:
    """A hidden object or city: its canonical name, other names that also count, and its group."""

    name: str
    aliases: tuple[str, ...] = ()
    group: str = ""  # category (Twenty Questions) or country (Guess My City)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


@dataclass(frozen=True)
class PromptFormat:
    """The policy's prompt: ``intro + [history_header + turn * n] + outro`` (see module doc)."""

    intro: str
    history_header: str
    turn: str  # with {question} and {answer}
    outro: str

    def render(self, history: Sequence[tuple[str, str]]) -> str:
        body = ""
        if history:
            body = self.history_header + "".join(self.turn.format(question=q, answer=a) for q, a in history)
        return self.intro + body + self.outro

    def parse(self, prompt: str) -> list[tuple[str, str]]:
        """The history a prompt of this format shows: the inverse of :meth:`render`.

        Raises ``ValueError`` for text that this format did not render.
        """
        if not (prompt.startswith(self.intro) and prompt.endswith(self.outro)) or len(prompt) < len(self.intro) + len(self.outro):
            raise ValueError("the prompt is not this game's (intro or closing request differ)")
        body = prompt[len(self.intro) : len(prompt) - len(self.outro)]
        if not body:
            return []
        if not body.startswith(self.history_header):
            raise ValueError("the prompt's history does not start with the game's history header")
        before, rest = self.turn.split("{question}")
        between, after = rest.split("{answer}")
        pattern = re.compile(re.escape(before) + "(.*?)" + re.escape(between) + "(.*?)" + re.escape(after), re.DOTALL)
        history, at, body = [], len(self.history_header), body
        while at < len(body):
            match = pattern.match(body, at)
            if not match:
                raise ValueError(f"the prompt's history cannot be read at character {len(self.intro) + at}")
            history.append((match.group(1), match.group(2)))
            at = match.end()
        return history


@dataclass
class QuestionGame:
    """One single-agent question game, built from its config (see ``config/game/*.yaml``).

    Attributes:
        name: registry name, e.g. ``"twenty_questions"``.
        family: whose rules and oracles it plays by (config ``family``, default the name): a
            testbed such as ``twenty_questions_subset`` is a ``twenty_questions`` game.
        targets: every target, in the data file's order.
        prompt: the policy's prompt format.
        max_turns: questions allowed per game (20 in both games).
        max_question_chars: longer questions are answered as invalid (a model that rambles).
        invalid_answer: what the oracle says to an output with no usable question.
        win_answer: what the oracle says to the winning question.
        decoys: phrases that contain a target's name but name something else ("El Salvador").
        single_guess: a question that names two or more different targets is not a guess (this
            stops "Is it a cat, a dog, a horse or a cow?" from collecting a win).
    """

    name: str
    targets: list[Target]
    prompt: PromptFormat
    max_turns: int = 20
    max_question_chars: int = 300
    invalid_answer: str = "Invalid Question."
    win_answer: str = "Yes."
    decoys: tuple[str, ...] = ()
    single_guess: bool = True
    family: str = ""
    _index: PhraseIndex = field(init=False, repr=False)
    _by_name: dict[str, Target] = field(init=False, repr=False)
    _phrases: dict[str, str] = field(init=False, repr=False)
    _outside: dict[tuple[str, ...], PhraseIndex] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.family = self.family or self.name
        phrases: dict[str, str] = {}
        for decoy in self.decoys:
            phrases[decoy] = ""  # a match that names no target
        for target in self.targets:
            for alias in target.names:
                phrases[alias] = target.name
        self._phrases = phrases
        self._index = PhraseIndex.build(phrases)
        self._by_name = {t.name: t for t in self.targets}
        self._outside = {}

    def settings(self) -> dict[str, Any]:
        """What decides how a game is played and scored, for a file's producer record: a resumed
        file continues only under the same rules (a lower ``max_turns`` would otherwise mix games
        of two lengths). Long texts and lists are recorded by digest."""
        return {"family": self.family, "max_turns": self.max_turns, "max_question_chars": self.max_question_chars,
                "invalid_answer": self.invalid_answer, "win_answer": self.win_answer, "single_guess": self.single_guess,
                "targets_sha256": digest([[t.name, list(t.aliases), t.group] for t in self.targets]),
                "decoys_sha256": digest(list(self.decoys)),
                "prompt_sha256": digest([self.prompt.intro, self.prompt.history_header, self.prompt.turn, self.prompt.outro])}

    def target(self, name: str) -> Target:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{name!r} is not a {self.name} target") from None

    # ---- the agent's side -------------------------------------------------------------
    def extract_question(self, action: str) -> str | None:
        """The question in a model output (:func:`aria.games.question.text.extract_question`), or ``None``.

        The same rule serves play and import. ``None`` (no question, or one over
        ``max_question_chars``) is answered with ``invalid_answer``.
        """
        return extract_question(action, self.max_question_chars)

    def named_targets(self, question: str) -> list[str]:
        """Distinct targets the question names as whole phrases (decoys removed), in order."""
        return list(dict.fromkeys(k for k in self._index.find(question) if k))

    def is_win(self, question: str | None, target: str, aliases: Sequence[str] = ()) -> bool:
        """Win rule (docs/method.md §6, whole-phrase form): the question names the target or an alias.

        With ``single_guess`` the question must name no other target. A target outside the game's
        list (an imported game's "Mexico City") is matched the same way, by its name and
        ``aliases`` among the game's own phrases; accents and quotes are folded ("Bogotá").
        """
        if question is None:
            return False
        if target in self._by_name and not aliases:
            named = self.named_targets(question)
        else:
            key = (target, *aliases)
            if key not in self._outside:
                self._outside[key] = PhraseIndex.build({**self._phrases, **{name: target for name in key}})
            named = list(dict.fromkeys(k for k in self._outside[key].find(question) if k))
        if target not in named:
            return False
        return not self.single_guess or len(named) == 1

    # ---- rewards (docs/method.md §3: −1 per turn, 0 on the winning turn) -----------------------
    @staticmethod
    def turn_reward(won: bool) -> float:
        return 0.0 if won else -1.0

    @staticmethod
    def final_reward(success: bool) -> float:
        """R used by reward aggregation: 1 for success, 0 otherwise (docs/method.md §3)."""
        return 1.0 if success else 0.0

    def render_prompt(self, history: Sequence[tuple[str, str]]) -> str:
        return self.prompt.render(history)

    def history_question(self, action: str, question: str | None) -> str:
        """What the game history shows for a turn: its question, or the start of an invalid output."""
        if question is not None:
            return question
        first_line = (action or "").strip().splitlines()[0] if (action or "").strip() else ""
        return first_line[: self.max_question_chars]

    def prompt_before_turn(self, turns: Sequence[dict], index: int) -> str:
        """The prompt the policy saw before ``turns[index]`` (schema-v1 turns of one game)."""
        history = [(self.history_question(t["action"], t.get("question")), t["observation"]) for t in turns[:index]]
        return self.render_prompt(history)


def target_schedule(targets: Sequence[Target], num_games: int, seed: int) -> list[Target]:
    """Targets of games 0..num_games−1: a seeded permutation of the list, cycled.

    The same (list, seed) gives the same targets for every model, so N = 200 games cycle
    through the 157 objects (or 91 cities) in one fixed order.
    """
    order = list(targets)
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(num_games)]


# ---- loading from config ----------------------------------------------------------------
def load_targets(cfg: Mapping[str, Any]) -> list[Target]:
    """Targets from the game's data files (``targets_file`` and optional ``aliases_file``)."""
    path = dataset_file(cfg["targets_file"])
    data = read_json(path)
    fmt = cfg["targets_format"]
    targets: list[Target] = []
    if fmt == "words":  # {"words": [{"category": ..., "names": [canonical, aliases...]}]}
        words = data.get("words") if isinstance(data, dict) else None
        if not isinstance(words, list):
            raise DataError(path, None, "words", "missing or not a list")
        for i, word in enumerate(words):
            names = word.get("names") if isinstance(word, dict) else None
            if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
                raise DataError(path, None, f"words[{i}].names", "expected a non-empty list of names")
            targets.append(Target(names[0], tuple(names[1:]), str(word.get("category", ""))))
    elif fmt == "cities":  # {"cities": [{"city": ..., "country": ...}]}
        cities = data.get("cities") if isinstance(data, dict) else None
        if not isinstance(cities, list):
            raise DataError(path, None, "cities", "missing or not a list")
        aliases: dict[str, list[str]] = {}
        if cfg.get("aliases_file"):
            facts_path = dataset_file(cfg["aliases_file"])
            facts = read_json(facts_path).get("cities", {})
            aliases = {name: list(entry.get("aliases", [])) for name, entry in facts.items()}
        for i, city in enumerate(cities):
            name = city.get("city") if isinstance(city, dict) else None
            if not isinstance(name, str) or not name.strip():
                raise DataError(path, None, f"cities[{i}].city", "expected a city name")
            targets.append(Target(name, tuple(aliases.get(name, ())), str(city.get("country", ""))))
    else:
        raise ValueError(f"unknown targets_format {fmt!r} (expected 'words' or 'cities')")
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise DataError(path, None, None, "duplicate target names")
    only = cfg.get("targets_only")
    if only is not None:  # a subset of the list, in the list's order (a testbed the model can win)
        unknown = sorted(set(only) - set(names))
        if unknown or not only:
            raise DataError(path, None, "targets_only", f"not in the list: {', '.join(unknown)}" if unknown else "empty")
        targets = [t for t in targets if t.name in set(only)]
    return targets


def build_game(cfg: Mapping[str, Any]) -> QuestionGame:
    """A :class:`QuestionGame` from a game config mapping (a Hydra ``game`` node or a dict)."""
    p = cfg["prompt"]
    return QuestionGame(
        name=cfg["name"],
        targets=load_targets(cfg),
        prompt=PromptFormat(p["intro"], p["history_header"], p["turn"], p["outro"]),
        max_turns=int(cfg["max_turns"]),
        max_question_chars=int(cfg["max_question_chars"]),
        invalid_answer=cfg["invalid_answer"],
        win_answer=cfg["win_answer"],
        decoys=tuple(cfg["decoys"]),
        single_guess=bool(cfg["single_guess"]),
        family=str(cfg.get("family") or cfg["name"]),
    )


def load_game(name: str) -> QuestionGame:
    """The game built from ``config/game/<name>.yaml``."""
    return build_game(load_game_config(name))
