"""Every command's way of stopping (aria/cli.py): bad bytes, NaN vectors, impossible settings and
Ctrl-C give one line and a known exit status (2, or 130 for SIGINT), never a traceback, and bad
settings are caught before a model loads. Commands run as a user runs them, in a subprocess; the
cases that only vary a bad value run the same script in this process (tests/in_process.py)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_openai import MODEL, Script, start_server
from in_process import run_script

REPO = Path(__file__).resolve().parents[1]


def run(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd or REPO, timeout=timeout)


def one_line_error(done: subprocess.CompletedProcess, code: int = 2) -> str:
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    return lines[-1]


MSG = {"actions": ["Is it a cat?"], "obs": ["Yes."], "reward": 0}


def test_bytes_that_are_not_utf8_are_named_by_file_and_line(tmp_path):
    bad = tmp_path / "msgs.jsonl"
    bad.write_bytes(json.dumps(MSG).encode() + b"\n" + b'{"actions": ["Is it a \xff dog?"], "obs": ["No."], "reward": -1}\n')
    line = one_line_error(run("scripts/import_trajectories.py", "--format", "aria_msgs", "--game", "twenty_questions",
                              str(bad), str(tmp_path / "out.jsonl")))
    assert "msgs.jsonl, line 2" in line and "not UTF-8" in line
    # The pipeline reading trajectories, and the trainer reading a training set
    games = tmp_path / "games.jsonl"
    games.write_bytes(b'{"schema_version": 1, \xe9}\n')
    line = one_line_error(run("reward_aggregation/1_embed_and_cluster.py", f"input={games}", f"run_dir={tmp_path / 'run'}"))
    assert "games.jsonl, line 1" in line and "not UTF-8" in line
    train = tmp_path / "train.json"
    train.write_bytes(b'[{"observation": "o", "action": "\xff", "reward": 1.0}]')
    line = one_line_error(run("scripts/run_offline.py", "--config-name", "reinforce_llm", f"data.train_file={train}",
                              f"output_dir={tmp_path / 'off'}", "model.path=/no/model/here"))
    assert "train.json, line 1" in line and "not UTF-8" in line


def test_nan_embeddings_are_refused_at_import_and_at_read(tmp_path):
    path = tmp_path / "msgs.jsonl"
    path.write_text(json.dumps({**MSG}).replace("}", ', "action_embeddings": [[NaN, 1.0]]}') + "\n")
    line = one_line_error(run("scripts/import_trajectories.py", "--format", "aria_msgs", "--game", "twenty_questions",
                              str(path), str(tmp_path / "out.jsonl")))
    assert "msgs.jsonl, line 1, field 'action_embeddings[0][0]': not a finite number" in line
    assert not (tmp_path / "out.jsonl").exists()
    # A trajectory file written by someone else with an infinite component
    from aria.trajectories import make_record

    record = make_record(game_id="g", game="twenty_questions", target="Cat", success=True, turns=[
        {"action": "Question: Is it a cat?", "question": "Is it a cat?", "observation": "Yes.", "reward": 0.0}])
    games = tmp_path / "games.jsonl"
    games.write_text(json.dumps(record).replace('"reward": 0.0}', '"reward": 0.0, "embedding": [1.0, Infinity]}') + "\n")
    line = one_line_error(run("reward_aggregation/1_embed_and_cluster.py", f"input={games}", f"run_dir={tmp_path / 'run'}"))
    assert "games.jsonl, line 1, field 'turns[0].embedding[1]'" in line


@pytest.mark.parametrize(("override", "message"), [
    ("train.optimizer=sgd", "train.optimizer: unknown 'sgd' (known: adam, adamw)"),
    ("train.micro_batch_size=0", "trainer settings: train.micro_batch_size: expected an integer >= 1, got 0"),
    ("train.epochs=0", "trainer settings: train.epochs: expected an integer >= 1, got 0"),  # wrote an untrained final/ with exit 0
    ("loss.name=ppo", "loss.name: unknown 'ppo' (known: clipped_reinforce, reinforce)"),
    ("train.threads=0", "train.threads: expected auto or a number of threads >= 1, got '0'"),
    ("train.threads=all", "train.threads: expected auto or a number of threads >= 1, got 'all'"),
    # each of these trained anyway (exit 0) or failed after the model loaded
    ("train.lr=inf", "trainer settings: train.lr: expected a finite number > 0, got inf"),
    ("train.save_freq=0", "trainer settings: train.save_freq: expected an integer >= 1, got 0"),
    ("train.keep_checkpoints=0", "trainer settings: train.keep_checkpoints: expected an integer >= 1, got 0"),
    ("train.warmup_ratio=2", "trainer settings: train.warmup_ratio: expected a finite number >= 0 and <= 1, got 2.0"),
    ("train.max_grad_norm=-1", "trainer settings: train.max_grad_norm: expected a finite number >= 0 (0: no clipping), got -1.0"),
    ("logging.log_every=0", "trainer settings: logging.log_every: expected an integer >= 1, got 0"),
    ("data.max_samples=0", "trainer settings: data.max_samples: expected an integer >= 1 (null: all), got 0"),
    ("data.max_prompt_tokens=0", "trainer settings: data.max_prompt_tokens: expected an integer >= 1, got 0"),
    # before: a traceback at the first optimizer step, and after the model loaded
    ("train.betas=[0.9]", "trainer settings: train.betas: expected a list of 2 numbers, got [0.9]"),
    ("logging.report_to=bogus", "trainer settings: logging.report_to: expected one of null, tensorboard, wandb, mlflow, "
                                "comet_ml, aim, clearml, dvclive, swanlab, trackio, all, got 'bogus'"),
])
def test_impossible_training_settings_stop_before_the_model_loads(tmp_path, override, message):
    # model.path names no model: a check that came after loading would fail on the path instead.
    # In this process (the script through a subprocess: the training set test above)
    line = one_line_error(run_script(REPO / "scripts/run_offline.py", "--config-name", "reinforce_llm", override,
                                     "model.path=/no/model", f"data.train_file={tmp_path / 'missing.json'}",
                                     f"output_dir={tmp_path / 'out'}"))
    assert line == f"error: {message}"
    assert not (tmp_path / "out" / "final").exists()


def test_fp8_without_a_cuda_device_stops_before_the_data_and_the_model(tmp_path):
    """Before: accelerate's ValueError traceback when the trainer built its accelerator (the
    adversarial pass: ``train.mixed_precision=fp8`` without transformer_engine or torchao)."""
    line = one_line_error(run_script(REPO / "scripts/run_offline.py", "--config-name", "reinforce_llm",
                                     "train.mixed_precision=fp8", "device=cpu", "model.path=/no/model",
                                     f"data.train_file={tmp_path / 'missing.json'}", f"output_dir={tmp_path / 'out'}"))
    assert line == ("error: train.mixed_precision=fp8 needs a CUDA device (this process sees none or device=cpu); "
                    "use auto, bf16 or no")
    assert not (tmp_path / "out").exists()


def test_a_model_path_that_is_no_folder_is_one_line(tmp_path):
    """Before: transformers' hub traceback, exit 1."""
    train = tmp_path / "train.json"
    train.write_text(json.dumps([{"observation": "Is it?", "action": "Question: Is it a cat?", "reward": 1.0}]))
    line = one_line_error(run_script(REPO / "scripts/run_offline.py", "--config-name", "reinforce_llm", "model.path=/no/model",
                                     f"data.train_file={train}", f"output_dir={tmp_path / 'out'}"))
    assert line == "error: model.path: '/no/model' is no model folder (give a Hugging Face model folder, or embedded)"


