"""One batched, resumable game scheduler for every kind of game.

Single-agent question games (:mod:`aria.games.question.play`) and two-player games
(:mod:`aria.games.two_player.play`) are played by the same loop; a game kind supplies only what
differs (verl's agent loop and RAGEN's split between stepping the environment and building
prompts work the same way):

* :meth:`GameKind.start`: a new live game from a job (a target, a configuration);
* :meth:`GameKind.play_turn`: one turn of every live game, batched (one policy call per player);
* :meth:`GameKind.record`: the finished game's schema-v1 record (:mod:`aria.trajectories`);
* :meth:`GameKind.release`: forget the players' per-game state (prompt caches);
* :meth:`GameKind.tally`: the kind's own counts for the summary (successes, deals, wins);
* :meth:`GameKind.check`: whether a record found in the output file is its job's game by the rules.

The loop, :func:`run_games`: jobs whose game id is already in the output file are skipped
(resume), once every record there is checked to be one of this run's games as its rules play it
(a file of other games, or one edited by hand, is refused naming its line); up to ``batch_size`` games are live at once; each finished game is written as one
complete line, released, and its slot refilled from the queue. The output file is never
continued under other settings (``producer``, :class:`~aria.trajectories.TrajectoryWriter`).
It plays in one of two ways, by what the players are (:attr:`GameKind.independent`):

* **in step** (an in-process model, which computes a batch of games in one pass): every turn,
  one batched call for all live games, then the next turn;
* **each game on its own** (players that are servers, e.g. vLLM, which batch the requests in
  flight themselves): every live game runs in its own thread and sends its next request as soon
  as its own reply and answer are in. In step, a server would sit waiting for the slowest game
  of every turn while the others idle (measured: one request running in 47 of 82 ten-second
  reports with 16 games in flight).
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from tqdm.auto import tqdm

from aria.io import ResumeMismatch
from aria.trajectories import TrajectoryWriter


class LiveGame(Protocol):
    game_id: str
    failed: bool  # a request failed after its retries: written as ``status: failed``

    @property
    def over(self) -> bool:
        """Finished by the rules (won, out of turns, a deal, ...)."""
        ...


class GameKind(Protocol):
    name: str  # the progress bar's label
    #: each game may be played on its own, from any thread: its players answer requests
    #: separately and gain nothing from a batch (servers, scripted players); False: in step
    independent: bool

    def start(self, game_id: str, job: Any) -> LiveGame: ...

    def play_turn(self, games: Sequence[LiveGame]) -> int:
        """One turn of every game in ``games``; returns extra requests made (re-prompts)."""
        ...

    def record(self, game: LiveGame) -> dict: ...

    def release(self, game: LiveGame) -> None: ...

    def tally(self, record: dict, counts: Counter) -> None: ...

    def check(self, record: dict, job: Any) -> str | None:
        """Why a finished ``record`` found in the output is not the game ``job`` played by the
        rules (another target or configuration, an outcome its turns do not give); None if it is."""
        ...

    def describe(self, counts: Counter, finished: int) -> str:
        """The kind's counts in words, for :meth:`PlaySummary.line`."""
        ...


@dataclass
class PlaySummary:
    """What one run did (``played`` excludes games found already done).

    ``counts`` are the game kind's own tallies (:meth:`GameKind.tally`): ``successes`` for
    question games; ``deals``, ``wins_alice``, ``wins_bob`` for two-player games.
    """

    total: int
    already_done: int
    played: int = 0
    failed: int = 0
    turns: int = 0
    extra_requests: int = 0  # re-prompts of unusable replies
    seconds: float = 0.0
    stopped: str | None = None  # why no more games were started (the policy's server was lost)
    counts: Counter = field(default_factory=Counter)
    _describe: Callable[[Counter, int], str] | None = field(default=None, repr=False)

    @property
    def finished(self) -> int:
        return self.played - self.failed

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        own = f", {self._describe(self.counts, self.finished)}" if self._describe else ""
        reprompts = f", {self.extra_requests} re-prompts" if self.extra_requests else ""
        stopped = f"; stopped early: {self.stopped}" if self.stopped else ""
        return (f"{self.already_done + self.finished}/{self.total} games done ({self.played} played now, "
                f"{self.failed} failed){own}, {self.turns} turns{reprompts} in {self.seconds:.1f}s "
                f"({self.turns_per_s:.2f} turns/s){stopped}")


