"""Batched, resumable collection of single-agent games (pipeline step 0: "collect").

Many games are played at once through the one game scheduler (:func:`aria.scheduler.run_games`:
queue, refill, write, release); this module supplies the question game's turn
(:class:`QuestionGames`): the prompts of all live games go to the policy in one batched call,
their questions to the oracle in one batched call. Each finished game is appended to the output
JSONL as one complete line (schema: :mod:`aria.trajectories`). With ``structured_output: regex``
(game config) every reply is generated under the game's one-line question format.

Resuming: re-running the same command skips the game ids already in the file; failed games are
played again. Game ``i`` of seed ``s`` always has the same id and target, so a resumed run plays
exactly the games that are missing.

Failures: a policy or oracle request that still fails after its backend's retries marks that
game ``failed`` (with the error in its record); the other games go on.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from aria.games.common.base import structured_output
from aria.games.common.settings import CollectSettings
from aria.games.question.game import QuestionGame, Target, build_game, target_schedule
from aria.games.question.oracle import Oracle, OracleRequest, build_oracle, check_oracle
from aria.llm.base import ChatModel, OutputFormat, concurrent
from aria.llm.registry import build_policy
from aria.scheduler import PlaySummary, run_games
from aria.trajectories import describe, make_record

log = logging.getLogger(__name__)

@dataclass
class _LiveGame:
    game_id: str
    target: Target
    max_turns: int
    history: list[tuple[str, str]] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    success: bool = False
    failed: bool = False

    @property
    def over(self) -> bool:
        return self.success or len(self.turns) >= self.max_turns


def game_id(game: str, seed: int, index: int) -> str:
    return f"{game}-s{seed}-{index:05d}"


def reply_format(game_cfg: Mapping[str, Any]) -> OutputFormat | None:
    """The format every reply is constrained to (``structured_output: regex``), or None."""
    return OutputFormat.regex(game_cfg["reply_regex"]) if structured_output(game_cfg, "question") == "regex" else None


class QuestionGames:
    """Twenty Questions or Guess My City as a game kind of :func:`aria.scheduler.run_games`."""

    def __init__(self, game: QuestionGame, policy: ChatModel, oracle: Oracle, seed: int,
                 system_prompt: str | None = None, fmt: OutputFormat | None = None):
        self.game, self.policy, self.oracle, self.seed = game, policy, oracle, seed
        self.system_prompt, self.format = system_prompt, fmt
        self.name = game.name
        self.independent = concurrent(policy) and concurrent(oracle)

    def start(self, gid: str, target: Target) -> _LiveGame:
        return _LiveGame(gid, target, self.game.max_turns)

    def play_turn(self, games: Sequence[_LiveGame]) -> int:
        _play_turn(self.game, self.policy, self.oracle, games, self.system_prompt, getattr(self.oracle, "name", "oracle"),
                   self.format)
        return 0

    def record(self, g: _LiveGame) -> dict:
        return make_record(game_id=g.game_id, game=self.game.name, target=g.target.name, turns=g.turns,
                           success=g.success, model=self.policy.name, oracle=getattr(self.oracle, "name", None),
                           seed=self.seed, status="failed" if g.failed else "finished", errors=g.errors)

    def release(self, g: _LiveGame) -> None:
        self.policy.release(g.game_id)

    def tally(self, record: dict, counts: Counter) -> None:
        counts["successes"] += record["success"]

    def check(self, record: dict, target: Target) -> str | None:
        """A finished record is ``target``'s game by the rules: this game and target, won on its
        last turn only and then, each turn's reward as the rules pay it, and over (won, or out of turns)."""
        if record["game"] != self.game.name or record["target"] != target.name:
            return f"is a game of {record['game']} with target {record['target']!r}, not this run's {target.name!r}"
        return rule_problem(self.game, record, self.game.max_turns)

    def describe(self, counts: Counter, finished: int) -> str:
        return f"success {counts['successes']}/{finished} this run"


def rule_problem(game: QuestionGame, record: dict, max_turns: int | None) -> str | None:
    """What in a finished record breaks ``game``'s rules (None if nothing): won on its last turn
    only and then, each turn's reward as the rules pay it, and over (won, or out of the
    ``max_turns`` it was played with; None: not known, that rule is not checked)."""
    won = [game.is_win(t.get("question"), record["target"]) for t in record["turns"]]
    if any(won[:-1]):
        return f"is won on turn {won.index(True) + 1} of {len(won)}: a won game ends there"
    if record["success"] != (bool(won) and won[-1]):
        return (f"says success {str(record['success']).lower()}, but its last question "
                f"{'names' if won and won[-1] else 'does not name'} the target")
    for i, (turn, w) in enumerate(zip(record["turns"], won)):
        if turn["reward"] != game.turn_reward(w):
            return f"has reward {turn['reward']} on turn {i + 1}, where the rules pay {game.turn_reward(w)}"
    if max_turns is not None and not record["success"] and len(won) != max_turns:
        return f"is lost after {len(won)} turns, but a game ends lost only after {max_turns}"
    return None