def test_importer_refuses_mismatched_games_and_folders(tmp_path):
    path = tmp_path / "msgs.jsonl"
    path.write_text(json.dumps(MSG) + "\n")
    line = one_line_error(run("scripts/import_trajectories.py", "--format", "aria_msgs", "--game", "negotiation",
                              str(path), str(tmp_path / "o.jsonl")))  # was KeyError: 'prompt'
    assert "negotiation is a two-player game" in line
    line = one_line_error(run("scripts/import_trajectories.py", "--format", "aria_two_player", "--game",
                              "twenty_questions", str(path), str(tmp_path / "o.jsonl")))  # was accepted
    assert "twenty_questions is a single-agent game" in line
    (tmp_path / "folder").mkdir()
    line = one_line_error(run("scripts/import_trajectories.py", "--format", "aria_msgs", "--game", "twenty_questions",
                              str(tmp_path / "folder"), str(tmp_path / "o.jsonl")))  # was IsADirectoryError
    assert "folder: is a folder, not a file" in line
    line = one_line_error(run("scripts/import_trajectories.py", "--format", "aria_msgs", "--game", "twenty_questions",
                              str(path), str(tmp_path / "folder")))
    assert "folder is a folder" in line
    (tmp_path / "a_file").write_text("x")  # the output's folder is a file: was a FileExistsError traceback
    line = one_line_error(run("scripts/import_trajectories.py", "--format", "aria_msgs", "--game", "twenty_questions",
                              str(path), str(tmp_path / "a_file" / "o.jsonl")))
    assert "a file stands where a folder is needed" in line
    line = one_line_error(run("scripts/import_trajectories.py", "--format", "aria_msgs", "--game", "twenty_questions",
                              str(path), str(path)))  # was: the input overwritten, exit 0
    assert "is the input file" in line and json.loads(path.read_text()) == MSG


