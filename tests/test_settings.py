"""Typed settings (aria/settings.py): every shipped config and preset fits its schema, and a wrong
key, a wrong type or a value left as ??? is one line naming the setting, before any work."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import pytest

from aria.io import ConfigError
from aria.resources import SCHEMAS, check_overrides, compose_config, config_dir, schema
from aria.settings import bounded, validated
from aria.trainers.settings import TrainerSettings

REPO = Path(__file__).resolve().parents[1]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))


# Every option of every group at least once, in a config that composes it: a shipped file the
# schema does not fit fails here, not in a user's run. (The scripted policy plays one game: it
# reads ${game}, which the evaluation's config, several games in one run, does not have.)
SHIPPED = [
    *[("reinforce_llm", [f"scale={s}", "model.path=m"]) for s in options("scale")],
    ("reward_model", []),
    *[("onlinereinforce_llm", [f"online_scale={s}", "model.path=m"]) for s in options("online_scale")],
    *[("onlinereinforce_llm", [f"oracle={o}"]) for o in options("oracle")],
    *[("experiment", [f"experiment={e}", "base_model=m"]) for e in options("experiment")],
    *[("collect", [f"game={g}"]) for g in options("game")],
    *[("collect", ["game=bargaining", f"policy={p}", f"opponent={o}"]) for p in options("policy") for o in options("opponent")],
    *[("intention", [f"embedder={e}"]) for e in options("embedder")],
    *[("eval", [f"policy={p}", f"oracle={o}"]) for p in options("policy") if p != "scripted" for o in options("oracle")],
    *[("eval", [f"opponent={o}"]) for o in options("opponent")],
]


@pytest.mark.parametrize(("name", "overrides"), SHIPPED, ids=[f"{n}:{','.join(o)}" for n, o in SHIPPED])
def test_every_shipped_config_fits_its_schema(name, overrides):
    cfg = compose_config(name, overrides)  # composes and validates
    assert set(cfg) == set(schema(name).__dataclass_fields__)


def test_every_top_level_config_has_a_schema():
    tops = {p.stem for p in config_dir().glob("*.yaml")} - {"default"}  # default.yaml: the trainers' shared part
    assert tops == set(SCHEMAS)


@pytest.fixture(scope="module")
def trainer_cfg() -> dict:
    return compose_config("reinforce_llm", [])


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c["train"].update(epocs=3), "train.epocs: not a setting of this command (Key 'epocs' not in 'TrainSettings')"),
    (lambda c: c["train"].update(epochs="three"), "train.epochs: Value 'three' of type 'str' could not be converted to Integer"),
    (lambda c: c["train"].update(epochs=1.5), "train.epochs: Value '1.5' of type 'float' could not be converted to Integer"),
    (lambda c: c["train"].update(epochs=True), "train.epochs: Value 'True' of type 'bool' could not be converted to Integer"),
    (lambda c: c["model"]["lora"].update(enabled="maybe"), "model.lora.enabled: Value 'maybe' is not a valid bool"),
    (lambda c: c.update(method=None), "method: Incompatible value 'None' for field of type 'str'"),
    (lambda c: c["model"].update(path="???"), "model.path: no value given (the config leaves it as ???)"),
    (lambda c: c.pop("logging"), "logging.log_every: no value given"),
])
def test_a_bad_setting_is_one_error_naming_it(trainer_cfg, change, message):
    cfg = copy.deepcopy(trainer_cfg)
    change(cfg)
    with pytest.raises(ConfigError) as err:
        validated(TrainerSettings, cfg, "trainer settings")
    assert str(err.value).startswith(f"trainer settings: {message}"), str(err.value)
    assert "\n" not in str(err.value)


def test_values_come_back_with_the_declared_types(trainer_cfg):
    cfg = copy.deepcopy(trainer_cfg)
    cfg["train"].update(lr=1, epochs="2", warmup_steps=None)
    cfg["model"]["lora"]["dropout"] = 0
    out = validated(TrainerSettings, cfg)
    assert out["train"]["lr"] == 1.0 and isinstance(out["train"]["lr"], float)
    assert out["train"]["epochs"] == 2 and isinstance(out["train"]["epochs"], int)
    assert isinstance(out["model"]["lora"]["dropout"], float) and out["train"]["warmup_steps"] is None
    assert type(out) is dict and type(out["train"]) is dict and type(out["train"]["betas"]) is list
    assert json.loads(json.dumps(out)) == out  # plain data: what the files and digests see


def test_a_bad_override_list_names_the_list():
    with pytest.raises(ConfigError) as err:
        check_overrides("reinforce_llm", ["model.path=m", "train.epocs=3"], "train_overrides")
    assert str(err.value).startswith("train_overrides: ") and "epocs" in str(err.value)
    with pytest.raises(ConfigError) as err:
        check_overrides("reinforce_llm", ["model.path=m", "train.epochs=many"], "train_overrides")
    assert str(err.value) == "train_overrides: train.epochs: Value 'many' of type 'str' could not be converted to Integer"
    assert check_overrides("reinforce_llm", ["model.path=m", "train.epochs=5"], "x")["train"]["epochs"] == 5


def test_the_trainer_refuses_a_bad_setting_before_it_reads_the_data(trainer_cfg, tmp_path):
    """The data file does not exist: an error about the setting means it came first."""
    from aria.trainers.offline import OfflineTrainer

    cfg = copy.deepcopy(trainer_cfg)
    cfg["data"]["train_file"] = str(tmp_path / "missing.json")
    cfg["train"]["micro_batch_size"] = "four"
    with pytest.raises(ConfigError, match=r"^trainer settings: train.micro_batch_size: Value 'four'"):
        OfflineTrainer(cfg)


@pytest.mark.subprocess
def test_a_bad_setting_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    """As a user runs it: a type error on the collection command's line stops it before any game."""
    done = subprocess.run([sys.executable, "scripts/collect_games.py", "num_games=many", f"out={tmp_path / 'g.jsonl'}",
                           "policy=scripted"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == \
        "error: collect: num_games: Value 'many' of type 'str' could not be converted to Integer"
    assert "Traceback" not in done.stderr and not (tmp_path / "g.jsonl").exists()


@dataclass
class Toy:
    share: float = bounded(ge=0, le=1)
    lr: float = bounded(gt=0)
    dropout: float = bounded(ge=0, lt=1)
    every: Optional[int] = bounded(ge=1, why="null: never")
    seeds: List[int] = bounded(nonempty=True, each={"ge": 0})
    engine: str = bounded(one_of=("vllm", "local"))


def test_bounds_by_hand():
    """What a type cannot say (aria.settings.bounded): each limit at its edge, NaN and inf, null
    where the field is Optional, every element of a list, a closed set of names."""
    fine = {"share": 0, "lr": 1e-9, "dropout": 0.0, "every": None, "seeds": [0, 3], "engine": "local"}
    assert validated(Toy, fine) == fine
    assert validated(Toy, {**fine, "share": 1, "every": 1})["share"] == 1.0  # both ends of [0, 1] are in
    for change, message in [
        ({"share": 1.0000001}, "share: expected a finite number >= 0 and <= 1, got 1.0000001"),
        ({"share": float("nan")}, "share: expected a finite number >= 0 and <= 1, got nan"),
        ({"lr": 0}, "lr: expected a finite number > 0, got 0.0"),
        ({"lr": float("inf")}, "lr: expected a finite number > 0, got inf"),
        ({"dropout": 1}, "dropout: expected a finite number >= 0 and < 1, got 1.0"),
        ({"every": 0}, "every: expected an integer >= 1 (null: never), got 0"),
        ({"seeds": []}, "seeds: expected a non-empty list, got []"),
        ({"seeds": [0, -1]}, "seeds: expected a list whose every element is an integer >= 0, got [0, -1]"),
        ({"engine": "vLLM"}, "engine: expected one of vllm, local, got 'vLLM'"),
    ]:
        with pytest.raises(ConfigError) as refused:
            validated(Toy, {**fine, **change}, "toy")
        assert str(refused.value) == f"toy: {message}"


# Each of these played, trained or labelled anyway (a wrong seat, greedy decoding, a game of no
# turns, an untrained run), or failed minutes later inside a library: now one line where the
# config enters, naming the setting.
OUT_OF_BOUNDS = [
    ("collect", ["policy_role=nope"], "collect: policy_role: expected one of alice, bob, got 'nope'"),
    ("eval", ["max_turns=-1"], "eval: max_turns: expected an integer >= 1, got -1"),
    ("eval", ["envs=[]"], "eval: envs: expected a non-empty list, got []"),
    ("eval", ["num_games=-2"], "eval: num_games: expected an integer >= 1 and <= 1_000_000, got -2"),
    # a schedule of 10**12 games filled the memory before the first game (the adversarial pass)
    ("collect", ["num_games=1000000000000"], "collect: num_games: expected an integer >= 0 and <= 1_000_000, got 1000000000000"),
    ("eval", ["two_player.games_per_config=0"], "eval: two_player.games_per_config: expected an integer >= 1 and <= 1_000_000, got 0"),
    ("experiment", ["warm_start.epsilon=2"], "experiment: warm_start.epsilon: expected a finite number >= 0 and <= 1, got 2.0"),
    ("experiment", ["eval.temperature=-0.5"], "experiment: eval.temperature: expected a finite number >= 0, got -0.5"),
    ("experiment", ["collect.max_tokens=0"], "experiment: collect.max_tokens: expected an integer >= 1, got 0"),
    ("experiment", ["seeds=[-1]"], "experiment: seeds: expected a list whose every element is an integer >= 0, got [-1]"),
    ("intention", ["clustering.tol=-1"], "intention: clustering.tol: expected a finite number >= 0, got -1.0"),
    ("intention", ["clustering.seeding=random"], "intention: clustering.seeding: expected one of shared, per_k, got 'random'"),
    ("intention", ["embedding.save_every=0"], "intention: embedding.save_every: expected an integer >= 1, got 0"),
    ("intention", ["selection.epsilon=nan"], "intention: selection.epsilon: expected a finite number >= 0, got nan"),
    ("intention", ["selection.tau=-1"], "intention: selection.tau: expected an integer >= 0, got -1"),
    ("intention", ["selection.silhouette_sample=0"], "intention: selection.silhouette_sample: expected an integer >= 2, got 0"),
    ("intention", ["aggregation.gamma=1.5"], "intention: aggregation.gamma: expected a finite number > 0 and <= 1 (the discount "
                                             "of R_t = gamma^(T-t) R: 0 would erase every step but the last), got 1.5"),
    # the bound of the type and the estimator's own check (aggregate.step_returns) disagreed: 0 passed here
    ("intention", ["aggregation.gamma=0"], "intention: aggregation.gamma: expected a finite number > 0 and <= 1 (the discount "
                                           "of R_t = gamma^(T-t) R: 0 would erase every step but the last), got 0.0"),
    ("critic", ["critic.tau=0"], "critic: critic.tau: expected a finite number > 0 and <= 1 (the target critic's step toward "
                                 "the critic; 0 would never move it), got 0.0"),
    ("intention", ["aggregation.n_rollout=0"], "intention: aggregation.n_rollout: expected an integer >= 1, got 0"),
    ("reinforce_llm", ["model.lora.r=0"], "reinforce_llm: model.lora.r: expected an integer >= 1, got 0"),
    ("reinforce_llm", ["model.lora.dropout=2"], "reinforce_llm: model.lora.dropout: expected a finite number >= 0 and < 1, got 2.0"),
    ("reinforce_llm", ["model.dtype=int8"], "reinforce_llm: model.dtype: expected one of float32, bfloat16, float16, got 'int8'"),
    ("reinforce_llm", ["train.betas=[0.9,1.5]"],
     "reinforce_llm: train.betas: expected a list whose every element is a finite number >= 0 and < 1, got [0.9, 1.5]"),
    ("reinforce_llm", ["train.mixed_precision=bf32"],
     "reinforce_llm: train.mixed_precision: expected one of auto, no, bf16, fp16, fp8, got 'bf32'"),
    ("reward_model", ["data.eval_fraction=1"], "reward_model: data.eval_fraction: expected a finite number >= 0 and < 1, got 1.0"),
    ("critic", ["critic.gamma=2"], "critic: critic.gamma: expected a finite number >= 0 and <= 1, got 2.0"),
    ("onlinereinforce_llm", ["online.games=[]"], "onlinereinforce_llm: online.games: expected a non-empty list, got []"),
    ("onlinereinforce_llm", ["rollout.top_p=0"], "onlinereinforce_llm: rollout.top_p: expected a finite number > 0 and <= 1, got 0.0"),
    ("onlinereinforce_llm", ["online.refresh_window=0"],
     "onlinereinforce_llm: online.refresh_window: expected an integer >= 1 (null: every iteration since the last refresh), got 0"),
]


@pytest.mark.parametrize(("name", "overrides", "setting"), [
    ("experiment", ["experiment=paper_single"], "base_model"),
    ("reinforce_llm", ["scale=paper"], "model.path"),
    ("onlinereinforce_llm", ["online_scale=paper"], "model.path"),
])
def test_a_preset_that_needs_a_model_refuses_to_run_without_one(name, overrides, setting):
    """Before: the preset's ``???`` lost to the value its defaults set (OmegaConf keeps it), so
    experiment=paper_single trained the embedded 135M model as if it were Llama-3-8B."""
    with pytest.raises(ConfigError) as refused:
        compose_config(name, overrides)
    assert str(refused.value) == (f"{name}: {setting}: no value given (this preset needs one): set it on the command "
                                  f"line, e.g. {setting}=/models/Meta-Llama-3-8B-Instruct")
    assert compose_config(name, [*overrides, f"{setting}=/models/llama"])[setting.split(".")[0]]


def test_options_of_a_registered_class_by_hand():
    """aria.registry.check_options: a key the constructor does not take, a value out of the shared
    ranges; a constructor taking **options accepts any key, ranges still checked."""
    from aria.registry import check_options

    class Fixed:
        def __init__(self, game_cfg, temperature: float = 1.0):
            pass

    class Open:
        def __init__(self, game_cfg, **options):
            pass

    check_options(Fixed, {"temperature": 0}, "oracle", "the fixed oracle")
    with pytest.raises(ConfigError, match=r"^oracle.top_k: not an option of the fixed oracle \(known: game_cfg, temperature\)$"):
        check_options(Fixed, {"top_k": 5}, "oracle", "the fixed oracle")
    check_options(Open, {"top_k": 5, "temperature": 0.0}, "oracle", "the open oracle")
    with pytest.raises(ConfigError, match=r"^oracle.temperature: expected a finite number >= 0, got -1$"):
        check_options(Open, {"temperature": -1}, "oracle", "the open oracle")
    with pytest.raises(ConfigError, match=r"^oracle.max_retries: expected an integer, got 2.5$"):
        check_options(Open, {"max_retries": 2.5}, "oracle", "the open oracle")


@pytest.mark.parametrize(("name", "overrides", "message"), OUT_OF_BOUNDS, ids=[f"{n}:{o[0]}" for n, o, _ in OUT_OF_BOUNDS])
def test_a_value_out_of_its_range_is_refused_where_the_config_enters(name, overrides, message):
    with pytest.raises(ConfigError) as refused:
        compose_config(name, overrides)
    assert str(refused.value) == message


@pytest.mark.parametrize(("game", "change", "message"), [
    ("twenty_questions", {"max_turns": "twenty"}, "game twenty_questions: max_turns: Value 'twenty' of type 'str' could not be converted to Integer"),
    ("twenty_questions", {"max_turn": 5}, "game twenty_questions: max_turn: not a setting of this command"),
    ("guess_my_city", {"prompt": {"intro": "x"}}, "game guess_my_city: prompt.history_header: no value given"),
    ("bargaining", {"max_reprompts": 1.5}, "game bargaining: max_reprompts: Value '1.5' of type 'float' could not be converted to Integer"),
    ("negotiation", {"players": "alice"}, "game negotiation: players: Invalid value assigned: AnyNode is not a ListConfig"),
])
def test_a_game_is_checked_against_its_familys_schema(game, change, message):
    from aria.games.common.base import load_game_config
    from aria.games.family import checked_game

    assert checked_game(load_game_config(game))["name"] == game
    with pytest.raises(ConfigError) as err:
        checked_game({**load_game_config(game), **change})
    assert str(err.value).startswith(message), str(err.value)


def test_a_composed_config_is_reused_as_a_copy_until_its_yaml_or_environment_changes(tmp_path, monkeypatch):
    """compose_config keeps what a process composed (the runner composes the same configs at every
    resume): a caller's change to its copy reaches no other caller, and an edited YAML file or a
    changed variable that a YAML file reads (``${oc.env:...}``) composes anew."""
    import shutil
    import time

    from aria import resources

    folder = tmp_path / "config"
    shutil.copytree(resources.config_dir(), folder)
    monkeypatch.setenv("ARIA_CONFIG_DIR", str(folder))
    monkeypatch.setenv("OPENAI_API_KEY", "first")
    first = resources.compose_config("collect", ["policy=endpoint"])
    assert first["policy"]["api_key"] == "first"
    first["num_games"] = -1
    again = resources.compose_config("collect", ["policy=endpoint"])
    assert again["num_games"] != -1 and again == resources.compose_config("collect", ["policy=endpoint"])

    monkeypatch.setenv("OPENAI_API_KEY", "second")
    assert resources.compose_config("collect", ["policy=endpoint"])["policy"]["api_key"] == "second"

    collect = folder / "collect.yaml"
    text = collect.read_text()
    assert "\nnum_games: " in text
    time.sleep(0.01)  # a later modification time, whatever the file system's resolution
    collect.write_text(text.replace("\nnum_games: ", "\nnum_games: 7 #", 1))
    assert resources.compose_config("collect", ["policy=endpoint"])["num_games"] == 7
