"""Bargaining and Negotiation rules (docs/method.md §6): payoffs by hand, turn rules, the rewards used for
training, the subgame-perfect split and the scripted opponents' known outcomes."""
import pytest

from aria.games.common.base import load_game_config
from aria.games.two_player.glee import (
    BargainingConfig, Match, Move, NegotiationConfig, config_from_dict, config_set, config_to_dict, normalized_rewards, rubinstein_split,
    spe_concessions, winner,
)
from aria.games.two_player.scripted import ScriptedBargainer, ScriptedNegotiator


def split(x, y):
    return {"alice_gain": float(x), "bob_gain": float(y)}


def price(p):
    return {"product_price": float(p)}


def play(match, *moves):
    for move in moves:
        assert match.check(move) is None, (move, match.check(move))
        match.apply(move)
    return match


# ---- Bargaining payoffs ---------------------------------------------------------------------
def test_bargaining_deal_in_round_three_is_discounted_per_player():
    m = play(Match(BargainingConfig(100, 0.9, 0.8, 12)),
             Move(None, split(70, 30)),            # round 1, Alice
             Move("reject", split(30, 70)),        # round 2, Bob
             Move("reject", split(60, 40)),        # round 3, Alice
             Move("accept"))                       # Bob accepts round 3's offer
    assert (m.outcome, m.deal_round, m.deal) == ("deal", 3, split(60, 40))
    assert m.payoffs() == pytest.approx({"alice": 0.81 * 60, "bob": 0.64 * 40})  # 48.6 and 25.6
    assert winner(m.payoffs()) == "alice"
    assert normalized_rewards(m.payoffs()) == pytest.approx({"alice": 48.6 / 74.2, "bob": 25.6 / 74.2})


def test_bargaining_round_one_deal_is_not_discounted():
    m = play(Match(BargainingConfig(1e6, 0.8, 0.8, 12)), Move(None, split(4e5, 6e5)), Move("accept"))
    assert m.payoffs() == {"alice": 4e5, "bob": 6e5}


def test_bargaining_no_deal_when_the_last_offer_is_rejected():
    m = play(Match(BargainingConfig(100, 1.0, 1.0, 2)), Move(None, split(90, 10)), Move("reject", split(10, 90)))
    assert not m.over and not m.can_offer
    assert "last round" in m.check(Move(None, split(50, 50)))  # no third offer
    play(m, Move("reject", split(50, 50)))  # a rejection; its counter-offer is void
    assert m.history[-1]["offer"] is None
    assert (m.outcome, m.payoffs()) == ("no_deal", {"alice": 0.0, "bob": 0.0})
    assert winner(m.payoffs()) is None and normalized_rewards(m.payoffs()) == {"alice": 0.5, "bob": 0.5}


def test_bargaining_tie_scores_half_each():
    m = play(Match(BargainingConfig(100, 0.9, 0.9, 12)), Move(None, split(50, 50)), Move("accept"))
    assert winner(m.payoffs()) is None
    assert normalized_rewards(m.payoffs()) == {"alice": 0.5, "bob": 0.5}


def test_bargaining_has_no_outside_option_and_checks_offers():
    m = Match(BargainingConfig(100, 0.9, 0.9, 12))
    assert "not allowed" in m.check(Move("walk_away"))
    assert "no offer to accept" in m.check(Move("accept"))
    assert "must equal 100" in m.check(Move(None, split(60, 60)))
    assert "negative" in m.check(Move(None, split(110, -10)))
    assert m.check(Move(None, split(33.33, 66.67))) is None  # cents are fine
    with pytest.raises(ValueError):
        m.apply(Move(None, split(1, 1)))


# ---- Negotiation payoffs --------------------------------------------------------------------
def test_negotiation_deal_gives_price_minus_values():
    config = NegotiationConfig(100, 1.0, 1.5, 10)  # V_A = 100, V_B = 150
    m = play(Match(config), Move(None, price(140)), Move("reject", price(110)), Move("accept"))
    assert (m.deal_round, m.payoffs()) == (2, pytest.approx({"alice": 10.0, "bob": 40.0}))
    assert normalized_rewards(m.payoffs()) == pytest.approx({"alice": 0.2, "bob": 0.8})


