"""One game scheduler (aria/scheduler.py) plays both kinds of games, resumes where it stopped, and
constrained two-player self-play with a tiny model writes only readable replies."""
from __future__ import annotations

import json
import threading

import pytest

from aria.games.common.base import load_game_config
from aria.games.question.game import build_game
from aria.games.question.oracle import build_oracle
from aria.games.question.play import QuestionGames, game_id
from aria.games.two_player.glee import BargainingConfig, config_set
from aria.games.two_player.play import PolicyPlayer, ScriptedPlayer, TwoPlayerGames, play_two_player
from aria.llm.local import LocalChatModel
from aria.scheduler import run_games
from aria.trajectories import ResumeMismatch, read_trajectories
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


class ServerGoesDown(ScriptedPolicy):
    """The scripted policy behind a server that goes down after ``answered`` replies: from then
    on every request fails, and ``server_lost`` says why, as an endpoint policy's watch does for
    a server this process started (aria/llm/endpoint.py)."""

    def __init__(self, script, answered: int, concurrent: bool):
        super().__init__(script)
        self.left, self.concurrent, self._lock = answered, concurrent, threading.Lock()

    def generate(self, conversations, keys=None):
        from aria.llm.base import Completion

        replies = []
        for conversation, key in zip(conversations, keys):
            with self._lock:
                self.left -= 1
                up = self.left >= 0
            replies.append(super().generate([conversation], [key])[0] if up
                           else Completion(text=None, error="connection refused"))
        return replies

    def server_lost(self):
        return "the engine process ended" if self.left < 0 else None


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("concurrent", [False, True], ids=["in step", "each on its own"])
def test_no_game_starts_once_the_server_is_lost_and_a_re_run_plays_the_rest(tmp_path, batch_size, concurrent):
    """Ten games, a server that answers five requests: the games in flight fail
    (batch_size of them at most), no other game starts, and a re-run on a new server plays the
    failed and the unstarted games (before: every game left was started and recorded as failed).
    Both ways of playing: every turn one batched call, and each game in its own thread (an
    endpoint policy with a knowledge-base oracle plays so)."""
    kind, _ = question_kind()
    game = kind.game
    jobs = [(game_id(game.name, 0, i), game.targets[i % len(game.targets)]) for i in range(10)]
    script = {gid: ["Question: Is it an animal?", "Question: Is it a dog?"] for gid, _ in jobs}
    out, producer = tmp_path / "games.jsonl", {"test": "lost server"}
    down = ServerGoesDown(script, answered=5, concurrent=concurrent)
    kind = QuestionGames(game, down, kind.oracle, seed=0)
    summary = run_games(kind, jobs, out, producer, batch_size=batch_size, progress=False, lost=down.server_lost)
    assert summary.stopped == "the engine process ended" and "stopped early: the engine process ended" in summary.line()
    records = list(read_trajectories(out))
    assert 1 <= summary.failed <= batch_size and summary.played == len(records) < len(jobs)
    assert sum(r["status"] == "failed" for r in records) == summary.failed

    again = ServerGoesDown(script, answered=10_000, concurrent=concurrent)
    rest = run_games(QuestionGames(game, again, kind.oracle, seed=0), jobs, out, producer, batch_size=batch_size,
                     progress=False, lost=again.server_lost)
    assert rest.stopped is None and rest.failed == 0 and rest.played == len(jobs) - (len(records) - summary.failed)
    finished = {r["game_id"] for r in read_trajectories(out) if r["status"] == "finished"}
    assert finished == {gid for gid, _ in jobs}


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


class ServerLikePolicy(ScriptedPolicy):
    """A scripted policy that serves requests one by one from many threads (``concurrent``), as a
    vLLM server does: game ``slow``'s first request is held until ``release_slow`` is set."""

    concurrent = True

    def __init__(self, script, slow: str):
        super().__init__(script)
        self.slow, self.release_slow = slow, threading.Event()
        self.held_until_released: bool | None = None
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0

    def generate(self, conversations, keys=None):
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.slow in keys and self.held_until_released is None:
                self.held_until_released = self.release_slow.wait(timeout=2.0)
            return super().generate(conversations, keys)
        finally:
            with self.lock:
                self.in_flight -= 1


