"""Game families: what differs between the two kinds of game, in one place.

A **question game** (Twenty Questions, Guess My City) is one agent asking an oracle until it
names the hidden target; a game is a success or not. A **two-player game** (Bargaining,
Negotiation) seats two agents, Alice and Bob: collection is self-play, evaluation puts the policy
in each seat against an opponent, and a game is won by a seat. A game config names its family
with ``kind`` (``question`` when absent, ``two_player``).

Everything outside the games asks :func:`family_of` instead of testing ``kind``: the experiment
runner (collect, evaluate, check settings), the collection command, the training-set renderer,
online training and the importers. Each family delegates to the module that plays it
(:mod:`aria.games.question.play` and :mod:`aria.games.two_player.play`, imported by module
because both name their functions alike: ``game_id``, ``rule_problem``...).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from aria.data import Transcript
from aria.games.common.base import structured_output
from aria.games.common.settings import CollectSettings, EvalSettings, QuestionGameSettings, TwoPlayerGameSettings
from aria.games.question import play as question_play
from aria.games.question.game import build_game
from aria.games.question.oracle import build_oracle, check_oracle
from aria.games.two_player import play as two_player_play
from aria.games.two_player.glee import PLAYERS, config_set, other
from aria.io import ConfigError
from aria.llm.registry import build_policy, reply_tokens_key
from aria.settings import typed, validated
from aria.statistics import generation_cost, percent, summarize_games
from aria.trajectories import describe, read_trajectories

Printer = Callable[[str], None]


class GameFamily(Protocol):
    """What differs between the two kinds of game. In the experiment's methods ``cfg`` is the
    experiment's settings (``aria.experiment.settings.ExperimentSettings``, not imported here:
    the experiment imports the games) and ``section`` its ``collect`` or ``eval``, read as
    attributes; ``game_cfg`` is a game config, which stays a mapping."""

    kind: str                             # the game config's ``kind``
    settings: type                        # the game config's schema (aria.games.common.settings)
    title: str                            # how messages name it
    outcome: str                          # what an evaluation counts: "success" or "win"
    seats: int                            # seats the policy plays in an evaluation (each its own games)
    online: bool                          # whether online ARIA (aria.trainers.online) is defined for it

    def observation_renderer(self, game_cfg: Mapping[str, Any]) -> Callable[[dict, int], str]:
        """``render(record, turn_index) -> observation``: what the policy saw before that turn."""

    def collect(self, cfg: CollectSettings):
        """A collection from ``config/collect.yaml`` (``scripts/collect_games.py``) -> PlaySummary."""

    def rules(self, game_cfg: Mapping[str, Any], producer: Mapping[str, Any] | None) -> Callable[[dict], str | None]:
        """``problem(record)``: what in a finished game this code played (``source: collected``)
        breaks the game's rules, or None; ``producer``: the record beside its file
        (:class:`~aria.trajectories.TrajectoryWriter`), None where the file has none."""

    def games_in(self, game_cfg: Mapping[str, Any], section: Any) -> int:
        """Games a collection or evaluation section plays (per seat, in an evaluation)."""

    def play(self, cfg: Any, policy, out: Path, seed: int, section: Any):
        """The experiment's collection (self-play for two players) into ``out`` -> PlaySummary."""

    def collection_producer(self, cfg: Any, section: Any, seed: int, made_by: dict) -> dict:
        """The producer record :meth:`play` writes for a policy described by ``made_by``."""

    def evaluation_output(self, where: Path) -> Path:
        """An evaluation's file (one seat) or folder (one file a seat) from its path without suffix."""

    def evaluation_seats(self, out: Path) -> list[tuple[Path, str | None]]:
        """(file, the policy's role, None for a question game) of each file of the evaluation at ``out``."""

    def evaluation_files(self, cfg: Any, out: Path, made_by: dict) -> list[tuple[Path, str | None, dict]]:
        """:meth:`evaluation_seats` with the producer record each file's games are played under."""

    def evaluation_ids(self, cfg: Any) -> set[str]:
        """The game ids of one evaluation under the settings (``eval``), in each seat."""

    def player_in(self, producer: Mapping[str, Any], role: str | None) -> tuple[str, Any]:
        """Where in a file's producer record the policy's side is named, and what it holds (the
        ``made_by`` it was played under: a mapping for a policy, or whatever an older file holds)."""

    def won(self, record: dict, role: str | None) -> bool:
        """Whether the policy (in ``role``; None in a question game) won the game ``record``."""

    def score(self, record: dict, role: str | None) -> float:
        """The policy's graded outcome of ``record`` in [0, 1]: a question game's success; a two-player
        game's payoff share (its ``role_rewards``, the training reward: 0.5 each on a tie or no deal)."""

    def turns(self, record: dict, role: str | None) -> int:
        """The policy's own turns in ``record``."""

    def evaluate(self, cfg: Any, policy, out: Path, echo: Printer) -> int:
        """The experiment's evaluation of ``policy`` into ``out``; returns the number of failed games."""

    def check_experiment(self, cfg: Any) -> None:
        """The family's own experiment settings, one :class:`ConfigError` line before any work."""

    def headline(self, summary: Mapping[str, Any]) -> tuple[float | None, list[float], int, int]:
        """(rate, its 95% interval, finished games, failed games) of one environment's evaluation
        summary: what a comparison of models shows (:func:`aria.games.evaluate.compare_table`)."""

    def summary_table(self, summary: Mapping[str, Any], envs: list[str]) -> list[str]:
        """The lines of ``summary.md`` for the environments ``envs`` (of this family) of an evaluation."""

    def evaluate_served(self, cfg: EvalSettings, game_cfg: dict, policy, out: Path, batch_size: int) -> dict:
        """One environment of ``evaluation/evaluate.py`` (``config/eval.yaml``) played into the folder
        ``out``: its summary (:mod:`aria.statistics`), with the generation cost and the reply format used."""


