"""Game families (aria/games/family.py): the one place that knows how question games and
two-player games differ."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from aria.experiment.settings import PlaySettings
from aria.games.common.base import load_game_config
from aria.games.family import FAMILIES, QuestionFamily, TwoPlayerFamily, family_of
from aria.io import ConfigError
from aria.resources import compose_config

REPO = Path(__file__).resolve().parents[1]


def test_every_game_config_has_a_family_and_an_unknown_kind_is_one_line():
    assert isinstance(family_of(load_game_config("twenty_questions")), QuestionFamily)
    assert isinstance(family_of(load_game_config("bargaining")), TwoPlayerFamily)
    assert family_of({"name": "g"}) is FAMILIES["question"]  # no kind: a question game
    with pytest.raises(ConfigError, match=r"^chess: kind: unknown 'board' \(known: question, two_player\)$"):
        family_of({"name": "chess", "kind": "board"})


def test_outcomes_and_seats_of_hand_made_records():
    question, two = FAMILIES["question"], FAMILIES["two_player"]
    found = {"success": True, "turns": [{"action": "a"}, {"action": "b"}, {"action": "c"}]}
    assert question.won(found, None) and question.turns(found, None) == 3
    assert not question.won({**found, "success": False}, None)
    deal = {"meta": {"winner": "bob"}, "turns": [{"role": "alice"}, {"role": "bob"}, {"role": "alice"}]}
    assert two.won(deal, "bob") and not two.won(deal, "alice")
    assert (two.turns(deal, "alice"), two.turns(deal, "bob")) == (2, 1)
    assert not two.won({**deal, "meta": {"winner": None}}, "alice")  # a tie is won by no seat
    # the graded outcome: a question game's success; a seat's payoff share (its training reward)
    assert (question.score(found, None), question.score({**found, "success": False}, None)) == (1.0, 0.0)
    shares = {**deal, "role_rewards": {"alice": 0.3, "bob": 0.7}}
    assert (two.score(shares, "alice"), two.score(shares, "bob")) == (0.3, 0.7)
    where = Path("run/eval/it0")
    assert question.evaluation_seats(question.evaluation_output(where)) == [(Path("run/eval/it0.jsonl"), None)]
    assert two.evaluation_seats(two.evaluation_output(where)) == [(where / "as_alice.jsonl", "alice"),
                                                                   (where / "as_bob.jsonl", "bob")]
    assert (question.seats, two.seats, question.outcome, two.outcome) == (1, 2, "success", "win")


def test_games_in_a_section():
    section = PlaySettings(config_set="eval48", games_per_config=3)  # the 48-configuration evaluation set
    assert FAMILIES["two_player"].games_in(load_game_config("bargaining"), section) == 3 * 48
    assert FAMILIES["question"].games_in(load_game_config("twenty_questions"), PlaySettings(games=7)) == 7


def test_the_collection_command_checks_its_counts_per_family_before_any_model_loads():
    from aria.games.family import collect_from_config

    with pytest.raises(ConfigError, match=r"^collect: num_games: expected an integer >= 0 and <= 1_000_000, got -1$"):
        collect_from_config(compose_config("collect", ["game=twenty_questions", "num_games=-1", "batch_size=1",
                                                       "policy.model_path=/no/such/model"]))
    with pytest.raises(ConfigError, match=r"^collect: games_per_config: expected an integer >= 1 and <= 1_000_000, got 0$"):
        collect_from_config(compose_config("collect", ["game=bargaining", "games_per_config=0", "batch_size=1",
                                                       "policy.model_path=/no/such/model"]))


@pytest.mark.parametrize(("overrides", "message"), [
    (["game=twenty_questions", "+policy.bogus=1"], "policy.bogus: not an option of the vllm policy (known: model_path, "),
    (["game=twenty_questions", "policy.temperature=-1"], "policy.temperature: expected a finite number >= 0, got -1"),
    (["game=twenty_questions", "policy.name=nope"], "policy.name: unknown policy 'nope' (known: endpoint, local, scripted, vllm)"),
    (["game=twenty_questions", "oracle.name=nope"], "oracle.name: unknown oracle 'nope' (known: "),
    (["game=twenty_questions", "oracle=llm", "oracle.max_retries=-1"], "oracle.max_retries: expected an integer >= 0, got -1"),
    (["game=bargaining", "config_set=nope"], "config_set: config/game/bargaining.yaml has no config set 'nope'"),
    (["game=bargaining", "opponent=endpoint", "opponent.temperature=-1"], "opponent.temperature: expected a finite number >= 0"),
])
def test_a_collection_refuses_bad_player_settings_before_a_model_loads(tmp_path, overrides, message):
    """Before: played greedily, a TypeError, a KeyError after the policy loaded; the policy's path
    names no model, so a check that came after loading would fail on the path instead."""
    from aria.games.family import collect_from_config

    cfg = compose_config("collect", [*overrides, "policy.model_path=/no/such/model", f"out={tmp_path / 'games.jsonl'}"])
    with pytest.raises(ConfigError) as refused:
        collect_from_config(cfg)
    assert str(refused.value).startswith(message)
    assert not (tmp_path / "games.jsonl").exists()


@pytest.mark.parametrize(("overrides", "message"), [
    (["envs=[twenty_questions]", "oracle.name=nope"], "oracle.name: unknown oracle 'nope'"),
    (["envs=[bargaining]", "two_player.config_set=nope"], "two_player.config_set: config/game/bargaining.yaml has no config set 'nope'"),
])
def test_an_evaluation_refuses_an_unknown_oracle_or_config_set_before_the_model_loads(tmp_path, overrides, message):
    from aria.games.evaluate import evaluate_model

    with pytest.raises(ConfigError) as refused:
        evaluate_model(compose_config("eval", [*overrides, "policy=local", "policy.model_path=/no/such/model",
                                               f"out={tmp_path / 'eval'}"]))
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize("policy", ["local", "endpoint", "vllm"])
def test_the_two_player_reply_length_is_an_option_of_every_policy(policy):
    """The two-player evaluation sets the reply length under the policy's own key (before:
    max_new_tokens for vllm, which only takes max_tokens)."""
    from aria.llm.registry import check_policy, reply_tokens_key

    cfg = compose_config("eval", [f"policy={policy}"])["policy"]
    check_policy({**cfg, reply_tokens_key(cfg): 64})
    assert reply_tokens_key(cfg) in cfg


def test_no_module_outside_the_families_tests_a_game_config_for_its_kind():
    """The family is decided by family_of alone: a new family is one class, not a hunt for branches."""
    # a game config's kind: game_cfg.get("kind"), cfg["game"]["kind"], load_game_config(name).get("kind"), ...
    pattern = re.compile(r"""(game\w*|\[["']game["']\]|load_game_config\([^)]*\))(\.get\(["']kind["']\)|\[["']kind["']\])""")
    offenders = [f"{path.relative_to(REPO)}:{i}" for folder in ("aria", "evaluation", "scripts", "clustering", "reward_aggregation")
                 for path in (REPO / folder).rglob("*.py") if path.name != "family.py"
                 for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == []
