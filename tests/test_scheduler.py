"""One game scheduler (aria/scheduler.py) plays both kinds of games, resumes where it stopped, and
constrained two-player self-play with a tiny model writes only readable replies."""
from __future__ import annotations

import json

import pytest

from aria.games.base import build_game, load_game_config
from aria.games.glee import BargainingConfig, config_set
from aria.games.oracle import build_oracle
from aria.llm.local import LocalChatModel
from aria.rollout import QuestionGames, game_id
from aria.scheduler import run_games
from aria.trajectories import ResumeMismatch, read_trajectories
from aria.two_player import PolicyPlayer, ScriptedPlayer, TwoPlayerGames, play_two_player
from conftest import ScriptedPolicy


class Stop(Exception):
    pass


def stop_after(n: int):
    seen = []

    def hook(record):
        seen.append(record["game_id"])
        if len(seen) == n:
            raise Stop

    return hook


def question_kind():
    cfg = load_game_config("twenty_questions_subset")
    game = build_game(cfg)
    jobs = [(game_id(game.name, 0, i), t) for i, t in enumerate(game.targets[:6])]
    script = {gid: ["Question: Is it an animal?", "Question: Is it a dog?"] for gid, _ in jobs}
    return QuestionGames(game, ScriptedPolicy(script), build_oracle({"name": "knowledge_base"}, cfg), seed=0), jobs


def bargaining_kind():
    cfg = load_game_config("bargaining")
    configs = config_set(cfg, "smoke") + [BargainingConfig(money=10000, delta_alice=0.9, delta_bob=0.9, max_rounds=4)]
    seats = {"alice": ScriptedPlayer("bargaining", 1.0), "bob": ScriptedPlayer("bargaining", 0.5)}
    jobs = [(f"{c.id}-{i}", c) for c in configs for i in range(3)]
    return TwoPlayerGames(cfg, seats, seed=0), jobs


@pytest.mark.parametrize("make", [question_kind, bargaining_kind], ids=["question game", "two-player game"])
def test_the_scheduler_resumes_either_kind_of_game_exactly(tmp_path, make):
    kind, jobs = make()
    producer = {"test": kind.name}
    whole = run_games(kind, jobs, tmp_path / "whole.jsonl", producer, batch_size=4, progress=False)
    assert (whole.played, whole.failed) == (len(jobs), 0)

    out = tmp_path / "resumed.jsonl"
    kind, jobs = make()
    with pytest.raises(Stop):
        run_games(kind, jobs, out, producer, batch_size=4, progress=False, on_game_end=stop_after(2))
    assert len(list(read_trajectories(out))) == 2  # the games finished before the stop are on disk
    kind, jobs = make()
    rest = run_games(kind, jobs, out, producer, batch_size=4, progress=False)
    assert (rest.already_done, rest.played) == (2, len(jobs) - 2)
    by_id = lambda path: {r["game_id"]: r for r in read_trajectories(path)}  # noqa: E731
    assert by_id(out) == by_id(tmp_path / "whole.jsonl")  # deterministic players: the same games
    again = run_games(kind, jobs, out, producer, batch_size=4, progress=False)
    assert again.played == 0 and again.already_done == len(jobs)


def test_game_ids_must_be_unique(tmp_path):
    kind, jobs = question_kind()
    with pytest.raises(ValueError, match="unique"):
        run_games(kind, jobs + jobs[:1], tmp_path / "x.jsonl", {}, progress=False)


def test_constrained_self_play_writes_only_legal_replies(tmp_path, tiny_model_dir):
    cfg = {**load_game_config("bargaining"), "structured_output": "json_schema"}
    # enough tokens for the longest legal reply: 80 message characters, each possibly a 6-character escape
    model = LocalChatModel(str(tiny_model_dir), max_new_tokens=600, temperature=1.0, dtype="float32", seed=1)
    player = PolicyPlayer(model)
    configs = [BargainingConfig(money=100, delta_alice=0.9, delta_bob=0.8, max_rounds=3)]
    out = tmp_path / "self_play.jsonl"
    summary = play_two_player(cfg, configs, {"alice": player, "bob": player}, out, games_per_config=4, batch_size=4,
                              progress=False)
    assert (summary.played, summary.failed) == (4, 0)
    for record in read_trajectories(out):
        for turn in record["turns"]:  # every reply of a random model is a legal move at the first try
            assert turn["attempts"] == [] and "forfeit" not in turn, turn
            json.loads(turn["action"])
    # the games were made under constrained replies: free replies do not continue the file
    with pytest.raises(ResumeMismatch, match="structured_output"):
        play_two_player({**cfg, "structured_output": "none"}, configs, {"alice": player, "bob": player}, out,
                        games_per_config=4, progress=False)


def test_an_unknown_structured_output_is_refused():
    cfg = {**load_game_config("bargaining"), "structured_output": "grammar"}
    with pytest.raises(ValueError, match="structured_output must be one of"):
        TwoPlayerGames(cfg, {}, seed=0)
