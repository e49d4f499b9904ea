"""What the players of Bargaining / Negotiation read: system prompts and the transcript lines.

Both come from templates in ``config/game/<game>.yaml`` (``prompts:``), written for this project
with the information content of GLEE's prompts (docs/method.md §6): the player's role, the amount or its
own value, the discounting or the outside option, the number of rounds, the goal, and, only
under complete information, the other player's discount factor or value. The reply format
(one JSON object) is part of the system prompt, so that the observation a policy is trained on
(system prompt + transcript, :class:`aria.data.Transcript`) is exactly the prompt it played with.

Transcript lines show each reply as the other player received it (:func:`shown_text`): the
decision, the free-text message when messages are relayed, and the offer with its round
number, e.g. ``I reject. Too low for me. Offer 3 of 12: Alice gets $55, Bob gets $45.``
"""
from __future__ import annotations

from typing import Any, Mapping

from aria.games.two_player.glee import BargainingConfig, GameConfig, NegotiationConfig, other


def money_text(x: float, sign: str = "$") -> str:
    """``10000`` -> ``$10,000``; ``52.631`` -> ``$52.63``; no trailing ``.00``.

    Money variables of the templates carry their ``$`` (a literal ``${`` in a YAML config would
    be read by Hydra as an interpolation).
    """
    text = f"{x:,.2f}"
    return sign + (text[:-3] if text.endswith(".00") else text)


def _pct(loss: float) -> str:
    return f"{round(100 * loss, 6):g}"


def _variables(config: GameConfig, role: str) -> dict[str, Any]:
    names = {"alice": "Alice", "bob": "Bob"}
    variables = {"me": names[role], "other": names[other(role)], "max_rounds": config.max_rounds,
                 "money": money_text(config.money), "money_number": money_text(config.money, sign="")}
    if isinstance(config, BargainingConfig):
        variables.update(my_loss=_pct(1 - config.delta(role)), other_loss=_pct(1 - config.delta(other(role))))
    elif isinstance(config, NegotiationConfig):
        variables.update(my_value=money_text(config.value(role)), other_value=money_text(config.value(other(role))),
                         max_price=money_text(config.max_price))
    return variables


def system_prompt(config: GameConfig, role: str, prompts: Mapping[str, Any]) -> str:
    """The system prompt of ``role`` for ``config`` from the game's ``prompts:`` templates."""
    v = _variables(config, role)
    v["rival_info"] = prompts["rival_info" if config.complete_information else "no_rival_info"][role].format(**v)
    v["reply_format"] = prompts["reply_format" if config.messages else "reply_format_no_messages"].format(**v)
    return prompts["system"][role].format(**v).strip()


def offer_text(config: GameConfig, offer: Mapping[str, float], round_: int, prompts: Mapping[str, Any]) -> str:
    values = {k: money_text(offer[k]) for k in config.offer_fields}
    return prompts["shown"]["offer"].format(round=round_, max_rounds=config.max_rounds, **values)


def shown_text(config: GameConfig, applied: Mapping[str, Any] | None, message: str, prompts: Mapping[str, Any]) -> str:
    """One transcript line's text (module doc).

    Args:
        applied: the move as the rules applied it (an entry of :attr:`Match.history`: the
            decision on the offer on the table, the new offer and its round), or None when the
            player gave no usable reply.
        message: the player's free-text message (shown only when messages are relayed).
    """
    shown = prompts["shown"]
    if applied is None:
        return shown["no_reply"]
    parts = []
    if applied["decision"] is not None:
        parts.append(shown[applied["decision"]])
    if config.messages and message and applied["decision"] not in ("accept", "walk_away"):
        parts.append(message.strip())
    if applied["offer"] is not None:
        parts.append(offer_text(config, applied["offer"], applied["round"], prompts))
    return " ".join(parts) if parts else shown["no_reply"]
