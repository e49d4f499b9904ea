"""A resumed games file is checked record by record (aria.scheduler.check_resumed): every game in
it must be one this run plays, once, and be that game by the rules (its target or configuration,
an outcome its turns give). Before, an evaluation resumed over a file holding another game's
record counted it (5 games for 4), a record saying success whose turns showed no win was counted
as a win, and a collection continued a file holding another game's record."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from in_process import run_script

REPO = Path(__file__).resolve().parents[1]


def collect(out: Path, num_games: int = 2):
    return run_script(REPO / "scripts/collect_games.py", "game=twenty_questions_subset", f"num_games={num_games}",
                      "progress=false", "policy=scripted", f"out={out}")


def one_line(done) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    return [line for line in done.stderr.strip().splitlines() if line.strip()][-1]


@pytest.fixture
def played(tmp_path):
    """Two scripted games of twenty_questions_subset (the scripted expert wins them)."""
    out = tmp_path / "games.jsonl"
    assert collect(out).returncode == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["success"] for r in records)
    return out, records


def rewrite(out: Path, records: list[dict]) -> None:
    out.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_game_this_run_does_not_play_is_refused_with_its_line(played):
    out, records = played
    stranger = {**records[1], "game_id": "twenty_questions_subset-s99-00007"}
    rewrite(out, [*records, stranger])
    line = one_line(collect(out))
    assert f"{out}, line 3: game 'twenty_questions_subset-s99-00007' is not one of the 2 games this run plays" in line


def test_a_win_the_turns_do_not_show_is_refused(played):
    out, records = played
    last = records[0]["turns"][-1]
    forged = {**records[0], "turns": [*records[0]["turns"][:-1], {**last, "question": "Is it a kind of weather?"}]}
    rewrite(out, [forged, records[1]])
    line = one_line(collect(out))
    assert f"{out}, line 1: game '{records[0]['game_id']}' says success true, but its last question does not name" in line


def test_another_target_under_a_game_id_of_this_run_is_refused(played):
    out, records = played
    rewrite(out, [records[0], {**records[1], "target": "Dog" if records[1]["target"] != "Dog" else "Cat"}])
    line = one_line(collect(out))
    assert f"{out}, line 2: game '{records[1]['game_id']}' is a game of twenty_questions_subset with target" in line


def test_a_game_written_twice_is_refused(played):
    """(The file reader's own check, which a resume goes through.)"""
    out, records = played
    rewrite(out, [records[0], records[1], records[0]])
    line = one_line(collect(out))
    assert f"{out}, line 3, field 'game_id': '{records[0]['game_id']}' already on line 1" in line


def test_a_file_of_this_runs_own_games_resumes(played):
    out, records = played
    rewrite(out, records[:1])  # the second game lost: it is played again, the first kept
    assert collect(out).returncode == 0
    assert [json.loads(line)["game_id"] for line in out.read_text().splitlines()] == [r["game_id"] for r in records]


def test_a_two_player_record_of_another_configuration_or_winner_is_refused(tmp_path):
    from aria.games.common.base import load_game_config
    from aria.games.two_player.glee import config_set
    from aria.games.two_player.play import ScriptedPlayer, play_two_player
    from aria.io import ResumeMismatch

    game_cfg = load_game_config("bargaining")
    configs = config_set(game_cfg, "eval48")[:2]
    seats = {"alice": ScriptedPlayer("bargaining", 1.0), "bob": ScriptedPlayer("bargaining", 0.5)}
    out = tmp_path / "games.jsonl"
    play_two_player(game_cfg, configs, seats, out, games_per_config=1, progress=False)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    swapped = {**records[0], "meta": {**records[0]["meta"], "config_id": records[1]["meta"]["config_id"],
                                      "config": records[1]["meta"]["config"]}}
    rewrite(out, [swapped, records[1]])
    with pytest.raises(ResumeMismatch, match=r"line 1: game .* is a game of bargaining in configuration"):
        play_two_player(game_cfg, configs, seats, out, games_per_config=1, progress=False)
    payoffs = records[1]["meta"]["payoffs"]
    loser = min(payoffs, key=payoffs.get) if payoffs["alice"] != payoffs["bob"] else "alice"
    rewrite(out, [records[0], {**records[1], "meta": {**records[1]["meta"], "winner": loser}}])
    with pytest.raises(ResumeMismatch, match=r"line 2: .* names the winner"):
        play_two_player(game_cfg, configs, seats, out, games_per_config=1, progress=False)


@pytest.mark.parametrize("sidecar", ['["not", "an", "object"]', '{"file": "games.jsonl", "producer": 3}', '{"file": "x"}'])
def test_a_producer_file_of_the_wrong_shape_is_named(played, sidecar):
    """Before: a traceback (KeyError, TypeError) from the resume check."""
    out, _ = played
    producer = out.with_name(out.name + ".producer.json")
    producer.write_text(sidecar)
    line = one_line(collect(out))
    assert line.startswith(f"error: {producer}") and "field 'producer'" in line, line


def step1(games: Path, run_dir: Path):
    return run_script(REPO / "reward_aggregation/1_embed_and_cluster.py", "game=twenty_questions_subset", f"input={games}",
                      f"run_dir={run_dir}", "clustering.k_max=3")


def test_pipeline_step_1_checks_a_collected_file_against_the_rules_it_was_played_under(played, tmp_path):
    """Step 1 labelled a forged win as one (before, it read the file as it found it). A game this
    code played (``source: collected``) is checked against the game's rules, with the max_turns of
    its file's producer record; an imported game keeps the outcome its importer decided."""
    out, records = played
    last = records[1]["turns"][-1]
    forged = {**records[1], "turns": [*records[1]["turns"][:-1], {**last, "question": "Is it a kind of weather?"}]}
    rewrite(out, [records[0], forged])
    line = one_line(step1(out, tmp_path / "int"))
    assert line.startswith(f"error: {out}, line 2: game '{records[1]['game_id']}' says success true, but its last "
                           "question does not name the target"), line
    assert not (tmp_path / "int" / "utterances.json").exists()
    # the same games played under a shorter max_turns (online.max_turns): a lost game of 3 turns is
    # within the rules it was played under
    short = tmp_path / "short.jsonl"
    assert run_script(REPO / "scripts/collect_games.py", "game=twenty_questions_subset", "num_games=2", "progress=false",
                      "policy=scripted", "policy.epsilon=1.0", "game.max_turns=3", f"out={short}").returncode == 0
    assert step1(short, tmp_path / "int_short").returncode == 0
    # without its producer record the win rule still holds (only the length rule needs the record)
    out.with_name(out.name + ".producer.json").unlink()
    assert "says success true, but its last question does not name" in one_line(step1(out, tmp_path / "int_bare"))
    # an imported game keeps its importer's outcome (another dataset's oracle may judge a win otherwise)
    rewrite(out, [records[0], {**forged, "source": "aria_msgs"}])
    assert step1(out, tmp_path / "int_imported").returncode == 0