def test_negotiation_losing_deal_normalises_to_zero_and_one():
    config = NegotiationConfig(100, 1.0, 1.5, 10)
    m = play(Match(config), Move(None, price(160)), Move("accept"))  # Bob pays above his value
    assert m.payoffs() == pytest.approx({"alice": 60.0, "bob": -10.0})
    assert normalized_rewards(m.payoffs()) == pytest.approx({"alice": 1.0, "bob": 0.0})
    assert winner(m.payoffs()) == "alice"


def test_negotiation_walk_away_is_the_zero_surplus_outside_option():
    config = NegotiationConfig(10000, 1.2, 0.8, 10)
    m = play(Match(config), Move(None, price(13000)), Move("walk_away"))
    assert (m.outcome, m.walked_away_by, m.payoffs()) == ("walk_away", "bob", {"alice": 0.0, "bob": 0.0})
    m = play(Match(config), Move("walk_away"))  # at any moment, the first turn included
    assert m.outcome == "walk_away" and m.turn == 1


def test_negotiation_price_range():
    m = Match(NegotiationConfig(100, 1.0, 1.2, 10))  # max price 2 * 120
    assert m.check(Move(None, price(240))) is None
    assert "above the value range" in m.check(Move(None, price(240.5)))
    assert "positive" in m.check(Move(None, price(-5)))


def test_single_round_negotiation_is_an_ultimatum():
    m = play(Match(NegotiationConfig(100, 1.0, 1.2, 1)), Move(None, price(115)))
    assert "last round" in m.check(Move(None, price(110)))
    play(m, Move("accept"))
    assert m.payoffs() == pytest.approx({"alice": 15.0, "bob": 5.0})


# ---- unusable replies ------------------------------------------------------------------------
def test_forfeit_reject_passes_the_turn_without_an_offer():
    m = play(Match(BargainingConfig(100, 0.9, 0.9, 12)), Move(None, split(60, 40)))
    m.forfeit("reject")
    assert m.pending is None and m.mover == "alice" and not m.over
    assert "make an offer" in m.check(Move("accept"))  # nothing to accept any more
    # the forfeit is in the history as Bob's rejection, marked with its rule
    assert m.history[-1] == {"role": "bob", "decision": "reject", "offer": None, "round": None, "forfeit": "reject"}
    assert m.turn == 2
    play(m, Move(None, split(55, 45)), Move("accept"))
    assert m.deal_round == 3
    with pytest.raises(ValueError, match="unknown rule"):
        m.forfeit("resign")


def test_forfeit_no_deal_ends_the_game_and_unusable_last_turn_is_a_rejection():
    m = play(Match(BargainingConfig(100, 0.9, 0.9, 12)), Move(None, split(60, 40)))
    m.forfeit("no_deal")
    assert m.outcome == "no_deal" and m.turn == 2
    assert m.history[-1] == {"role": "bob", "decision": None, "offer": None, "round": None, "forfeit": "no_deal"}
    m = play(Match(BargainingConfig(100, 0.9, 0.9, 1)), Move(None, split(60, 40)))
    m.forfeit("reject")
    assert m.outcome == "no_deal"


def test_normalized_rewards_by_hand():
    assert normalized_rewards({"alice": 30.0, "bob": 10.0}) == {"alice": 0.75, "bob": 0.25}
    assert normalized_rewards({"alice": -5.0, "bob": 15.0}) == {"alice": 0.0, "bob": 1.0}
    assert normalized_rewards({"alice": 0.0, "bob": 0.0}) == {"alice": 0.5, "bob": 0.5}
    assert normalized_rewards({"alice": -3.0, "bob": -3.0}) == {"alice": 0.5, "bob": 0.5}
    assert normalized_rewards({"alice": 0.3, "bob": 0.1}) == pytest.approx({"alice": 0.75, "bob": 0.25})  # small sums too


def test_winner_by_hand():
    assert winner({"alice": 3.0, "bob": 1.0}) == "alice"
    assert winner({"alice": 1.0, "bob": 3.0}) == "bob"
    assert winner({"alice": -1.0, "bob": -1.0}) is None


