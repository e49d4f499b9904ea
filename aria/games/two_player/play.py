"""Batched, resumable play of Bargaining and Negotiation (self-play collection and evaluation).

Two seats, Alice and Bob, are each filled by a player: the policy (a local model or an
OpenAI-compatible endpoint, :class:`PolicyPlayer`), or a scripted opponent
(:class:`ScriptedPlayer`). The same policy object may fill both seats (self-play). Many games run
at once through the one game scheduler (:func:`aria.scheduler.run_games`); this module supplies
the two-player turn (:class:`TwoPlayerGames`): the live games are grouped by the player to move
and every group is one batched call.

A turn (rules: :mod:`aria.games.two_player.glee`):

1. the mover's prompt is its system prompt plus the transcript so far (:class:`aria.data.Transcript`,
   the same renderer that builds training observations);
2. with ``structured_output: json_schema`` (game config) the reply is generated under the JSON
   schema of its turn (:func:`aria.games.two_player.offers.reply_schema`: an offer, or accept / reject with
   a counter-offer / walk away), so a small model always writes a legal move;
3. the reply is parsed (:func:`aria.games.two_player.offers.parse_reply`) and checked against the rules; an
   unreadable or illegal reply is sent back with the reason, up to ``max_reprompts`` times
   (batched across games), then the turn counts as ``on_invalid``;
4. the move is applied and the other player sees it as one transcript line (:func:`shown_text`).

Each game is written as one schema-v1 two-player record (:mod:`aria.trajectories`). Turn fields:
``role``, ``action`` (the reply used, or the last unusable one), ``shown``, ``decision``, ``offer``,
``round`` (of a new offer), ``message``, ``attempts`` (every unusable reply with its error),
``forfeit`` (the rule applied when no reply was usable). ``role_rewards`` are the normalised
payoffs of :func:`aria.games.two_player.glee.normalized_rewards`; ``meta`` keeps the configuration, the
payoffs, the outcome, the winner, who played each seat, and the two system prompts (under the
original's keys ``player_1_system_prompt`` / ``player_2_system_prompt``).

Resuming: re-running with the same arguments skips the game ids already in the output file.
A request that still fails after its backend's retries marks the game ``failed``; the others go on.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from omegaconf import OmegaConf

from aria.data import Transcript
from aria.games.common.base import structured_output
from aria.games.common.settings import CollectSettings
from aria.games.two_player.glee import (PLAYERS, GameConfig, Match, Move, config_set, config_to_dict,
                                        normalized_rewards, other, winner)
from aria.games.two_player.glee_text import shown_text, system_prompt
from aria.games.two_player.offers import MESSAGE_CHARS, OFFER_STEPS, ParseError, parse_reply, reply_schema
from aria.games.two_player.scripted import SCRIPTED_PLAYERS, reply_json
from aria.io import ConfigError, json_digest
from aria.llm.base import ChatModel, Completion, Message, OutputFormat, concurrent
from aria.llm.registry import build_policy, check_policy
from aria.registry import check_options
from aria.scheduler import PlaySummary, run_games
from aria.statistics import summarize_two_player
from aria.trajectories import describe, make_record, read_trajectories

SYSTEM_PROMPT_KEYS = {"alice": "player_1_system_prompt", "bob": "player_2_system_prompt"}


# ---- players --------------------------------------------------------------------------------
@dataclass
class TurnRequest:
    key: str  # "<game id>/<role>": one prompt cache per player per game
    match: Match
    conversation: list[Message]
    format: OutputFormat | None = None  # the reply's JSON schema under structured_output: json_schema


class PolicyPlayer:
    """A chat model in a seat: one batched ``generate`` per call."""

    def __init__(self, model: ChatModel):
        self.model = model
        self.concurrent = concurrent(model)
        self.name = model.name
        self.settings = getattr(model, "settings", {"name": model.name})

    def replies(self, requests: Sequence[TurnRequest]) -> list[Completion]:
        conversations, keys = [r.conversation for r in requests], [r.key for r in requests]
        if any(r.format is not None for r in requests):
            return self.model.generate(conversations, keys=keys, formats=[r.format for r in requests])
        return self.model.generate(conversations, keys=keys)

    def release(self, key: str) -> None:
        self.model.release(key)


class ScriptedPlayer:
    """A scripted opponent (:mod:`aria.games.two_player.scripted`) in a seat; it reads the game
    state, not the text."""

    concurrent = True  # a function of the game's state: safe from any thread

    def __init__(self, game: str, strength: float = 1.0):
        if game not in SCRIPTED_PLAYERS:
            raise KeyError(f"no scripted player for {game!r}; known: {sorted(SCRIPTED_PLAYERS)}")
        self.strategy = SCRIPTED_PLAYERS[game](strength)
        self.name = self.strategy.name

    def replies(self, requests: Sequence[TurnRequest]) -> list[Completion]:
        return [Completion(reply_json(self.strategy.move(r.match), r.match.config.messages)) for r in requests]

    def release(self, key: str) -> None:
        pass


# ---- one game ---------------------------------------------------------------------------------
@dataclass
class _LiveGame:
    game_id: str
    match: Match
    seats: Mapping[str, Any]  # role -> player
    prompts: dict[str, str]  # role -> system prompt
    turns: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed: bool = False

    @property
    def over(self) -> bool:
        return self.match.over

    def record_view(self) -> dict:
        """What :class:`Transcript` needs to render the next prompt."""
        return {"game_id": self.game_id, "turns": self.turns + [{"role": self.match.mover}],
                "meta": {SYSTEM_PROMPT_KEYS[r]: p for r, p in self.prompts.items()}}


def game_id(config: GameConfig, seed: int, index: int) -> str:
    return f"{config.id}-s{seed}-{index:03d}"


class TwoPlayerGames:
    """Bargaining or Negotiation as a game kind of :func:`aria.scheduler.run_games`.

    Each turn the live games are grouped by the player to move and every group is one batched
    call (self-play: one call for all games).
    """

    def __init__(self, game_cfg: Mapping[str, Any], seats: Mapping[str, Any], seed: int):
        self.game_cfg, self.seats, self.seed = game_cfg, seats, seed
        self.name = game_cfg["name"]
        self.independent = all(concurrent(player) for player in seats.values())
        self.transcript = Transcript.from_config(game_cfg)
        # the options of every turn's JSON schema under structured_output: json_schema, else None
        self.schema = schema_options(game_cfg) if structured_output(game_cfg, "two_player") == "json_schema" else None

    def start(self, gid: str, config: GameConfig) -> _LiveGame:
        prompts = {r: system_prompt(config, r, self.game_cfg["prompts"]) for r in PLAYERS}
        return _LiveGame(gid, Match(config), self.seats, prompts)

    def play_turn(self, games: Sequence[_LiveGame]) -> int:
        by_player: dict[int, list[_LiveGame]] = {}
        for g in games:
            by_player.setdefault(id(g.seats[g.match.mover]), []).append(g)
        return sum(_play_turn(self.game_cfg, self.transcript, group, self.schema) for group in by_player.values())

    def record(self, g: _LiveGame) -> dict:
        return _record(self.name, g, self.seed)

    def release(self, g: _LiveGame) -> None:
        for role in PLAYERS:
            g.seats[role].release(f"{g.game_id}/{role}")

    def tally(self, record: dict, counts: Counter) -> None:
        counts["deals"] += record["meta"]["outcome"] == "deal"
        if record["meta"]["winner"]:
            counts[f"wins_{record['meta']['winner']}"] += 1

    def describe(self, counts: Counter, finished: int) -> str:
        return f"{counts['deals']} deals, wins alice {counts['wins_alice']} / bob {counts['wins_bob']} of {finished}"

    def check(self, record: dict, config: GameConfig) -> str | None:
        """A finished record is ``config``'s game: this game and configuration, and the winner and
        rewards its payoffs give."""
        meta = record.get("meta") or {}
        if record["game"] != self.name or meta.get("config_id") != config.id or meta.get("config") != config_to_dict(config):
            return f"is a game of {record['game']} in configuration {meta.get('config_id')!r}, not this run's {config.id!r}"
        return rule_problem(record)


def rule_problem(record: dict) -> str | None:
    """What in a finished record breaks the game's rules (None if nothing): the winner and the
    rewards its payoffs give."""
    meta = record.get("meta") or {}
    payoffs = meta.get("payoffs")
    if not isinstance(payoffs, dict) or set(payoffs) != set(PLAYERS):
        return "has no payoff for each player"
    if meta.get("winner") != winner(payoffs):
        return f"names the winner {meta.get('winner')!r}, but its payoffs make it {winner(payoffs)!r}"
    if record["role_rewards"] != normalized_rewards(payoffs):
        return "has rewards that are not its payoffs' shares"
    return None


#: The largest ``reply_schema`` options: a schema lists every offer of the grid (``offer_steps + 1``
#: of them per turn), so a grid of millions would take minutes to build and compile into a
#: grammar for no gain; a message longer than a reply's token budget cannot be written anyway.
SCHEMA_LIMITS = {"offer_steps": 1_000, "message_chars": 10_000}


def schema_options(game_cfg: Mapping[str, Any]) -> dict[str, int]:
    """The game config's ``reply_schema`` options of :func:`aria.games.two_player.offers.reply_schema`
    (``message_chars``, ``offer_steps``) over their defaults, checked."""
    options = {"message_chars": MESSAGE_CHARS, "offer_steps": OFFER_STEPS}
    given = dict(game_cfg.get("reply_schema") or {})
    unknown = sorted(set(given) - set(options))
    if unknown:
        raise ConfigError(f"{game_cfg['name']}: unknown reply_schema option(s) {unknown} (known: {sorted(options)})")
    options.update(given)
    for name, value in options.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= SCHEMA_LIMITS[name]:
            raise ConfigError(f"{game_cfg['name']}: reply_schema.{name} must be a whole number from 1 to "
                              f"{SCHEMA_LIMITS[name]:,}, got {value!r}")
    return options


def game_settings(game_cfg: Mapping[str, Any]) -> dict[str, str]:
    """The two-player game's whole config by digest (its rules, configuration sets and reply
    options), so a resumed file continues only under the same game."""
    plain = OmegaConf.to_container(game_cfg, resolve=True) if OmegaConf.is_config(game_cfg) else game_cfg
    return {"config_sha256": json_digest(plain)}


def two_player_producer(game_cfg: Mapping[str, Any], configs: Sequence[GameConfig], seats: Mapping[str, dict],
                        seed: int) -> dict:
    """The producer record of a file of two-player games (:class:`~aria.trajectories.TrajectoryWriter`):
    the settings its games were played under, which a resumed run must match exactly. ``seats``
    maps each role to its player's description (:func:`aria.trajectories.describe`)."""
    producer = {"game": game_cfg["name"], "game_settings": game_settings(game_cfg), "seed": seed,
                "configurations": [c.id for c in configs], "seats": dict(seats)}
    if structured_output(game_cfg, "two_player") == "json_schema":  # files written before the setting existed keep their producer
        producer["structured_output"] = "json_schema"
        producer["reply_schema"] = schema_options(game_cfg)
    return producer


