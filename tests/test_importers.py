"""Importers of the original formats (aria/games/importers.py) and their command-line script.

Fixtures are small hand-written files in the originals' formats; the expected records were worked
out by hand from the rules in the importers' module doc. The released ARIA training sample in
``tests/data/original`` checks :func:`parse_history` against the games' prompt rendering.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from aria.games.importers import IMPORTERS, import_file, import_summary, parse_history, split_line
from aria.games.question.game import load_game
from aria.io import DataError
from aria.trajectories import read_trajectories, validate_record
from conftest import ORIGINAL_SAMPLES

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "import_trajectories.py"
TRAINING_SAMPLE = ORIGINAL_SAMPLES / "aria_sample_actor_reinforce_llama3-8b_single.json"

# ---- fixtures in the original formats ---------------------------------------------------
TQ_MSGS = [
    {"actions": ["Is it an animal?", "Is it a mammal?", "Is it a cat?"], "obs": ["Yes.", "Yes.", "Yes."],
     "reward": 0, "word": ["cat"], "action_embeddings": [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]},
    {"actions": ["Question: Is it electronic?", "Is it a radio?"], "obs": ["Yes.", "No."],
     "reward": -1, "word": "television"},
    {"game_id": "own-7", "actions": ["Is it a fruit?", "Is it an apple?"], "obs": ["Yes."], "reward": [-1, 0]},
]
GMC_MSGS = [
    {"actions": ["Is your city in Asia?", "Is it Seoul?"],
     "obs": ["Yes, it is in Asia.", "Yes, you guessed it! That is my city."], "reward": 0, "city": "Seoul, South Korea"},
    {"actions": ["Is it in Europe?"], "obs": ["No, it is not in Europe."], "reward": -1.0, "city": "Atlantis"},
]
TQ_ARCHER = [
    {"lines": ["Is it an animal? Yes.", "Is it a large cat? Yes.", "Is it a lion? Yes."], "correct": True, "word": ["Lion"]},
    {"lines": ["Is it a fruit? No.", "Tell me the object. Invalid Question."], "correct": False, "word": ["Television", "TV"]},
    {"conversation": ["Is it a vehicle? Yes.", "Is it a plane? Yes."], "done": True, "word": "Airplane"},
    {"conversation": ["Is it a tool? No."], "done": True, "word": ["Hammer"]},
]
GMC_ARCHER = [
    {"lines": ["Is it big? Like, really big? Yes, it is very big.", "Is your city Seoul? Yes, you guessed it! That is my city."],
     "correct": True, "word": "Seoul,South korea"},
]


@pytest.fixture(scope="module")
def games():
    return {name: load_game(name) for name in ("twenty_questions", "guess_my_city")}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """One line per row: a dict as JSON, a string as given (to write malformed lines)."""
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows), encoding="utf-8")
    return path


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


def turn(question: str, observation: str, reward: float, action: str | None = None, **extra) -> dict:
    return {"action": action or f"Question: {question}", "question": question,
            "observation": observation, "reward": reward, **extra}


def summary(record: dict) -> tuple:
    return (record["game_id"], record["target"], record["success"], [t["reward"] for t in record["turns"]])


# ---- aria_msgs --------------------------------------------------------------------------
def test_aria_msgs_twenty_questions(tmp_path, games):
    path = write_jsonl(tmp_path / "llama3-8b_twenty_questions_msgs.jsonl", TQ_MSGS)
    records = import_file(path, "aria_msgs", games["twenty_questions"])

    assert records[0] == {
        "schema_version": 1, "game_id": "llama3-8b_twenty_questions_msgs-000001", "game": "twenty_questions",
        "target": "Cat", "seed": None, "model": None, "oracle": None,
        "turns": [
            turn("Is it an animal?", "Yes.", -1.0, embedding=[0.1, 0.2]),
            turn("Is it a mammal?", "Yes.", -1.0, embedding=[0.3, 0.4]),
            turn("Is it a cat?", "Yes.", 0.0, embedding=[0.5, 0.6]),
        ],
        "num_turns": 3, "success": True, "final_reward": 1.0, "env_return": -2.0,
        "status": "finished", "errors": [], "source": "aria_msgs",
        "meta": {"source_line": 1, "success_source": "rule", "rule_success": True, "target_in_game": True,
                 "dataset_success": True, "dataset_success_field": "reward", "source_target": ["cat"]},
    }
    # An action already in "Question:" form is kept; "television" maps to the canonical name.
    assert records[1]["turns"] == [
        turn("Is it electronic?", "Yes.", -1.0, action="Question: Is it electronic?"),
        turn("Is it a radio?", "No.", -1.0),
    ]
    assert summary(records[1]) == ("llama3-8b_twenty_questions_msgs-000002", "Television", False, [-1.0, -1.0])
    assert (records[1]["final_reward"], records[1]["env_return"]) == (0.0, -2.0)
    # Own id, per-turn reward list, unanswered winning question, no target key: the file's flag decides.
    assert summary(records[2]) == ("own-7", None, True, [-1.0, 0.0])
    assert [t["observation"] for t in records[2]["turns"]] == ["Yes.", "Yes."]
    assert records[2]["meta"] == {"source_line": 3, "last_observation_filled": True, "dataset_success": True,
                                  "dataset_success_field": "reward", "success_source": "dataset (no target for the win rule)"}
    assert all("embedding" not in t for r in records[1:] for t in r["turns"])
    for record in records:
        validate_record(record)


def test_aria_msgs_guess_my_city(tmp_path, games):
    path = write_jsonl(tmp_path / "llama3-8b_guess_my_city_msgs.jsonl", GMC_MSGS)
    records = import_file(path, "aria_msgs", games["guess_my_city"])

    assert [summary(r) for r in records] == [
        ("llama3-8b_guess_my_city_msgs-000001", "Seoul", True, [-1.0, 0.0]),
        ("llama3-8b_guess_my_city_msgs-000002", "Atlantis", False, [-1.0]),  # unknown city kept as written
    ]
    assert records[0]["turns"] == [
        turn("Is your city in Asia?", "Yes, it is in Asia.", -1.0),
        turn("Is it Seoul?", "Yes, you guessed it! That is my city.", 0.0),
    ]
    assert all(r["game"] == "guess_my_city" and r["source"] == "aria_msgs" for r in records)
    for record in records:
        validate_record(record)


# ---- archer -----------------------------------------------------------------------------
def test_archer_twenty_questions(tmp_path, games):
    path = write_json(tmp_path / "convos.json", TQ_ARCHER)
    records = import_file(path, "archer", games["twenty_questions"])

    assert records[0]["turns"] == [
        turn("Is it an animal?", "Yes.", -1.0),
        turn("Is it a large cat?", "Yes.", -1.0),
        turn("Is it a lion?", "Yes.", 0.0),
    ]
    assert records[0]["meta"] == {"source_index": 0, "success_source": "rule", "rule_success": True, "target_in_game": True,
                                  "dataset_success": True, "dataset_success_field": "correct"}
    assert [summary(r) for r in records] == [
        ("convos-000000", "Lion", True, [-1.0, -1.0, 0.0]),    # the rule and "correct" agree
        ("convos-000001", "Television", False, [-1.0, -1.0]),
        ("convos-000002", "Airplane", True, [-1.0, 0.0]),     # "plane" names Airplane
        ("convos-000003", "Hammer", False, [-1.0]),           # "done": true, but no guess: the rule says lost
    ]
    assert [r["meta"]["dataset_success"] for r in records] == [True, False, True, True]
    # A line without "? " ending in the invalid answer is still split.
    assert records[1]["turns"][1] == turn("Tell me the object.", "Invalid Question.", -1.0)
    assert all(r["source"] == "archer" for r in records)
    for record in records:
        validate_record(record)


def test_archer_guess_my_city(tmp_path, games):
    path = write_json(tmp_path / "city_convos.json", GMC_ARCHER)
    [record] = import_file(path, "archer", games["guess_my_city"])

    assert summary(record) == ("city_convos-000000", "Seoul", True, [-1.0, 0.0])
    assert record["turns"] == [
        turn("Is it big? Like, really big?", "Yes, it is very big.", -1.0),  # split at the last "? "
        turn("Is your city Seoul?", "Yes, you guessed it! That is my city.", 0.0),
    ]
    validate_record(record)


# The shape of a public LLM-played Guess My City set: "done" set by a substring test, cities outside
# the environment's list, accents, and multi-line outputs whose question follows a preamble.
GMC_REAL = [
    {"conversation": ["Is your city in South America? Yes, it is in South America.",
                      "Is the city you are from Bogotá? Yes, the city I am from is Bogotá."],
     "done": False, "word": "Bogotá,Colombia"},                       # accents: the file missed this win
    {"conversation": ["Is your city in Asia? Yes.",
                      "Based on the information provided, my next question would be:\n\nIs your hometown Dalian? "
                      "Yes, my hometown is Dalian."],
     "done": True, "word": "Dalian,China"},                           # the question follows a preamble
    {"conversation": ["Is your city in the United States? Yes.", "Is your city New York? Yes, it is New York!"],
     "done": True, "word": "New York,USA"},                           # outside the 91 cities
    {"conversation": ["Is your city in Asia? No, it is not.", "Is your city in Europe? No."],
     "done": False, "word": "Mexico City,Mexico"},                    # outside, and lost
    {"conversation": ["Is it St. Petersburg? Yes, you got it."], "done": True, "word": "St Petersburg,Russia"},
    {"conversation": ["Is your city Saigon? Yes!"], "done": True, "word": "Ho Chi Minh City,Vietnam"},  # no alias known
]


def test_real_shaped_guess_my_city_file_is_taken_whole(tmp_path, games):
    path = write_json(tmp_path / "gmc_llm.json", GMC_REAL)
    records = import_file(path, "archer", games["guess_my_city"])

    assert [r["target"] for r in records] == ["Bogota", "Dalian", "New York", "Mexico City", "St Petersburg",
                                              "Ho Chi Minh City"]
    assert [r["meta"]["target_in_game"] for r in records] == [True, True, False, False, False, False]
    assert [r["success"] for r in records] == [True, True, True, False, True, False]  # the win rule
    assert [r["meta"]["dataset_success"] for r in records] == [False, True, True, False, True, True]
    assert records[1]["turns"][1]["question"] == "Is your hometown Dalian?"
    assert records[0]["turns"][1]["reward"] == 0.0 and records[0]["meta"]["source_target"] == "Bogotá,Colombia"
    line = import_summary(records)
    assert "6 games; success from rule: 4/6 won (66.7%)" in line
    assert "win rule: 4/6 won; the file's 'done': 4/6 won; the two disagree on 2 of 6 games" in line
    assert "4 targets outside the game's list" in line

    # --success-from dataset: the file's own flag decides; the rule's verdict is still recorded.
    flagged = import_file(path, "archer", games["guess_my_city"], success_from="dataset")
    assert [r["success"] for r in flagged] == [False, True, True, False, True, True]
    assert [r["meta"]["rule_success"] for r in flagged] == [True, True, True, False, True, False]
    assert all(r["meta"]["success_source"] == "dataset" for r in flagged)
    with pytest.raises(ValueError, match="unknown success source 'oracle'"):
        import_file(path, "archer", games["guess_my_city"], success_from="oracle")


def test_game_without_target_or_flag_fails_on_that_game(tmp_path, games):
    path = write_json(tmp_path / "no_signal.json", [GOOD_CONVO, {"lines": ["Is it a cat? Yes."], "word": []}])
    with pytest.raises(DataError) as info:
        import_file(path, "archer", games["twenty_questions"])
    assert_names(info.value, path, None, "[1].word")
    path = write_json(tmp_path / "no_flag.json", [{"lines": ["Is it a cat? Yes."], "word": "Cat"}])
    assert import_file(path, "archer", games["twenty_questions"])[0]["success"]  # the rule needs no flag
    with pytest.raises(DataError, match=r"\[0\]\.correct.*missing"):
        import_file(path, "archer", games["twenty_questions"], success_from="dataset")


def test_split_line_rules(games):
    tq, gmc = games["twenty_questions"], games["guess_my_city"]
    assert split_line(tq, "Is it an animal? No.") == ("Is it an animal?", "No.")
    assert split_line(tq, "Name it. Invalid Question.") == ("Name it.", "Invalid Question.")
    assert split_line(gmc, "Is it hot? Yes, it is hot in summer.") == ("Is it hot?", "Yes, it is hot in summer.")
    assert split_line(tq, "Is it an animal?") is None
    assert split_line(tq, "Yes.") is None


# ---- round trip -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fmt", "game", "name", "data"),
    [
        ("aria_msgs", "twenty_questions", "tq_msgs.jsonl", TQ_MSGS),
        ("aria_msgs", "guess_my_city", "gmc_msgs.jsonl", GMC_MSGS),
        ("archer", "twenty_questions", "tq.json", TQ_ARCHER),
        ("archer", "guess_my_city", "gmc.json", GMC_ARCHER),
    ],
)
def test_round_trip_through_trajectory_files(tmp_path, fmt, game, name, data):
    path = (write_jsonl if fmt == "aria_msgs" else write_json)(tmp_path / name, data)
    out = tmp_path / "out" / "trajectories.jsonl"
    records = import_file(path, fmt, game, out_path=out)

    assert len(records) == len(data)
    assert list(read_trajectories(out)) == records


def test_registry_and_unknown_format(tmp_path):
    assert set(IMPORTERS) == {"aria_msgs", "archer"}
    with pytest.raises(ValueError, match="unknown format 'lmrl'"):
        import_file(tmp_path / "x.json", "lmrl", "twenty_questions")


# ---- bad input --------------------------------------------------------------------------
GOOD_MSG = {"actions": ["Is it a cat?"], "obs": ["Yes."], "reward": 0}


def assert_names(err: DataError, path: Path, line: int | None, field: str | None) -> None:
    message = str(err)
    assert path.name in message
    if line is not None:
        assert f"line {line}" in message
    if field is not None:
        assert f"field '{field}'" in message


@pytest.mark.parametrize(
    ("rows", "line", "field"),
    [
        ([GOOD_MSG, {"obs": ["Yes."], "reward": 0}], 2, "actions"),
        ([{"actions": ["a?", "b?", "c?"], "obs": ["No."], "reward": -1}], 1, "obs"),
        ([{"actions": ["a?", "b?"], "obs": ["No."], "reward": -1}], 1, "obs"),  # short only for a win
        ([GOOD_MSG, GOOD_MSG, '{"actions": ["Is it a cat?"], "obs": '], 3, None),  # malformed JSON
        ([{"actions": "Is it a cat?", "obs": ["Yes."], "reward": 0}], 1, "actions"),
        ([{"actions": ["Is it a cat?", 7], "obs": ["Yes.", "No."], "reward": -1}], 1, "actions[1]"),
        ([{"actions": ["Is it a cat?"], "obs": ["Yes."], "reward": "won"}], 1, "reward"),
        ([{"actions": ["Is it a cat?"], "obs": ["Yes."], "reward": 1}], 1, "reward"),
        ([{"actions": ["a?", "b?"], "obs": ["Yes.", "No."], "reward": [0, -1]}], 1, "reward[0]"),
        ([{"actions": ["a?"], "obs": ["Yes."]}], 1, "reward"),
        ([{**GOOD_MSG, "action_embeddings": [[0.1], [0.2]]}], 1, "action_embeddings"),
        ([{**GOOD_MSG, "action_embeddings": ["0.1"]}], 1, "action_embeddings[0]"),
        ([{**GOOD_MSG, "game_id": "g"}, {**GOOD_MSG, "game_id": "g"}], 2, "game_id"),
        ([{**GOOD_MSG, "word": 3}], 1, "word"),
        ([GOOD_MSG, {**GOOD_MSG, "reward": 10 ** 400}], 2, "reward"),  # no float holds it
        ([GOOD_MSG, '{"actions": ["a?"], "obs": ["Yes."], "reward": 1' + "0" * 5000 + "}"], 2, None),  # 5,001 digits
        ([{**GOOD_MSG, "actions": ["Is it \ud800?"]}], 1, "actions[0]"),  # half a surrogate pair
        ([{**GOOD_MSG, "action_embeddings": [[0.1, 0.2]]}, {**GOOD_MSG, "action_embeddings": [[0.3]]}], 2,
         "action_embeddings[0]"),  # two embedding models in one file
        # "won" by the file, lost by the win rule: the unanswered question's answer would be invented
        ([{"actions": ["Is it an animal?", "Is it a cat?"], "obs": ["Yes."], "reward": 0, "word": "Dog"}], 1, "obs"),
        ([{**GOOD_MSG, "next_observations": ["No."]}], 1, "next_observations"),  # two answer lists that differ
    ],
    ids=["missing-actions", "count-mismatch", "short-obs-lost-game", "malformed-json", "actions-not-list",
         "action-not-string", "reward-type", "reward-value", "early-win", "missing-reward",
         "embedding-count", "embedding-type", "duplicate-id", "target-type", "huge-int", "too-many-digits",
         "lone-surrogate", "embedding-width", "filled-answer-of-a-lost-game", "obs-and-next-observations"],
)
def test_aria_msgs_bad_input_names_file_line_field(tmp_path, games, rows, line, field):
    path = write_jsonl(tmp_path / "bad_msgs.jsonl", rows)
    with pytest.raises(DataError) as info:
        import_file(path, "aria_msgs", games["twenty_questions"])
    assert_names(info.value, path, line, field)


GOOD_CONVO = {"lines": ["Is it a cat? Yes."], "correct": True, "word": ["Cat"]}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ([GOOD_CONVO, {"correct": True, "word": ["Cat"]}], "[1].lines"),
        ([{**GOOD_CONVO, "lines": "Is it a cat? Yes."}], "[0].lines"),
        ([{**GOOD_CONVO, "lines": []}], "[0].lines"),
        ([{**GOOD_CONVO, "lines": ["Is it a cat? Yes.", "cat"]}], "[0].lines[1]"),
        ([{**GOOD_CONVO, "correct": "yes"}], "[0].correct"),
        ([{**GOOD_CONVO, "done": "yes", "correct": None}], "[0].correct"),
        ([{**GOOD_CONVO, "word": []}], "[0].word"),
        ([GOOD_CONVO, "Is it a cat? Yes."], "[1]"),
    ],
    ids=["missing-lines", "lines-not-list", "no-lines", "unsplittable-line", "correct-type",
         "correct-null", "empty-word", "sample-not-object"],
)
def test_archer_bad_input_names_file_sample_field(tmp_path, games, data, field):
    path = write_json(tmp_path / "bad_convos.json", data)
    with pytest.raises(DataError) as info:
        import_file(path, "archer", games["twenty_questions"])
    assert_names(info.value, path, None, field)


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_a_file_without_games_is_an_error_not_an_empty_import(tmp_path, games, text):
    path = tmp_path / "msgs.jsonl"
    path.write_text(text)
    with pytest.raises(DataError, match="no games in the file"):
        import_file(path, "aria_msgs", games["twenty_questions"], tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_archer_bad_file_shape(tmp_path, games):
    not_list = write_json(tmp_path / "dict.json", {"lines": ["Is it a cat? Yes."]})
    with pytest.raises(DataError, match="expected a JSON list of conversations") as info:
        import_file(not_list, "archer", games["twenty_questions"])
    assert_names(info.value, not_list, None, None)

    malformed = tmp_path / "malformed.json"
    malformed.write_text('[\n {"lines": ["Is it a cat? Yes."],\n', encoding="utf-8")
    with pytest.raises(DataError, match="invalid JSON") as info:
        import_file(malformed, "archer", games["twenty_questions"])
    assert_names(info.value, malformed, 3, None)


# ---- command line -----------------------------------------------------------------------
def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_cli_imports_and_reports(tmp_path):
    path = write_jsonl(tmp_path / "llama3-8b_twenty_questions_msgs.jsonl", TQ_MSGS)
    out = tmp_path / "out.jsonl"
    result = run_script("--format", "aria_msgs", "--game", "twenty_questions", str(path), str(out))

    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1
    assert "3 games; success from dataset (no target for the win rule) and rule: 2/3 won (66.7%)" in result.stdout
    assert "win rule: 1/2 won; the file's 'reward': 2/3 won; the two disagree on 0 of 2 games" in result.stdout
    assert [r["game_id"] for r in read_trajectories(out)] == [
        "llama3-8b_twenty_questions_msgs-000001", "llama3-8b_twenty_questions_msgs-000002", "own-7",
    ]


def test_cli_success_from_dataset_and_summary_line(tmp_path):
    path = write_json(tmp_path / "gmc_llm.json", GMC_REAL)
    out = tmp_path / "out.jsonl"
    result = run_script("--format", "archer", "--game", "guess_my_city", "--success-from", "dataset", str(path), str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().count("\n") == 0
    assert "6 games; success from dataset: 4/6 won (66.7%); win rule: 4/6 won" in result.stdout
    assert "the two disagree on 2 of 6 games; 4 targets outside the game's list" in result.stdout
    assert [r["success"] for r in read_trajectories(out)] == [False, True, True, False, True, True]


def test_cli_bad_file_exits_2_with_one_line(tmp_path):
    path = write_jsonl(tmp_path / "broken_msgs.jsonl", [GOOD_MSG, {"obs": ["Yes."], "reward": 0}])
    out = tmp_path / "out.jsonl"
    result = run_script("--format", "aria_msgs", "--game", "twenty_questions", str(path), str(out))

    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "broken_msgs.jsonl" in lines[0] and "line 2" in lines[0] and "field 'actions'" in lines[0]
    assert result.stdout == ""
    assert not out.exists()


# ---- history in the original's training prompts -----------------------------------------
def test_parse_history_inverts_render(games):
    history = [("Is it red?", "No."), ("Is it big?", "Yes.")]
    for game in games.values():
        assert parse_history(game.render_prompt(history)) == history
        assert parse_history(game.render_prompt([])) == []


def test_parse_history_reproduces_released_training_prompts(games):
    samples = json.loads(TRAINING_SAMPLE.read_text(encoding="utf-8"))
    game_by_first_line = {
        "Let's play a game of Twenty Questions.": games["twenty_questions"],
        "Let's play a game of Guess My City.": games["guess_my_city"],
    }
    turns_seen = 0
    for i, sample in enumerate(samples):
        observation = sample["observation"]
        game = game_by_first_line[observation.split("\n", 1)[0]]
        history = parse_history(observation)
        assert game.render_prompt(history) == observation, f"sample {i}"
        turns_seen += len(history)

    assert len(samples) == 9
    assert turns_seen > len(samples)  # most samples carry a history
    assert parse_history(samples[0]["observation"]) == [
        ("Is the object a living thing?", "No."),
        ("Is the object a man-made object?", "No."),
    ]


@pytest.mark.parametrize(("fmt", "game", "name", "text"), [
    ("aria_msgs", "twenty_questions", "deep_msgs.jsonl", '{"actions": ' + "[" * 10000 + "]" * 10000 + "}\n"),
    ("archer", "twenty_questions", "deep.json", "[" * 10000 + "]" * 10000),
    ("aria_two_player", "bargaining", "deep.jsonl", '{"x": ' + "[" * 10000 + "]" * 10000 + "}\n"),
], ids=["aria_msgs", "archer", "aria_two_player"])
def test_json_nested_thousands_deep_is_one_line_naming_the_file(tmp_path, fmt, game, name, text):
    """A hostile file nested 10,000 levels deep (before: RecursionError and its traceback)."""
    path = tmp_path / name
    path.write_text(text)
    result = run_script("--format", fmt, "--game", game, str(path), str(tmp_path / "out.jsonl"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [f"error: {path}{', line 1' if name.endswith('.jsonl') else ''}: "
                                                  "JSON nested too deeply to read (thousands of levels): "
                                                  "not a file of this project's kinds"]
    assert not (tmp_path / "out.jsonl").exists()