def server_kind(concurrent: bool):
    cfg = load_game_config("twenty_questions_subset")
    game = build_game(cfg)
    jobs = [(game_id(game.name, 0, i), t) for i, t in enumerate(game.targets[:4])]
    script = {gid: ["Question: Is it an animal?", "Question: Is it made of metal?", f"Question: Is it a {t.name}?"]
              for gid, t in jobs}
    policy = ServerLikePolicy(script, slow=jobs[0][0])
    policy.concurrent = concurrent
    return QuestionGames(game, policy, build_oracle({"name": "knowledge_base"}, cfg), seed=0), jobs, policy


@pytest.mark.parametrize("concurrent", [True, False], ids=["each game on its own", "in step"])
def test_a_slow_reply_holds_up_only_its_own_game_when_the_policy_is_a_server(tmp_path, concurrent):
    """With a server for a policy, the other games play all their turns while one game waits for
    its first reply; in step (an in-process model) they wait for it at every turn."""
    kind, jobs, policy = server_kind(concurrent)
    assert kind.independent is concurrent
    finished = []

    def on_end(record):
        finished.append(record["game_id"])
        if len(finished) == len(jobs) - 1:
            policy.release_slow.set()

    summary = run_games(kind, jobs, tmp_path / "games.jsonl", {}, batch_size=4, progress=False, on_game_end=on_end)
    assert (summary.played, summary.failed, summary.turns) == (4, 0, 12)
    assert {r["game_id"]: r["num_turns"] for r in read_trajectories(tmp_path / "games.jsonl")} == {g: 3 for g, _ in jobs}
    if concurrent:
        assert policy.held_until_released is True and finished[-1] == policy.slow  # the others finished meanwhile
        assert policy.most_in_flight >= 2  # the others' requests went out while the slow one was held
    else:
        assert policy.held_until_released is False  # nobody could finish while the slow reply was out
        assert policy.most_in_flight == 1  # one batched call per turn


def test_an_interrupted_run_of_independent_games_writes_only_whole_games_and_resumes(tmp_path):
    kind, jobs, policy = server_kind(True)
    policy.release_slow.set()
    out = tmp_path / "games.jsonl"
    with pytest.raises(Stop):
        run_games(kind, jobs, out, {}, batch_size=4, progress=False, on_game_end=stop_after(2))
    assert not [t for t in threading.enumerate() if t.name.startswith("game")]  # no game thread outlives the run
    assert len(list(read_trajectories(out))) == 2
    rest = run_games(kind, jobs, out, {}, batch_size=2, progress=False)
    assert (rest.already_done, rest.played) == (2, 2)
    assert sorted(r["game_id"] for r in read_trajectories(out)) == sorted(g for g, _ in jobs)


def test_an_interruption_does_not_wait_out_a_reply_stuck_in_flight(tmp_path):
    """A server that stopped answering holds a request for the policy's whole timeout (minutes): a
    Ctrl-C then must end the run within the grace period, not after it (before: it waited for the
    stuck reply), with only whole games written and the rest left to a re-run."""
    import time

    from aria import scheduler

    kind, jobs, policy = server_kind(True)  # the slow game's first reply is held (here: 2 s, as if for minutes)
    out = tmp_path / "games.jsonl"
    grace, scheduler.INTERRUPT_GRACE_S = scheduler.INTERRUPT_GRACE_S, 0.2
    try:
        start = time.monotonic()
        with pytest.raises(Stop):
            run_games(kind, jobs, out, {}, batch_size=4, progress=False, on_game_end=stop_after(1))
        assert time.monotonic() - start < 1.5 and policy.held_until_released is None  # the held reply is still out
    finally:
        scheduler.INTERRUPT_GRACE_S = grace
    assert [r["game_id"] for r in read_trajectories(out)] != [] and policy.slow not in {r["game_id"] for r in read_trajectories(out)}
    policy.release_slow.set()