def play_two_player(
    game_cfg: Mapping[str, Any],
    configs: Sequence[GameConfig],
    seats: Mapping[str, Any],
    out_path: str | Path,
    games_per_config: int = 1,
    seed: int = 0,
    batch_size: int = 16,
    progress: bool = True,
    force_new: bool = False,
) -> PlaySummary:
    """Play ``games_per_config`` games of every configuration into ``out_path`` (module doc).

    Args:
        game_cfg: ``config/game/<game>.yaml`` as a mapping (prompts, transcript, re-prompt rules,
            ``structured_output``).
        seats: ``{"alice": player, "bob": player}``; one object in both seats is self-play.
        batch_size: games live at once.
    """
    if games_per_config < 1:
        raise ValueError("games_per_config must be at least 1")
    if set(seats) != set(PLAYERS):
        raise ValueError(f"seats must name exactly {PLAYERS}, got {sorted(seats)}")
    kind = TwoPlayerGames(game_cfg, seats, seed)
    if kind.schema is not None:  # a configuration no schema can serve fails here, before any game is played
        for config in configs:
            reply_schema(Match(config), **kind.schema)
    producer = two_player_producer(game_cfg, configs, {role: describe(player) for role, player in seats.items()}, seed)
    jobs = [(game_id(c, seed, i), c) for c in configs for i in range(games_per_config)]
    watched = [player.server_lost for player in {id(p): p for p in seats.values()}.values() if hasattr(player, "server_lost")]
    lost = (lambda: next(filter(None, (ended() for ended in watched)), None)) if watched else None
    return run_games(kind, jobs, out_path, producer, batch_size=batch_size, progress=progress, force_new=force_new,
                     lost=lost)


