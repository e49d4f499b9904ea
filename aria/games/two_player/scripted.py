"""Scripted offline opponents for Bargaining and Negotiation (docs/method.md §6: the paper's LLM
opponents are replaced offline by these; any OpenAI-compatible model can still be used).

Every scripted player has a ``strength`` s in [0, 1] (1 = strong):

* :class:`ScriptedBargainer` plays the subgame-perfect strategy of the finite alternating-offers
  game (:func:`aria.games.two_player.glee.spe_concessions`): as proposer in round t it offers the responder
  c_t, the responder's value of rejecting (in round-t money); as responder it accepts an offer
  worth at least c_t. Two strong bargainers therefore agree in round 1 on the discount-predicted
  split. A weaker one offers s·c_t + (1 − s)·M/2 (closer to an even split) and accepts anything
  worth at least s·c_t (easier to exploit). Under incomplete information it assumes the other
  player discounts like itself.
* :class:`ScriptedNegotiator` follows a concession schedule from an anchor (the other player's
  value, the best price it could hope for) to a reservation price (its own value plus s times
  half the surplus), conceding late when strong (price path τ^(1+4s), τ the share of rounds
  gone) and linearly when weak. It accepts a price at least as good as its own next one (or any
  price with non-negative surplus in the last round) and walks away when it believes no
  surplus is possible (the buyer's value at most the seller's). Under incomplete information it
  guesses the other's value as its own × 1.5 (seller) or ÷ 1.5 (buyer).

Players write their replies as the JSON the policy is asked for, so scripted and model turns
go through the same parser and look the same in a transcript.
"""
from __future__ import annotations

import json
import math

from aria.games.two_player.glee import BargainingConfig, Match, Move, NegotiationConfig, other, spe_concessions

_GUESS_FACTOR = 1.5  # a negotiator's guess of the other's value under incomplete information


def _cents_up(x: float) -> float:
    return math.ceil(round(x * 100, 6)) / 100


class ScriptedBargainer:
    """Discount-aware proposer and responder (module doc)."""

    game = "bargaining"

    def __init__(self, strength: float = 1.0):
        if not 0 <= strength <= 1:
            raise ValueError(f"strength must lie in [0, 1], got {strength}")
        self.strength = strength
        self.name = f"scripted-bargainer-s{strength:g}"
        self._plans: dict[tuple, list[float]] = {}

    def _plan(self, config: BargainingConfig, role: str) -> list[float]:
        """c_t for every round, under this player's beliefs."""
        mine = config.delta(role)
        theirs = config.delta(other(role)) if config.complete_information else mine
        deltas = {role: mine, other(role): theirs}
        key = (config.money, deltas["alice"], deltas["bob"], config.max_rounds)
        if key not in self._plans:
            self._plans[key] = spe_concessions(config.money, deltas["alice"], deltas["bob"], config.max_rounds)
        return self._plans[key]

    def move(self, match: Match) -> Move:
        config, role, s = match.config, match.mover, self.strength
        plan = self._plan(config, role)
        if match.pending is not None:
            offered = match.pending[f"{role}_gain"]
            if offered >= s * plan[match.pending_round - 1] - 1e-9 * config.money or not match.can_offer:
                return Move("accept")
        if not match.can_offer:
            return Move("reject")
        give = min(config.money, _cents_up(s * plan[match.turn] + (1 - s) * config.money / 2))
        gains = {role: round(config.money - give, 2), other(role): give}
        decision = "reject" if match.pending is not None else None
        offer = {"alice_gain": gains["alice"], "bob_gain": gains["bob"]}
        return Move(decision, offer, "This is my best offer." if s >= 0.5 else "Let's be fair.")


class ScriptedNegotiator:
    """Seller (Alice) or buyer (Bob) with a concession schedule (module doc)."""

    game = "negotiation"

    def __init__(self, strength: float = 1.0):
        if not 0 <= strength <= 1:
            raise ValueError(f"strength must lie in [0, 1], got {strength}")
        self.strength = strength
        self.name = f"scripted-negotiator-s{strength:g}"

    @staticmethod
    def surplus(config: NegotiationConfig, role: str, price: float) -> float:
        return price - config.value(role) if role == "alice" else config.value(role) - price

    def price(self, config: NegotiationConfig, role: str, round_: int) -> float:
        """This player's price for ``round_`` (1-based) on its schedule."""
        own = config.value(role)
        if config.complete_information:
            rival = config.value(other(role))
        else:
            rival = own * _GUESS_FACTOR if role == "alice" else own / _GUESS_FACTOR
        reserve = own + self.strength * (rival - own) / 2
        tau = (round_ - 1) / max(config.max_rounds - 1, 1)
        price = rival + (reserve - rival) * tau ** (1 + 4 * self.strength)
        return round(min(price, config.max_price), 2)

    def _believes_no_surplus(self, config: NegotiationConfig, role: str) -> bool:
        if not config.complete_information:
            return False
        return config.value("bob") <= config.value("alice")

    def move(self, match: Match) -> Move:
        config, role = match.config, match.mover
        if match.pending is not None:
            gain = self.surplus(config, role, match.pending["product_price"])
            if not match.can_offer:
                return Move("accept") if gain >= 0 else Move("reject")
            if gain >= 0 and gain >= self.surplus(config, role, self.price(config, role, match.turn + 1)):
                return Move("accept")
        if self._believes_no_surplus(config, role):
            return Move("walk_away")
        if not match.can_offer:
            return Move("reject")
        decision = "reject" if match.pending is not None else None
        price = self.price(config, role, match.turn + 1)
        return Move(decision, {"product_price": price}, "That is the price I can do.")


SCRIPTED_PLAYERS = {"bargaining": ScriptedBargainer, "negotiation": ScriptedNegotiator}


def reply_json(move: Move, messages: bool = True) -> str:
    """A move written as the JSON object players are asked to reply with."""
    reply: dict = {}
    if move.decision is not None:
        reply["decision"] = move.decision
    if move.offer is not None:
        reply.update(move.offer)
        if messages and move.message:
            reply["message"] = move.message
    return json.dumps(reply)
