"""Reading a player's reply in Bargaining / Negotiation: model text -> a move
(:class:`~aria.games.two_player.glee.Move`).

Models are asked for one JSON object, e.g. ``{"decision": "reject", "alice_gain": 60,
"bob_gain": 40, "message": "..."}``, but often wrap it in prose or code fences, use other
spellings, or write plain sentences. Parsing therefore goes in two stages:

1. **JSON**: every JSON object in the text (fenced or not; braces inside its strings are fine),
   then every balanced ``{...}`` (single quotes and trailing commas are tolerated), is tried in order; the first object with a known key is used. Keys are matched
   loosely (``"Alice gain"``, ``aliceGain`` and ``alice_gain`` are the same), numbers may be
   strings (``"$1,200"``), decisions may be any of the words in :data:`DECISION_WORDS`.
2. **Text**, when no JSON object is usable: the decision from accept / reject / walk-away
   words (with negations: "I can't accept" is a rejection), the offer from amounts attributed
   to a player ("Alice gets $60", "$40 for you", "60/40 split") or, in Negotiation, the last
   money amount in the text.

What the parser cannot read raises :class:`ParseError` with a reason that is shown to the
model when it is asked again; whether a readable move is *legal* is the rules' business
(:meth:`aria.games.two_player.glee.Match.check`). Both are recorded in the trajectory.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Sequence

from aria.games.two_player.glee import Move

DECISION_WORDS = {
    "accept": ("accept", "accepted", "accepting", "agree", "agreed", "deal", "yes"),
    "reject": ("reject", "rejected", "rejecting", "decline", "declined", "refuse", "refused", "no", "counter",
               "counteroffer", "counter-offer", "counter_offer", "propose", "offer"),
    "walk_away": ("walk_away", "walk away", "walkaway", "walk", "leave", "quit", "john", "outside option", "opt out"),
}

_FIELD_ALIASES = {
    "alice_gain": ("alicegain", "alice", "aliceshare", "aliceamount", "alicegets"),
    "bob_gain": ("bobgain", "bob", "bobshare", "bobamount", "bobgets"),
    "product_price": ("productprice", "price", "offerprice", "offer", "amount", "counterprice", "counteroffer"),
}
_DECISION_KEYS = ("decision", "action", "response", "answer", "choice")
_MESSAGE_KEYS = ("message", "msg", "text", "note", "comment")

# A money amount: "$1,200.50", "1200", "1.5 million", "12k" (not a percentage).
_AMOUNT = r"\$?\s*(?<![\d.,])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?!\d|\.\d)(?:\s*(k|thousand|m|million|mln)\b)?(?!\s*%)"
_AMOUNT_RE = re.compile(_AMOUNT, re.IGNORECASE)
_SCALE = {"k": 1e3, "thousand": 1e3, "m": 1e6, "million": 1e6, "mln": 1e6}


class ParseError(ValueError):
    """The reply could not be read; the message says why (and is shown to the model)."""


def _norm_key(key: str) -> str:
    return re.sub(r"[^a-z]", "", key.lower())


def to_number(value: Any) -> float | None:
    """A number from JSON: ints, floats, or strings like ``"$1,200"`` / ``"1.5 million"``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        match = _AMOUNT_RE.search(value)
        if match and not re.search(r"[a-z]{3,}", _AMOUNT_RE.sub("", value).lower().replace("usd", "").replace("dollars", "")):
            return _amount(match)
    return None


def _amount(match: re.Match) -> float:
    number = float(match.group(1).replace(",", ""))
    return number * _SCALE.get((match.group(2) or "").lower(), 1.0)


def decision_from_word(word: str) -> str | None:
    w = word.strip().lower().replace("-", "_")
    for decision, words in DECISION_WORDS.items():
        if w in words or w.replace("_", " ") in words:
            return decision
    return None


# ---- stage 1: JSON --------------------------------------------------------------------------
def _json_objects(text: str) -> list[dict]:
    """Every JSON object the text holds where a ``{`` starts one (strings may hold braces), in order."""
    decoder, out, end = json.JSONDecoder(), [], 0
    for i, ch in enumerate(text):
        if ch != "{" or i < end:
            continue
        try:
            obj, stop = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
            end = stop
    return out