def test_negative_game_count_and_compare_help(tmp_path):
    line = one_line_error(run("scripts/collect_games.py", "num_games=-3", f"out={tmp_path / 'c.jsonl'}",
                              "policy.model_path=/no/model"))  # reported '-3/-3 games done', exit 0
    assert line == "error: collect: num_games: expected an integer >= 0 and <= 1_000_000, got -3"
    done = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "compare", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "usage: compare.py" in done.stdout and "results" in done.stdout


def test_argument_types_with_ranges_by_hand(capsys):
    """aria.cli.number and torch_device: argparse's one line and exit 2, before anything loads."""
    import argparse

    from aria.cli import number, torch_device

    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--n", type=number(int, ge=1))
    parser.add_argument("--share", type=number(float, ge=0, le=1))
    parser.add_argument("--device", type=torch_device)
    assert vars(parser.parse_args(["--n", "1", "--share", "1", "--device", "cuda:1"])) == {"n": 1, "share": 1.0, "device": "cuda:1"}
    for args, message in [(["--n", "0"], "argument --n: expected an integer >= 1, got 0"),
                          (["--n", "two"], "argument --n: expected an integer, got 'two'"),
                          (["--share", "nan"], "argument --share: expected a finite number >= 0 and <= 1, got nan"),
                          (["--device", "gpu"], "argument --device: expected a torch device (cpu, cuda, cuda:1), got 'gpu'")]:
        with pytest.raises(SystemExit) as stop:
            parser.parse_args(args)
        assert stop.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"p: error: {message}"


@pytest.mark.parametrize(("args", "message"), [
    ([str(REPO / "scripts/grouping_schemes.py"), "run", "--threshold", "2"],
     "argument --threshold: expected a finite number > 0 and < 1, got 2"),
    ([str(REPO / "scripts/grouping_schemes.py"), "run", "--threshold", "1"],  # before: a traceback after the work
     "argument --threshold: expected a finite number > 0 and < 1, got 1"),
    ([str(REPO / "scripts/serve_reward_model.py"), "m", "--batch-size", "0"], "argument --batch-size: expected an integer >= 1, got 0"),
    ([str(REPO / "scripts/behavioural_intentions.py"), "games.jsonl", "--game", "bargaining"],
     "error: --game: bargaining has no offline oracle (facts_file) to compute behavioural intentions from"),
    ([str(REPO / "scripts/merge_lora.py"), "adapter", "out"], "error: adapter has no adapter_config.json (is it a LoRA output?)"),
])
def test_the_analysis_scripts_refuse_bad_arguments_in_one_line(tmp_path, args, message):
    """Before: tracebacks (a threshold of 2, a two-player game) or a server serving batches of 0."""
    line = one_line_error(run(*args, cwd=tmp_path))
    assert line.endswith(message), line


def test_a_games_file_of_another_policy_is_refused_before_the_vllm_server_starts(tmp_path):
    """The default policy (a vLLM server of the run's own) starts its server at its first request,
    after the games file's producer is checked: a file of another policy's games costs one line,
    not a server start (minutes for a large model). Here the scripted expert made the file."""
    from aria.trajectories import read_trajectories

    out, log = tmp_path / "games.jsonl", tmp_path / "vllm.log"
    common = ["game=twenty_questions_subset", "num_games=1", "progress=false", f"out={out}"]
    assert run_script(REPO / "scripts/collect_games.py", *common, "policy=scripted").returncode == 0
    line = one_line_error(run_script(REPO / "scripts/collect_games.py", *common, f"policy.log={log}"))
    assert "holds games made under other settings" in line and "force_new" in line, line
    assert not log.exists()  # no server was started
    assert len(list(read_trajectories(out))) == 1  # the scripted game is kept


