"""Win rule, question extraction and target schedule of the single-agent games (docs/method.md §6)."""
from __future__ import annotations

import pytest

from aria.games.question.game import target_schedule


@pytest.mark.parametrize(
    "game, count, template",
    [("twenty_questions", 157, "Is it a {name}?"), ("guess_my_city", 91, "Is your city {name}?")],
)
def test_every_target_is_winnable_by_each_of_its_names(request, game, count, template):
    game = request.getfixturevalue(game)
    assert len(game.targets) == count
    unwinnable = [
        (t.name, name) for t in game.targets for name in t.names if not game.is_win(template.format(name=name), t.name)
    ]
    assert unwinnable == []


def test_two_word_objects_the_original_rule_could_not_win(twenty_questions):
    # The original compared only the question's last word: "ball?" never equals "soccer ball".
    for name in ("Soccer ball", "Golf ball", "Tennis ball", "Tennis racket", "Baseball bat", "Watering can", "Lawn mower"):
        assert twenty_questions.is_win(f"Is it a {name.lower()}?", name)


@pytest.mark.parametrize(
    "question, target, wins",
    [
        ("Is it a soccer ball?", "Soccer ball", True),
        ("Are they cats?", "Cat", True),                      # plural of the last word
        ("Is it a TV?", "Television", True),                  # alias
        ("Is it a pencil eraser?", "Pencil", False),          # longest match names Eraser
        ("Is it a pencil eraser?", "Eraser", True),
        ("Is it a baseball bat?", "Baseball", False),
        ("Is it a cat or a dog?", "Cat", False),              # two objects named: not one guess
        ("Do you watch TV with it?", "Watch", False),         # decoy phrase
        ("Is it a catalogue?", "Cat", False),                 # whole words only
        ("Is it a ball?", "Soccer ball", False),
    ],
)
def test_win_rule_cases_twenty_questions(twenty_questions, question, target, wins):
    assert twenty_questions.is_win(question, target) is wins


@pytest.mark.parametrize(
    "question, target, wins",
    [
        ("Is your city Mumbai?", "Bombay", True),
        ("Is it São Paulo?", "Sao Paulo", True),              # accents folded
        ("Is your city in California?", "Cali", False),
        ("Is your city in El Salvador?", "Salvador", False),  # decoy
        ("Is it Tokyo or Osaka?", "Tokyo", False),
    ],
)
def test_win_rule_cases_guess_my_city(guess_my_city, question, target, wins):
    assert guess_my_city.is_win(question, target) is wins