class QuestionFamily:
    kind = "question"
    settings = QuestionGameSettings
    title = "single-agent"
    outcome = "success"
    seats = 1
    online = True

    def observation_renderer(self, game_cfg):
        game = build_game(game_cfg)
        return lambda record, index: game.prompt_before_turn(record["turns"], index)

    def collect(self, cfg):
        return question_play.collect_questions(cfg)

    def rules(self, game_cfg, producer):
        game = build_game(game_cfg)
        # as played (online.max_turns shortens it); without the file's producer record, not known
        max_turns = ((producer or {}).get("game_settings") or {}).get("max_turns")
        max_turns = max_turns if isinstance(max_turns, int) else None
        return lambda record: question_play.rule_problem(game, record, max_turns)

    def games_in(self, game_cfg, section):
        return section.games

    def play(self, cfg, policy, out, seed, section):
        return question_play.play_games(build_game(cfg.game), policy, build_oracle(cfg.oracle, cfg.game), out,
                                        num_games=section.games, seed=seed, batch_size=section.batch_size,
                                        progress=False, force_new=True,
                                        reply_format=question_play.reply_format(cfg.game))

    def collection_producer(self, cfg, section, seed, made_by):
        game = build_game(cfg.game)
        oracle = describe(build_oracle(cfg.oracle, cfg.game))
        return question_play.question_producer(game, seed, made_by, oracle,
                                               reply_format=question_play.reply_format(cfg.game))

    def evaluation_output(self, where):
        return where.with_suffix(".jsonl")

    def evaluation_seats(self, out):
        return [(out, None)]

    def evaluation_files(self, cfg, out, made_by):
        e = cfg.eval
        return [(out, None, self.collection_producer(cfg, e, e.seed, made_by))]

    def evaluation_ids(self, cfg):
        e = cfg.eval
        return {question_play.game_id(cfg.game["name"], e.seed, i) for i in range(e.games)}

    def player_in(self, producer, role):
        return "policy", producer.get("policy")

    def won(self, record, role):
        return bool(record["success"])

    def score(self, record, role):
        return float(bool(record["success"]))

    def turns(self, record, role):
        return len(record["turns"])

    def evaluate(self, cfg, policy, out, echo):
        e = cfg.eval
        summary = self.play(cfg, policy, out, e.seed, e)
        echo(f"[experiment] evaluation {out.parent.name}: {summary.line()}")
        return summary.failed

    def check_experiment(self, cfg):
        check_oracle(cfg.oracle)  # the counts are checked with the types (aria.settings)

    def headline(self, summary):
        return summary["success_rate"], summary["success_rate_ci95"], summary["finished"], summary["failed"]

    def summary_table(self, summary, envs):
        lines = ["| environment | games | success % | 95% CI | mean turns | unreadable replies % | answered invalid % | failed |",
                 "|---|---|---|---|---|---|---|---|"]
        for env in envs:
            s = summary["environments"][env]
            low, high = s["success_rate_ci95"]
            turns = "n/a" if s["mean_turns"] is None else f"{s['mean_turns']:.2f}"
            lines.append(f"| {env} | {s['finished']} | {percent(s['success_rate'])} | {percent(low)}-{percent(high)} | "
                         f"{turns} | {percent(s['invalid_question_share'])} | {percent(s.get('invalid_answer_share'))} | "
                         f"{s['failed']} |")
        return lines

    def evaluate_served(self, cfg, game_cfg, policy, out, batch_size):
        if cfg.structured_output is not None:
            game_cfg["structured_output"] = cfg.structured_output
        if cfg.max_turns is not None:
            game_cfg["max_turns"] = cfg.max_turns
        transcripts = out / "transcripts.jsonl"
        tokens, seconds = getattr(policy, "generated_tokens", 0), getattr(policy, "generation_seconds", 0.0)
        run = question_play.play_games(build_game(game_cfg), policy, build_oracle(cfg.oracle, game_cfg), transcripts,
                                       num_games=cfg.num_games, seed=cfg.seed, batch_size=batch_size,
                                       progress=cfg.progress, force_new=cfg.force_new,
                                       reply_format=question_play.reply_format(game_cfg))
        print(f"[eval] {game_cfg['name']}: {run.line()}")
        return {**summarize_games(list(read_trajectories(transcripts)), game_cfg["invalid_answer"]),
                "generation": generation_cost(policy, tokens, seconds),
                "structured_output": structured_output(game_cfg, self.kind)}  # what was used