def test_collection_with_an_endpoint_logs_no_line_per_request(tmp_path):
    server = start_server(Script(reply=lambda body: "Question: Is it alive?"))
    try:
        done = run("scripts/collect_games.py", "policy=endpoint", f"policy.base_url={server.url}", f"policy.model={MODEL}",
                   "num_games=2", "progress=false", f"out={tmp_path / 'games.jsonl'}")
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    assert "HTTP Request" not in done.stdout + done.stderr
    assert len(server.requests) >= 40  # 2 games of 20 turns: the requests happened, their lines did not


def as_if_from_a_terminal() -> None:
    """Run in the child before exec: Ctrl-C's default action. A test run started as a background
    job (``cmd &`` in a script) inherits SIGINT ignored, and Python then installs no
    KeyboardInterrupt handler, so the signal would never reach the command under test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_when(proc: subprocess.Popen, ready, timeout: float = 120) -> subprocess.CompletedProcess:
    deadline = time.monotonic() + timeout
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, "the command finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


WAITING_COMMAND = """
import sys, time
from aria.cli import command
with command(kept=lambda: "the test's work"):
    try:
        print("ready", flush=True)
        time.sleep(120)
    finally:  # where a command stops the servers it started
        open(sys.argv[1], "w").write("cleaned up")
"""


def test_sigterm_stops_a_command_as_ctrl_c_does(tmp_path):
    """SIGTERM is how ``kill`` and cluster schedulers stop a job: the command ends as on Ctrl-C,
    its ``finally`` blocks run (its servers are stopped), one line, exit 143 (128 + SIGTERM)."""
    proc = subprocess.Popen([sys.executable, "-c", WAITING_COMMAND, str(tmp_path / "cleanup")], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    line = one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), code=143)
    assert line == "interrupted: the test's work kept; re-run the same command to resume"
    assert (tmp_path / "cleanup").read_text() == "cleaned up"


def test_ctrl_c_before_the_command_starts_its_work_is_one_line():
    """Before: a Ctrl-C while Hydra composed the settings (0.2-0.3 s in) printed Python's
    KeyboardInterrupt traceback (the adversarial pass). Here the Ctrl-C comes right after
    protect_terminal, where a command's __main__ calls it, and before any command() block."""
    program = ("import sys; sys.argv = ['x', 'game=y']\n"
               "from aria.cli import protect_terminal, check_command_line\n"
               "protect_terminal()\n"
               "print('ready', flush=True)\n"
               "import time; time.sleep(60)\n"
               "check_command_line('collect')\n")
    proc = subprocess.Popen([sys.executable, "-c", program], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_if_from_a_terminal)
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    # Python ends an unhandled Ctrl-C by SIGINT itself, which a shell's $? reads as 130
    line = one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), code=-signal.SIGINT)
    assert line == "interrupted: before any work; nothing was written" and err.count("\n") == 1


def test_ctrl_c_during_collection_keeps_games_and_says_how_to_resume(tmp_path):
    server = start_server(Script(reply=lambda body: "Question: Is it alive?", delay_s=0.02))
    out = tmp_path / "games.jsonl"
    try:
        proc = subprocess.Popen([sys.executable, "scripts/collect_games.py", "policy=endpoint", f"policy.base_url={server.url}",
                                 f"policy.model={MODEL}", "num_games=40", "batch_size=2", "progress=false", f"out={out}"],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=as_if_from_a_terminal)
        done = interrupt_when(proc, lambda: out.is_file() and out.read_text().count("\n") >= 2)
    finally:
        server.stop()
    line = one_line_error(done, code=130)
    kept = out.read_text().count("\n")
    assert line == f"interrupted: {kept} finished game(s) in {out} kept; re-run the same command to resume"


def test_ctrl_c_during_training_keeps_checkpoints(tmp_path, tiny_model_dir):
    train = tmp_path / "train.json"
    train.write_text(json.dumps([{"observation": f"Question {i}: Is it an animal?", "action": "Question: Is it big?",
                                  "reward": 0.5} for i in range(400)]))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "scripts/run_offline.py", "--config-name", "reinforce_llm",
                             f"model.path={tiny_model_dir}", f"data.train_file={train}", f"output_dir={out}", "device=cpu",
                             "train.mixed_precision=no", "train.micro_batch_size=2", "train.gradient_accumulation_steps=1",
                             "train.save_freq=1", "train.epochs=5"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_if_from_a_terminal)
    done = interrupt_when(proc, lambda: any(p for p in (out / "checkpoints").glob("step-*") if not p.name.endswith(".tmp"))
                          if (out / "checkpoints").is_dir() else False)
    line = one_line_error(done, code=130)
    assert line.startswith("interrupted: checkpoints up to step ") and f"in {out / 'checkpoints'} kept" in line