def _play_turn(game_cfg: Mapping[str, Any], transcript: Transcript, games: Sequence[_LiveGame],
               schema: Mapping[str, int] | None = None) -> int:
    """One turn of games whose mover is the same player; returns the number of re-prompts."""
    player = games[0].seats[games[0].match.mover]
    max_reprompts, on_invalid = game_cfg["max_reprompts"], game_cfg["on_invalid"]
    requests = []
    for g in games:
        view = g.record_view()
        conversation = [{"role": "user", "content": transcript.render(view, len(view["turns"]) - 1)}]
        fmt = OutputFormat.json_schema(reply_schema(g.match, **schema)) if schema is not None else None
        requests.append(TurnRequest(f"{g.game_id}/{g.match.mover}", g.match, conversation, fmt))
    attempts: dict[int, list[dict]] = {id(g): [] for g in games}
    pending = list(zip(games, requests))
    reprompts = 0
    for attempt in range(max_reprompts + 1):
        if attempt:
            reprompts += len(pending)
        completions = player.replies([r for _, r in pending])
        retry = []
        for (g, request), completion in zip(pending, completions):
            if not completion.ok:
                g.failed = True
                g.errors.append(f"{g.match.mover} ({player.name}): {completion.error}")
                continue
            try:
                move = read_move(completion.text, g.match, request.format is not None)
                problem = g.match.check(move)
            except ParseError as err:
                move, problem = None, str(err)
            if problem is None:
                _apply(game_cfg, g, move, completion.text, attempts[id(g)])
                continue
            attempts[id(g)].append({"output": completion.text, "error": problem})
            reprompt = game_cfg["prompts"]["reprompt"].format(error=problem)
            request.conversation = request.conversation + [{"role": "assistant", "content": completion.text},
                                                           {"role": "user", "content": reprompt}]
            retry.append((g, request))
        pending = retry
        if not pending:
            break
    for g, _ in pending:  # no usable reply: the configured rule
        tries = attempts[id(g)]
        role = g.match.mover
        g.match.forfeit(on_invalid)
        g.turns.append({"role": role, "action": tries[-1]["output"], "shown": shown_text(g.match.config, None, "", game_cfg["prompts"]),
                        "decision": g.match.history[-1]["decision"], "offer": None, "round": None, "message": "",
                        "attempts": tries, "forfeit": on_invalid})
    return reprompts


