"""Bargaining and Negotiation, the two-player games of GLEE (``docs/method.md`` §6).

Pure rules: game configurations, what a player may do on its turn, payoffs, and the rewards
used for training. No I/O and no models; prompts and parsing live in :mod:`aria.games.two_player.offers`
and the players in :mod:`aria.games.two_player.scripted` / :mod:`aria.games.two_player.play`.

Turn structure (both games). Alice and Bob speak alternately, Alice first. Every turn is one
reply of the mover:

* turn 0 (round 1): Alice proposes (``offer``); in Negotiation she may walk away instead;
* turn i ≥ 1: the mover answers the offer on the table with ``accept`` (the game ends with a
  deal on that offer), ``reject`` plus a counter-offer (which becomes round i + 1), or, in
  Negotiation, ``walk_away`` (the game ends; both trade with the outside party at their own
  value, zero surplus);
* an offer made on turn i belongs to round t = i + 1; offers can be made in rounds
  1..``max_rounds``; turn ``max_rounds`` may only accept or reject the last offer; a rejection
  there, or running out of offers, ends the game with no deal.

GLEE asks the receiver for its decision and its counter-offer in two calls; here both are one
reply, so a transcript alternates Alice, Bob, Alice, ... exactly like the original's training
data (``aria_sample_actor_reinforce_llama3-8b_multi.json``).

Payoffs (docs/method.md §6):

* Bargaining, a deal on ``{alice_gain: x, bob_gain: y}`` (x + y = M) offered in round t:
  p_A = δ_A^(t−1)·x, p_B = δ_B^(t−1)·y; no deal: 0 each.
* Negotiation, a deal at price p: u_A = p − V_A (seller, V_A = M·F_A), u_B = V_B − p (buyer,
  V_B = M·F_B); no deal or walking away: 0 each.

Rewards for training (:func:`normalized_rewards`): each role's payoff normalised to [0, 1]
within the game, r_i = (p_i − m) / Σ_j (p_j − m) with m = min(0, p_A, p_B); when the sum is 0
(a no-deal, or both payoffs equal at m) each role gets 0.5. A tie therefore gives 0.5 each, a
no-deal 0.5 each as in the original's data, and a split of non-negative payoffs gives each
player its share of the total.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

from aria.io import ConfigError

PLAYERS = ("alice", "bob")
DECISIONS = ("accept", "reject", "walk_away")
OUTCOMES = ("deal", "no_deal", "walk_away")


def other(role: str) -> str:
    return PLAYERS[1 - PLAYERS.index(role)]


def _fmt(x: float) -> str:
    return f"{x:g}"


# ---- configurations ---------------------------------------------------------------------
@dataclass(frozen=True)
class BargainingConfig:
    """One Bargaining configuration: split ``money`` with per-player discount factors δ."""

    money: float  # M, the amount to divide (GLEE: 100, 1e4, 1e6)
    delta_alice: float  # δ_A: Alice's money is worth δ_A^(t−1) of its face value in round t
    delta_bob: float  # δ_B
    max_rounds: int  # rounds in which an offer can be made (GLEE: 12, 99)
    complete_information: bool = True  # does each player know the other's δ?
    messages: bool = True  # are free-text messages relayed with the offers?

    game: ClassVar[str] = "bargaining"
    offer_fields: ClassVar[tuple[str, ...]] = ("alice_gain", "bob_gain")
    walk_away: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not self.money > 0 or self.max_rounds < 1:
            raise ValueError(f"bargaining needs money > 0 and max_rounds >= 1, got {self}")
        for d in (self.delta_alice, self.delta_bob):
            if not 0 < d <= 1:
                raise ValueError(f"discount factors must lie in (0, 1], got {self}")

    @property
    def id(self) -> str:
        return (f"bargaining-M{_fmt(self.money)}-dA{_fmt(self.delta_alice)}-dB{_fmt(self.delta_bob)}"
                f"-R{self.max_rounds}-{'ci' if self.complete_information else 'ii'}-{'msg' if self.messages else 'nomsg'}")

    def delta(self, role: str) -> float:
        return self.delta_alice if role == "alice" else self.delta_bob

    def check_offer(self, offer: Mapping[str, float]) -> str | None:
        """Why ``offer`` is illegal, or None: both gains present, finite, ≥ 0, adding up to M."""
        x, y = offer.get("alice_gain"), offer.get("bob_gain")
        if x is None or y is None:
            return "an offer needs both alice_gain and bob_gain"
        if not (math.isfinite(x) and math.isfinite(y)):
            return "the gains must be numbers"
        if x < 0 or y < 0:
            return "gains cannot be negative"
        if abs(x + y - self.money) > max(0.01, 1e-9 * self.money):
            return f"alice_gain + bob_gain must equal {_fmt(self.money)}, got {_fmt(x)} + {_fmt(y)} = {_fmt(x + y)}"
        return None

    def payoffs(self, offer: Mapping[str, float] | None, round_: int | None) -> dict[str, float]:
        """p_A = δ_A^(t−1)·x, p_B = δ_B^(t−1)·y for a deal in round t; 0 each without a deal."""
        if offer is None:
            return {"alice": 0.0, "bob": 0.0}
        return {"alice": self.delta_alice ** (round_ - 1) * offer["alice_gain"],
                "bob": self.delta_bob ** (round_ - 1) * offer["bob_gain"]}


@dataclass(frozen=True)
class NegotiationConfig:
    """One Negotiation configuration: seller Alice values the product at M·F_A, buyer Bob at M·F_B."""

    money: float  # M, the price's order of magnitude (GLEE: 100, 1e4, 1e6)
    seller_factor: float  # F_A: V_A = M·F_A (GLEE: 0.8, 1, 1.2, 1.5)
    buyer_factor: float  # F_B: V_B = M·F_B
    max_rounds: int  # rounds in which an offer can be made (GLEE: 1, 10, 30)
    complete_information: bool = True  # does each player know the other's value?
    messages: bool = True
    max_price_factor: float = 2.0  # prices above this × max(V_A, V_B) are illegal ("above the value range")

    game: ClassVar[str] = "negotiation"
    offer_fields: ClassVar[tuple[str, ...]] = ("product_price",)
    walk_away: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not (self.money > 0 and self.seller_factor > 0 and self.buyer_factor > 0) or self.max_rounds < 1:
            raise ValueError(f"negotiation needs positive money and factors and max_rounds >= 1, got {self}")

    @property
    def id(self) -> str:
        return (f"negotiation-M{_fmt(self.money)}-FA{_fmt(self.seller_factor)}-FB{_fmt(self.buyer_factor)}"
                f"-R{self.max_rounds}-{'ci' if self.complete_information else 'ii'}-{'msg' if self.messages else 'nomsg'}")

    def value(self, role: str) -> float:
        """V_A (the seller's, Alice) or V_B (the buyer's, Bob)."""
        return self.money * (self.seller_factor if role == "alice" else self.buyer_factor)

    @property
    def max_price(self) -> float:
        return self.max_price_factor * max(self.value("alice"), self.value("bob"))

    def check_offer(self, offer: Mapping[str, float]) -> str | None:
        """Why ``offer`` is illegal, or None: a price in (0, max_price]."""
        p = offer.get("product_price")
        if p is None:
            return "an offer needs a product_price"
        if not math.isfinite(p):
            return "the price must be a number"
        if p <= 0:
            return "the price must be positive"
        if p > self.max_price:
            return f"the price {_fmt(p)} is above the value range (at most {_fmt(self.max_price)})"
        return None

    def payoffs(self, offer: Mapping[str, float] | None, round_: int | None = None) -> dict[str, float]:
        """u_A = p − V_A, u_B = V_B − p for a deal at price p; 0 each without a deal."""
        if offer is None:
            return {"alice": 0.0, "bob": 0.0}
        p = offer["product_price"]
        return {"alice": p - self.value("alice"), "bob": self.value("bob") - p}


GameConfig = BargainingConfig | NegotiationConfig
CONFIG_TYPES: dict[str, type] = {"bargaining": BargainingConfig, "negotiation": NegotiationConfig}


def config_from_dict(game: str, params: Mapping[str, Any]) -> GameConfig:
    """A configuration of ``game`` from its parameters (as stored in a record's ``meta.config``)."""
    if game not in CONFIG_TYPES:
        raise KeyError(f"unknown two-player game {game!r}; known: {sorted(CONFIG_TYPES)}")
    return CONFIG_TYPES[game](**params)


def config_to_dict(config: GameConfig) -> dict:
    return asdict(config)


def expand_grid(game: str, grid: Mapping[str, Sequence[Any]]) -> list[GameConfig]:
    """Every combination of the grid's values, in key order (the last key varies fastest)."""
    keys = list(grid)
    return [config_from_dict(game, dict(zip(keys, values))) for values in itertools.product(*(grid[k] for k in keys))]


def config_set(game_cfg: Mapping[str, Any], name: str, setting: str = "config_set") -> list[GameConfig]:
    """A named set of configurations from ``config/game/<game>.yaml`` (``config_sets:``); a name
    it does not have is a ``ConfigError`` naming ``setting``, where the name was given."""
    sets = game_cfg.get("config_sets") or {}
    if name not in sets:
        raise ConfigError(f"{setting}: config/game/{game_cfg['name']}.yaml has no config set {name!r} (known: {sorted(sets)})")
    configs = expand_grid(game_cfg["name"], sets[name])
    ids = [c.id for c in configs]
    if len(set(ids)) != len(ids):
        raise ValueError(f"config set {name!r} of {game_cfg['name']} repeats a configuration")
    return configs


# ---- one game in progress -----------------------------------------------------------------
@dataclass(frozen=True)
class Move:
    """A parsed, not yet validated reply: decision on the offer on the table, and/or a new offer."""

    decision: str | None = None  # "accept" | "reject" | "walk_away" | None (a proposal, nothing answered)
    offer: dict[str, float] | None = None
    message: str = ""


@dataclass
class Match:
    """The state of one game between Alice and Bob (rules in the module doc)."""

    config: GameConfig
    turn: int = 0  # replies applied so far
    pending: dict[str, float] | None = None  # the offer on the table
    pending_round: int | None = None
    outcome: str | None = None  # one of OUTCOMES once the game is over
    deal_round: int | None = None
    deal: dict[str, float] | None = None
    walked_away_by: str | None = None
    history: list[dict] = field(default_factory=list)  # applied moves: {role, decision, offer (new), round (of the new offer)}

    @property
    def over(self) -> bool:
        return self.outcome is not None

    @property
    def mover(self) -> str:
        return PLAYERS[self.turn % 2]

    @property
    def can_offer(self) -> bool:
        """Whether the mover may still make an offer (rounds 1..max_rounds)."""
        return self.turn < self.config.max_rounds

    def check(self, move: Move) -> str | None:
        """Why ``move`` cannot be played now, or None."""
        if self.over:
            return "the game is over"
        if move.decision is not None and move.decision not in DECISIONS:
            return f"unknown decision {move.decision!r}"
        if move.decision == "walk_away":
            return None if self.config.walk_away else "walking away is not allowed in this game"
        if move.decision == "accept":
            return None if self.pending is not None else "there is no offer to accept yet; make an offer"
        # a proposal, or a rejection with a counter-offer
        if not self.can_offer:
            if move.decision == "reject":
                return None  # the last round: a plain rejection ends the game
            return "this is the last round: accept or reject the offer, no new offer is possible"
        if move.offer is None:
            return "make an offer" if self.pending is None else "to reject, make a counter-offer"
        return self.config.check_offer(move.offer)

    def apply(self, move: Move) -> None:
        """Play a legal move (raises ValueError for an illegal one: call :meth:`check` first)."""
        problem = self.check(move)
        if problem:
            raise ValueError(problem)
        self._apply(move)

    def forfeit(self, rule: str) -> None:
        """The mover gave no usable reply: ``reject`` (answer no, offer nothing) or ``no_deal`` (end the game)."""
        if rule == "no_deal":
            self.history.append({"role": self.mover, "decision": None, "offer": None, "round": None, "forfeit": rule})
            self.turn += 1
            self.outcome = "no_deal"
        elif rule == "reject":
            self._apply(Move("reject", None))
            self.history[-1]["forfeit"] = rule
        else:
            raise ValueError(f"unknown rule for an unusable reply {rule!r} (expected 'reject' or 'no_deal')")

    def _apply(self, move: Move) -> None:
        role, round_ = self.mover, None
        # what the reply did to the offer on the table: a new offer rejects it; with nothing on
        # the table there is nothing to reject
        decision = move.decision if move.decision in ("accept", "walk_away") else ("reject" if self.pending else None)
        if move.decision == "accept":
            self.outcome, self.deal, self.deal_round = "deal", dict(self.pending), self.pending_round
        elif move.decision == "walk_away":
            self.outcome, self.walked_away_by = "walk_away", role
        elif self.can_offer and move.offer is not None:
            round_ = self.turn + 1
            self.pending, self.pending_round = {k: float(move.offer[k]) for k in self.config.offer_fields}, round_
        else:
            self.pending = self.pending_round = None
        self.history.append({"role": role, "decision": decision,
                             "offer": None if round_ is None else dict(self.pending), "round": round_})
        self.turn += 1
        if self.outcome is None and self.pending is None and not self.can_offer:
            self.outcome = "no_deal"  # nothing on the table and no offer left to make
        elif self.outcome is None and self.turn > self.config.max_rounds:
            self.outcome = "no_deal"  # the last offer was rejected

    def payoffs(self) -> dict[str, float]:
        if not self.over:
            raise ValueError("the game is not over")
        return self.config.payoffs(self.deal, self.deal_round)


# ---- results ------------------------------------------------------------------------------
def normalized_rewards(payoffs: Mapping[str, float]) -> dict[str, float]:
    """Each role's training reward in [0, 1] (module doc): shifted payoff shares, 0.5 each on a tie."""
    m = min(0.0, *payoffs.values())
    shifted = {role: p - m for role, p in payoffs.items()}
    total = sum(shifted.values())
    if total <= 0:
        return {role: 1.0 / len(payoffs) for role in payoffs}
    return {role: s / total for role, s in shifted.items()}


def winner(payoffs: Mapping[str, float]) -> str | None:
    """The role whose payoff is strictly higher, or None for a tie (a no-deal is a tie)."""
    a, b = payoffs["alice"], payoffs["bob"]
    return None if a == b else ("alice" if a > b else "bob")


# ---- game theory of Bargaining: what strong players do ----------------------------------
def spe_concessions(money: float, delta_alice: float, delta_bob: float, max_rounds: int) -> list[float]:
    """Subgame-perfect offers of the finite alternating-offers game, by backward induction.

    Entry t−1 is what round t's proposer gives the responder, in round-t money: exactly the
    responder's value of going on to round t+1 (discounted back), so the responder is
    indifferent and accepts. In the last round the proposer keeps everything. As max_rounds
    grows, round 1 approaches Rubinstein's split (:func:`rubinstein_split`).
    """
    delta = {"alice": delta_alice, "bob": delta_bob}
    offers = [0.0] * max_rounds
    # value (in time-0 money) of reaching round t+1, for each role; past the last round: nothing
    next_value = {"alice": 0.0, "bob": 0.0}
    for t in range(max_rounds, 0, -1):
        proposer = PLAYERS[(t - 1) % 2]
        responder = other(proposer)
        give = min(money, next_value[responder] / delta[responder] ** (t - 1))
        offers[t - 1] = give
        next_value = {proposer: delta[proposer] ** (t - 1) * (money - give), responder: next_value[responder]}
    return offers


def rubinstein_split(money: float, delta_alice: float, delta_bob: float) -> tuple[float, float]:
    """Infinite-horizon split with Alice proposing first: x = M(1−δ_B)/(1−δ_Aδ_B), y = M − x."""
    if delta_alice * delta_bob >= 1:
        raise ValueError("Rubinstein's split needs δ_A·δ_B < 1")
    x = money * (1 - delta_bob) / (1 - delta_alice * delta_bob)
    return x, money - x
