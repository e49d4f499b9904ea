"""scripts/reevaluate.py: finished models played again on an experiment's evaluation with more
games, paired by target, and the docs' table of it (aria/experiment/tables.py) by hand.

The end-to-end test plays a tiny random model in process (``engine=local``), as the experiment
tests do: a vLLM server cannot start in the test suite's time on CPU."""
import json
import subprocess
import sys
from pathlib import Path

from aria.experiment.tables import reevaluated_lines

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "reevaluate.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO)


def test_the_table_of_a_reevaluation_by_hand():
    # a won 3 of 4 games, b won 1 of 4, on games g0..g3; a alone won g0 and g2, b alone none
    results = {"preset": "small", "game": "twenty_questions_subset", "games": 4, "engine": "vllm", "cpu": "some CPU",
               "eval": {"seed": 7, "temperature": 1.0, "max_tokens": 32}, "compare": [["a", "b"]],
               "models": [{"name": "a", "about": "trained", "game_ids": ["g0", "g1", "g2", "g3"], "won": "1110"},
                          {"name": "b", "about": "warm", "game_ids": ["g3", "g1", "g2", "g0"], "won": "0100"}]}
    lines = reevaluated_lines(results)
    assert "| a | trained | 3 / 4 | 75.0% (30.1–95.4) |" in lines  # Wilson interval of 3/4
    assert "| b | warm | 1 / 4 | 25.0% (4.6–69.9) |" in lines
    # paired by game id, not by position: a alone won g0 and g2, b alone none; (2 - 0) / 4 = +50 points;
    # exact McNemar p = 2 * 0.5**2 = 0.5; Agresti-Min: centre 2/6, se sqrt(3 - 4/6)/6, 1.96 se = 0.499
    row = next(line for line in lines if line.startswith("| a − b |"))
    assert row == "| a − b | 4 | 2 / 0 | +50.0 (−16.6 to +83.2) | 0.5 |"


def test_bad_arguments_are_one_line_and_exit_2_before_any_work(tmp_path):
    for args, message in [(["a"], "models: expected NAME=VALUE, got 'a'"),
                          ([f"a={tmp_path}"], f"models: no model folder (config.json) at a={tmp_path}"),
                          (["--compare", "a:c", f"a={tmp_path}"], "--compare: expected FIRST:SECOND of the models (a)")]:
        done = run("--preset", "small", "--games", "4", "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "out"), *args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith(f"error: {message}"), done.stderr
    assert not (tmp_path / "run").exists()


def test_two_models_play_the_same_targets_and_a_rerun_continues_instead_of_playing_again(tmp_path, tiny_model_dir):
    args = ["--preset", "small", "--games", "3", "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "out"),
            "--set", "engine=local", "--set", "game.max_turns=3", "--set", "eval.max_tokens=8", "--set", "eval.batch_size=3",
            "--about", "first=the tiny model", "--compare", "first:second",
            f"first={tiny_model_dir}", f"second={tiny_model_dir}"]
    done = run(*args)
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    first, second = results["models"]
    assert first["about"] == "the tiny model" and second["about"] == ""
    assert len(first["game_ids"]) == 3 and first["game_ids"] == second["game_ids"]
    assert set(first["won"]) <= {"0", "1"} and len(first["won"]) == 3
    transcripts = [json.loads(line) for line in (tmp_path / "run" / "first.jsonl").read_text().splitlines()]
    targets = {g["game_id"]: g["target"] for g in transcripts}
    assert targets == {g["game_id"]: g["target"] for g in map(json.loads, (tmp_path / "run" / "second.jsonl").open())}
    before = (tmp_path / "run" / "first.jsonl").read_bytes()
    again = run(*args)  # every game is done: nothing is played again, the same results
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "run" / "first.jsonl").read_bytes() == before
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == results
    assert any(line.startswith("| first − second | 3 |") for line in reevaluated_lines(results))


def test_a_bar_in_a_models_description_stays_in_its_cell():
    results = {"preset": "small", "game": "g", "games": 1, "engine": "vllm", "cpu": "c", "compare": [],
               "eval": {"seed": 1, "temperature": 1.0, "max_tokens": 8},
               "models": [{"name": "a", "about": "lr 1e-4 | 2 epochs", "game_ids": ["g0"], "won": "1"}]}
    row = next(line for line in reevaluated_lines(results) if line.startswith("| a |"))
    assert row.count(" | ") == 3 and "lr 1e-4 \\| 2 epochs" in row