def test_rubinstein_split_by_hand():
    # x = M(1 − δ_B)/(1 − δ_A δ_B) = 100 · 0.2 / 0.28, y = M − x
    x, y = rubinstein_split(100, 0.9, 0.8)
    assert (x, y) == pytest.approx((100 * 0.2 / 0.28, 100 - 100 * 0.2 / 0.28))
    with pytest.raises(ValueError, match="Rubinstein's split needs"):
        rubinstein_split(100, 1.0, 1.0)


# ---- the subgame-perfect split ----------------------------------------------------------------
def test_spe_by_hand():
    # one round: an ultimatum, the proposer keeps everything
    assert spe_concessions(100, 0.8, 0.9, 1) == [0.0]
    # two rounds: Bob would keep 100 in round 2, worth 0.9 * 100 = 90 now, so Alice offers him 90
    assert spe_concessions(100, 0.8, 0.9, 2) == pytest.approx([90.0, 0.0])
    # three rounds: round 3 Alice keeps 100 (worth 64 to her at time 0); round 2 Bob must give her
    # 64 / 0.8 = 80 and keeps 20 (worth 18); round 1 Alice gives Bob 18 and keeps 82
    assert spe_concessions(100, 0.8, 0.9, 3) == pytest.approx([18.0, 80.0, 0.0])
    # no discounting: the last proposer takes all, so with an even number of rounds Bob gets everything
    assert spe_concessions(100, 1.0, 1.0, 12)[0] == pytest.approx(100.0)


def test_long_game_approaches_rubinstein():
    for d_a, d_b in [(0.9, 0.9), (0.8, 0.95), (0.95, 0.8)]:
        x, _ = rubinstein_split(100, d_a, d_b)
        assert 100 - spe_concessions(100, d_a, d_b, 99)[0] == pytest.approx(x, abs=0.01)
    assert rubinstein_split(100, 0.9, 0.9)[0] == pytest.approx(100 / 1.9)


# ---- scripted opponents ------------------------------------------------------------------------
def scripted_game(config, alice, bob):
    m = Match(config)
    while not m.over:
        m.apply((alice if m.mover == "alice" else bob).move(m))
    return m


@pytest.mark.parametrize("config", config_set(load_game_config("bargaining"), "eval48")
                         + [BargainingConfig(100, 0.9, 0.9, 99), BargainingConfig(1e4, 0.8, 0.95, 3)], ids=lambda c: c.id)
def test_two_strong_bargainers_reach_the_discount_predicted_split(config):
    m = scripted_game(config, ScriptedBargainer(1.0), ScriptedBargainer(1.0))
    predicted_bob = spe_concessions(config.money, config.delta_alice, config.delta_bob, config.max_rounds)[0]
    assert (m.outcome, m.deal_round) == ("deal", 1)
    assert m.deal["bob_gain"] == pytest.approx(predicted_bob, abs=0.01)  # offers are rounded up to cents
    assert m.deal["alice_gain"] == pytest.approx(config.money - predicted_bob, abs=0.01)


def test_strong_bargainers_in_a_long_game_split_like_rubinstein():
    m = scripted_game(BargainingConfig(100, 0.9, 0.9, 99), ScriptedBargainer(1.0), ScriptedBargainer(1.0))
    assert m.deal["alice_gain"] == pytest.approx(100 / 1.9, abs=0.02)


def test_strength_matters_in_bargaining():
    config = BargainingConfig(100, 0.9, 0.9, 99)
    strong_vs_weak = scripted_game(config, ScriptedBargainer(0.0), ScriptedBargainer(1.0))
    # a weak Alice offers an even split, which a strong Bob (who needs only ~47.4) accepts
    assert strong_vs_weak.deal == split(50, 50)
    # a weak responder accepts less than a strong one would
    m = play(Match(config), Move(None, split(90, 10)))
    assert ScriptedBargainer(1.0).move(m).decision == "reject"
    assert ScriptedBargainer(0.0).move(m).decision == "accept"


def test_strong_negotiators_split_the_surplus():
    config = NegotiationConfig(100, 1.0, 1.5, 10)
    m = scripted_game(config, ScriptedNegotiator(1.0), ScriptedNegotiator(1.0))
    assert m.outcome == "deal" and 100 <= m.deal["product_price"] <= 150
    assert m.deal["product_price"] == pytest.approx(125.0)  # both hold out for half of the 50 surplus
    assert winner(m.payoffs()) is None