# ---- the experiment runner: every bad setting and unusable path is one line, before any work ----------
BAD_EXPERIMENT_SETTINGS = [
    (["engine=bogus"], "experiment: engine: expected one of vllm, local, got 'bogus'"),
    # these failed only when first used: after the expert's games, at the first training
    (["base_model=/no/model"], "base_model: '/no/model' is no model folder"),
    # before: refused after two stages had written (a folder), or accepted (an adapter, then a second adapter on it)
    ([f"base_model={REPO / 'docs'}"], f"base_model: '{REPO / 'docs'}' holds no config.json"),
    (["launcher=bogus launch"], "launcher: 'bogus launch' does not start with a command on PATH"),
    (["iterations=0"], "iterations: expected a whole number >= 1, got 0"),
    (["iterations=-1"], "iterations: expected a whole number >= 1, got -1"),
    (["+iterations_by_method.aria=0"], "iterations_by_method.aria: expected a whole number >= 1, got 0"),
    (["methods=[aria,bogus]"], "methods: unknown ['bogus']"),
    (["eval.games=0"], "experiment: eval.games: expected an integer >= 1 and <= 1_000_000, got 0"),
    # a key or a type the schema does not have (aria/settings.py), here and inside the override lists
    (["eval.games=many"], "experiment: eval.games: Value 'many' of type 'str' could not be converted to Integer"),
    (["+eval.gmes=5"], "experiment: eval.gmes: not a setting of this command"),
    (["train_overrides=['train.epochs=3','train.lr=fast']"],
     "train_overrides: train.lr: Value 'fast' of type 'str' could not be converted to Float"),
    (["intention_overrides=['selection.fixed_k=twenty']"],
     "intention_overrides: selection.fixed_k: expected null, a whole number >= 1 or {pool: k}, got 'twenty'"),
    (["intention_overrides=['selection.fixed_k={questions: 5, answers: 3}']"],  # a game of one pool
     "intention_overrides: selection.fixed_k: pool(s) ['answers'] not in the game's ['questions']"),
    (["train_overrides=['train.epocs=3']"], "train_overrides: train.epocs: no such setting (misspelt? "),
    # a two-player game given to a question-game preset (before: KeyError: 'prompt')
    (["game=bargaining"], "warm_start.enabled: the scripted expert plays question games, not bargaining"),
    (["experiment=bargaining", "eval.config_set=nope"], "eval.config_set: config/game/bargaining.yaml has no config set 'nope'"),
    (["experiment=bargaining", "game.structured_output=bogus"],
     "bargaining: structured_output must be one of ('none', 'json_schema'), got 'bogus'"),
    (["experiment=bargaining", "game.reply_schema.offer_steps=0"],
     "bargaining: reply_schema.offer_steps must be a whole number from 1 to 1,000, got 0"),
    (["experiment=bargaining", "game.reply_schema.message_chars=-1"],
     "bargaining: reply_schema.message_chars must be a whole number from 1 to 10,000, got -1"),
    # absurd sizes are refused with the limit, not built for minutes
    (["experiment=bargaining", "game.reply_schema.offer_steps=1000000000"],
     "bargaining: reply_schema.offer_steps must be a whole number from 1 to 1,000, got 1000000000"),
    # a seed twice: one training run counted as two, a method-level interval of zero width (found by a review)
    (["seeds=[0,0]"], "seeds: each seed once, got [0, 0]"),
    (["seeds=[0,1]", "+seeds_by_method.aria=[1,1]"], "seeds_by_method.aria: expected a non-empty list of some of seeds [0, 1], each once, got [1, 1]"),
]


def run_experiment_command(overrides: list[str], capsys) -> tuple[int, str]:
    """The runner as its script runs it (``aria.cli.command`` around ``aria.experiment.runner.run``),
    in this process: the exit status and what it printed to stderr."""
    from aria.experiment import runner as experiment
    from aria.cli import command
    from aria.resources import compose_config

    with pytest.raises(SystemExit) as stop:
        with command(kept=lambda: "nothing"):
            experiment.run(compose_config("experiment", overrides), lambda line: None)
    return stop.value.code, capsys.readouterr().err