# Real-looking model outputs and the question the one extractor reads out of each (play and import).
EXTRACTION_TABLE = [
    # the prompt's format
    ("Question: Is it an animal?", "Is it an animal?"),
    ("question:   Does it have wheels?  ", "Does it have wheels?"),
    ("QUESTION: Is it bigger than a breadbox?", "Is it bigger than a breadbox?"),
    ("**Question:** Is it made of metal?", "Is it made of metal?"),
    ("Question 3: Does it fly?", "Does it fly?"),
    # preambles before the marker or before the question
    ("Sure! Here is my question:\nQuestion: Is it red?\nThanks", "Is it red?"),
    ("Based on the information provided, my next question would be:\n\nIs your hometown Dalian?", "Is your hometown Dalian?"),
    ("Question: Based on the information provided, my next question would be:\n\nIs your hometown Dalian?",
     "Is your hometown Dalian?"),  # an imported output prefixed with "Question: "
    ("Great, thanks for the answer! Since it is not alive, I will ask:\nQuestion: Is it used in the kitchen?",
     "Is it used in the kitchen?"),
    ("Let me think step by step.\n1. It is not alive.\n2. It is man-made.\n\nQuestion: Is it electronic?",
     "Is it electronic?"),
    ("Okay, so far we know it's in Europe.\n\nMy next question is: Is your city in Scandinavia?",
     "Is your city in Scandinavia?"),
    ("Thanks. Is your city on the coast?", "Is your city on the coast?"),
    ("Question: Thanks. Is it a tool?", "Is it a tool?"),
    # numbered lists and several candidates: the last one
    ("Here are some questions I could ask:\n1. Is it alive?\n2. Is it big?\n3. Is it red?", "Is it red?"),
    ("- Is it a fruit?\n- Is it a vegetable?", "Is it a vegetable?"),
    ("Question: Is it a mammal?\nQuestion: Is it a pet?", "Is it a pet?"),  # the last marker counts
    # quoted questions
    ('My next question: "Is your city in Europe?"', "Is your city in Europe?"),
    ('I would ask "Is it a fruit?" next.', "Is it a fruit?"),
    ("Question: \u201cIs it a musical instrument?\u201d", "Is it a musical instrument?"),
    ("Question: 'Does it have strings?'", "Does it have strings?"),
    # several question marks in one sentence run, and question marks in remarks
    ("Question: Is it big? Like, really big?", "Is it big? Like, really big?"),
    ("Question: Is it a dog? That would be my guess.", "Is it a dog?"),
    ("Question: Is it red?\nThis would help me narrow it down.", "Is it red?"),
    ("Question: Does it have four legs? (This helps separate animals from furniture.)", "Does it have four legs?"),
    ("Question: Is it used for writing?\nWhy? Because we know it is an office supply.", "Is it used for writing?"),
    # abbreviations do not end a sentence
    ("Is it St. Petersburg?", "Is it St. Petersburg?"),
    ("Question: Is your city in the U.S. or Canada?", "Is your city in the U.S. or Canada?"),
    ("Interesting. Is your city, e.g. Paris, in France?", "Is your city, e.g. Paris, in France?"),
    # accents are kept in the question (the win rule folds them)
    ("Question: Is the city you are from Bogotá?", "Is the city you are from Bogotá?"),
    # statements and nothing at all
    ("Question: Tell me the object.", "Tell me the object."),  # a marker's statement goes to the oracle
    ("I think it is an animal.", None),                        # no marker, no question
    ("Question:", None),
    ("", None),
    ("\n\n", None),
    ("Question: " + "very " * 80 + "long?", None),  # over max_question_chars
    ("Is it an animal?", "Is it an animal?"),
]


@pytest.mark.parametrize("action, question", EXTRACTION_TABLE)
def test_extract_question(twenty_questions, action, question):
    assert twenty_questions.extract_question(action) == question


def test_extraction_table_is_large_enough():
    assert len(EXTRACTION_TABLE) >= 30
    assert sum("\n" in action for action, _ in EXTRACTION_TABLE) >= 10  # multi-line outputs


def test_turn_and_final_rewards(twenty_questions):
    assert twenty_questions.turn_reward(won=False) == -1.0
    assert twenty_questions.turn_reward(won=True) == 0.0
    assert twenty_questions.final_reward(True) == 1.0
    assert twenty_questions.final_reward(False) == 0.0


def test_target_schedule_is_seeded_and_cycles(twenty_questions):
    targets = twenty_questions.targets
    first = target_schedule(targets, 200, seed=3)
    assert first == target_schedule(targets, 200, seed=3)
    assert first != target_schedule(targets, 200, seed=4)
    assert {t.name for t in first[:157]} == {t.name for t in targets}  # one full pass first
    assert first[157:] == first[:43]                                    # then the same order again


