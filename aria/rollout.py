"""Batched, resumable collection of single-agent games (pipeline step 0: "collect").

Many games are played at once: each turn, the prompts of all live games go to the policy in
one batched call, their questions go to the oracle in one batched call, and a finished game's
slot is refilled from the queue right away (up to ``batch_size`` live games). Each finished
game is appended to the output JSONL as one complete line (schema: :mod:`aria.trajectories`).

Resuming: re-running the same command skips the game ids already in the file; failed games are
played again. Game ``i`` of seed ``s`` always has the same id and target, so a resumed run plays
exactly the games that are missing.

Failures: a policy or oracle request that still fails after its backend's retries marks that
game ``failed`` (with the error in its record); the other games go on.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tqdm.auto import tqdm

from aria.games.base import QuestionGame, Target, build_game, target_schedule
from aria.games.oracle import Oracle, OracleRequest, build_oracle
from aria.llm.base import ChatModel
from aria.trajectories import TrajectoryWriter, describe, make_record

log = logging.getLogger(__name__)


@dataclass
class _LiveGame:
    game_id: str
    target: Target
    history: list[tuple[str, str]] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    success: bool = False
    failed: bool = False


@dataclass
class CollectSummary:
    """What one collection run did (``played`` excludes games found already done)."""

    total: int
    already_done: int
    played: int
    failed: int
    successes: int
    turns: int
    seconds: float

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        done = self.already_done + self.played - self.failed
        return (
            f"{done}/{self.total} games done ({self.played} played now, {self.failed} failed), "
            f"success {self.successes}/{max(self.played - self.failed, 0)} this run, "
            f"{self.turns} turns in {self.seconds:.1f}s ({self.turns_per_s:.2f} turns/s)"
        )


def game_id(game: str, seed: int, index: int) -> str:
    return f"{game}-s{seed}-{index:05d}"


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
) -> CollectSummary:
    """Play games ``0..num_games-1`` of ``seed`` into ``out_path`` (see module doc).

    A file holding games of another policy, sampling, oracle, seed or system prompt is not
    continued (:class:`~aria.trajectories.ResumeMismatch`) unless ``force_new`` moves it aside.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if num_games < 0:
        raise ValueError(f"num_games must be >= 0, got {num_games}")
    targets = target_schedule(game.targets, num_games, seed)
    producer = {"game": game.name, "seed": seed, "system_prompt": system_prompt, "policy": describe(policy),
                "oracle": describe(oracle)}
    writer = TrajectoryWriter(out_path, producer=producer, force_new=force_new).open()
    pending = [
        _LiveGame(game_id(game.name, seed, i), t)
        for i, t in enumerate(targets)
        if game_id(game.name, seed, i) not in writer.done
    ]
    already_done = num_games - len(pending)
    summary = CollectSummary(num_games, already_done, 0, 0, 0, 0, 0.0)
    bar = tqdm(total=num_games, initial=already_done, unit="game", desc=game.name, disable=not progress, dynamic_ncols=True)
    start = time.perf_counter()
    live: list[_LiveGame] = []
    try:
        while pending or live:
            while pending and len(live) < batch_size:
                live.append(pending.pop(0))
            _play_turn(game, policy, oracle, live, system_prompt, getattr(oracle, "name", "oracle"))
            summary.turns += len(live)
            still_live = []
            for g in live:
                if g.failed or g.success or len(g.turns) >= game.max_turns:
                    record = make_record(
                        game_id=g.game_id, game=game.name, target=g.target.name, turns=g.turns,
                        success=g.success, model=policy.name, oracle=getattr(oracle, "name", None), seed=seed,
                        status="failed" if g.failed else "finished", errors=g.errors,
                    )
                    writer.write(record)
                    policy.release(g.game_id)
                    summary.played += 1
                    summary.failed += g.failed
                    summary.successes += g.success
                    bar.update(1)
                    if on_game_end:
                        on_game_end(record)
                else:
                    still_live.append(g)
            live = still_live
            finished = summary.played - summary.failed
            bar.set_postfix(success=f"{summary.successes}/{finished}", turns_s=f"{summary.turns / max(time.perf_counter() - start, 1e-9):.2f}")
    finally:
        summary.seconds = time.perf_counter() - start
        bar.close()
        writer.close()
    return summary


def _play_turn(game, policy, oracle, live: Sequence[_LiveGame], system_prompt, oracle_name) -> None:
    """One turn of every live game: one batched policy call, one batched oracle call."""
    conversations = []
    for g in live:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": game.render_prompt(g.history)})
        conversations.append(messages)
    completions = policy.generate(conversations, keys=[g.game_id for g in live])

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
def _local_policy(**options) -> ChatModel:
    from aria.llm.local import LocalChatModel  # imported on use: loads torch and transformers

    return LocalChatModel(**options)


def _endpoint_policy(**options) -> ChatModel:
    from aria.llm.endpoint import EndpointChatModel

    return EndpointChatModel(**options)


def _served_policy(**options) -> ChatModel:
    from aria.llm.served import ServedChatModel

    return ServedChatModel(**options)


def _scripted_policy(**options) -> ChatModel:
    from aria.games.expert import ScriptedExpertPolicy

    return ScriptedExpertPolicy(**options)


POLICIES: dict[str, Callable[..., ChatModel]] = {"local": _local_policy, "endpoint": _endpoint_policy,
                                                 "vllm": _served_policy, "scripted": _scripted_policy}


def build_policy(cfg: Mapping[str, Any]) -> ChatModel:
    """The policy named by ``cfg["name"]`` (a key of :data:`POLICIES`), other keys as options."""
    options = dict(cfg)
    kind = options.pop("name")
    if kind not in POLICIES:
        raise KeyError(f"unknown policy {kind!r}; registered: {sorted(POLICIES)}")
    return POLICIES[kind](**options)


def collect_from_config(cfg: Mapping[str, Any]) -> CollectSummary:
    """Run a collection from a (Hydra) config: ``game``, ``policy``, ``oracle`` + run options.

    Two-player games (``kind: two_player``) are played by :mod:`aria.two_player` instead, with
    ``opponent`` in the other seat and no oracle. Counts are checked before any model loads.
    """
    from aria.cli import ConfigError

    counts = {"batch_size": 1, **({"games_per_config": 1} if cfg["game"].get("kind") == "two_player" else {"num_games": 0})}
    for name, low in counts.items():
        value = cfg.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{name}: expected an integer >= {low}, got {value!r}")
    if cfg["game"].get("kind") == "two_player":
        from aria.two_player import collect_two_player_from_config

        return collect_two_player_from_config(cfg)
    game = build_game(cfg["game"])
    policy = build_policy(cfg["policy"])
    oracle = build_oracle(cfg["oracle"], cfg["game"])
    try:
        return play_games(
            game, policy, oracle, cfg["out"], num_games=int(cfg["num_games"]), seed=int(cfg["seed"]),
            batch_size=int(cfg["batch_size"]), system_prompt=cfg.get("system_prompt"),
            progress=bool(cfg.get("progress", True)), force_new=bool(cfg.get("force_new", False)),
        )
    finally:
        getattr(policy, "close", lambda: None)()  # a policy=vllm server goes with the run