def test_weak_negotiator_concedes_more():
    config = NegotiationConfig(100, 1.0, 1.5, 10)
    weak_seller = scripted_game(config, ScriptedNegotiator(0.0), ScriptedNegotiator(1.0))
    assert weak_seller.outcome == "deal" and weak_seller.payoffs()["bob"] > weak_seller.payoffs()["alice"]
    weak_buyer = scripted_game(config, ScriptedNegotiator(1.0), ScriptedNegotiator(0.0))
    assert weak_buyer.outcome == "deal" and weak_buyer.payoffs()["alice"] > weak_buyer.payoffs()["bob"]


def test_negotiator_walks_away_when_no_surplus_is_possible():
    m = scripted_game(NegotiationConfig(100, 1.5, 0.8, 10), ScriptedNegotiator(1.0), ScriptedNegotiator(1.0))
    assert (m.outcome, m.walked_away_by, m.turn) == ("walk_away", "alice", 1)
    # without knowing the buyer's value the seller tries, and no price ever suits both: no deal
    m = scripted_game(NegotiationConfig(100, 1.5, 0.8, 10, complete_information=False),
                      ScriptedNegotiator(1.0), ScriptedNegotiator(1.0))
    assert m.outcome == "no_deal" and m.payoffs() == {"alice": 0.0, "bob": 0.0}


def test_scripted_players_never_make_an_illegal_move():
    for game, player in (("bargaining", ScriptedBargainer), ("negotiation", ScriptedNegotiator)):
        for config in config_set(load_game_config(game), "grid")[::7]:
            for s_a, s_b in ((1.0, 1.0), (0.0, 1.0), (0.5, 0.2)):
                m = Match(config)
                a, b = player(s_a), player(s_b)
                while not m.over:
                    move = (a if m.mover == "alice" else b).move(m)
                    assert m.check(move) is None, (config.id, move)
                    m.apply(move)


def test_config_sets():
    bargaining, negotiation = load_game_config("bargaining"), load_game_config("negotiation")
    assert len(config_set(bargaining, "eval48")) == 48 and len(config_set(negotiation, "eval48")) == 48
    assert len(config_set(bargaining, "grid")) == 3 * 4 * 4 * 2 * 2 * 2
    assert len(config_set(negotiation, "grid")) == 3 * 4 * 4 * 3 * 2 * 2
    assert len({c.id for c in config_set(negotiation, "grid")}) == 576
    from aria.io import ConfigError

    with pytest.raises(ConfigError, match=r"^eval.config_set: config/game/bargaining.yaml has no config set 'nope'"):
        config_set(bargaining, "nope", "eval.config_set")


def test_configuration_ids_and_round_trip():
    b = BargainingConfig(1e4, 0.9, 0.95, 12, complete_information=False)
    n = NegotiationConfig(100, 0.8, 1.5, 30, messages=False)
    assert b.id == "bargaining-M10000-dA0.9-dB0.95-R12-ii-msg"
    assert n.id == "negotiation-M100-FA0.8-FB1.5-R30-ci-nomsg"
    assert n.max_price == 2.0 * 150  # twice the larger value, V_B = 100 · 1.5
    assert config_to_dict(n) == {"money": 100, "seller_factor": 0.8, "buyer_factor": 1.5, "max_rounds": 30,
                                 "complete_information": True, "messages": False, "max_price_factor": 2.0}
    assert config_from_dict("bargaining", config_to_dict(b)) == b
    assert BargainingConfig(100, 0.9, 0.9, 12).check_offer({"alice_gain": 60.5, "bob_gain": 40}) \
        == "alice_gain + bob_gain must equal 100, got 60.5 + 40 = 100.5"


def test_history_records_what_a_reply_did_to_the_offer_on_the_table():
    m = play(Match(BargainingConfig(100, 0.9, 0.9, 12)), Move("reject", split(60, 40)))  # {"decision": "propose", ...}
    assert m.history[-1] == {"role": "alice", "decision": None, "offer": split(60, 40), "round": 1}
    play(m, Move(None, split(50, 50)))  # a bare counter-offer rejects the offer on the table
    assert m.history[-1] == {"role": "bob", "decision": "reject", "offer": split(50, 50), "round": 2}
