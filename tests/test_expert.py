"""The scripted expert questioner (aria/games/question/expert.py): it wins, it means what it asks, and it
says so on every turn; its noise makes worse games; it plays through the rollout machinery."""
from __future__ import annotations

import json
from collections import defaultdict

import pytest
from hypothesis import given, settings, strategies as st

from aria.games.common.base import load_game_config
from aria.games.family import collect_from_config
from aria.games.question.expert import NO, YES, ScriptedExpertPolicy, answer_class
from aria.games.question.game import build_game
from aria.games.question.oracle import build_oracle
from aria.games.question.play import play_games
from aria.resources import compose_config
from aria.trajectories import read_trajectories

GAMES = ["twenty_questions_subset", "guess_my_city_subset", "twenty_questions", "guess_my_city"]


def _play(game_name: str, tmp_path, epsilon: float, num_games: int, seed: int = 0, batch_size: int = 16):
    cfg = load_game_config(game_name)
    out = tmp_path / f"{game_name}-{epsilon}-{batch_size}.jsonl"
    play_games(build_game(cfg), ScriptedExpertPolicy(cfg, epsilon=epsilon, seed=seed),
               build_oracle({"name": "knowledge_base"}, cfg), out, num_games=num_games, seed=seed,
               batch_size=batch_size, progress=False)
    return cfg, list(read_trajectories(out))


@pytest.mark.parametrize("game_name", GAMES)
def test_the_noiseless_expert_wins_every_game_and_records_what_it_meant(game_name, tmp_path):
    num_games = 20 if game_name.endswith("subset") else 12
    cfg, records = _play(game_name, tmp_path, 0.0, num_games)
    expert = ScriptedExpertPolicy(cfg).expert
    game = expert.game
    assert len(records) == num_games and all(r["success"] for r in records)
    for r in records:
        assert all(isinstance(t.get("intention"), str) for t in r["turns"])
        assert r["turns"][-1]["intention"] == f"guess:{r['target']}"
        # every question means its intention to the oracle: yes exactly on the intention's yes-set
        for t in r["turns"][:-1]:
            assert not t["intention"].startswith("guess:"), "a noiseless expert guesses only when one target is left"
            truth = YES if r["target"] in expert.yes[t["intention"]] else NO
            assert answer_class(t["observation"], game.win_answer) == truth, (t, r["target"])
    # halving the candidates every turn: about log2(targets) questions, far below the limit
    mean_turns = sum(len(r["turns"]) for r in records) / len(records)
    assert mean_turns <= 2 + len(game.targets).bit_length() + 2


def test_one_intention_has_many_surface_forms_all_answered_alike(tmp_path):
    cfg, records = _play("guess_my_city_subset", tmp_path, 0.3, 60)
    expert = ScriptedExpertPolicy(cfg).expert
    forms = defaultdict(set)
    for r in records:
        for t in r["turns"]:
            forms[t["intention"]].add(t["question"])
    assert max(len(v) for v in forms.values()) >= 5
    assert sum(len(v) >= 2 for v in forms.values()) >= 10
    for intention, questions in forms.items():
        for q in questions:  # every surface form gets the intention's answer on every target
            for target in expert.targets:
                expected = YES if target in expert.yes[intention] else NO
                assert expert._class(target, q) == expected, (intention, q, target)


def test_noise_gives_longer_games_with_random_questions_and_guesses(tmp_path):
    _, clean = _play("twenty_questions", tmp_path, 0.0, 24)
    _, noisy = _play("twenty_questions", tmp_path, 0.6, 24)
    turns = lambda rs: sum(len(r["turns"]) for r in rs) / len(rs)  # noqa: E731
    assert turns(noisy) > turns(clean) + 2
    wrong_guesses = [t for r in noisy for t in r["turns"] if t["intention"].startswith("guess:")
                     and t["intention"] != f"guess:{r['target']}"]
    assert len(wrong_guesses) >= 10


