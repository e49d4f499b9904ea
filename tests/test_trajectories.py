"""Trajectory schema v1: round trip, validation errors naming line and field, crash-safe writer."""
from __future__ import annotations

import json
import re

import pytest

from aria.io import DataError
from aria.trajectories import TrajectoryWriter, make_record, read_trajectories, validate_record, write_trajectories


def record(i: int, success: bool = True, status: str = "finished") -> dict:
    turns = [
        {"action": "Question: Is it alive?", "question": "Is it alive?", "observation": "No.", "reward": -1.0},
        {"action": "Question: Is it a rock?", "question": "Is it a rock?", "observation": "Yes.", "reward": 0.0 if success else -1.0},
    ]
    return make_record(game_id=f"g{i}", game="twenty_questions", target="Rock", turns=turns, success=success,
                       model="m", oracle="knowledge_base", seed=0, status=status)


def test_round_trip_and_derived_fields(tmp_path):
    records = [record(0), record(1, success=False)]
    path = tmp_path / "t.jsonl"
    write_trajectories(path, records)
    assert list(read_trajectories(path)) == records
    assert (records[0]["num_turns"], records[0]["final_reward"], records[0]["env_return"]) == (2, 1.0, -1.0)
    assert (records[1]["final_reward"], records[1]["env_return"]) == (0.0, -2.0)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda r: r.pop("game_id"), "game_id"),
        (lambda r: r.update(num_turns=5), "num_turns"),
        (lambda r: r["turns"][1].update(reward=float("nan")), "turns[1].reward"),
        (lambda r: r["turns"][0].pop("observation"), "turns[0].observation"),
        (lambda r: r.update(schema_version=2), "schema_version"),
        (lambda r: r.update(status="half-done"), "status"),
        (lambda r: r.update(success="yes"), "success"),
        (lambda r: r["turns"][1].update(reward=10 ** 400), "turns[1].reward"),  # an int no float holds
        (lambda r: r.update(final_reward=7.5), "final_reward"),  # R is 1 for a won game
        (lambda r: r.update(success=False), "final_reward"),  # ... and 0 for a lost one
        (lambda r: r.update(env_return=123.0), "env_return"),  # the turns' rewards sum to -1
        (lambda r: r.update(meta=["x"]), "meta"),
        (lambda r: r.update(meta={"prices": [1.0, float("inf")]}), "meta.prices[1]"),  # not JSON for other tools
        (lambda r: r.update(turns=[], num_turns=0, env_return=0.0), "success"),  # a game is won on a turn
        (lambda r: r["turns"][0].update(action="Is it \ud800?"), "turns[0].action"),  # no UTF-8 file holds it
        # each reward finite, their sum beyond a float's range
        (lambda r: [t.update(reward=1e308) for t in r["turns"]] and r.update(env_return=1e308), "turns"),
    ],
)
def test_bad_record_names_file_line_and_field(tmp_path, mutate, field):
    good, bad = record(0), record(1)
    mutate(bad)
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError) as err:
        list(read_trajectories(path))
    message = str(err.value)
    assert "bad.jsonl" in message and "line 2" in message and f"'{field}'" in message


def test_duplicate_game_id_and_malformed_line(tmp_path):
    path = tmp_path / "dup.jsonl"
    path.write_text(json.dumps(record(0)) + "\n" + json.dumps(record(0)) + "\n")
    with pytest.raises(DataError, match="line 2.*game_id"):
        list(read_trajectories(path))
    path.write_text(json.dumps(record(0)) + "\n{not json\n")
    with pytest.raises(DataError, match="line 2"):
        list(read_trajectories(path))


def test_writer_drops_a_torn_last_line_and_failed_games(tmp_path):
    path = tmp_path / "resume.jsonl"
    path.write_text(json.dumps(record(0)) + "\n" + json.dumps(record(1, status="failed")) + "\n" + json.dumps(record(2))[:40])
    with TrajectoryWriter(path) as writer:
        assert set(writer.done) == {"g0"}  # the failed game is retried, the torn line dropped
        writer.write(record(3))
    assert [r["game_id"] for r in read_trajectories(path)] == ["g0", "g3"]


def test_validate_record_accepts_imported_embeddings():
    r = record(0)
    r["turns"][0]["embedding"] = [0.1, 0.2]
    assert validate_record(r) is r
    r["turns"][0]["embedding"] = ["x"]
    with pytest.raises(DataError, match="embedding"):
        validate_record(r)


