"""Trajectories -> the flat utterance/step arrays that clustering and aggregation work on.

Which utterances are clustered, and how, is per-game config (``intention:`` in
``config/game/*.yaml``, docs/method.md §3)::

    intention:
      channels:                          # every utterance belongs to one channel
        action: {cluster: questions}     # clustered; channels naming the same pool share one clustering
        observation: {map: yes_no_other} # labelled by a fixed rule (Twenty Questions' answers)
      trained: [action]                  # channels whose utterances are agent steps

Single-agent games have the channels ``action`` (the agent's output) and ``observation`` (the
oracle's answer), in the order action, observation, action, ... Two-player games have one channel
per role (``alice``, ``bob``) in speaking order. Each trained channel is its own role for
aggregation.

What is skipped (listed in :attr:`Corpus.skipped`, never silently): games whose status is
``failed`` and games with no turns. What is rejected with a :class:`~aria.io.DataError` naming
the game: a two-player game without a reward for a trained role, a precomputed embedding that
is zero, NaN or of the wrong size.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from aria.games.question.oracle import normalize_yes_no
from aria.intention.aggregate import StepTable, step_returns
from aria.io import DataError, located


def yes_no_other(text: str) -> int:
    """Twenty Questions' answers: 0 = yes, 1 = no, 2 = anything else (the original's three labels)."""
    answer = normalize_yes_no(text, invalid="")
    return {"Yes.": 0, "No.": 1}.get(answer, 2)


#: Fixed labelling rules for channels that are not clustered, by name.
LABEL_MAPS: dict[str, Callable[[str], int]] = {"yes_no_other": yes_no_other}


@dataclass(frozen=True)
class ChannelRule:
    name: str
    pool: str | None = None  # clustered in this pool
    label_map: str | None = None  # or labelled by this rule


@dataclass(frozen=True)
class IntentionSpec:
    """The ``intention:`` section of a game config (see the module doc)."""

    channels: tuple[ChannelRule, ...]
    trained: tuple[str, ...]

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], game: str = "?") -> "IntentionSpec":
        where = f"config/game/{game}.yaml: intention"
        if not cfg or "channels" not in cfg:
            raise ValueError(f"{where}: missing 'channels'")
        rules = []
        for name, rule in cfg["channels"].items():
            rule = dict(rule or {})
            if ("cluster" in rule) == ("map" in rule):
                raise ValueError(f"{where}.channels.{name}: give exactly one of 'cluster: <pool>' or 'map: <rule>'")
            if "map" in rule and rule["map"] not in LABEL_MAPS:
                raise ValueError(f"{where}.channels.{name}.map: unknown rule {rule['map']!r} (known: {sorted(LABEL_MAPS)})")
            rules.append(ChannelRule(str(name), rule.get("cluster"), rule.get("map")))
        names = [r.name for r in rules]
        trained = tuple(cfg.get("trained", ()))
        if not trained or any(t not in names for t in trained):
            raise ValueError(f"{where}.trained: expected a non-empty list of channels among {names}, got {list(trained)}")
        return cls(tuple(rules), trained)

    @property
    def pools(self) -> list[str]:
        """Names of the clustered pools, in channel order."""
        out: list[str] = []
        for rule in self.channels:
            if rule.pool is not None and rule.pool not in out:
                out.append(rule.pool)
        return out

    def rule(self, channel: str) -> ChannelRule:
        for r in self.channels:
            if r.name == channel:
                return r
        raise KeyError(channel)


@dataclass
class Corpus:
    """Every utterance and agent step of a set of games (see :class:`StepTable` for the arrays).

    Attributes:
        table: the arrays aggregation needs.
        game_ids: game id of each game index.
        pools: per clustered pool, its distinct texts in first-seen order.
        utterance_pool: [n_utt] index into ``list(pools)``, −1 for a mapped channel.
        utterance_value: [n_utt] text index within the pool, or the fixed label of a mapped channel.
        step_game / step_turn: [n_steps] game index and index into that game's ``turns``.
        step_intention: [n_steps] the intention the player recorded for the step's turn (a turn's
            optional ``intention``: the scripted expert's fact asked or guess), or None.
        roles: role names; ``table.step_role`` indexes it.
        precomputed: per pool, embeddings found in the data ([n_texts, dim]) or None.
        skipped: games left out, each ``{"game_id", "reason"}``.
        sources: each game's file and line, where the records came from files.
    """

    table: StepTable
    game_ids: list[str]
    pools: dict[str, list[str]]
    utterance_pool: np.ndarray
    utterance_value: np.ndarray
    step_game: np.ndarray
    step_turn: np.ndarray
    roles: list[str]
    precomputed: dict[str, np.ndarray | None] = field(default_factory=dict)
    skipped: list[dict] = field(default_factory=list)
    step_intention: list[str | None] = field(default_factory=list)
    sources: dict[str, tuple[Any, int]] = field(default_factory=dict)

    def text_counts(self, pool: str) -> np.ndarray:
        """How often each distinct text of ``pool`` occurs (int [n_texts]): the clustering weights."""
        index = list(self.pools).index(pool)
        return np.bincount(self.utterance_value[self.utterance_pool == index], minlength=len(self.pools[pool]))

    def utterance_labels(self, pool_labels: Mapping[str, np.ndarray]) -> np.ndarray:
        """Labels of every utterance, given one label per distinct text for every pool."""
        labels = self.utterance_value.copy()
        for i, pool in enumerate(self.pools):
            mine = self.utterance_pool == i
            labels[mine] = np.asarray(pool_labels[pool])[self.utterance_value[mine]]
        return labels


def _utterances(record: dict, two_player: bool) -> Iterable[tuple[str, str, int, list | None]]:
    """(channel, text, turn index, precomputed embedding) in speaking order."""
    for i, turn in enumerate(record["turns"]):
        if two_player:
            yield turn["role"], turn["action"], i, turn.get("embedding")
        else:
            yield "action", turn["action"], i, turn.get("embedding")
            yield "observation", turn["observation"], i, None


def _check_vector(vector: list, game_id: str, turn: int, dim: int | None) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float64)
    if v.ndim != 1 or v.size == 0 or not np.isfinite(v).all():
        raise DataError(None, None, f"turns[{turn}].embedding", f"game {game_id!r}: not a finite vector")
    if not np.any(v):
        raise DataError(None, None, f"turns[{turn}].embedding", f"game {game_id!r}: an all-zero vector")
    if dim is not None and v.size != dim:
        raise DataError(None, None, f"turns[{turn}].embedding", f"game {game_id!r}: {v.size} dimensions, others have {dim}")
    return v


def build_corpus(records: Iterable[dict], spec: IntentionSpec, gamma: float = 0.95, use_precomputed: bool = True,
                 discount: str = "paper", sources: Mapping[str, tuple[Any, int]] | None = None) -> Corpus:
    """Flatten games into a :class:`Corpus` (docs/method.md §3: step returns R_t = γ^(T−t)·R per role).

    ``discount`` names the convention of :func:`~aria.intention.aggregate.step_returns`. Under
    ``original`` a two-player game also keeps the release's shape: it counts m = min(#Alice, #Bob)
    rounds, and a first mover's turn after the m-th (Alice's last offer that Bob never answered)
    is not a step (``reward_utils.get_multi_values`` loops over ``range(min_length - 1)``).
    ``sources``: each game's file and line, named by a problem found in its record.
    """
    builder = _CorpusBuilder(spec, use_precomputed, discount)
    for record in records:
        with located(*(sources or {}).get(record["game_id"], (None, None))):
            builder.add_game(record)
    return builder.corpus(gamma, sources)


class _CorpusBuilder:
    """The columns of a :class:`Corpus`, filled a game at a time: one row per utterance (``u_*``)
    and one per agent step (``s_*``), the distinct texts of every pool, and the precomputed
    vectors the trajectories carry."""

    def __init__(self, spec: IntentionSpec, use_precomputed: bool, discount: str):
        self.spec, self.use_precomputed, self.discount = spec, use_precomputed, discount
        self.rules = {r.name: r for r in spec.channels}
        self.channel_index = {r.name: i for i, r in enumerate(spec.channels)}
        self.role_index = {name: i for i, name in enumerate(spec.trained)}
        self.pools: dict[str, dict[str, int]] = {p: {} for p in spec.pools}  # pool -> {text: index}
        self.vectors: dict[str, dict[int, np.ndarray]] = {p: {} for p in spec.pools}
        self.missing: dict[str, str] = {}  # pool -> first game with a text lacking a precomputed embedding
        self.dims: dict[str, int] = {}
        self.u: dict[str, list] = {k: [] for k in ("game", "pos", "channel", "pool", "value")}
        self.s: dict[str, list] = {k: [] for k in ("utt", "role", "game", "turn", "final", "index", "count", "seat",
                                                   "rounds", "intention")}
        self.game_ids: list[str] = []
        self.skipped: list[dict] = []

    def add_game(self, record: dict) -> None:
        gid, spec = record["game_id"], self.spec
        if record.get("status") == "failed" or not record["turns"]:
            self.skipped.append({"game_id": gid, "reason": "failed game" if record.get("status") == "failed" else "no turns"})
            return
        two_player = "players" in record
        utterances = list(_utterances(record, two_player))
        for channel, _, i, _ in utterances:
            if channel not in self.rules:
                raise DataError(None, None, f"turns[{i}].role", f"game {gid!r}: channel {channel!r} not in the game's intention config")
        rounds = min(sum(1 for c, *_ in utterances if c == p) for p in record["players"]) if two_player \
            else len(record["turns"])
        if two_player and self.discount == "original" and rounds == 0:  # the release counts m = min(#Alice, #Bob)
            self.skipped.append({"game_id": gid, "reason": "a player never spoke: no round under discount=original"})
            return
        g = len(self.game_ids)
        self.game_ids.append(gid)
        counts = {role: sum(1 for c, *_ in utterances if c == role) for role in spec.trained}
        seats = {role: (record["players"].index(role) if role in record["players"] else -1) if two_player else -1
                 for role in spec.trained}
        if two_player and self.discount == "original":
            counts = {role: min(n, rounds) for role, n in counts.items()}
        seen = {role: 0 for role in spec.trained}
        for position, (channel, text, turn, vector) in enumerate(utterances):
            self._add_utterance(g, position, channel, text, turn, vector, gid)
            if channel in self.role_index and seen[channel] < counts[channel]:
                seen[channel] += 1
                for key, value in (("utt", len(self.u["game"]) - 1), ("role", self.role_index[channel]), ("game", g),
                                   ("turn", turn), ("intention", record["turns"][turn].get("intention")),
                                   ("index", seen[channel]), ("count", counts[channel]), ("seat", seats[channel]),
                                   ("rounds", rounds), ("final", _final_reward(record, channel, two_player))):
                    self.s[key].append(value)

    def _add_utterance(self, g: int, position: int, channel: str, text: str, turn: int, vector, gid: str) -> None:
        rule = self.rules[channel]
        self.u["game"].append(g)
        self.u["pos"].append(position)
        self.u["channel"].append(self.channel_index[channel])
        if rule.pool is None:
            self.u["pool"].append(-1)
            self.u["value"].append(LABEL_MAPS[rule.label_map](text))
            return
        texts = self.pools[rule.pool]
        if text not in texts:
            texts[text] = len(texts)
        self.u["pool"].append(list(self.pools).index(rule.pool))
        self.u["value"].append(texts[text])
        if self.use_precomputed and rule.pool not in self.missing:
            if vector is None:
                self.missing[rule.pool] = gid
            elif texts[text] not in self.vectors[rule.pool]:  # the first vector of a repeated text wins
                v = _check_vector(vector, gid, turn, self.dims.get(rule.pool))
                self.dims[rule.pool] = v.size
                self.vectors[rule.pool][texts[text]] = v

    def corpus(self, gamma: float, sources: Mapping[str, tuple[Any, int]] | None) -> Corpus:
        u, s = self.u, self.s
        table = StepTable(
            utterance_game=np.array(u["game"], dtype=np.int64),
            utterance_position=np.array(u["pos"], dtype=np.int64),
            utterance_channel=np.array(u["channel"], dtype=np.int64),
            step_utterance=np.array(s["utt"], dtype=np.int64),
            step_role=np.array(s["role"], dtype=np.int64),
            step_return=step_returns(np.array(s["final"]), np.array(s["index"]), np.array(s["count"]), gamma, self.discount,
                                     np.array(s["seat"]), np.array(s["rounds"])) if s["utt"] else np.zeros(0),
        )
        precomputed = {}
        for pool, texts in self.pools.items():
            have = self.vectors[pool]
            precomputed[pool] = np.stack([have[i] for i in range(len(texts))]).astype(np.float32) \
                if self.use_precomputed and pool not in self.missing and texts and len(have) == len(texts) else None
        return Corpus(
            table=table, game_ids=self.game_ids, pools={p: list(t) for p, t in self.pools.items()},
            utterance_pool=np.array(u["pool"], dtype=np.int64), utterance_value=np.array(u["value"], dtype=np.int64),
            step_game=np.array(s["game"], dtype=np.int64), step_turn=np.array(s["turn"], dtype=np.int64),
            roles=list(self.spec.trained), precomputed=precomputed, skipped=self.skipped, step_intention=s["intention"],
            sources=dict(sources or {}),
        )


def _final_reward(record: dict, role: str, two_player: bool) -> float:
    """R of docs/method.md §3: the game's final reward (single-agent) or the role's reward (two-player)."""
    if not two_player:
        return float(record["final_reward"])
    value = record.get("role_rewards", {}).get(role)
    if value is None:
        raise DataError(None, None, f"role_rewards.{role}", f"game {record['game_id']!r}: no reward for trained role {role!r}")
    return float(value)