def test_the_same_games_whatever_the_batch(tmp_path):
    _, one = _play("twenty_questions_subset", tmp_path, 0.4, 12, batch_size=1)
    _, many = _play("twenty_questions_subset", tmp_path, 0.4, 12, batch_size=12)
    strip = lambda rs: [(r["game_id"], [(t["action"], t["intention"]) for t in r["turns"]]) for r in rs]  # noqa: E731
    assert sorted(strip(one)) == sorted(strip(many))


def test_epsilon_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match="epsilon"):
        ScriptedExpertPolicy(load_game_config("twenty_questions_subset"), epsilon=1.5)


def test_policy_scripted_through_the_collection_config(tmp_path):
    out = tmp_path / "games.jsonl"
    cfg = compose_config("collect", ["game=guess_my_city_subset", "policy=scripted", "policy.epsilon=0.2", "num_games=5",
                                     f"out={out}", "progress=false"])
    summary = collect_from_config(cfg)
    assert summary.counts["successes"] == 5
    records = list(read_trajectories(out))
    assert all(t["intention"] for r in records for t in r["turns"])
    producer = json.loads(out.with_name(out.name + ".producer.json").read_text())
    assert producer["producer"]["policy"] == {"name": "scripted", "epsilon": 0.2, "seed": 0}


_TEXT = st.text(alphabet=st.characters(blacklist_characters="\n"), max_size=30)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_TEXT, _TEXT), max_size=6), st.sampled_from(GAMES))
def test_parsing_a_prompt_gives_back_the_history_it_was_rendered_from(history, game_name):
    game = build_game(load_game_config(game_name))
    assert game.prompt.parse(game.render_prompt(history)) == history


def test_a_prompt_of_another_game_is_not_parsed():
    tq = build_game(load_game_config("twenty_questions"))
    gmc = build_game(load_game_config("guess_my_city"))
    with pytest.raises(ValueError):
        tq.prompt.parse(gmc.render_prompt([("Is it in Asia?", "Yes.")]))
    policy = ScriptedExpertPolicy(load_game_config("twenty_questions"))
    reply = policy.generate([[{"role": "user", "content": gmc.render_prompt([])}]], keys=["g"])[0]
    assert not reply.ok and "scripted expert" in reply.error


def test_answer_classes():
    win = "Yes, you guessed it! That is my city."
    assert [answer_class(a, win) for a in ["Yes.", "No.", "Invalid Question.", win, "Nope, it is not.",
                                           "No, that is not my city."]] == ["yes", "no", "other", "yes", "no", "no"]


def test_expert_games_go_through_pipeline_steps_1_to_4_keeping_the_true_intention(tmp_path, tiny_sentence_model_dir):
    from aria.intention import pipeline

    _, records = _play("guess_my_city_subset", tmp_path, 0.3, 8)
    games = tmp_path / "guess_my_city_subset-0.3-16.jsonl"
    cfg = compose_config("intention", ["game=guess_my_city_subset", f"input={games}", f"run_dir={tmp_path / 'run'}",
                                       f"embedder.model={tiny_sentence_model_dir}", "clustering.k_max=5"])
    quiet = lambda line: None  # noqa: E731
    pipeline.step1_embed_and_cluster(cfg, quiet)
    report = pipeline.step2_select_k(cfg, quiet)
    assert report["intention_recovery"]["steps"] == sum(len(r["turns"]) for r in records)
    labelled = pipeline.step3_apply_labels(cfg, quiet)
    train = json.loads(pipeline.step4_build_training_set(cfg, quiet).read_text())
    turns = [t for line in labelled.read_text().splitlines() for t in json.loads(line)["turns"]]
    assert [t["intention"]["player"] for t in turns] == [t["intention"] for r in records for t in r["turns"]]
    assert all("action_label" in t["intention"] for t in turns) and len(train) == len(turns)
