"""Secrets never reach a file (aria/secrets.py and the writers of aria/io.py).

The planted-key test runs collection, evaluation, pipeline steps 1-4, offline training, the
reward model and online ARIA with an API key in the environment (and so in every resolved config
that names ``${oc.env:OPENAI_API_KEY}``), with the policy, the oracle and the embedder behind the
scripted OpenAI-compatible server of ``fake_openai.py``, then greps every file written for it.
The server also records the ``Authorization`` headers, which shows that the key was in use.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from aria.io import atomic_write_json, atomic_write_jsonl, atomic_write_text, new_file_mode
from aria.resources import compose_config
from aria.secrets import REDACTED, redact, redact_text, secret_values
from fake_openai import MODEL, Script, last_user, start_server

REPO = Path(__file__).resolve().parents[1]
PLANTED = "sk-planted-7f3a9c1e5b2d"
PLANTED_ENV = {"OPENAI_API_KEY": PLANTED, "HF_TOKEN": "hf_planted_0a1b2c3d4e", "WANDB_API_KEY": "wandb-planted-99887766"}


def test_redaction_rules(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "hunter2hunter2")
    monkeypatch.setenv("SHORT_TOKEN", "abc")  # too short to redact safely
    cfg = {"policy": {"api_key": PLANTED, "base_url": "http://x/v1", "max_new_tokens": 64},
           "oracle": {"api_key": "EMPTY"}, "embedder": {"api_key": None},
           "cli_key": {"hf_token": "hf_given_on_the_command_line"}, "tokenizer": {"pad_token": "<|endoftext|>"},
           "notes": [f"the key {PLANTED} in a sentence", "hunter2hunter2", "abc"]}
    assert redact(cfg) == {"policy": {"api_key": REDACTED, "base_url": "http://x/v1", "max_new_tokens": 64},
                           "oracle": {"api_key": "EMPTY"}, "embedder": {"api_key": None},
                           "cli_key": {"hf_token": REDACTED}, "tokenizer": {"pad_token": "<|endoftext|>"},
                           "notes": [f"the key {REDACTED} in a sentence", REDACTED, "abc"]}
    assert redact_text(f"Bearer {PLANTED}") == f"Bearer {REDACTED}"
    assert "abc" not in secret_values()


def test_writers_redact_and_keep_the_umask(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "config.json", {"oracle": {"api_key": PLANTED}})
        atomic_write_text(tmp_path / "report.md", f"key: {PLANTED}\n")
        atomic_write_jsonl(tmp_path / "games.jsonl", [{"action": PLANTED}])
        for name in ("config.json", "report.md", "games.jsonl"):
            assert PLANTED not in (tmp_path / name).read_text()
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644  # not mkstemp's 0600
        os.umask(0o027)
        assert new_file_mode() == 0o640
        atomic_write_text(tmp_path / "group.txt", "x")
        assert stat.S_IMODE((tmp_path / "group.txt").stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_saved_weights_get_the_umask_not_safetensors_0600(tmp_path, tiny_model_dir):
    """A model folder written whole (aria.io.atomic_folder: merges, final models, the experiment's
    models) and a checkpoint (replace_folder) hold weights readable as the umask allows (before:
    every .safetensors -rw------- under umask 022, unlike every other output)."""
    import torch
    from safetensors.torch import save_file

    from aria.io import atomic_folder
    from aria.llm.policy import load_policy

    old = os.umask(0o022)
    try:
        _, model = load_policy(str(tiny_model_dir))
        with atomic_folder(tmp_path / "model") as tmp:
            model.save_pretrained(tmp)
            save_file({"rng": torch.zeros(2)}, str(tmp / "rng_state_0.safetensors"))
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "model").iterdir()}
        assert modes["model.safetensors"] == modes["rng_state_0.safetensors"] == modes["config.json"] == 0o644, modes
    finally:
        os.umask(old)


def files_holding(root: Path, needles: list[str]) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path.relative_to(root)}: {n[:12]}..." for n in needles if n.encode() in data]
    return found


@pytest.mark.slow
def test_planted_key_reaches_no_file(tmp_path, monkeypatch, tiny_model_dir, tiny_sentence_model_dir):
    for name, value in PLANTED_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    # The policy asks one question; as the oracle, the server answers yes.
    server = start_server(Script(reply=lambda body: "Yes." if "hidden word" in last_user(body) or "secret" in last_user(body).lower()
                                 else "Question: Is it alive?"))
    endpoint = ["policy=endpoint", f"policy.base_url={server.url}", f"policy.model={MODEL}", "policy.max_tokens=8"]
    llm_oracle = ["oracle=llm", f"oracle.base_url={server.url}", f"oracle.model={MODEL}"]
    try:
        # 1. collection: the endpoint policy against the LLM oracle
        from aria.games.family import collect_from_config

        games = tmp_path / "data" / "games.jsonl"
        collect_from_config(compose_config("collect", [*endpoint, *llm_oracle, "num_games=3", "batch_size=3",
                                                       "progress=false", f"out={games}"]))
        # 2. evaluation through its script (a fresh process that inherits the environment)
        done = subprocess.run([sys.executable, str(REPO / "evaluation/evaluate.py"), *endpoint, *llm_oracle,
                               "envs=[twenty_questions]", "num_games=2", "progress=false", f"out={tmp_path / 'eval'}"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert PLANTED not in done.stdout + done.stderr
        # 3. pipeline steps 1-4 with the OpenAI-compatible embedder
        from aria.intention import pipeline

        cfg = compose_config("intention", [f"input={games}", f"run_dir={tmp_path / 'intention'}", "embedder=openai",
                                           f"embedder.base_url={server.url}", f"embedder.api_key={PLANTED}",
                                           "embedder.model=text-embedding-3-small", "clustering.k_max=3"])
        for step in (pipeline.step1_embed_and_cluster, pipeline.step2_select_k, pipeline.step3_apply_labels,
                     pipeline.step4_build_training_set):
            step(cfg, lambda line: None)
        train_file = tmp_path / "intention" / "train.json"
        small = ["device=cpu", "train.mixed_precision=no", "train.epochs=1", "train.micro_batch_size=4",
                 "train.gradient_accumulation_steps=1"]
        # 4. offline REINFORCE, 5. the reward model
        from aria.trainers.offline import OfflineTrainer
        from aria.trainers.reward_model import RewardModelTrainer

        OfflineTrainer(compose_config("reinforce_llm", [f"model.path={tiny_model_dir}", f"data.train_file={train_file}",
                                                        f"output_dir={tmp_path / 'offline'}", *small])).train()
        RewardModelTrainer(compose_config("reward_model", [f"model.path={tiny_model_dir}", f"data.train_file={train_file}",
                                                           f"output_dir={tmp_path / 'rm'}", "data.eval_fraction=0",
                                                           *small])).train()
        # 6. online ARIA with the LLM oracle (the leak: final/aria_training.json held the resolved key)
        from aria.trainers.online import OnlineTrainer

        OnlineTrainer(compose_config("onlinereinforce_llm", [
            f"model.path={tiny_model_dir}", f"output_dir={tmp_path / 'online'}", *llm_oracle, *small,
            "online.rollout_size=2", "online.rollout_batch_size=2", "online.actor_updates=1", "online.iterations=1",
            "online.rm_refresh=0", "rollout.max_new_tokens=4", "logging.progress=false", f"reward_model.init_path={tmp_path / 'rm' / 'final'}"])).train()
    finally:
        server.stop()

    assert f"Bearer {PLANTED}" in server.authorizations  # the key was in use
    assert (tmp_path / "online" / "final" / "aria_training.json").is_file()
    assert json.loads((tmp_path / "online" / "final" / "aria_training.json").read_text())["config"]["oracle"]["api_key"] == REDACTED
    assert files_holding(tmp_path, list(PLANTED_ENV.values())) == []


@pytest.mark.slow
def test_keys_given_to_the_experiment_runner_reach_no_file(tmp_path, tiny_model_dir, tiny_sentence_model_dir):
    """The runner with a key in the environment, one in a top-level override (the LLM oracle's),
    one inside ``intention_overrides`` (the embedder's) and one inside ``train_overrides`` (the
    environment's Hugging Face token inside a run name: no trainer setting is named like a secret,
    aria/settings.py, so there the rule by value must catch it): the
    run uses them (the server saw the oracle's and the embedder's), and no file under the run
    folder, the results folder or the working folder holds any (before: ``experiment.json`` and
    ``trained_on.json`` kept the override strings as they were given)."""
    from test_experiment import tiny_overrides

    top, inner, train = "sk-top-level-5e6f7a8b9c", "sk-in-a-list-1a2b3c4d5e", PLANTED_ENV["HF_TOKEN"]
    server = start_server(Script(reply=lambda body: "Yes."))
    overrides = [o for o in tiny_overrides(tmp_path, tiny_model_dir, tiny_sentence_model_dir)
                 if not o.startswith(("intention_overrides=", "train_overrides="))]
    overrides += [
        "iterations=1", "methods=[aria]", "grad_variance.enabled=false",
        "oracle=llm", f"oracle.base_url={server.url}", f"oracle.model={MODEL}", f"oracle.api_key={top}",
        f"intention_overrides=['embedder=openai','embedder.base_url={server.url}','embedder.model=m',"
        f"'embedder.api_key={inner}','clustering.k_max=4']",
        "train_overrides=['train.mixed_precision=no','train.epochs=1','train.micro_batch_size=4',"
        f"'train.gradient_accumulation_steps=1','logging.run_name=run-{train}']",
    ]
    try:
        done = subprocess.run([sys.executable, str(REPO / "scripts/run_experiment.py"), "--config-name", "experiment",
                               *overrides], capture_output=True, text=True, timeout=900, cwd=tmp_path,
                              env={**os.environ, **PLANTED_ENV})
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Bearer {top}" in server.authorizations and f"Bearer {inner}" in server.authorizations
    assert (tmp_path / "run" / "experiment.json").is_file() and (tmp_path / "results" / "table.md").is_file()
    assert files_holding(tmp_path, [top, inner, train, *PLANTED_ENV.values()]) == []
    assert not [k for k in (top, inner, train, *PLANTED_ENV.values()) if k in done.stdout + done.stderr]
    # the command line is kept with the run (its invocations.json), every key in it redacted
    invocation, = json.loads((tmp_path / "run" / "invocations.json").read_text())
    assert invocation["command"].startswith("python ") and "scripts/run_experiment.py" in invocation["command"]
    assert invocation["command"].count("<redacted>") == 3 and invocation["seconds"] > 0


KEY = "sk-typed-4e5f6a7b8c9d"


@pytest.mark.parametrize("args, shown", [
    # a mistyped group name: Hydra's "Could not override" (its "use +embeder.api_key=..." hint dropped)
    (["reward_aggregation/1_embed_and_cluster.py", f"embeder.api_key={KEY}"], "embeder.api_key: no such setting"),
    # a key inside the runner's override list, under a group that does not take it
    (["scripts/run_experiment.py", "--config-name", "experiment", "run_dir=/tmp/none",
      f"intention_overrides=['embedder.api_key={KEY}']"], "intention_overrides"),
    # a key given as a list: refused without its value
    (["reward_aggregation/1_embed_and_cluster.py", "embedder=openai", f"embedder.api_key=[{KEY}]",
      "embedder.base_url=http://127.0.0.1:9/v1", "input=/no/games.jsonl"], ""),
])
def test_a_key_on_the_command_line_never_reaches_the_terminal(tmp_path, args, shown):
    """Before: Hydra's error and hint lines, and the runner's one line that quotes Hydra, printed
    the key (aria.cli.protect_terminal now redacts both streams of every command)."""
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "OPENAI_API_KEY": ""})
    assert done.returncode != 0
    assert KEY not in done.stdout + done.stderr, (done.stdout + done.stderr)[-2000:]
    assert shown in done.stdout + done.stderr


def test_a_key_given_as_a_list_is_refused_before_any_request():
    from aria.io import ConfigError
    from aria.llm.endpoint import _default_api_key

    with pytest.raises(ConfigError, match="api_key: expected a string .*got a list") as found:
        _default_api_key([KEY])
    assert KEY not in str(found.value)


def test_command_line_secrets_by_hand():
    from aria.secrets import command_line_secrets

    found = command_line_secrets(["oracle.api_key=sk-aaaa1111", "+policy.token='tok-bbbb2222'", "seed=3",
                                  "intention_overrides=['embedder.api_key=sk-cccc3333','k=4']",
                                  "embedder.api_key=[sk-dddd4444]", "policy.api_key=EMPTY"])
    for key in ("sk-aaaa1111", "tok-bbbb2222", "sk-cccc3333", "sk-dddd4444"):
        assert key in found
    assert "EMPTY" not in found and "3" not in found and "4" not in found