def run_games(
    kind: GameKind,
    jobs: Sequence[tuple[str, Any]],
    out_path: str | Path,
    producer: dict,
    batch_size: int = 16,
    progress: bool = True,
    force_new: bool = False,
    on_game_end: Callable[[dict], None] | None = None,
    lost: Callable[[], str | None] | None = None,
) -> PlaySummary:
    """Play every ``(game_id, job)`` not yet in ``out_path`` (module doc). ``lost`` says what
    ended the policy's server (None while it serves): once a game fails and it says so, no new
    game starts, so the games left are not all recorded as failed against a server that is gone
    (``summary.stopped``; a re-run plays them)."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    ids = [gid for gid, _ in jobs]
    if len(set(ids)) != len(ids):
        raise ValueError("game ids must be unique")
    writer = TrajectoryWriter(out_path, producer=producer, force_new=force_new).open()
    try:
        check_resumed(kind, dict(jobs), writer)
    except BaseException:
        writer.close()
        raise
    todo = [(gid, job) for gid, job in jobs if gid not in writer.done]
    summary = PlaySummary(total=len(jobs), already_done=len(jobs) - len(todo), _describe=kind.describe)
    bar = tqdm(total=len(jobs), initial=summary.already_done, unit="game", desc=kind.name, disable=not progress,
               dynamic_ncols=True)

    def finish(game: LiveGame) -> None:
        record = kind.record(game)
        writer.write(record)
        kind.release(game)
        summary.played += 1
        summary.failed += game.failed
        if not game.failed:
            kind.tally(record, summary.counts)
        elif lost is not None and summary.stopped is None:
            summary.stopped = lost()
        bar.update(1)
        if on_game_end:
            on_game_end(record)

    start = time.perf_counter()
    try:
        play = _each_on_its_own if getattr(kind, "independent", False) else _in_step
        play(kind, todo, batch_size, summary, finish, bar)
    finally:
        summary.seconds = time.perf_counter() - start
        bar.close()
        writer.close()
    return summary


def check_resumed(kind: GameKind, jobs: dict[str, Any], writer: TrajectoryWriter) -> None:
    """Every game the output already holds is one this run plays, and is that game by its rules
    (:meth:`GameKind.check`): a resumed file continues only its own games, and counts none twice."""
    for gid, record in writer.done.items():
        line = writer.lines.get(gid)
        where = f"{writer.path}, line {line}" if line else str(writer.path)
        if gid not in jobs:
            raise ResumeMismatch(f"{where}: game {gid!r} is not one of the {len(jobs)} games this run plays: the file "
                                 "holds other games; write to another file (or move this one aside)")
        if record["status"] == "finished" and (why := kind.check(record, jobs[gid])):
            raise ResumeMismatch(f"{where}: game {gid!r} {why}: not continued (write to another file, or move this "
                                 "one aside)")


def _in_step(kind: GameKind, todo: list, batch_size: int, summary: PlaySummary, finish: Callable, bar) -> None:
    """Every turn one batched call for all live games (module doc)."""
    live: list[LiveGame] = []
    while (todo and not summary.stopped) or live:
        while todo and len(live) < batch_size and not summary.stopped:
            live.append(kind.start(*todo.pop(0)))
        summary.extra_requests += kind.play_turn(live)
        summary.turns += len(live)
        still_live = []
        for game in live:
            if game.failed or game.over:
                finish(game)
            else:
                still_live.append(game)
        live = still_live
        bar.set_postfix_str(kind.describe(summary.counts, summary.finished), refresh=False)


def _each_on_its_own(kind: GameKind, todo: list, batch_size: int, summary: PlaySummary, finish: Callable, bar) -> None:
    """Up to ``batch_size`` games at once, each in its own thread from start to end (module doc);
    finished games are written from this thread. On an interruption no new turn starts, the
    turns in flight get :data:`INTERRUPT_GRACE_S` to end, and the unfinished games are not written
    (a re-run plays them)."""
    stop = threading.Event()

    def play_one(gid: str, job: Any) -> tuple[LiveGame | None, int, int]:
        game, turns, extra = kind.start(gid, job), 0, 0
        while not (game.failed or game.over):
            if stop.is_set():
                return None, turns, extra
            extra += kind.play_turn([game])
            turns += 1
        return game, turns, extra

    queue = iter(todo)
    running: set[Future] = set()
    ended = False
    try:
        for gid, job in queue:
            running.add(_in_a_thread(play_one, gid, job))
            if len(running) >= batch_size:
                break
        while running:
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                game, turns, extra = future.result()
                summary.turns += turns
                summary.extra_requests += extra
                finish(game)
                following = next(queue, None) if not summary.stopped else None
                if following is not None:
                    running.add(_in_a_thread(play_one, *following))
            bar.set_postfix_str(kind.describe(summary.counts, summary.finished), refresh=False)
        ended = True
    finally:
        stop.set()
        if not ended:  # the turns in flight get a moment to end; a reply stuck for the policy's whole
            # timeout (minutes, against a hung server) is left to a thread that cannot hold the exit
            wait(running, timeout=INTERRUPT_GRACE_S)


#: On an interruption, how long the turns in flight may take to end before their games are left
#: unwritten (a re-run plays them) and the command stops.
INTERRUPT_GRACE_S = 5.0


def _in_a_thread(fn: Callable, *args) -> Future:
    """``fn(*args)`` in a daemon thread of its own: a game blocked in a request never keeps the
    process from ending (a pool's threads are joined at exit, whatever the interruption)."""
    future: Future = Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
                future.set_exception(error)

    threading.Thread(target=run, name=f"game-{args[0]}", daemon=True).start()
    return future