def _json_candidates(text: str) -> list[str]:
    """Every balanced ``{...}`` substring, outermost first, in order of appearance (for almost-JSON:
    single quotes, trailing commas)."""
    out, depth, start = [], 0, None
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                out.append(text[start:i + 1])
    return out


def _loads(candidate: str) -> Any:
    for attempt in (candidate, re.sub(r",\s*}", "}", candidate), re.sub(r",\s*}", "}", candidate.replace("'", '"'))):
        try:
            return json.loads(attempt)
        except json.JSONDecodeError:
            continue
    return None


def _from_json(obj: dict, offer_fields: Sequence[str]) -> Move | None:
    keys = {_norm_key(k): v for k, v in obj.items() if isinstance(k, str)}
    decision = None
    for k in _DECISION_KEYS:
        if isinstance(keys.get(k), str):
            decision = decision_from_word(keys[k])
            if decision is None:
                raise ParseError(f"unknown decision {keys[k]!r}: use \"accept\", \"reject\" or \"walk_away\"")
            break
    if decision is None:
        for word in ("accept", "reject", "walkaway"):  # {"accept": true}
            if keys.get(word) is True:
                decision = decision_from_word(word)
    offer: dict[str, float] = {}
    for name in offer_fields:
        for alias in (_norm_key(name), *_FIELD_ALIASES[name]):
            if alias in keys and not isinstance(keys[alias], (dict, list)):
                number = to_number(keys[alias])
                if number is None:
                    raise ParseError(f"{name} must be a number, got {keys[alias]!r}")
                offer[name] = number
                break
    message = next((keys[k] for k in _MESSAGE_KEYS if isinstance(keys.get(k), str)), "")
    if decision is None and not offer and not message:
        return None
    if decision is None and not offer:
        raise ParseError("the JSON object has neither a decision nor an offer")
    if offer and len(offer) < len(offer_fields):
        missing = [f for f in offer_fields if f not in offer]
        raise ParseError(f"the offer is missing {', '.join(missing)}")
    return Move(decision, offer or None, message.strip())


# ---- stage 2: plain text --------------------------------------------------------------------
# A decision in plain text must be stated by the speaker, near the start of the reply: "I accept",
# "I'll reject", "Deal!", "Accepted." as its first word. A word such as "accept" or "agreed"
# somewhere inside a ramble is not a decision (small models write such rambles; reading them as
# acceptances would end games on text nobody meant as a move).
_DECISION_WINDOW = 200  # characters from the start of the reply searched for a decision
_I = r"\bi(?:'ll|'d|\s+(?:will|would|shall|do|must|hereby|have to))?\s+(?:(?:like|want|have|need) to\s+)?"
_NEGATED_ACCEPT = re.compile(r"\bi(?:\s+\w+){0,2}?\s*(?:can't|cannot|can not|won't|will not|don't|do not|am not able to|am unable to|must not)\s+(?:\w+\s+)?(?:accept|agree)", re.IGNORECASE)
_ACCEPT = re.compile(rf"(?:{_I}(?:accept|agree)\b|^\W*(?:accept(?:ed)?|agreed|deal|it'?s a deal)\b|\byou have a deal\b)", re.IGNORECASE)
_REJECT = re.compile(rf"(?:{_I}(?:reject|decline|refuse|counter)|^\W*(?:reject(?:ed)?|declined?|no deal|no)\b|\bcounter-?offer\b)", re.IGNORECASE)
_WALK = re.compile(r"\b(?:walk(?:ing)?\s+away|sell (?:it |the product )?to john|buy (?:it )?from john|go with john|deal with john|opt out)", re.IGNORECASE)


def _text_decision(text: str) -> str | None:
    head = text.strip()[:_DECISION_WINDOW]
    if _WALK.search(head):
        return "walk_away"
    if _NEGATED_ACCEPT.search(head) or _REJECT.search(head):
        return "reject"
    if _ACCEPT.search(head):
        return "accept"
    return None


# "me" and "you" in a split: "$60 for me", "I keep 60", "$40 to you", "you get 40"
_ME_AFTER, _ME_BEFORE = r"(?:me|myself)", r"(?:i(?:'ll| will)?\s+(?:get|keep|take|receive|need|want)(?:\s+at\s+least)?)"
_YOU_AFTER, _YOU_BEFORE = r"(?:you|yourself)", r"(?:you(?:'ll| will)?\s+(?:get|keep|take|receive))"


