"""The reply parser of the two-player games on a table of model-style outputs (issue: parsing).

Each row is (reply text, game, speaker, money, expected), expected being either
``(decision, offer)`` or ``ParseError`` (the text cannot be read). Rows are written the way
instruction-tuned models answer: clean JSON, JSON inside prose or code fences, sloppy JSON,
numbers only, sentences, refusals and garbage. Legality (sums, ranges) is the rules' job and is
tested in tests/test_two_player_games.py; a few rows here go through the rules too.
"""
import pytest

from aria.games.two_player.glee import BargainingConfig, Match, Move, NegotiationConfig
from aria.games.two_player.offers import ParseError, parse_reply, to_number

BAR = ("alice_gain", "bob_gain")
NEG = ("product_price",)


def split(x, y):
    return {"alice_gain": float(x), "bob_gain": float(y)}


def price(p):
    return {"product_price": float(p)}


TABLE = [
    # --- well-formed JSON -------------------------------------------------------------------
    ('{"alice_gain": 60, "bob_gain": 40, "message": "Fair enough?"}', BAR, "alice", 100, (None, split(60, 40))),
    ('{"decision": "accept"}', BAR, "bob", 100, ("accept", None)),
    ('{"decision": "reject", "alice_gain": 45, "bob_gain": 55, "message": "I need more."}', BAR, "bob", 100, ("reject", split(45, 55))),
    ('{"product_price": 110, "message": "A great product."}', NEG, "alice", 100, (None, price(110))),
    ('{"decision": "walk_away"}', NEG, "alice", 100, ("walk_away", None)),
    ('{"decision": "reject", "product_price": 95.5, "message": "Too pricey."}', NEG, "bob", 100, ("reject", price(95.5))),
    ('{"alice_gain": 500000, "bob_gain": 500000, "message": "Even split."}', BAR, "alice", 1e6, (None, split(5e5, 5e5))),
    ('{"decision": "ACCEPT", "message": "Deal!"}', NEG, "bob", 100, ("accept", None)),
    # --- JSON inside prose or code fences ---------------------------------------------------
    ('Sure! Here is my offer:\n```json\n{"alice_gain": 70, "bob_gain": 30, "message": "Take it."}\n```', BAR, "alice", 100, (None, split(70, 30))),
    ('I think this is fair. {"decision": "reject", "alice_gain": 52, "bob_gain": 48, "message": "Meet me halfway"} Hope you agree!', BAR, "alice", 100, ("reject", split(52, 48))),
    ('```\n{"product_price": 12000, "message": "Premium quality"}\n```', NEG, "alice", 10000, (None, price(12000))),
    ('My answer: {"decision": "accept", "message": "Thank you, Alice."}', BAR, "bob", 100, ("accept", None)),
    ('Let me think... The price is high.\n\n{"decision": "walk_away", "message": "I will buy from John."}', NEG, "bob", 100, ("walk_away", None)),
    # --- sloppy JSON ------------------------------------------------------------------------
    ("{'alice_gain': 55, 'bob_gain': 45, 'message': 'ok'}", BAR, "alice", 100, (None, split(55, 45))),
    ('{"alice_gain": 80, "bob_gain": 20,}', BAR, "alice", 100, (None, split(80, 20))),
    ('{"Alice gain": "$6,000", "Bob gain": "$4,000", "message": "Deal?"}', BAR, "alice", 10000, (None, split(6000, 4000))),
    ('{"aliceGain": 30, "bobGain": 70}', BAR, "bob", 100, (None, split(30, 70))),
    ('{"decision": "Rejected", "price": "$1,150"}', NEG, "bob", 1000, ("reject", price(1150))),
    ('{"product_price": "105 dollars", "message": "final"}', NEG, "alice", 100, (None, price(105))),
    ('{"decision": "counteroffer", "product_price": 98}', NEG, "bob", 100, ("reject", price(98))),
    ('{"product_price": "1.2 million"}', NEG, "alice", 1e6, (None, price(1.2e6))),
    ('{"accept": true}', BAR, "bob", 100, ("accept", None)),
    # --- JSON that cannot be used ------------------------------------------------------------
    ('{"alice_gain": "sixty", "bob_gain": "forty"}', BAR, "alice", 100, ParseError),
    ('{"alice_gain": 60, "message": "You get the rest"}', BAR, "alice", 100, ParseError),
    ('{"decision": "maybe later"}', BAR, "bob", 100, ParseError),
    ('{"message": "Hello Bob, nice to meet you!"}', BAR, "alice", 100, ParseError),
    # --- plain text: the offer written out ---------------------------------------------------
    ("I propose alice gain 400000, bob gain 600000.", BAR, "bob", 1e6, (None, split(4e5, 6e5))),
    ("How about Alice gets $65 and Bob gets $35?", BAR, "alice", 100, (None, split(65, 35))),
    ("I'll take $60 for me and $40 for you.", BAR, "alice", 100, (None, split(60, 40))),
    ("I reject. I keep 7000 and you get 3000.", BAR, "bob", 10000, ("reject", split(3000, 7000))),
    ("Let's split it 50/50, a fair start!", BAR, "alice", 100, (None, split(50, 50))),
    ("I suggest a 60-40 split in my favour.", BAR, "bob", 1000, (None, split(400, 600))),
    ("Bob: $45, Alice: $55", BAR, "alice", 100, (None, split(55, 45))),
    ("How about $110.", NEG, "alice", 100, (None, price(110))),
    ("I'm not willing to go as low as $9,000. How about $9,500?", NEG, "alice", 10000, (None, price(9500))),  # a counter-offer rejects
    ("I understand your concerns, but I can only pay $102 for it.", NEG, "bob", 100, (None, price(102))),
    ("I would like to counter with a price of $12k.", NEG, "bob", 10000, ("reject", price(12000))),
    # --- plain text: decisions ----------------------------------------------------------------
    ("I accept your offer. Pleasure doing business!", BAR, "bob", 100, ("accept", None)),
    ("Deal! I accept $95 for the product.", NEG, "alice", 100, ("accept", None)),
    ("We couldn't reach a mutual agreement, so I'll sell the product to John.", NEG, "alice", 100, ("walk_away", None)),
    ("I'm walking away from this negotiation.", NEG, "bob", 100, ("walk_away", None)),
    ("I cannot accept that offer. I need at least $70.", BAR, "alice", 100, ("reject", split(70, 30))),
    ("No, I reject this.", BAR, "bob", 100, ("reject", None)),
    ("I'm afraid I can't accept. How about $130?", NEG, "alice", 100, ("reject", price(130))),
    # --- numbers only, refusals, garbage -----------------------------------------------------
    ("60", NEG, "alice", 100, (None, price(60))),
    ("60 40", BAR, "alice", 100, ParseError),
    ("I'm sorry, but I can't help with that request.", BAR, "alice", 100, ParseError),
    ("As an AI language model, I do not have personal preferences.", NEG, "bob", 100, ParseError),
    ("", BAR, "alice", 100, ParseError),
    ("asdf qwerty ;;; {{{", BAR, "bob", 100, ParseError),
    ("Question: Is it a fruit?", BAR, "alice", 100, ParseError),
    # --- rambles with decision words inside: no decision (written by the embedded 135M model at
    # temperature 1 in an evaluation run; an early parser read them as acceptances) ------------
    ("Sorry, unfortunately, but are you ready for this. We are teaser strategy for you, 2 some things to say and two "
     "for a outcome another day. But you agreed so much more than you gave yourself.", BAR, "alice", 100, ParseError),
    ("To accept my offer: You will be requested to accept my money. You can accept anything and come to my table.",
     BAR, "alice", 100, ParseError),
    ("This is my best offer and gives a resolution to the problem regarding the second round. Had to accept the "
     "proposal that has you and going to chambers.", BAR, "alice", 100, ParseError),
    ("1. Respond: Accepting Offer 1, and 2 additional agreed upon what you each would have made if you made it.",
     BAR, "alice", 100, ParseError),
    ("Remember the puzzle about inflation? Even a single round has a payoff of 80%, and it continues to add to "
     "its payoff: \n* 1 to Alice's proposal accepts; \n* \n* \n\nThis form of money has a \"flip\" effect",
     BAR, "alice", 1000000, ParseError),  # a possessive names no share (an early parser read "Alice gets 1")
    ("I offer 60 to Alice and the rest to Bob.", BAR, "bob", 100, (None, split(60, 40))),
    ("Yes, I'd like to propose $60 for me and $40 for you.", BAR, "alice", 100, (None, split(60, 40))),
    ("I'll accept that.", NEG, "bob", 100, ("accept", None)),
    ("Accepted.", BAR, "bob", 100, ("accept", None)),
    # numbers inside rambles are not prices (the same evaluation run, Negotiation) -----------
    ("Quantitative: https://_{refrole_brail_62_7311133CABEK_07_2001} {a_combination_binary}\nQuantitative: 3.14\n"
     "This quantitiy is an alternative to Agoraphobia and metaphor.", NEG, "alice", 100, ParseError),
    ("dogs.therese_python/santasabug said:\nIreland took all of my gold.\nPass it on to the pope.\n#Arizona has 4 "
     "hospital room colors. \n#Three of them are blue.", NEG, "alice", 100, ParseError),
    ("I was born in 1990 and I have 3 cats.", NEG, "bob", 100, ParseError),
    ("I can pay 102 for it.", NEG, "bob", 100, (None, price(102))),
    ("1200 dollars is my price", NEG, "alice", 1000, (None, price(1200))),
]


