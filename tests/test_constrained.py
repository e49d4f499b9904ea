"""Schema-constrained replies (issue: two-player games that small models can play).

The local policy under a JSON schema or a regex (aria/llm/constrained.py, llguidance) on a tiny
random model built in the test: whatever it samples, the reply is valid and the game's parser
reads it; rows without a format, and the prompt-cache reuse, are left exactly as they were.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aria.games.common.base import load_game_config
from aria.games.question.game import build_game
from aria.games.two_player.glee import BargainingConfig, Match, Move, NegotiationConfig
from aria.games.two_player.offers import parse_reply, reply_schema, split_grid
from aria.llm.base import OutputFormat
from aria.llm.endpoint import structured_request
from aria.llm.local import LocalChatModel

BARGAINING = BargainingConfig(money=10000, delta_alice=0.9, delta_bob=0.8, max_rounds=3)
BARGAINING_QUIET = BargainingConfig(money=100, delta_alice=1.0, delta_bob=0.95, max_rounds=12, messages=False)
NEGOTIATION = NegotiationConfig(money=1000, seller_factor=0.8, buyer_factor=1.2, max_rounds=2)


def states() -> list[Match]:
    """Every kind of turn: an opening offer, an answer to an offer, the last round."""
    out = []
    for config, first in ((BARGAINING, {"alice_gain": 6000, "bob_gain": 4000}),
                          (BARGAINING_QUIET, {"alice_gain": 60, "bob_gain": 40}),
                          (NEGOTIATION, {"product_price": 1100})):
        opening = Match(config)
        answer = Match(config)
        answer.apply(Move(None, first, ""))
        out += [opening, answer]
    last = Match(BARGAINING)  # three rounds: turn 3 may only accept or reject
    for gains in ({"alice_gain": 6000, "bob_gain": 4000}, {"alice_gain": 5000, "bob_gain": 5000},
                  {"alice_gain": 5500, "bob_gain": 4500}):
        last.apply(Move("reject" if last.pending else None, gains, ""))
    assert not last.can_offer and last.pending is not None
    return out + [last]


@pytest.fixture(scope="module")
def sampler(tiny_model_dir):
    # Enough tokens for the longest valid reply even when every token is one character and every
    # message character a 6-character escape (80 × 6 + the object around it).
    return LocalChatModel(str(tiny_model_dir), max_new_tokens=600, temperature=1.0, dtype="float32")


def test_split_grid_lists_legal_divisions():
    assert split_grid(4) == [(0, 4), (1, 3), (2, 2), (3, 1), (4, 0)]  # every whole split when M <= 100
    assert split_grid(100) == [(a, 100 - a) for a in range(101)]
    big = split_grid(1e6)
    assert len(big) == 101 and big[0] == (0, 1000000) and big[50] == (500000, 500000) and big[1] == (10000, 990000)
    assert [a for a, _ in split_grid(1001, steps=4)] == [0, 250, 500, 751, 1001]  # rounded to whole units
    assert all(a + b == 1001 for a, b in split_grid(1001, steps=4))
    cents = split_grid(10.5, steps=2)
    assert cents == [(0.0, 10.5), (5.25, 5.25), (10.5, 0.0)]
    for money in (7, 100, 10000, 1e6, 10.5, 333.33):  # every listed pair is an offer the rules accept
        config = BargainingConfig(money=money, delta_alice=1.0, delta_bob=1.0, max_rounds=3)
        assert all(config.check_offer({"alice_gain": a, "bob_gain": b}) is None for a, b in split_grid(money))
    with pytest.raises(ValueError, match="steps"):
        split_grid(100, steps=0)


def test_reply_schema_follows_the_turn():
    opening, answer, quiet_opening, _, nego_opening, nego_answer, last = states()
    offers = reply_schema(opening)["anyOf"]  # one option per legal division of M = 10000
    assert [o["required"] for o in offers] == [["alice_gain", "bob_gain", "message"]] * 101
    assert [(o["properties"]["alice_gain"]["const"], o["properties"]["bob_gain"]["const"]) for o in offers] == split_grid(10000)
    assert {tuple(o["required"]) for o in reply_schema(quiet_opening)["anyOf"]} == {("alice_gain", "bob_gain")}  # messages are not relayed
    answers = reply_schema(answer)["anyOf"]
    assert answers[0] == {"type": "object", "properties": {"decision": {"const": "accept"}}, "required": ["decision"],
                          "additionalProperties": False}
    assert len(answers) == 102 and all(o["properties"]["decision"]["const"] == "reject" for o in answers[1:])
    assert answers[1]["required"] == ["decision", "alice_gain", "bob_gain", "message"]
    assert [o["required"] for o in reply_schema(last)["anyOf"]] == [["decision"], ["decision"]]  # no counter-offer left
    # Negotiation: walking away is always an option; prices up to the highest legal one
    assert [o.get("properties", {}).get("decision", {}).get("const") for o in reply_schema(nego_opening)["anyOf"]] == [None, "walk_away"]
    assert reply_schema(nego_answer)["anyOf"][1]["properties"]["product_price"]["maximum"] == int(NEGOTIATION.max_price)


@pytest.mark.slow  # 12 x 7 sampled replies of up to 600 tokens, about 2 minutes
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_constrained_replies_always_parse(sampler, seed):
    """Whatever a random model samples under a turn's schema is a valid reply that the game reads
    as a move the rules accept."""
    import torch

    torch.manual_seed(seed)
    matches = states()
    formats = [OutputFormat.json_schema(reply_schema(m)) for m in matches]
    conversations = [[{"role": "user", "content": f"Game {i}: reply with JSON."}] for i in range(len(matches))]
    replies = sampler.generate(conversations, formats=formats)
    for match, fmt, reply in zip(matches, formats, replies):
        obj = json.loads(reply.text)
        jsonschema.validate(obj, fmt.schema)
        move = parse_reply(reply.text, match.config.offer_fields, match.config.money, match.mover)
        problem = match.check(move)
        assert problem is None, (reply.text, problem)


def test_regex_replies_are_one_question_line(sampler):
    import torch

    game_cfg = load_game_config("twenty_questions")
    game = build_game(game_cfg)
    fmt = OutputFormat.regex(game_cfg["reply_regex"])
    torch.manual_seed(3)
    replies = sampler.generate([[{"role": "user", "content": "Ask."}]] * 6, formats=[fmt] * 6)
    for reply in replies:
        assert reply.text.startswith("Question: ") and reply.text.endswith("?") and "\n" not in reply.text
        question = game.extract_question(reply.text)  # never answered "Invalid Question."
        assert question is not None and question in reply.text


def test_rows_without_a_format_are_untouched(tiny_model_dir):
    greedy = LocalChatModel(str(tiny_model_dir), max_new_tokens=200, temperature=0, dtype="float32")
    conversations = [[{"role": "user", "content": text}] for text in ("Is it an animal?", "Offer?", "Guess the object.")]
    alone = [c.text for c in greedy.generate([conversations[0], conversations[2]])]
    fmt = OutputFormat.json_schema(reply_schema(Match(BARGAINING)))
    mixed = greedy.generate(conversations, formats=[None, fmt, None])
    assert [mixed[0].text, mixed[2].text] == alone
    json.loads(mixed[1].text)


def test_constrained_decoding_keeps_the_prompt_cache_exact(tiny_model_dir):
    """Greedy constrained replies with per-game cache reuse equal those without, turn after turn."""
    cached = LocalChatModel(str(tiny_model_dir), max_new_tokens=200, temperature=0, reuse_cache=True, dtype="float32")
    plain = LocalChatModel(str(tiny_model_dir), max_new_tokens=200, temperature=0, reuse_cache=False, dtype="float32")
    matches = states()[:3]
    formats = [OutputFormat.json_schema(reply_schema(m)) for m in matches]
    prompts = ["Alice:", "Bob: I reject.", "Let's play."]
    for turn in range(3):
        conversations = [[{"role": "user", "content": p}] for p in prompts]
        with_cache = [c.text for c in cached.generate(conversations, keys=["a", "b", "c"], formats=formats)]
        without = [c.text for c in plain.generate(conversations, formats=formats)]
        assert with_cache == without, f"turn {turn}"
        assert all(len(cached._caches[k].token_ids) > 0 for k in "abc")
        prompts = [p + f"\n{reply}\nOther: ok" for p, reply in zip(prompts, with_cache)]


def test_a_format_the_engine_cannot_compile_is_refused(sampler):
    with pytest.raises(ValueError, match="cannot compile the regex"):
        sampler.generate([[{"role": "user", "content": "x"}]], formats=[OutputFormat.regex("Question: (unclosed")])
    with pytest.raises(ValueError, match="unknown output format"):
        OutputFormat("grammar", "x")


def test_endpoint_requests_carry_the_format():
    schema = reply_schema(Match(BARGAINING))
    assert structured_request(None) == {}
    assert structured_request(OutputFormat.json_schema(schema)) == {
        "response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}}
    assert structured_request(OutputFormat.regex("Question: .+\\?")) == {
        "extra_body": {"structured_outputs": {"regex": "Question: .+\\?"}}}


def test_the_schema_options_come_from_the_game_config():
    from aria.games.two_player.play import schema_options

    cfg = load_game_config("bargaining")
    assert schema_options(cfg) == {"message_chars": 80, "offer_steps": 100}
    coarse = schema_options({**cfg, "reply_schema": {"offer_steps": 4, "message_chars": 20}})
    options = reply_schema(Match(BARGAINING), **coarse)["anyOf"]
    assert [o["properties"]["alice_gain"]["const"] for o in options] == [0, 2500, 5000, 7500, 10000]
    assert options[0]["properties"]["message"] == {"type": "string", "maxLength": 20}
    with pytest.raises(ValueError, match="unknown reply_schema option"):
        schema_options({**cfg, "reply_schema": {"offer_step": 4}})
    with pytest.raises(ValueError, match="offer_steps must be a whole number from 1 to 1,000, got 0"):
        schema_options({**cfg, "reply_schema": {"offer_steps": 0}})
    with pytest.raises(ValueError, match="offer_steps must be a whole number from 1 to 1,000, got 1001"):
        schema_options({**cfg, "reply_schema": {"offer_steps": 1001}})
    assert schema_options({**cfg, "reply_schema": {"offer_steps": 1000}})["offer_steps"] == 1000