def read_move(text: str, match: Match, constrained: bool = False) -> Move:
    """The move in a reply on ``match``'s turn (raises :class:`ParseError`).

    A constrained reply is one JSON object or nothing: a reply that ends before its object
    closes ran out of tokens, and is sent back rather than read as prose, where the words of a
    cut-off message ("... I agree it is close, but ...") could be taken for the opposite move.
    """
    if constrained:
        try:
            json.loads(text)
        except json.JSONDecodeError:
            raise ParseError("the reply ended before its JSON object was complete (keep the message short)") from None
    return parse_reply(text, match.config.offer_fields, match.config.money, match.mover)


def _apply(game_cfg: Mapping[str, Any], g: _LiveGame, move: Move, text: str, attempts: list[dict]) -> None:
    role = g.match.mover
    g.match.apply(move)
    applied = g.match.history[-1]
    g.turns.append({"role": role, "action": text, "shown": shown_text(g.match.config, applied, move.message, game_cfg["prompts"]),
                    "decision": applied["decision"], "offer": applied["offer"], "round": applied["round"],
                    "message": move.message, "attempts": attempts})


def _record(game: str, g: _LiveGame, seed: int) -> dict:
    match = g.match
    names = {role: g.seats[role].name for role in PLAYERS}
    if g.failed:
        payoffs = rewards = {role: 0.0 for role in PLAYERS}
        win = None
    else:
        payoffs = match.payoffs()
        rewards = normalized_rewards(payoffs)
        win = winner(payoffs)
    meta = {"config_id": match.config.id, "config": config_to_dict(match.config), "outcome": match.outcome,
            "deal": match.deal, "deal_round": match.deal_round, "walked_away_by": match.walked_away_by,
            "payoffs": payoffs, "winner": win, "agents": names,
            **{SYSTEM_PROMPT_KEYS[r]: p for r, p in g.prompts.items()}}
    model = names["alice"] if names["alice"] == names["bob"] else f"{names['alice']} vs {names['bob']}"
    return make_record(game_id=g.game_id, game=game, players=list(PLAYERS), turns=g.turns,
                       role_rewards=rewards, model=model, seed=seed,
                       status="failed" if g.failed else "finished", errors=g.errors, meta=meta)