class TwoPlayerFamily:
    kind = "two_player"
    settings = TwoPlayerGameSettings
    title = "two-player"
    outcome = "win"
    seats = 2
    online = False  # online ARIA is defined for single-agent games (the paper's online experiments)

    def observation_renderer(self, game_cfg):
        return Transcript.from_config(game_cfg).render

    def collect(self, cfg):
        return two_player_play.collect_two_player_from_config(cfg)

    def rules(self, game_cfg, producer):
        return two_player_play.rule_problem

    def games_in(self, game_cfg, section):
        return len(config_set(game_cfg, section.config_set)) * section.games_per_config

    def play(self, cfg, policy, out, seed, section):
        player = two_player_play.PolicyPlayer(policy)
        return two_player_play.play_two_player(cfg.game, config_set(cfg.game, section.config_set),
                                               {"alice": player, "bob": player}, out,
                                               games_per_config=section.games_per_config, seed=seed,
                                               batch_size=section.batch_size, progress=False, force_new=True)

    def collection_producer(self, cfg, section, seed, made_by):
        return self._producer(cfg, section, seed, {"alice": made_by, "bob": made_by})

    def evaluation_output(self, where):
        return where

    def evaluation_seats(self, out):
        return [(out / f"as_{role}.jsonl", role) for role in PLAYERS]

    def evaluation_files(self, cfg, out, made_by):
        e = cfg.eval
        opponent = describe(two_player_play.build_player(e.opponent, cfg.game["name"]))
        return [(file, role, self._producer(cfg, e, e.seed, {role: made_by, other(role): opponent}))
                for file, role in self.evaluation_seats(out)]

    def evaluation_ids(self, cfg):
        e = cfg.eval
        return {two_player_play.game_id(c, e.seed, i)
                for c in config_set(cfg.game, e.config_set) for i in range(e.games_per_config)}

    def player_in(self, producer, role):
        seats = producer.get("seats")
        return f"seats.{role}", seats.get(role) if isinstance(seats, Mapping) else None

    def won(self, record, role):
        return record["meta"]["winner"] == role

    def score(self, record, role):
        return float(record["role_rewards"][role])  # the payoffs' shares: two_player.play.rule_problem holds records to it

    def turns(self, record, role):
        return sum(t["role"] == role for t in record["turns"])

    def evaluate(self, cfg, policy, out, echo):
        e = cfg.eval
        player = two_player_play.PolicyPlayer(policy)
        configs = config_set(cfg.game, e.config_set)
        opponent = two_player_play.build_player(e.opponent, cfg.game["name"], player)
        summary = two_player_play.evaluate_two_player(cfg.game, configs, player, opponent, out,
                                                      games_per_config=e.games_per_config, seed=e.seed,
                                                      batch_size=e.batch_size, progress=False,
                                                      echo=lambda line: echo(f"[experiment] {line}"), force_new=True)
        return summary["overall"]["failed"]

    def check_experiment(self, cfg):
        if cfg.warm_start.enabled:
            raise ConfigError(f"warm_start.enabled: the scripted expert plays question games, not {cfg.game['name']}; "
                              "a two-player game starts from the base model (warm_start.enabled=false, as experiment=bargaining)")
        two_player_play.schema_options(cfg.game)
        for name in ("collect", "eval"):
            section = getattr(cfg, name)
            for key in ("config_set", "games_per_config"):
                if getattr(section, key) is None:
                    raise ConfigError(f"{name}.{key}: a two-player game needs it (see config/experiment/bargaining.yaml)")
            config_set(cfg.game, section.config_set, f"{name}.config_set")
        if not cfg.eval.opponent:
            raise ConfigError("eval.opponent: a two-player evaluation needs an opponent (see config/experiment/bargaining.yaml)")
        two_player_play.check_player(cfg.eval.opponent, "eval.opponent")

    def headline(self, summary):
        o = summary["overall"]  # both seats
        return o["win_rate"], o["win_rate_ci95"], o["finished"], o["failed"]

    def summary_table(self, summary, envs):
        rows = []
        for env in envs:
            for seat in ("as_alice", "as_bob", "overall"):
                s = summary["environments"][env][seat]
                low, high = s["win_rate_ci95"]
                share = "n/a" if s["mean_payoff_share"] is None else f"{s['mean_payoff_share']:.3f}"
                rows.append(f"| {env} | {seat.replace('_', ' ')} | {s['finished']} | {percent(s['win_rate'])} | "
                            f"{percent(low)}-{percent(high)} | {percent(s['tie_rate'])} | {percent(s['deal_rate'])} | {share} | "
                            f"{percent(s['unusable_reply_share'])} | {s['failed']} |")
        opponents = sorted({summary["environments"][env]["opponent"] for env in envs})
        setup = summary.get("two_player")
        measured = (f" ({setup['config_set']}, {setup['games_per_config']} per configuration and seat, "
                    f"replies up to {setup['max_tokens']} tokens)") if setup else ""
        return ["", f"Two-player games{measured} against {', '.join(opponents)}:", "",
                "| environment | policy plays | games | win % | 95% CI | ties % | deals % | mean payoff share | unusable replies % | failed |",
                "|---|---|---|---|---|---|---|---|---|---|", *rows]

    def evaluate_served(self, cfg, game_cfg, policy, out, batch_size):
        tp = cfg.two_player
        if tp.structured_output is not None:
            game_cfg["structured_output"] = tp.structured_output
        # a policy of its own: the reply length of a two-player turn is its own setting
        configs = config_set(game_cfg, tp.config_set, "two_player.config_set")
        player = two_player_play.PolicyPlayer(build_policy({**cfg.policy, reply_tokens_key(cfg.policy): tp.max_tokens}))
        opponent = two_player_play.build_player(cfg.opponent, game_cfg["name"], player)
        summary = two_player_play.evaluate_two_player(game_cfg, configs, player, opponent, out,
                                                      games_per_config=tp.games_per_config, seed=cfg.seed,
                                                      batch_size=batch_size, progress=cfg.progress,
                                                      force_new=cfg.force_new)
        return {**summary, "generation": generation_cost(player.model, 0, 0.0),
                "structured_output": structured_output(game_cfg, self.kind)}

    @staticmethod
    def _producer(cfg, section, seed, seats):
        return two_player_play.two_player_producer(cfg.game, config_set(cfg.game, section.config_set), seats, seed)