@pytest.mark.parametrize(("overrides", "message"), BAD_EXPERIMENT_SETTINGS)
def test_a_bad_experiment_setting_is_one_line_before_any_work(tmp_path, capsys, overrides, message):
    code, err = run_experiment_command([f"run_dir={tmp_path / 'run'}", f"results_dir={tmp_path / 'results'}",
                                        *overrides], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"error: {message}"), err
    assert not (tmp_path / "run").exists()  # nothing written: the check comes before the first stage


def test_bad_experiment_settings_through_the_script(tmp_path):
    """The same through ``scripts/run_experiment.py`` as a user runs it (before: a 20-line
    traceback above the useful line): one case in a process of its own, which is the script's
    subject; the other cases run in this process above."""
    for overrides, message in (BAD_EXPERIMENT_SETTINGS[-1],):
        done = run("scripts/run_experiment.py", "--config-name", "experiment", f"run_dir={tmp_path / 'run'}",
                   f"results_dir={tmp_path / 'results'}", *overrides)
        assert one_line_error(done) == f"error: {message}"


def test_a_results_dir_among_the_runs_own_folders_is_one_line(tmp_path, capsys):
    """Before: accepted, the table written among the run's files (run_dir/results stays allowed)."""
    for results in (tmp_path / "run", tmp_path / "run" / "s0", tmp_path / "run" / "warm" / "table"):
        code, err = run_experiment_command([f"run_dir={tmp_path / 'run'}", f"results_dir={results}"], capsys)
        assert code == 2 and err.startswith(f"error: results_dir: {results} is the run folder or one of its stages'"), err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("script, args, message", [
    # games of no turn were recorded as finished losses
    ("scripts/collect_games.py", ["game=twenty_questions_subset", "policy=scripted", "game.max_turns=0"],
     "error: game twenty_questions_subset: max_turns: expected an integer >= 1, got 0"),
    # an arm no one can run made no paired test and no complaint, after the warm start had trained
    ("scripts/run_experiment.py", ["--config-name", "experiment", "report.paired=[aria,nope]"],
     "error: report.paired: unknown ['nope'] (known: "),
    # KeyError traceback
    ("scripts/run_online.py", ["--config-name", "onlinereinforce_llm", "reward_model.serve.name=nope"],
     "error: reward_model.serve.name: unknown 'nope' (known: http, in_process)"),
    # named after the policy had loaded
    ("scripts/run_online.py", ["--config-name", "onlinereinforce_llm", "reward_model.init_path=/no/rm"],
     "error: reward_model.init_path: '/no/rm' is no model folder"),
    # a key no labelling setting has, or a value out of range: accepted, then a failure at the
    # first labelling, after a whole iteration of play and training
    ("scripts/run_online.py", ["--config-name", "onlinereinforce_llm", "online.intention_overrides=['clustering.kmax=6']"],
     "error: online.intention_overrides: "),
    ("scripts/run_online.py", ["--config-name", "onlinereinforce_llm", "online.intention_overrides=['aggregation.gamma=2']"],
     "error: online.intention_overrides: aggregation.gamma: expected "),
    # a KeyError in the question expert's game builder
    ("scripts/collect_games.py", ["game=bargaining", "policy=scripted"], "error: policy=scripted is the question games' expert"),
    # a list as the key: accepted, the model loaded and played until the labelling built its client
    ("scripts/run_online.py", ["--config-name", "onlinereinforce_llm",
                               "online.intention_overrides=['embedder=openai','embedder.api_key=[sk-LISTKEY12345678]']"],
     "error: online.intention_overrides: embedder.api_key: expected a string (the key itself), got a list"),
    # step 1 does not choose k, but one config serves all four steps: refused at step 2, after the embedding
    ("reward_aggregation/1_embed_and_cluster.py", ["selection.criterion=nope", "input=/no/games.jsonl"],
     "error: selection.criterion: unknown 'nope' (known: split_score, silhouette, calinski_harabasz, davies_bouldin"),
])
def test_the_adversarial_passs_late_or_missing_refusals_are_one_line(tmp_path, script, args, message):
    done = run_script(REPO / script, *args, f"out={tmp_path / 'g.jsonl'}" if "collect" in script else
                      f"output_dir={tmp_path / 'o'}" if "online" in script else f"run_dir={tmp_path / 'run'}")
    assert one_line_error(done) .startswith(message), done.stderr[-2000:]
    assert "Loading weights" not in done.stderr  # before any model loads


