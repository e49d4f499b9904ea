"""The commands the README and docs/ give, read from the documents themselves, so that a changed
flag, script or output folder breaks a test instead of a newcomer's first hour.

Three levels, from all commands to the recipe:
* every command of every bash block names a program that exists (and an accelerate config that does);
* every command of a Hydra program composes: its overrides are settings of its config, with values
  its schema accepts (aria/settings.py); values that are placeholders (``...``, ``/models/...``)
  are taken as strings, as Hydra takes them;
* the README's recipe runs as written, in order, on tiny random models (their paths appended to
  the commands), with real processes, files, a real two-process launch and a real vLLM server;
  then what it wrote is checked: one training per launch, no run's output replaced by another's,
  the merge the trained adapter's, the evaluation's games counted.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import run_recipe  # noqa: E402  (scripts/run_recipe.py: the parser and runner of the documented commands)

from conftest import build_tiny_chat_model  # noqa: E402

COMMANDS = run_recipe.documented_commands(REPO)


def hydra_config_name(command: run_recipe.Command) -> str | None:
    """The config a Hydra program composes for ``command`` (its ``--config-name``, else the
    ``config_name`` of its ``@hydra.main``), or None for a program that is not a Hydra app."""
    program = REPO / command.program
    if program.suffix != ".py":
        return None
    declared = re.search(r'@hydra\.main\([^)]*config_name="([^"]+)"', program.read_text(encoding="utf-8"))
    if not declared:
        return None
    words = shlex.split(command.text)
    return words[words.index("--config-name") + 1] if "--config-name" in words else declared.group(1)


def overrides(command: run_recipe.Command) -> list[str]:
    """The Hydra overrides of ``command``: the words after its program that set something."""
    words = shlex.split(command.text)
    after = words[next(i for i, w in enumerate(words) if w.endswith(command.program)) + 1:]
    return [w for w in after if "=" in w and not w.startswith("-")]


def test_the_documents_hold_the_commands_this_test_reads():
    """The parser finds the blocks: the README's recipe and the pipeline page's commands (a
    parser that found nothing would let every test below pass)."""
    files = {c.file for c in COMMANDS}
    assert {"README.md", "docs/pipeline.md", "docs/games.md", "docs/experiments.md"} <= files
    assert len(COMMANDS) >= 50
    programs = {c.program for c in run_recipe.recipe(REPO)}
    assert {"scripts/collect_games.py", "reward_aggregation/1_embed_and_cluster.py", "scripts/run_offline.py",
            "scripts/merge_lora.py", "scripts/train_critic.py", "scripts/train_rm.py", "scripts/run_online.py",
            "scripts/serve_vllm.sh", "evaluation/eval.sh"} <= programs


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.file}:{c.line}")
def test_every_documented_command_runs_a_program_that_exists(command):
    assert command.program, f"{command.file}:{command.line}: no program found in {command.text!r}"
    assert (REPO / command.program).is_file(), f"{command.file}:{command.line}: {command.program} does not exist"
    words = shlex.split(command.text)
    if "--config_file" in words:
        config = words[words.index("--config_file") + 1]
        assert (REPO / config).is_file(), f"{command.file}:{command.line}: {config} does not exist"


HYDRA_COMMANDS = [c for c in COMMANDS if c.program and (REPO / c.program).is_file() and hydra_config_name(c)]


@pytest.mark.parametrize("command", HYDRA_COMMANDS, ids=lambda c: f"{c.file}:{c.line}")
def test_every_documented_hydra_command_composes_under_its_schema(command):
    """Composed with Hydra's API and checked by the schema the command's code checks it with;
    a key the config does not have, or a value out of its bounds, fails here."""
    from hydra import compose, initialize_config_dir

    from aria.resources import SCHEMAS, schema
    from aria.settings import validated

    name = hydra_config_name(command)
    with initialize_config_dir(config_dir=str(REPO / "config"), version_base="1.3"):
        cfg = compose(config_name=name, overrides=overrides(command))
    if name in SCHEMAS:
        validated(schema(name), cfg, f"{command.file}:{command.line}")


def test_the_two_commands_of_the_front_door_are_the_first_block():
    """The README's set-up block is the two commands it promises."""
    first = [c for c in COMMANDS if c.file == "README.md"][:2]
    assert [c.text for c in first] == ["bash scripts/run_main.sh", "bash scripts/run_tests.sh"]


