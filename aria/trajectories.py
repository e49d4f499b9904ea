"""The trajectory schema (version 1): one finished game per JSON line.

Every game this project plays or imports is stored as one JSON object per line::

    {
      "schema_version": 1,
      "game_id": "twenty_questions-s0-00012",   # unique within a file; resume skips ids present
      "game": "twenty_questions",               # registry name of the game
      "target": "Soccer ball",                  # hidden object / city (null if unknown on import)
      "seed": 0,                                # collection seed (null on import)
      "model": "SmolLM2-135M-Instruct",         # policy that played
      "oracle": "knowledge_base",               # who answered
      "turns": [                                # one entry per agent turn, in order
        {"action": "Question: Is it round?",    # the model's full output
         "question": "Is it round?",            # extracted question, null when invalid
         "observation": "Yes.",                 # the oracle's answer
         "reward": -1.0}                        # −1 per turn, 0 on the winning turn
                                                # (optional: "intention", what the player meant,
                                                #  e.g. "fact:round"; step 2 scores labels against it)
      ],
      "num_turns": 1,
      "success": false,
      "final_reward": 0.0,                      # R of docs/method.md §3: 1 for success, 0 otherwise
      "env_return": -1.0,                       # sum of the per-turn rewards
      "status": "finished",                     # "finished" | "failed" (see "errors")
      "errors": [],                             # error messages (failed requests, ...)
      "source": "collected"                     # or "aria_msgs" / "archer" for imports
    }

Optional fields: ``turns[i].embedding`` (a list of floats from an imported file, e.g. ARIA's
``action_embeddings``), ``meta`` (a dict of anything else worth keeping).

Two-player games (bargaining, negotiation) use the same envelope with ``players`` and
``role_rewards`` instead of the single-agent result fields::

      "players": ["alice", "bob"],              # roles, first mover first
      "turns": [{"role": "alice", "action": "I offer $110.", "reward": 0.0}, ...],  # speaking order
      "role_rewards": {"alice": 0.5, "bob": 0.5},   # each role's final reward R (docs/method.md §3)

Their turns need ``role`` and ``action`` (``observation``/``question`` are not used: the other
player's next turn is the observation); ``reward``, ``embedding`` and ``shown`` (the text the other
player received, which transcripts show instead of ``action``) are optional. Games played here
add the parsed move and every re-prompt to each turn (see :mod:`aria.games.two_player.play`).

:func:`validate_record` checks all of this and names file, line and field of the first problem.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterator

from aria.io import (DataError, ResumeMismatch, atomic_write_json, atomic_write_jsonl, differences, find_non_finite, hold_output,
                     is_finite_number, iter_jsonl, read_json, release_output, require)
from aria.secrets import redact, redact_text

SCHEMA_VERSION = 1
STATUSES = ("finished", "failed")


def make_record(
    *,
    game_id: str,
    game: str,
    turns: list[dict],
    target: str | None = None,
    success: bool | None = None,
    players: list[str] | None = None,
    role_rewards: dict[str, float] | None = None,
    model: str | None = None,
    oracle: str | None = None,
    seed: int | None = None,
    status: str = "finished",
    errors: list[str] | None = None,
    source: str = "collected",
    meta: dict | None = None,
) -> dict:
    """Build a schema-v1 record; derived fields (counts, rewards) are computed here, once. A
    question game's record has its ``target`` and ``success``; a two-player game's its ``players``
    and their ``role_rewards`` (see the module doc). The fields stand in the order every file has
    them (a file written again is byte for byte the same)."""
    if players is None:
        if success is None or role_rewards is not None:
            raise TypeError("make_record: a question game's record needs success, and has no role_rewards")
        outcome = {"success": bool(success), "final_reward": 1.0 if success else 0.0,
                   "env_return": float(sum(t["reward"] for t in turns))}
    else:
        if role_rewards is None or success is not None or target is not None or oracle is not None:
            raise TypeError("make_record: a two-player game's record has players and role_rewards, no target, "
                            "success or oracle")
        outcome = {"role_rewards": {p: float(role_rewards[p]) for p in players}}
    record = {"schema_version": SCHEMA_VERSION, "game_id": game_id, "game": game, "target": target, "seed": seed,
              "model": model, "oracle": oracle, **({"players": list(players)} if players is not None else {}),
              "turns": turns, "num_turns": len(turns), **outcome, "status": status, "errors": list(errors or []),
              "source": source}
    if meta:
        record["meta"] = meta
    return record


def producer_path(games: str | os.PathLike) -> Path:
    """Where :class:`TrajectoryWriter` keeps what made the games of the file ``games``."""
    games = Path(games)
    return games.with_name(games.name + ".producer.json")


def read_producer(games: str | os.PathLike) -> dict | None:
    """The producer record beside the games file ``games`` (:class:`TrajectoryWriter`), or None
    where there is none (a file imported, or written before the record existed)."""
    beside = producer_path(games)
    if not beside.is_file():
        return None
    record = read_json(beside)
    if not isinstance(record, dict) or not isinstance(record.get("producer"), dict):
        raise DataError(beside, None, "producer", "expected an object {\"file\": ..., \"producer\": "
                        "{...}} (what made the games beside it); remove it only if those games are yours")
    return record["producer"]


def validate_record(record: Any, path: str | os.PathLike | None = None, line: int | None = None,
                    widths: VectorWidth | None = None) -> dict:
    """Check one record against schema v1; raise :class:`DataError` at the first problem.
    ``widths``: the embedding width of the file so far (a record's own vectors are checked alike)."""
    if not isinstance(record, dict):
        raise DataError(path, line, None, "expected a JSON object")
    widths = widths or VectorWidth()
    version = require(record, "schema_version", int, path, line)
    if version != SCHEMA_VERSION:
        raise DataError(path, line, "schema_version", f"unsupported version {version} (this code reads {SCHEMA_VERSION})")
    for key in ("game_id", "game"):
        if not require(record, key, str, path, line).strip():
            raise DataError(path, line, key, "empty")
    for key in ("target", "model", "oracle"):
        if key in record and record[key] is not None and not isinstance(record[key], str):
            raise DataError(path, line, key, "expected a string or null")
    if record.get("seed") is not None and (isinstance(record["seed"], bool) or not isinstance(record["seed"], int)):
        raise DataError(path, line, "seed", "expected an integer or null")
    if "meta" in record and not isinstance(record["meta"], dict):
        raise DataError(path, line, "meta", f"expected an object, got {type(record['meta']).__name__}")
    if "meta" in record and (field := find_non_finite(record["meta"], "meta")):
        raise DataError(path, line, field, "not a finite number (NaN and infinities are not JSON)")
    turns = require(record, "turns", list, path, line)
    if require(record, "status", str, path, line) not in STATUSES:
        raise DataError(path, line, "status", f"expected one of {STATUSES}, got {record['status']!r}")
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(path, line, f"turns[{i}]", "expected an object")
        if "embedding" in turn:
            widths.check(turn["embedding"], path, line, f"turns[{i}].embedding")
    if "players" in record:
        _validate_two_player(record, turns, path, line)
    else:
        _validate_single_agent(record, turns, path, line)
    errors = require(record, "errors", list, path, line)
    if not all(isinstance(e, str) for e in errors):
        raise DataError(path, line, "errors", "expected a list of strings")
    return record


class VectorWidth:
    """The one length every embedding read together must have (a file's, or the files clustered
    together): the first vector's, named in the error."""

    def __init__(self) -> None:
        self.width: int | None = None
        self.first, self.path = "", None

    def check(self, vector: Any, path, line, field: str) -> None:
        if not isinstance(vector, list) or not vector:
            raise DataError(path, line, field, "expected a non-empty list of numbers")
        bad = next((i for i, x in enumerate(vector) if not is_finite_number(x)), None)
        if bad is not None:
            raise DataError(path, line, f"{field}[{bad}]", f"not a finite number ({vector[bad]!r:.40})")
        if self.width is None:
            self.width, self.path = len(vector), path
            self.first = f"{field} on line {line}" if line is not None else field
        elif len(vector) != self.width:
            first = self.first if self.path == path else f"{self.first} of {self.path}"
            raise DataError(path, line, field, f"has {len(vector)} numbers, {first} has {self.width}: "
                                               "all vectors read together come from one embedding model")


def _validate_two_player(record: dict, turns: list, path, line) -> None:
    players = require(record, "players", list, path, line)
    if len(players) < 2 or not all(isinstance(p, str) and p for p in players) or len(set(players)) != len(players):
        raise DataError(path, line, "players", "expected two or more distinct role names")
    rewards = require(record, "role_rewards", dict, path, line)
    for player in players:
        if not is_finite_number(rewards.get(player)):
            raise DataError(path, line, f"role_rewards.{player}", "missing or not a finite number")
    for i, turn in enumerate(turns):
        where = f"turns[{i}]"
        if turn.get("role") not in players:
            raise DataError(path, line, f"{where}.role", f"expected one of {players}, got {turn.get('role')!r}")
        if not isinstance(turn.get("action"), str):
            raise DataError(path, line, f"{where}.action", "missing or not a string")
        if "reward" in turn and not is_finite_number(turn["reward"]):
            raise DataError(path, line, f"{where}.reward", "not a finite number")
        if "shown" in turn and not isinstance(turn["shown"], str):
            raise DataError(path, line, f"{where}.shown", "expected a string")
    if require(record, "num_turns", int, path, line) != len(turns):
        raise DataError(path, line, "num_turns", f"is {record['num_turns']} but there are {len(turns)} turns")


def _validate_single_agent(record: dict, turns: list, path, line) -> None:
    for i, turn in enumerate(turns):
        where = f"turns[{i}]"
        for key in ("action", "observation"):
            if not isinstance(turn.get(key), str):
                raise DataError(path, line, f"{where}.{key}", "missing or not a string")
        if turn.get("question") is not None and not isinstance(turn["question"], str):
            raise DataError(path, line, f"{where}.question", "expected a string or null")
        if turn.get("intention") is not None and not isinstance(turn["intention"], str):
            raise DataError(path, line, f"{where}.intention", "expected a string or null")
        if not is_finite_number(turn.get("reward")):
            raise DataError(path, line, f"{where}.reward", "missing or not a finite number")
    if require(record, "num_turns", int, path, line) != len(turns):
        raise DataError(path, line, "num_turns", f"is {record['num_turns']} but there are {len(turns)} turns")
    success = require(record, "success", bool, path, line)
    if success and not turns:  # (a game without a turn is kept, and skipped by the pipeline)
        raise DataError(path, line, "success", "true, but the game has no turn: a game is won on a turn")
    for key in ("final_reward", "env_return"):
        if not is_finite_number(require(record, key, (int, float), path, line)):
            raise DataError(path, line, key, "not a finite number")
    # R of docs/method.md §3, which aggregation reads: a file whose R disagrees with its own outcome
    # would train on it silently
    if record["final_reward"] != (1.0 if success else 0.0):
        raise DataError(path, line, "final_reward", f"is {record['final_reward']!r}, but success is "
                                                    f"{str(success).lower()} (R is 1 for a won game, 0 otherwise)")
    try:
        total = math.fsum(turn["reward"] for turn in turns)
    except OverflowError:  # each finite, their sum beyond a float's range
        raise DataError(path, line, "turns", "the turns' rewards sum beyond a float's range") from None
    if not math.isclose(record["env_return"], total, rel_tol=1e-9, abs_tol=1e-6):
        raise DataError(path, line, "env_return", f"is {record['env_return']!r}, but the turns' rewards sum to {total!r}")


def read_trajectories(path: str | os.PathLike, allow_partial_last_line: bool = False,
                      widths: VectorWidth | None = None, game: str | None = None) -> Iterator[dict]:
    """Yield validated records from a trajectories JSONL file; see :func:`iter_trajectories`."""
    for _, record in iter_trajectories(path, allow_partial_last_line, widths, game):
        yield record


def iter_trajectories(path: str | os.PathLike, allow_partial_last_line: bool = False,
                      widths: VectorWidth | None = None, game: str | None = None) -> Iterator[tuple[int, dict]]:
    """Yield (line, record) of validated records; a duplicate ``game_id`` is an error.
    ``widths``: shared by the files read together, whose embeddings are clustered together.
    ``game``: the game every record must be (a file of another game would be rendered and
    labelled with this game's prompts and oracle without a word)."""
    seen: dict[str, int] = {}
    widths = widths or VectorWidth()
    for line, record in iter_jsonl(path, allow_partial_last_line=allow_partial_last_line):
        validate_record(record, path, line, widths)
        if game is not None and record["game"] != game:
            raise DataError(path, line, "game", f"{record['game']!r}, but this run's game is {game!r} "
                                                f"(give game={record['game']}, or a file of {game} games)")
        if record["game_id"] in seen:
            raise DataError(path, line, "game_id", f"{record['game_id']!r} already on line {seen[record['game_id']]}")
        seen[record["game_id"]] = line
        yield line, record


def write_trajectories(path: str | os.PathLike, records: list[dict]) -> None:
    """Validate and write records atomically (the whole file at once)."""
    widths = VectorWidth()
    for i, record in enumerate(records):
        validate_record(record, path, i + 1, widths)
    atomic_write_jsonl(path, records)




def describe(obj: Any) -> dict:
    """What a policy, oracle or player is, for :class:`TrajectoryWriter`'s ``producer``."""
    return dict(getattr(obj, "settings", None) or {"name": getattr(obj, "name", type(obj).__name__)})


class TrajectoryWriter:
    """Appends finished games to a JSONL file, one complete line per game, flushed to disk.

    Resuming: :meth:`open` first drops a last line cut short by a crash and, when
    ``retry_failed`` is set, rewrites the file without its ``failed`` games (atomically), so
    that only finished games count as done. A crash therefore loses at most the games that were
    in flight.

    Provenance: ``producer`` describes what makes this run's games (model or served name,
    decoding settings, oracle or opponent, seed, configurations; see :func:`describe`). It is kept
    beside the file in ``<file>.producer.json``, and a file that holds games made under another
    producer (or under an unknown one, written before this check) is not continued:
    :class:`ResumeMismatch` names the differences. ``force_new`` moves such a file (and its
    record) aside, to ``<stem>.replaced-<n><suffix>``, and starts a new one; no game is deleted.
    """

    def __init__(self, path: str | os.PathLike, retry_failed: bool = True, producer: dict | None = None,
                 force_new: bool = False):
        self.path = Path(path)
        self.retry_failed = retry_failed
        self.producer = None if producer is None else json.loads(json.dumps(redact(producer)))
        self.force_new = force_new
        self.done: dict[str, dict] = {}
        self.lines: dict[str, int] = {}  # each done game's line in the file
        self.moved_to: Path | None = None
        self._handle = None
        self._lock: Path | None = None

    @property
    def producer_path(self) -> Path:
        return producer_path(self.path)

    def _has_games(self) -> bool:
        return self.path.exists() and bool(self.path.read_bytes().strip())

    def _check_producer(self) -> None:
        if self.producer is None or not self._has_games():
            return
        recorded = read_producer(self.path)
        if recorded == self.producer:
            return
        if self.force_new:
            n = 1
            while (aside := self.path.with_name(f"{self.path.stem}.replaced-{n}{self.path.suffix}")).exists():
                n += 1
            self.path.rename(aside)
            if self.producer_path.is_file():
                self.producer_path.rename(aside.with_name(aside.name + ".producer.json"))
            self.moved_to = aside
            return
        why = ("it has no record of what produced its games (written before this check)" if recorded is None
               else "; ".join(differences(recorded, self.producer)[:4]))
        raise ResumeMismatch(f"{self.path} holds games made under other settings ({why}); continuing it would mix "
                             f"them: start over with force_new=true (the old file is moved aside, nothing is lost) "
                             f"or write to another file")

    def open(self) -> "TrajectoryWriter":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # one writer a file: a second command on it would write every game again (InUse, one line)
        self._lock = hold_output(self.path, "out", is_file=True)
        try:
            return self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> "TrajectoryWriter":
        self._check_producer()
        if self.path.exists():
            numbered = list(iter_trajectories(self.path, allow_partial_last_line=True))
            keep = [(n, r) for n, r in numbered if r["status"] == "finished" or not self.retry_failed]
            raw = self.path.read_bytes()
            if len(keep) != len(numbered) or (raw and not raw.endswith(b"\n")):
                atomic_write_jsonl(self.path, [r for _, r in keep])  # drop failed games / a torn last line
                keep = [(i, r) for i, (_, r) in enumerate(keep, 1)]
            self.lines = {r["game_id"]: n for n, r in keep}  # (the reader refuses a game id twice)
            self.done = {r["game_id"]: r for _, r in keep}
        if self.producer is not None and not (self._has_games() and self.producer_path.is_file()):
            atomic_write_json(self.producer_path, {"file": self.path.name, "producer": self.producer})
        self._handle = open(self.path, "a", encoding="utf-8")
        return self

    def write(self, record: dict) -> None:
        validate_record(record, self.path, None)
        self._handle.write(redact_text(json.dumps(record, ensure_ascii=False)) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self.done[record["game_id"]] = record

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._lock is not None:
            release_output(self._lock)
            self._lock = None

    def __enter__(self) -> "TrajectoryWriter":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()
