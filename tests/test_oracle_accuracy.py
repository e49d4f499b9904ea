"""Accuracy of the offline knowledge-base oracle on hand-written fair questions.

``tests/data/oracle_cases_*.jsonl`` were written from common knowledge, separately from the fact
tables in ``dataset/``: 497 Twenty Questions cases over 155 objects and 379 Guess My City cases
over 81 cities. Measured when the floors were set: 98.0 % and 99.2 % (the Guess My City rules
were revised once after a first measurement on this same set, so read its figure as a
regression guard rather than an unbiased estimate). The floors stay a little below.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from aria.games.question.knowledge_base import KnowledgeBaseOracle
from aria.games.question.oracle import OracleRequest, build_oracle
from aria.games.question.text import contains_phrase

CASES = Path(__file__).parent / "data"
FLOOR = {"twenty_questions": 0.95, "guess_my_city": 0.95}


def load_cases(game: str) -> list[dict]:
    return [json.loads(line) for line in (CASES / f"oracle_cases_{game}.jsonl").read_text().splitlines() if line.strip()]


def is_correct(oracle: KnowledgeBaseOracle, case: dict, answer: str) -> bool:
    if "expected_any" in case:  # open question: the answer mentions one of these
        return any(s.lower() in answer.lower() for s in case["expected_any"])
    expected = case["expected"]
    if oracle.game.name == "twenty_questions":
        return answer == expected
    if expected == "yes" and answer == oracle.game.win_answer:
        return True
    return answer.lower().startswith(expected)


@pytest.mark.parametrize("game", ["twenty_questions", "guess_my_city"])
def test_accuracy_floor_on_hand_written_cases(game, game_configs):
    oracle = build_oracle({"name": "knowledge_base"}, game_configs[game])
    cases = load_cases(game)
    assert len(cases) >= 150
    answers = oracle.answer([OracleRequest(game, c["target"], c["question"]) for c in cases])
    correct = sum(is_correct(oracle, c, a.text) for c, a in zip(cases, answers))
    accuracy = correct / len(cases)
    print(f"{game}: {correct}/{len(cases)} = {accuracy:.3f}")
    assert accuracy >= FLOOR[game]


def test_twenty_questions_answers_are_in_the_answer_set(game_configs):
    oracle = KnowledgeBaseOracle(game_configs["twenty_questions"])
    questions = [c["question"] for c in load_cases("twenty_questions")]
    answers = {oracle.answer_one(t.name, q) for t in oracle.game.targets[::10] for q in questions[::7]}
    assert answers <= {"Yes.", "No.", "Invalid Question."}
    assert answers == {"Yes.", "No.", "Invalid Question."}


def test_guess_my_city_answers_never_name_the_city(game_configs):
    oracle = KnowledgeBaseOracle(game_configs["guess_my_city"])
    questions = [c["question"] for c in load_cases("guess_my_city") if "Is it " not in c["question"]]
    questions += ["What is your city famous for?", "What landmarks does it have?", "Describe your city.",
                  "What country is your city in?", "What river flows through your city?"]
    leaks = [
        (t.name, q, answer)
        for t in oracle.game.targets
        for q in questions
        for answer in [oracle.answer_one(t.name, q)]
        if any(contains_phrase(answer, name) for name in t.names)
    ]
    assert leaks == []


def test_oracle_is_deterministic(game_configs):
    first = KnowledgeBaseOracle(game_configs["guess_my_city"])
    second = KnowledgeBaseOracle(game_configs["guess_my_city"])
    for case in load_cases("guess_my_city")[:60]:
        assert first.answer_one(case["target"], case["question"]) == second.answer_one(case["target"], case["question"])


def test_invalid_forms_twenty_questions(game_configs):
    oracle = KnowledgeBaseOracle(game_configs["twenty_questions"])
    for question in ["What color is it?", "Is it a cat or a dog?", "It is an animal.", "asdf qwer", ""]:
        assert oracle.answer_one("Dog", question) == "Invalid Question."
    assert oracle.answer_one("Dog", "Is it an animal, or not?") == "Yes."


def test_guess_my_city_says_you_guessed_it_exactly_when_the_game_counts_a_win(game_configs):
    """A question naming the hidden city among others is no guess under single_guess, so the
    oracle must not answer "you guessed it" (it did, and the game went on as lost: seen in a
    collection, "How does Bombay fit into Chicago?")."""
    from aria.games.question.game import load_game
    from aria.games.question.oracle import build_oracle

    game = load_game("guess_my_city")
    oracle = build_oracle({"name": "knowledge_base"}, game_configs["guess_my_city"])
    questions = ["How does Bombay fit into Chicago?", "Is it Bombay or Tokyo?", "Is your city Bombay?", "Is it Mumbai?",
                 "Is it Tokyo?", "Is your city in Asia?", "Bombay, Tokyo, Paris: which one?"]
    for target in ("Bombay", "Tokyo", "Paris"):
        for question in questions:
            answer = oracle.answer_one(target, question)
            assert (answer == game.win_answer) == game.is_win(question, target), (target, question, answer)
    assert oracle.answer_one("Bombay", "How does Bombay fit into Chicago?") == \
        oracle.answer_one("Tokyo", "How does Bombay fit into Chicago?")  # it tells nothing of the named cities