# ---- the recipe, run ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory, tiny_sentence_model_dir):
    """The README's recipe in a folder of its own, on tiny models: a chat model vLLM's CPU build
    can serve (head size 64) and a tiny sentence encoder. Collection uses the in-process policy
    (``policy=local``): the recipe's own server start for 32 short games would cost the suite
    about 40 CPU seconds, and the evaluation below starts a real server from the recipe's
    ``serve_vllm.sh`` line anyway."""
    policy = build_tiny_chat_model(tmp_path_factory.mktemp("tiny-servable"), hidden_size=128, heads=2)
    work = tmp_path_factory.mktemp("recipe")
    appended = {
        "scripts/collect_games.py": f"policy=local policy.model_path={policy}",
        # the four intention steps take the same overrides (they check each other's settings)
        **{step: f"embedder.model={tiny_sentence_model_dir}" for step in (
            "reward_aggregation/1_embed_and_cluster.py", "clustering/2_select_k.py", "clustering/3_apply_labels.py",
            "clustering/4_build_training_set.py")},
        "scripts/run_offline.py": f"model.path={policy}",
        # the tiny encoder has 256 positions (a longer critic.max_tokens is refused in one line)
        "scripts/train_critic.py": f"critic.encoder={tiny_sentence_model_dir} critic.max_tokens=256",
        "scripts/train_rm.py": f"model.path={policy}",
        "scripts/run_online.py": f"model.path={policy} online.max_turns=4",
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    steps = run_recipe.recipe(REPO)
    results = run_recipe.run(work, steps, appended, env)
    return {"work": work, "steps": steps, "results": results, "policy": policy}


def log_of(run: dict, program: str, nth: int = 0) -> str:
    chosen = [r for r in run["results"] if r["program"] == program][nth]
    return Path(chosen["log"]).read_text(encoding="utf-8", errors="replace")


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_readme_recipe_runs_as_written(recipe_run):
    results = recipe_run["results"]
    failed = next((r for r in results if r["rc"]), None)
    detail = Path(failed["log"]).read_text(errors="replace")[-3000:] if failed else ""
    assert failed is None, f"README.md:{failed['line']} exited {failed['rc']}: {failed['text']}\n{detail}"
    assert len(results) == len(recipe_run["steps"])


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_two_process_launch_trains_once_over_split_data(recipe_run):
    """docs/pipeline.md's launch without ``device=cpu`` once ran two whole trainings side by side,
    each printing its packing line and training every micro-batch. Now the processes form one
    group: one packing line, and each process takes half of the one-process run's micro-batches."""
    out = recipe_run["work"] / "outputs/offline/cpu/aria"
    launched = log_of(recipe_run, "scripts/run_offline.py", 1)
    assert launched.count("[train] prefix-tree packing") == 1, launched[-3000:]
    one = (out / "twenty_questions_subset/metrics.jsonl").read_text().splitlines()
    two = (out / "twenty_questions_subset-2proc/metrics.jsonl").read_text().splitlines()
    assert len(two) == len(one) // 2 and len(two) >= 1


@pytest.mark.subprocess
@pytest.mark.slow
def test_no_run_of_the_recipe_replaced_another(recipe_run):
    """Each training wrote its own folder (named by method and data), the merge is of the adapter
    trained, the reward model is its own and the evaluation counted the games it was asked for."""
    from aria.llm.merge_record import stale_merge

    work = recipe_run["work"]
    offline = work / "outputs/offline/cpu"
    assert json.loads((offline / "aria/twenty_questions_subset/final/aria_training.json").read_text())["config"]["method"] == "aria"
    assert json.loads((offline / "archer/twenty_questions_subset/final/aria_training.json").read_text())["config"]["method"] == "archer"
    assert stale_merge(offline / "aria/twenty_questions_subset/merged") is None
    assert (work / "outputs/reward_model/cpu/twenty_questions_subset/final").is_dir()
    assert (work / "outputs/critic/twenty_questions_subset/train.json").is_file()
    summary = json.loads((work / "results/eval/merged/summary.json").read_text())["environments"]
    assert summary["twenty_questions_subset"]["games"] == 16, summary
    # no command left Hydra's own output folder (outputs/<date>/<time>/.hydra) beside what it wrote
    assert not [str(p.relative_to(work)) for p in work.glob("outputs/*") if p.name[:1].isdigit()]