#: ``kind`` of a game config -> its family.
FAMILIES: dict[str, GameFamily] = {f.kind: f for f in (QuestionFamily(), TwoPlayerFamily())}


def family_of(game_cfg: Mapping[str, Any]) -> GameFamily:
    """The family of a game config (its ``kind``; ``question`` when absent)."""
    kind = game_cfg.get("kind") or QuestionFamily.kind
    if kind not in FAMILIES:
        raise ConfigError(f"{game_cfg.get('name', 'game')}: kind: unknown {kind!r} (known: {', '.join(FAMILIES)})")
    return FAMILIES[kind]


def family_of_summary(summary: Mapping[str, Any]) -> GameFamily:
    """The family of one environment's evaluation summary (its ``kind``, written by the family's
    evaluation; a question game's summary has none)."""
    return FAMILIES[summary.get("kind") or QuestionFamily.kind]


def checked_game(game_cfg: Mapping[str, Any]) -> dict:
    """A game config checked against its family's schema (:mod:`aria.games.common.settings`), as a plain dict:
    what every command does with the game it is given, before it plays."""
    if not isinstance(game_cfg, Mapping):  # (a hand-edited record: a name where the game's settings belong)
        raise ConfigError(f"game: expected a game's settings (a mapping, as config/game/ holds), got {game_cfg!r}")
    return validated(family_of(game_cfg).settings, game_cfg, f"game {game_cfg.get('name', '?')}")


def collect_from_config(cfg: Mapping[str, Any]):
    """A collection from ``config/collect.yaml`` (``scripts/collect_games.py``): the settings are
    checked before any model loads, then the game's family plays (question games against the
    oracle; two-player games with ``opponent`` in the other seat) -> PlaySummary."""
    cfg = typed(CollectSettings, cfg, "collect")
    cfg.game = checked_game(cfg.game)
    return family_of(cfg.game).collect(cfg)