def test_a_testbed_config_starts_from_its_game_and_keeps_a_subset(tmp_path, monkeypatch):
    """twenty_questions_subset = twenty_questions + its own keys (as Hydra composes it): the ten
    objects of ArCHer's subset, named in the prompt, played by Twenty Questions' rules and oracle."""
    from pathlib import Path

    import yaml
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from aria.games.common.base import load_game_config
    from aria.games.question.game import load_game
    from aria.games.question.oracle import OracleRequest, build_oracle
    from aria.io import DataError

    subset, full = load_game_config("twenty_questions_subset"), load_game_config("twenty_questions")
    assert {k for k in subset if subset[k] != full.get(k)} == {"name", "family", "targets_only", "prompt"}
    assert subset["prompt"]["turn"] == full["prompt"]["turn"] and subset["prompt"]["intro"] != full["prompt"]["intro"]
    repo = Path(__file__).resolve().parents[1]
    with initialize_config_dir(config_dir=str(repo / "config"), version_base="1.3"):
        composed = OmegaConf.to_container(compose("collect", overrides=["game=twenty_questions_subset"]), resolve=True)
    assert composed["game"] == subset

    game = load_game("twenty_questions_subset")
    assert [t.name for t in game.targets] == ["Football", "Dog", "Banana", "Truck", "Pants", "Computer", "Piano",
                                              "Chair", "Pen", "Scissors"]  # the word list's order
    assert game.family == "twenty_questions" and load_game("twenty_questions").family == "twenty_questions"
    assert "one of: football, dog, banana, truck, pants, computer, piano, chair, pen, scissors." in game.prompt.intro
    oracle = build_oracle({"name": "knowledge_base"}, subset)
    answers = oracle.answer([OracleRequest(game.name, "Dog", q) for q in ("Is it an animal?", "Is it a dog?", "Is it a pen?")])
    assert [a.text for a in answers] == ["Yes.", game.win_answer, "No."]

    (tmp_path / "game").mkdir()  # a config folder of its own (ARIA_CONFIG_DIR)
    (tmp_path / "game" / "bad.yaml").write_text(yaml.safe_dump({"defaults": ["twenty_questions", "_self_"], "name": "bad",
                                                       "targets_only": ["Dog", "Unicorn"]}))
    (tmp_path / "game" / "twenty_questions.yaml").write_text((repo / "config/game/twenty_questions.yaml").read_text())
    monkeypatch.setenv("ARIA_CONFIG_DIR", str(tmp_path))
    with pytest.raises(DataError, match="targets_only.*not in the list: Unicorn"):
        load_game("bad")
    (tmp_path / "game" / "loop.yaml").write_text(yaml.safe_dump({"defaults": ["loop2"], "name": "loop"}))
    (tmp_path / "game" / "loop2.yaml").write_text(yaml.safe_dump({"defaults": ["loop"], "name": "loop2"}))
    with pytest.raises(DataError, match="starts from itself: loop -> loop2 -> loop"):
        load_game_config("loop")
    (tmp_path / "game" / "empty.yaml").write_text("")
    with pytest.raises(DataError, match="expected a mapping"):
        load_game_config("empty")


def test_guess_my_city_subset_is_guess_my_city_on_ten_named_cities():
    from aria.games.common.base import load_game_config
    from aria.games.question.game import load_game
    from aria.games.question.oracle import OracleRequest, build_oracle

    subset, full = load_game_config("guess_my_city_subset"), load_game_config("guess_my_city")
    assert {k for k in subset if subset[k] != full.get(k)} == {"name", "family", "targets_only", "prompt"}
    game = load_game("guess_my_city_subset")
    names = [t.name for t in game.targets]
    assert len(names) == 10 and set(names) == set(subset["targets_only"])
    assert game.family == "guess_my_city"
    assert all(name in game.prompt.intro for name in names)  # every candidate is named to the player
    oracle = build_oracle({"name": "knowledge_base"}, subset)
    answers = oracle.answer([OracleRequest(game.name, "Tokyo", q) for q in ("Is your city in Asia?", "Is it Tokyo?",
                                                                             "Is it Paris?")])
    assert answers[0].text.startswith("Yes") and answers[1].text == game.win_answer
    assert not answers[2].text.startswith("Yes")
    assert game.is_win(game.extract_question("Question: Is your city Mumbai?"), "Bombay")  # aliases still count