def _text_split(text: str, money: float, speaker: str) -> dict[str, float] | None:
    """Bargaining gains attributed by name, by me/you, or as a percentage split."""
    gains: dict[str, float] = {}
    for role in ("alice", "bob"):
        m = re.search(rf"\b{role}(?:'s)?(?:[\s_]*(?:gain|gets?|share|receives?|takes?|keeps?|would get|will get|:|=|with|to))*\s*{_AMOUNT}",
                      text, re.IGNORECASE)
        if m is None:
            # "60 to Alice", but not "1 to Alice's proposal" (a possessive names no share)
            m = re.search(rf"{_AMOUNT}\s*(?:dollars\s*)?(?:for|to)\s+{role}\b(?!['’]s)", text, re.IGNORECASE)
        if m:
            gains[role] = _amount(m)
    you = "bob" if speaker == "alice" else "alice"
    for role, after, before in ((speaker, _ME_AFTER, _ME_BEFORE), (you, _YOU_AFTER, _YOU_BEFORE)):
        if role in gains:
            continue
        m = re.search(rf"{_AMOUNT}\s*(?:dollars\s*)?(?:for|to)\s+{after}\b", text, re.IGNORECASE) or \
            re.search(rf"\b{before}\s*{_AMOUNT}", text, re.IGNORECASE)
        if m:
            gains[role] = _amount(m)
    if len(gains) == 1:  # one side named: the other gets the rest
        (role, value), = gains.items()
        gains["bob" if role == "alice" else "alice"] = money - value
    if len(gains) == 2:
        return {"alice_gain": gains["alice"], "bob_gain": gains["bob"]}
    m = re.search(r"\b(\d{1,3}(?:\.\d+)?)\s*(?:%\s*)?[/-]\s*(\d{1,3}(?:\.\d+)?)\s*%?(?:\s+split)?", text)
    if m and abs(float(m.group(1)) + float(m.group(2)) - 100) < 1e-9:  # "50/50", "60-40 split": speaker first
        mine, yours = float(m.group(1)) * money / 100, float(m.group(2)) * money / 100
        return {"alice_gain": mine, "bob_gain": yours} if speaker == "alice" else {"alice_gain": yours, "bob_gain": mine}
    return None


_PRICE_CUE = re.compile(r"\b(?:price(?:\s+of)?|offer(?:\s+of)?|pay|for|at|about)\W{0,3}$", re.IGNORECASE)


def _text_price(text: str) -> dict[str, float] | None:
    """Negotiation: the last amount that is money by its form or its place.

    In order: the last amount written as money ("$9,500", "12k", "1.5 million"); a reply that is
    only a number; the last amount right after a price word ("a price of 95", "I can pay 102").
    A number anywhere else (a date, a list item, a count in a ramble) is not an offer.
    """
    amounts = list(_AMOUNT_RE.finditer(text))
    money = [m for m in amounts if "$" in m.group(0) or m.group(2) or re.match(r"\s*dollars?\b", text[m.end():], re.IGNORECASE)]
    if money:
        return {"product_price": _amount(money[-1])}
    if len(amounts) == 1 and amounts[0].group(0).strip() == text.strip().rstrip(".!"):
        return {"product_price": _amount(amounts[0])}
    cued = [m for m in amounts if _PRICE_CUE.search(text[max(0, m.start() - 12):m.start()])]
    return {"product_price": _amount(cued[-1])} if cued else None


def parse_reply(text: str | None, offer_fields: Sequence[str], money: float, speaker: str) -> Move:
    """The move in a reply (see the module doc); :class:`ParseError` when there is none.

    Args:
        text: the model's whole output.
        offer_fields: the game's offer fields (``("alice_gain", "bob_gain")`` or ``("product_price",)``).
        money: M of the configuration (to complete "I keep $60" and percentage splits).
        speaker: ``"alice"`` or ``"bob"`` (who "me" and "you" are).
    """
    if text is None or not text.strip():
        raise ParseError("the reply is empty")
    for obj in _json_objects(text) + [_loads(c) for c in _json_candidates(text)]:
        if isinstance(obj, dict):
            move = _from_json(obj, offer_fields)
            if move is not None:
                return move
    decision = _text_decision(text)
    offer = _text_split(text, money, speaker) if "alice_gain" in offer_fields else _text_price(text)
    if decision == "accept" or decision == "walk_away":
        return Move(decision, None, text.strip())
    if offer is None:
        if decision == "reject":
            return Move("reject", None, text.strip())
        raise ParseError("no JSON object and no offer or decision found in the reply")
    return Move(decision, offer, text.strip())