def test_embeddings_are_one_width_in_a_record_and_in_a_file(tmp_path):
    """Vectors of two embedding models (or a cut one) cannot be clustered together: named where
    they first differ, not in step 1 without a file."""
    r = record(0)
    r["turns"][0]["embedding"], r["turns"][1]["embedding"] = [0.1, 0.2], [0.3]
    with pytest.raises(DataError, match=re.escape("field 'turns[1].embedding': has 1 numbers, turns[0].embedding has 2")):
        validate_record(r)
    r["turns"][1]["embedding"] = []
    with pytest.raises(DataError, match=re.escape("field 'turns[1].embedding': expected a non-empty list of numbers")):
        validate_record(r)
    first, second = record(0), record(1)
    for t in first["turns"]:
        t["embedding"] = [0.1, 0.2]
    for t in second["turns"]:
        t["embedding"] = [0.1, 0.2, 0.3]
    path = tmp_path / "mixed.jsonl"
    path.write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")
    with pytest.raises(DataError, match=re.escape("line 2, field 'turns[0].embedding': has 3 numbers, "
                                                  "turns[0].embedding on line 1 has 2")):
        list(read_trajectories(path))


def test_a_game_without_a_turn_is_kept_if_it_was_not_won():
    """A failed request before the first turn, or an imported game cut to nothing: the pipeline
    skips it and says so (tests/test_intention_pipeline.py)."""
    r = record(0, success=False, status="failed")
    r.update(turns=[], num_turns=0, env_return=0.0, errors=["the server did not answer"])
    assert validate_record(r) is r
    r.update(status="finished", errors=[])
    assert validate_record(r) is r


def test_writer_refuses_to_continue_a_file_of_another_producer(tmp_path):
    from aria.trajectories import ResumeMismatch, TrajectoryWriter

    path = tmp_path / "games.jsonl"
    turn = {"action": "Question: Is it a cat?", "question": "Is it a cat?", "observation": "Yes.", "reward": 0.0}
    first = {"policy": {"model": "a", "temperature": 1.0}, "oracle": {"name": "knowledge_base"}, "seed": 0}
    with TrajectoryWriter(path, producer=first) as writer:
        writer.write(make_record(game_id="g0", game="twenty_questions", target="Cat", turns=[turn], success=True, model="a"))
    with TrajectoryWriter(path, producer=first) as writer:  # the same producer resumes
        assert set(writer.done) == {"g0"}
    other = {**first, "policy": {"model": "a", "temperature": 0.7}}
    with pytest.raises(ResumeMismatch, match=r"policy.temperature was 1.0, now 0.7.*force_new=true"):
        TrajectoryWriter(path, producer=other).open()
    # force_new moves the old games aside and starts a new file with its own record.
    with TrajectoryWriter(path, producer=other, force_new=True) as writer:
        assert writer.done == {} and writer.moved_to == tmp_path / "games.replaced-1.jsonl"
    assert [r["game_id"] for r in read_trajectories(tmp_path / "games.replaced-1.jsonl")] == ["g0"]
    assert json.loads((tmp_path / "games.jsonl.producer.json").read_text())["producer"] == other
    # A file written before provenance was recorded is not continued blindly.
    legacy = tmp_path / "legacy.jsonl"
    legacy.write_text(path.with_name("games.replaced-1.jsonl").read_text())
    with pytest.raises(ResumeMismatch, match="no record of what produced its games"):
        TrajectoryWriter(legacy, producer=first).open()
    # An API key in a producer is not written down.
    with TrajectoryWriter(tmp_path / "k.jsonl", producer={"policy": {"api_key": "sk-abcdefghijkl"}}):
        pass
    assert "sk-abcdefghijkl" not in (tmp_path / "k.jsonl.producer.json").read_text()


def test_make_record_builds_either_kind_and_refuses_a_mix():
    """One builder: a question game's record (target, success) or a two-player game's (players,
    role_rewards); fields of the other kind are refused, not silently dropped."""
    from aria.trajectories import make_record

    turns = [{"role": "alice", "action": "a", "reward": 0.0}, {"role": "bob", "action": "b", "reward": 0.0}]
    two = make_record(game_id="g", game="bargaining", players=["alice", "bob"], turns=turns,
                      role_rewards={"alice": 0.75, "bob": 0.25})
    assert list(two)[:9] == ["schema_version", "game_id", "game", "target", "seed", "model", "oracle", "players", "turns"]
    assert two["role_rewards"] == {"alice": 0.75, "bob": 0.25} and "success" not in two and two["num_turns"] == 2
    one = make_record(game_id="q", game="twenty_questions", target="dog", turns=turns[:1], success=True)
    assert (one["success"], one["final_reward"], one["env_return"]) == (True, 1.0, 0.0) and "players" not in one
    with pytest.raises(TypeError, match="needs success"):
        make_record(game_id="q", game="twenty_questions", target="dog", turns=turns)
    with pytest.raises(TypeError, match="has no role_rewards"):
        make_record(game_id="q", game="twenty_questions", target="dog", turns=turns, success=True,
                    role_rewards={"alice": 1.0, "bob": 0.0})
    with pytest.raises(TypeError, match="no target, success or oracle"):
        make_record(game_id="g", game="bargaining", players=["alice", "bob"], turns=turns,
                    role_rewards={"alice": 1.0, "bob": 0.0}, success=True)
