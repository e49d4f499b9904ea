"""Behavioural intentions of a question game: the exact partition that ARIA's clusters estimate.

ARIA's argument (the paper's section 4) is that the actions of one intention lead to the same
observations and the same futures. With an offline oracle that can be computed for any
utterance: two utterances are the same intention when, for every target of the game, the game
answers both the same way. That answer is the oracle's for a question, the game's win answer for
a guess of that target (a guess wins only when the target is the one it names), and the invalid
answer for an output with no usable question. So "Is it a dog?" (a guess of the dog) and "Does it
bark?" (answered "Yes." only for the dog, but never a win) are two intentions, while "Is it alive?"
and "Is it an animal?" are one wherever the oracle answers them alike for every target.

:func:`signatures` asks the oracle once per distinct question and target; :func:`partition`
numbers the signatures.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from aria.games.question.oracle import OracleRequest


@dataclass(frozen=True)
class Signature:
    """What an utterance does in every game: the game's answer for each target, in the game's
    order of targets, and the targets for which it is a winning guess."""

    answers: tuple[str, ...]
    wins: tuple[str, ...]


def signatures(game, oracle, actions: Iterable[str]) -> dict[str, Signature]:
    """The signature of every distinct action (a policy's raw output): its question as the game
    extracts it, answered for every target of ``game`` by ``oracle`` (a question game's
    :class:`~aria.games.question.oracle.Oracle`). An oracle that fails to answer raises
    RuntimeError naming the question and the target: a signature with a hole would merge
    intentions that differ."""
    questions = {action: game.extract_question(action) for action in dict.fromkeys(actions)}
    asked = list(dict.fromkeys(q for q in questions.values() if q is not None))
    targets = [t.name for t in game.targets]
    requests = [OracleRequest(game.name, target, q) for q in asked for target in targets]
    answers = oracle.answer(requests) if requests else []
    for request, answer in zip(requests, answers):
        if not answer.ok:
            raise RuntimeError(f"oracle {getattr(oracle, 'name', 'oracle')}: no answer to {request.question!r} "
                               f"for the target {request.target!r}: {answer.error}")
    by_question = {}
    for i, question in enumerate(asked):
        row = answers[i * len(targets):(i + 1) * len(targets)]
        wins = tuple(t for t in targets if game.is_win(question, t))
        by_question[question] = Signature(
            tuple(game.win_answer if t in wins else a.text for t, a in zip(targets, row)), wins)
    invalid = Signature((game.invalid_answer,) * len(targets), ())
    return {action: invalid if q is None else by_question[q] for action, q in questions.items()}


def partition(found: Mapping[str, Signature]) -> dict[str, int]:
    """An intention id per action: equal signatures share one, numbered in order of first appearance."""
    ids: dict[Signature, int] = {}
    return {action: ids.setdefault(signature, len(ids)) for action, signature in found.items()}