def test_a_list_valued_key_is_never_echoed(tmp_path):
    done = run_script(REPO / "scripts/run_online.py", "--config-name", "onlinereinforce_llm",
                      "online.intention_overrides=['embedder=openai','embedder.api_key=[sk-LISTKEY12345678]']",
                      f"output_dir={tmp_path / 'o'}")
    assert "LISTKEY" not in done.stderr + done.stdout and not (tmp_path / "o").exists()


def test_a_weighted_mse_whose_extremes_overlap_is_one_line(tmp_path):
    """low above high weighs every target as an extreme (the plain MSE doubled): it trained to the
    end, exit 0. Refused with the other settings, before the data and the model."""
    done = run_script(REPO / "scripts/train_rm.py", "loss.weighted_mse.low=0.9", "loss.weighted_mse.high=0.1",
                      "model.path=/no/model", f"data.train_file={tmp_path / 'missing.json'}", f"output_dir={tmp_path / 'rm'}")
    assert one_line_error(done) == "error: loss.weighted_mse: low (0.9) is above high (0.1): the extremes are below low and above high"
    done = run_script(REPO / "scripts/train_rm.py", "loss.weighted_mse.extreme_weight=-1",
                      "model.path=/no/model", f"data.train_file={tmp_path / 'missing.json'}", f"output_dir={tmp_path / 'rm'}")
    assert "loss.weighted_mse.extreme_weight: expected a finite number >= 0, got -1.0" in one_line_error(done)


@pytest.mark.parametrize("targets, message", [
    ("[nope_proj]", "names no module of"), ("[]", "is empty")])
def test_lora_target_modules_are_checked_before_the_weights_load(tmp_path, tiny_model_dir, targets, message):
    """Refused after the model had loaded (a peft traceback, then one late line): now from the
    model's config, built on the meta device."""
    train = tmp_path / "train.json"
    train.write_text(json.dumps([{"observation": "o", "action": "a", "reward": 1.0}]))
    done = run_script(REPO / "scripts/run_offline.py", "--config-name", "reinforce_llm", f"model.path={tiny_model_dir}",
                      f"model.lora.target_modules={targets}", f"data.train_file={train}", f"output_dir={tmp_path / 'o'}")
    line = one_line_error(done)
    assert line.startswith("error: model.lora.target_modules: ") and message in line, line
    assert "Loading weights" not in done.stderr, done.stderr[-2000:]


def test_an_empty_out_is_one_line():
    """Before: ValueError("PosixPath('.') has an empty name"), a traceback."""
    assert one_line_error(run_script(REPO / "scripts/collect_games.py", "game=twenty_questions_subset", "policy=scripted",
                                     "out=''")) == "error: collect: out: expected a non-empty path, got ''"


def test_a_merge_under_a_file_is_refused_before_the_models_load(tmp_path, tiny_model_dir):
    from aria.io import ConfigError
    from aria.llm.policy import load_policy, merge_lora

    _, model = load_policy(str(tiny_model_dir), lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"]})
    model.save_pretrained(tmp_path / "adapter")
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ConfigError, match=r"OUT_DIR: .*merged lies under .*a_file, a file"):
        merge_lora(tmp_path / "adapter", tmp_path / "a_file" / "merged", base=str(tiny_model_dir))


def test_a_lora_adapter_as_base_model_is_one_line(tmp_path, capsys):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    code, err = run_experiment_command([f"run_dir={tmp_path / 'run'}", f"base_model={adapter}"], capsys)
    assert code == 2 and err == f"error: base_model: '{adapter}' is a LoRA adapter, not a whole model: give the model it " \
                                 "was trained from, or its merge (scripts/merge_lora.py)\n", err
    assert not (tmp_path / "run").exists()


