"""Behavioural intentions (aria/intention/behaviour.py) by hand on a three-target game."""
from __future__ import annotations

import dataclasses

import pytest

from aria.games.question.game import Target, load_game
from aria.intention.behaviour import Signature, partition, signatures
from aria.llm.base import Completion


class TableOracle:
    """An oracle whose answers are a table written in the test (a whole Oracle, not a mock: the
    game asks it as it asks the knowledge base), counting what it is asked."""

    name = "table"

    def __init__(self, table: dict[str, tuple[str, str, str]], targets: list[str]):
        self.table, self.targets, self.asked = table, targets, []

    def answer(self, requests):
        self.asked += [(r.question, r.target) for r in requests]
        return [Completion(self.table[r.question][self.targets.index(r.target)]) if r.question in self.table
                else Completion(text=None, error="not in the table") for r in requests]


TARGETS = ["Cat", "Dog", "Car"]
TABLE = {  # the oracle's answers for Cat, Dog, Car
    "Is it an animal?": ("Yes.", "Yes.", "No."),
    "Is it alive?": ("Yes.", "Yes.", "No."),
    "Is it a cat or a dog?": ("Yes.", "Yes.", "No."),  # names two targets: not a guess (single_guess)
    "Does it bark?": ("No.", "Yes.", "No."),
    "Is it a dog?": ("No.", "Yes.", "No."),  # a guess of the dog: the game answers "Yes." and the game is won
    "Is it the dog?": ("No.", "Yes.", "No."),
}


@pytest.fixture
def game():
    return dataclasses.replace(load_game("twenty_questions_subset"), name="toy",
                               targets=[Target(name) for name in TARGETS])


def test_signatures_and_the_partition_by_hand(game):
    actions = ["Question: Is it an animal?", "Is it alive?", "Is it a cat or a dog?", "Does it bark?",
               "Question: Is it a dog?", "Is it the dog?", "hmm", "I think so", "Is it an animal?"]
    oracle = TableOracle(TABLE, TARGETS)
    found = signatures(game, oracle, actions)
    animal = Signature(("Yes.", "Yes.", "No."), ())
    assert found["Question: Is it an animal?"] == found["Is it alive?"] == found["Is it a cat or a dog?"] == animal
    assert found["Does it bark?"] == Signature(("No.", "Yes.", "No."), ())
    # the guess of the dog has the same answers as "Does it bark?", but it wins when the target is the dog
    assert found["Question: Is it a dog?"] == found["Is it the dog?"] == Signature(("No.", "Yes.", "No."), ("Dog",))
    assert found["hmm"] == found["I think so"] == Signature(("Invalid Question.",) * 3, ())
    assert partition(found) == {"Question: Is it an animal?": 0, "Is it alive?": 0, "Is it a cat or a dog?": 0,
                                "Does it bark?": 1, "Question: Is it a dog?": 2, "Is it the dog?": 2,
                                "hmm": 3, "I think so": 3, "Is it an animal?": 0}
    # each distinct question once per target: "Is it an animal?" twice in the actions, asked once
    assert sorted(oracle.asked) == sorted((q, t) for q in TABLE for t in TARGETS)


def test_an_unanswered_question_names_itself_and_its_target(game):
    with pytest.raises(RuntimeError, match=r"oracle table: no answer to 'Is it red\?' for the target 'Cat': not in the table"):
        signatures(game, TableOracle(TABLE, TARGETS), ["Is it an animal?", "Is it red?"])


def test_the_script_counts_a_games_file(tmp_path):
    """Two scripted games on twenty_questions_subset through the scheduler: the Dog game asks
    "Is it an animal?" and wins with "Is it a dog?" (2 outputs); the Banana game asks both and
    repeats the second until its 20 questions run out (20 outputs). Two texts, two intentions
    (the animal question is answered "Yes." for the Dog only, so not alike for every target)."""
    import json
    from pathlib import Path

    from conftest import ScriptedPolicy
    from in_process import run_script

    from aria.games.common.base import load_game_config
    from aria.games.question.game import build_game
    from aria.games.question.oracle import build_oracle
    from aria.games.question.play import QuestionGames, game_id
    from aria.scheduler import run_games

    cfg = load_game_config("twenty_questions_subset")
    game = build_game(cfg)
    jobs = [(game_id(game.name, 0, i), game.target(name)) for i, name in enumerate(["Dog", "Banana"])]
    policy = ScriptedPolicy({gid: ["Question: Is it an animal?", "Question: Is it a dog?"] for gid, _ in jobs})
    out = tmp_path / "games.jsonl"
    run_games(QuestionGames(game, policy, build_oracle({"name": "knowledge_base"}, cfg), seed=0), jobs, out,
              {"test": "behaviour"}, progress=False)
    done = run_script(Path(__file__).resolve().parents[1] / "scripts/behavioural_intentions.py", str(out))
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert (found["games"], found["outputs"], found["distinct_texts"], found["intentions"]) == (2, 22, 2, 2)
    assert found["questions_answered_alike"] == 0 and found["share_answered_alike"] == 0.0
    # a failed game is skipped and counted, as pipeline step 1 does (before: its outputs were counted)
    lines = out.read_text().splitlines()
    failed = json.loads(lines[-1])
    failed.update(game_id=failed["game_id"] + "-again", status="failed")
    out.write_text("\n".join([*lines, json.dumps(failed)]) + "\n")
    done = run_script(Path(__file__).resolve().parents[1] / "scripts/behavioural_intentions.py", str(out))
    found = json.loads(done.stdout)
    assert (found["games"], found["failed_games_skipped"], found["outputs"]) == (2, 1, 22)
    out.write_text(json.dumps(failed) + "\n")  # nothing finished: refused (before: exit 0, all counts 0)
    done = run_script(Path(__file__).resolve().parents[1] / "scripts/behavioural_intentions.py", str(out))
    assert done.returncode == 2 and done.stderr.strip() == f"error: {out}: no finished game (1 failed)"