# ---- the schema of a reply (structured outputs) -----------------------------------------------
#: Longest message in a constrained reply: one short sentence keeps the JSON within a reply's tokens.
MESSAGE_CHARS = 80


#: A constrained Bargaining offer names one of at most this many + 1 divisions of M (all whole
#: splits when M <= 100, else steps of M/100): a JSON schema cannot say "the two gains add up to
#: M", so the legal pairs are listed, and a grammar over a million pairs (M = 1e6) would not compile.
#: Game config: ``reply_schema.offer_steps`` (and ``reply_schema.message_chars``).
OFFER_STEPS = 100


def split_grid(money: float, steps: int = OFFER_STEPS) -> list[tuple[float, float]]:
    """The divisions ``(alice_gain, bob_gain)`` of ``money`` that a constrained offer may name.

    Every whole-number split when M is a whole number no larger than ``steps``; otherwise ``steps``
    equal steps of M, rounded to whole units (cents when M is not a whole number). Each pair adds
    up to M exactly (to the cent), so every listed offer is legal
    (:meth:`aria.games.two_player.glee.BargainingConfig.check_offer`), and the grid includes 0, M and (for
    an even ``steps``) the even split.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if float(money).is_integer():
        m = int(money)
        gains = range(m + 1) if m <= steps else sorted({round(i * m / steps) for i in range(steps + 1)})
        return [(a, m - a) for a in gains]
    gains = sorted({round(i * money / steps, 2) for i in range(steps + 1)})
    return [(a, round(money - a, 2)) for a in gains]


def reply_schema(match, message_chars: int = MESSAGE_CHARS, offer_steps: int = OFFER_STEPS) -> dict:
    """The JSON schema of a legal reply on this turn of ``match`` (:class:`aria.games.two_player.glee.Match`),
    as the prompt's reply format describes it (``config/game/<game>.yaml``, ``reply_format``).

    * nothing on the table: an offer ``{<offer fields>, "message"}`` (Negotiation: or walk away);
    * an offer on the table: ``{"decision": "accept"}``, a rejection with a counter-offer, or
      (Negotiation) ``{"decision": "walk_away"}``;
    * the last round: accept or a plain ``{"decision": "reject"}``.

    Every reply the schema allows is a move the rules accept. Negotiation: a whole-number price
    from 1 to the highest legal price (a configuration without one raises ``ValueError``).
    Bargaining: one of the divisions of :func:`split_grid` (the two gains must add up to M, which
    a schema can only say by listing the pairs), so at M = 1e4 or 1e6 a constrained offer moves
    in steps of M/``offer_steps`` (M/100). ``"message"`` (at most ``message_chars`` characters) is
    present only where messages are relayed (``config.messages``).
    """
    config = match.config
    if "alice_gain" in config.offer_fields:
        offers = [{"alice_gain": {"const": a}, "bob_gain": {"const": b}} for a, b in split_grid(config.money, offer_steps)]
    else:  # a positive whole-number price (the rules also allow fractions; a schema of numbers would let a
        # small model write long decimals), at most the highest legal one
        top = math.floor(config.max_price)
        if top < 1:
            raise ValueError(f"{config.id}: no whole-number price is legal (the highest is {config.max_price:g}), "
                             f"so replies cannot be constrained to one")
        offers = [{"product_price": {"type": "integer", "minimum": 1, "maximum": top}}]
    if config.messages:
        message = {"type": "string", "maxLength": message_chars}
        offers = [{**offer, "message": message} for offer in offers]

    def obj(properties: dict) -> dict:
        return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}

    def decision(word: str, **more) -> dict:
        return obj({"decision": {"const": word}, **more})

    if match.pending is None:
        options = [obj(offer) for offer in offers]
    else:
        options = [decision("accept")]
        options += [decision("reject", **offer) for offer in offers] if match.can_offer else [decision("reject")]
    if config.walk_away:
        options.append(decision("walk_away"))
    return options[0] if len(options) == 1 else {"anyOf": options}