def test_a_run_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    taken = tmp_path / "run"
    taken.write_text("not a folder")
    code, err = run_experiment_command([f"run_dir={taken}", f"results_dir={tmp_path / 'results'}"], capsys)
    assert code == 2 and err == (f"error: {taken}: File exists: a file stands where a folder is needed: "
                                 "give another path, or move the file\n")
    assert taken.read_text() == "not a folder"


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder this process cannot write: a read-only tmpfs for root (whom permissions do not
    stop), else a folder without write permission."""
    import os

    folder = tmp_path / "read-only"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True, text=True)
    assert mounted.returncode == 0, f"root could not mount a tmpfs: {mounted.stderr}"
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.parametrize("which", ["run_dir", "results_dir"])
def test_a_read_only_run_or_results_folder_is_one_line_before_any_work(tmp_path, capsys, read_only_dir, which):
    paths = {"run_dir": tmp_path / "run", "results_dir": tmp_path / "results", which: read_only_dir / "x"}
    code, err = run_experiment_command([f"{k}={v}" for k, v in paths.items()], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {read_only_dir / 'x'}: ") and "give a folder" in err, err
    assert not (tmp_path / "run").exists() or which == "results_dir" and not any((tmp_path / "run").iterdir())


@pytest.mark.parametrize("script, args, message", [
    ("scripts/run_experiment.py", ["--config-name", "experiment", "oracle=nope"],
     "error: In 'experiment': Could not find 'oracle/nope' (known: flan_t5, knowledge_base, llm)"),
    ("scripts/collect_games.py", ["game=nope"], "error: In 'collect': Could not find 'game/nope' (known: bargaining, "),
    ("reward_aggregation/1_embed_and_cluster.py", ["embeder.model=x"], "error: embeder.model: no such setting (misspelt? "),
    ("scripts/run_offline.py", ["--config-name", "reinforce_llm", "train.lr=="], "error: Error parsing override 'train.lr=='"),
    # before: Hydra's ValueError traceback (found by the adversarial pass)
    ("scripts/collect_games.py", ["=2"], "error: Config group override must be a string or a list. Got int"),
])
def test_an_unknown_option_or_key_of_the_command_line_is_one_line(script, args, message):
    """Before: Hydra's own message, 5 to 16 lines (the options one a line, its config search path),
    and exit 1 (aria.cli.check_command_line composes the command line first)."""
    done = run(script, *args)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), done.stderr


@pytest.mark.parametrize("script, args, setting", [
    ("scripts/run_offline.py", ["--config-name", "reinforce_llm", "seed=7"], "seed: 7"),  # through aria.cli.hydra_command
    ("scripts/run_experiment.py", ["--config-name", "experiment", "-h", "experiment=replicated"], "name: replicated"),  # hydra.main
    ("reward_aggregation/1_embed_and_cluster.py", [], "embedder:"),
    ("aria/trainers/launch.py", ["--config-dir", "config", "--config-name", "reinforce_llm"], "seed: 0"),  # as launchers run it
])
def test_help_says_what_the_command_does_then_every_setting(script, args, setting):
    """--help: the script's docstring first, then its settings as the command line composes them
    (before: "launch is powered by Hydra." and Hydra's template, the command's purpose nowhere)."""
    import ast

    command = ["-m", script.removesuffix(".py").replace("/", ".")] if script.startswith("aria/") else [script]
    done = run(*command, *args, *([] if "-h" in args else ["--help"]))
    assert done.returncode == 0, done.stderr[-2000:]
    first = ast.get_docstring(ast.parse((REPO / script).read_text())).splitlines()[0]
    assert done.stdout.splitlines()[0] == first and "powered by Hydra" not in done.stdout
    settings = done.stdout.split("== Every setting, as this command line composes it ==", 1)[1]
    assert setting in settings.splitlines(), settings[:500]


def test_an_unusable_output_file_is_refused_before_the_models_load(tmp_path):
    """movement.py's --out and grad_variance.py's grad_variance.out: a folder, or a path under a
    file, is one line before any model or data is read (before: after the models' work, the error
    naming the temporary file)."""
    (tmp_path / "a_file").write_text("x")
    for out, message in [(tmp_path, "is a folder; give the file to write"), (tmp_path / "a_file" / "r.json", "a_file")]:
        line = one_line_error(run_script(REPO / "scripts/movement.py", "/no/parent", "/no/child", "/no/steps.json",
                                         "--out", str(out)))
        assert line.startswith("error: ") and message in line and "/no/" not in line, line
        line = one_line_error(run_script(REPO / "scripts/grad_variance.py", "data.train_file=/no/train.json",
                                         f"grad_variance.out={out}"))
        assert message in line and "/no/" not in line, line