def question_producer(game: QuestionGame, seed: int, policy: dict, oracle: dict, system_prompt: str | None = None,
                      reply_format: OutputFormat | None = None) -> dict:
    """The producer record of a file of question games (:class:`~aria.trajectories.TrajectoryWriter`):
    the settings its games were played under, the game's rules included
    (:meth:`~aria.games.question.game.QuestionGame.settings`), which a resumed run must match exactly."""
    producer = {"game": game.name, "game_settings": game.settings(), "seed": seed, "system_prompt": system_prompt,
                "policy": policy, "oracle": oracle}
    if reply_format is not None:  # files written before the setting existed keep their producer
        producer["reply_format"] = {"kind": reply_format.kind, "spec": reply_format.spec}
    return producer


def play_games(
    game: QuestionGame,
    policy: ChatModel,
    oracle: Oracle,
    out_path: str | Path,
    num_games: int,
    seed: int = 0,
    batch_size: int = 16,
    system_prompt: str | None = None,
    progress: bool = True,
    on_game_end: Callable[[dict], None] | None = None,
    force_new: bool = False,
    reply_format: OutputFormat | None = None,
) -> PlaySummary:
    """Play games ``0..num_games-1`` of ``seed`` into ``out_path`` (see module doc).

    A file holding games of another policy, sampling, oracle, seed, system prompt or reply
    format is not continued (:class:`~aria.trajectories.ResumeMismatch`) unless ``force_new``
    moves it aside. ``reply_format`` constrains every reply (structured outputs).
    """
    if num_games < 0:
        raise ValueError(f"num_games must be >= 0, got {num_games}")
    targets = target_schedule(game.targets, num_games, seed)
    producer = question_producer(game, seed, describe(policy), describe(oracle), system_prompt, reply_format)
    kind = QuestionGames(game, policy, oracle, seed, system_prompt, reply_format)
    jobs = [(game_id(game.name, seed, i), t) for i, t in enumerate(targets)]
    return run_games(kind, jobs, out_path, producer, batch_size=batch_size, progress=progress, force_new=force_new,
                     on_game_end=on_game_end, lost=getattr(policy, "server_lost", None))


def _play_turn(game, policy, oracle, live: Sequence[_LiveGame], system_prompt, oracle_name,
               fmt: OutputFormat | None = None) -> None:
    """One turn of every live game: one batched policy call, one batched oracle call."""
    conversations = []
    for g in live:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": game.render_prompt(g.history)})
        conversations.append(messages)
    keys = [g.game_id for g in live]
    completions = (policy.generate(conversations, keys=keys) if fmt is None
                   else policy.generate(conversations, keys=keys, formats=[fmt] * len(live)))

    asks: list[tuple[_LiveGame, str, str, str | None]] = []  # (game, action, question, intention) for the oracle
    for g, completion in zip(live, completions):
        if not completion.ok:
            g.failed = True
            g.errors.append(f"policy: {completion.error}")
            continue
        action = completion.text
        question = game.extract_question(action)
        if question is None:
            _record_turn(game, g, action, None, game.invalid_answer, False, completion.intention)
        elif game.is_win(question, g.target.name):
            _record_turn(game, g, action, question, game.win_answer, True, completion.intention)
        else:
            asks.append((g, action, question, completion.intention))
    if not asks:
        return
    answers = oracle.answer([OracleRequest(game.name, g.target.name, q) for g, _, q, _ in asks])
    for (g, action, question, intention), answer in zip(asks, answers):
        if not answer.ok:
            g.failed = True
            g.errors.append(f"oracle {oracle_name}: {answer.error}")
            continue
        _record_turn(game, g, action, question, answer.text, False, intention)


def _record_turn(game: QuestionGame, g: _LiveGame, action: str, question: str | None, observation: str, won: bool,
                 intention: str | None = None) -> None:
    turn = {"action": action, "question": question, "observation": observation, "reward": game.turn_reward(won)}
    if intention is not None:  # the player's own word for what it meant (the scripted expert)
        turn["intention"] = intention
    g.turns.append(turn)
    g.history.append((game.history_question(action, question), observation))
    g.success = won


# ---- building the pieces from config ----------------------------------------------------
def collect_questions(cfg: CollectSettings) -> PlaySummary:
    """A question-game collection from a (Hydra) config: ``game``, ``policy``, ``oracle`` + run
    options (:func:`aria.games.family.collect_from_config` checks the settings first)."""
    game = build_game(cfg.game)
    check_oracle(cfg.oracle)  # before the policy's model loads
    policy = build_policy(cfg.policy)
    try:
        oracle = build_oracle(cfg.oracle, cfg.game)
        return play_games(
            game, policy, oracle, cfg.out, num_games=cfg.num_games, seed=cfg.seed,
            batch_size=cfg.batch_size, system_prompt=cfg.system_prompt, progress=cfg.progress,
            force_new=cfg.force_new,
            reply_format=reply_format(cfg.game),
        )
    finally:
        getattr(policy, "close", lambda: None)()  # a policy=vllm server goes with the run