@pytest.mark.parametrize("text,fields,speaker,money,expected", TABLE)
def test_parser_table(text, fields, speaker, money, expected):
    if expected is ParseError:
        with pytest.raises(ParseError):
            parse_reply(text, fields, money, speaker)
        return
    move = parse_reply(text, fields, money, speaker)
    decision, offer = expected
    assert move.decision == decision
    assert move.offer == (pytest.approx(offer) if offer else None)


def test_table_is_large_and_varied():
    assert len(TABLE) >= 40
    assert sum(row[-1] is ParseError for row in TABLE) >= 12


def test_json_message_is_kept_and_text_replies_keep_their_text():
    assert parse_reply('{"alice_gain": 1, "bob_gain": 99, "message": " hi "}', BAR, 100, "alice").message == "hi"
    assert parse_reply("How about $110.", NEG, 100, "alice").message == "How about $110."


def test_first_usable_json_object_wins():
    text = 'Example format: {"note": 1}. My reply: {"product_price": 90} and {"product_price": 10}'
    assert parse_reply(text, NEG, 100, "bob").offer == price(90)


@pytest.mark.parametrize("value,expected", [(5, 5.0), ("$1,200.50", 1200.5), ("12k", 12000.0), ("1.5 million", 1.5e6),
                                            ("about sixty", None), (True, None), ("50%", None)])
def test_to_number(value, expected):
    assert to_number(value) == expected


def test_parsed_but_illegal_replies_are_refused_by_the_rules():
    bargaining = BargainingConfig(100, 0.9, 0.9, 3)
    move = parse_reply('{"alice_gain": 70, "bob_gain": 40}', BAR, 100, "alice")
    assert "must equal 100" in Match(bargaining).check(move)
    move = parse_reply('{"alice_gain": -10, "bob_gain": 110}', BAR, 100, "alice")
    assert "negative" in Match(bargaining).check(move)
    negotiation = NegotiationConfig(100, 1.0, 1.2, 3)
    assert "above the value range" in Match(negotiation).check(parse_reply("$500", NEG, 100, "alice"))
    assert "positive" in Match(negotiation).check(Move(None, price(0)))
    assert "no offer to accept" in Match(negotiation).check(parse_reply("I accept.", NEG, 100, "alice"))