# ---- building from config ---------------------------------------------------------------------
def check_player(cfg: Mapping[str, Any], setting: str = "opponent") -> None:
    """A seat's config checked before any model loads: ``self`` takes no options, ``scripted`` a
    ``strength`` in [0, 1], a policy its own (:func:`aria.llm.registry.check_policy`); a problem
    is a ``ConfigError`` naming ``setting.<key>``."""
    options = dict(cfg)
    kind = options.pop("name", None)
    # the two built-in seats' options, as the signatures check_options reads
    if kind == "self":
        check_options(lambda: None, options, setting, "the self opponent (the policy itself)")
    elif kind == "scripted":
        check_options(lambda strength=1.0: None, options, setting, "the scripted opponent")
    else:
        check_policy(cfg, setting)


def build_player(cfg: Mapping[str, Any], game: str, policy: PolicyPlayer | None = None):
    """A seat's player from config: ``{name: self}`` (the policy), ``{name: scripted, strength}``,
    or a policy config (``local`` / ``endpoint``) for a separate model."""
    check_player(cfg)
    options = dict(cfg)
    kind = options.pop("name")
    if kind == "self":
        if policy is None:
            raise ValueError("opponent 'self' needs a policy")
        return policy
    if kind == "scripted":
        return ScriptedPlayer(game, float(options.get("strength", 1.0)))

    return PolicyPlayer(build_policy({"name": kind, **options}, setting="opponent"))


def collect_two_player_from_config(cfg: CollectSettings) -> PlaySummary:
    """Self-play (or policy vs opponent) collection from a Hydra config (``config/collect.yaml``)."""
    game_cfg = cfg.game
    configs = config_set(game_cfg, cfg.config_set)  # what can be checked, before a model loads
    check_player(cfg.opponent, "opponent")
    if cfg.policy["name"] == "scripted":  # the question games' expert (before: a KeyError in its game builder)

        raise ConfigError(f"policy=scripted is the question games' expert; {game_cfg['name']} is played by a model "
                          "(policy=vllm, local or endpoint; a scripted player sits in the other seat: opponent=scripted)")
    policy = PolicyPlayer(build_policy(cfg.policy))
    seats = {"alice": policy, "bob": policy}
    try:
        opponent = build_player(cfg.opponent, game_cfg["name"], policy)
        seats = {"alice": policy, "bob": opponent} if cfg.policy_role == "alice" else {"alice": opponent, "bob": policy}
        return play_two_player(game_cfg, configs, seats, cfg.out, games_per_config=cfg.games_per_config,
                               seed=cfg.seed, batch_size=cfg.batch_size, progress=cfg.progress,
                               force_new=cfg.force_new)
    finally:  # policy=vllm servers go with the run
        for player in {id(p): p for p in seats.values()}.values():
            getattr(getattr(player, "model", None), "close", lambda: None)()


def evaluate_two_player(
    game_cfg: Mapping[str, Any],
    configs: Sequence[GameConfig],
    policy: PolicyPlayer,
    opponent: Any,
    out_dir: str | Path,
    games_per_config: int,
    seed: int = 0,
    batch_size: int = 16,
    progress: bool = True,
    echo=print,
    force_new: bool = False,
) -> dict:
    """Win-rate evaluation (docs/method.md §6): the policy as Alice, then as Bob, against ``opponent`` on
    every configuration; transcripts in ``out_dir/as_<role>.jsonl`` (re-running resumes).

    Returns the environment's summary: per seat and over both seats
    (:func:`aria.statistics.summarize_two_player`), plus the opponent and the configurations used.
    """
    games: dict[str, list[dict]] = {}
    for role in PLAYERS:
        path = Path(out_dir) / f"as_{role}.jsonl"
        seats = {role: policy, other(role): opponent}
        run = play_two_player(game_cfg, configs, seats, path, games_per_config=games_per_config, seed=seed,
                              batch_size=batch_size, progress=progress, force_new=force_new)
        echo(f"[eval] {game_cfg['name']} as {role}: {run.line()}")
        games[role] = list(read_trajectories(path))
    return {"kind": "two_player", "opponent": opponent.name, "configurations": [c.id for c in configs],
            "games_per_config": games_per_config,
            "as_alice": summarize_two_player({"alice": games["alice"]}),
            "as_bob": summarize_two_player({"bob": games["bob"]}),
            "overall": summarize_two_player(games)}
