"""Pipeline steps 1-4 end to end: the original's negotiation sample (its own 1536-d embeddings)
through the real scripts, and collected Twenty Questions games embedded by a tiny random
sentence-transformers model built in the test. Also resume, determinism and bad input."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from aria.games.importers import import_file
from aria.games.question.game import target_schedule
from aria.games.question.oracle import build_oracle
from aria.games.question.play import game_id, play_games
from aria.intention import pipeline
from aria.io import ConfigError, DataError
from aria.resources import compose_config
from aria.trajectories import make_record, write_trajectories
from conftest import ORIGINAL_SAMPLES, ScriptedPolicy

REPO = Path(__file__).resolve().parents[1]
NEGOTIATION = ORIGINAL_SAMPLES / "aria_sample_llama3-8b_negotiation_embedding_msgs.jsonl"
OUTPUTS = ("utterances.json", "embeddings.npz", "labels.npz", "selection.json", "labelled.jsonl", "train.json")


def config(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "config"), version_base="1.3"):
        return OmegaConf.to_container(compose("intention", overrides=list(overrides)), resolve=True)


def run_all(cfg: dict, echo=lambda line: None) -> None:
    for step in (pipeline.step1_embed_and_cluster, pipeline.step2_select_k,
                 pipeline.step3_apply_labels, pipeline.step4_build_training_set):
        step(cfg, echo)


@pytest.fixture(scope="module")
def negotiation_trajectories(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("negotiation") / "games.jsonl"
    import_file(NEGOTIATION, "aria_two_player", "negotiation", out_path=out)
    return out


def test_negotiation_sample_through_the_scripts(tmp_path, negotiation_trajectories):
    run_dir = tmp_path / "run"
    args = ["game=negotiation", f"input={negotiation_trajectories}", f"run_dir={run_dir}"]
    lines = []
    for script in ("reward_aggregation/1_embed_and_cluster.py", "clustering/2_select_k.py",
                   "clustering/3_apply_labels.py", "clustering/4_build_training_set.py"):
        done = subprocess.run([sys.executable, str(REPO / script), *args], capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        lines.append(done.stdout)
    assert "wrote" in lines[0] and "chose" in lines[1] and "wrote" in lines[3]

    summary = json.loads((run_dir / "utterances.json").read_text())
    pool = summary["pools"]["messages"]
    assert pool["embedding"].startswith("precomputed") and pool["dim"] == 1536
    assert summary["num_games"] == 5 and summary["num_steps"] == 73  # 7 + 12 + 13 + 21 + 20 messages, all trained
    labels = np.load(run_dir / "labels.npz")
    n_texts = len(pool["texts"])
    assert labels["ks"].tolist() == list(range(2, min(100, pool["distinct_vectors"]) + 1))
    assert labels["messages"].shape == (len(labels["ks"]), n_texts)
    assert all(len(np.unique(row)) <= k for row, k in zip(labels["messages"], labels["ks"]))

    report = json.loads((run_dir / "selection.json").read_text())
    assert set(report["curves"]) >= {"split_score", "silhouette", "calinski_harabasz", "davies_bouldin",
                                     "variance_aggregated"}
    kept = report["variance"]["kept_steps"]
    assert all(a <= r + 1e-12 for a, r in zip(kept["aggregated"], kept["raw"])) and report["variance"]["claim"]["holds"]
    assert all(a <= report["variance"]["all_steps"]["raw"] + 1e-12 for a in report["variance"]["all_steps"]["aggregated"])
    assert (run_dir / "selection.png").stat().st_size > 10_000

    from datasets import load_dataset

    train = load_dataset("json", data_files=str(run_dir / "train.json"), split="train")
    assert train.num_rows == 73
    assert set(train.column_names) == {"observation", "action", "reward", "step_return", "game", "role", "game_id",
                                  "turn", "q", "v", "kept", "final_reward", "success", "target"}
    assert all(train["kept"]) and set(train["final_reward"]) == {0.5} and not any(train["success"])  # ties
    # Every reward is R~ = a mean of 0.5·γ^(T−t) (every sample game is a 0.5/0.5 no-deal).
    assert all(0 < r <= 0.5 for r in train["reward"])
    # Observations: the role's own system prompt, then the transcript in the original's layout.
    records = [json.loads(line) for line in negotiation_trajectories.read_text().splitlines()]
    first = records[0]
    bob_first = next(s for s in train if s["game_id"] == first["game_id"] and s["role"] == "bob")
    alice, bob = first["turns"][0]["action"], first["turns"][1]["action"]
    assert bob_first["observation"] == first["meta"]["player_2_system_prompt"].lstrip() + "\n\n" + f"Alice: {alice}"
    alice_second = next(s for s in train if s["game_id"] == first["game_id"] and s["turn"] == 2)
    assert alice_second["observation"].endswith(f"\n\nAlice: {alice}\nBob: {bob}")
    assert alice_second["observation"].startswith("You are Alice.")

    # Re-running a finished step does nothing.
    again = subprocess.run([sys.executable, str(REPO / "reward_aggregation/1_embed_and_cluster.py"), *args],
                           capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0 and "up to date" in again.stdout


def test_per_role_pools_and_original_first_action_rule(tmp_path, negotiation_trajectories):
    cfg = config("game=negotiation", f"input={negotiation_trajectories}", f"run_dir={tmp_path}",
                 "clustering.k_max=6",
                 "aggregation.include_first_action=false", "aggregation.mode=adv", "selection.fixed_k=3")
    cfg["game"]["intention"]["channels"] = {"alice": {"cluster": "alice_pool"}, "bob": {"cluster": "bob_pool"}}
    run_all(cfg)
    summary = json.loads((tmp_path / "utterances.json").read_text())
    assert set(summary["pools"]) == {"alice_pool", "bob_pool"}
    steps = json.loads((tmp_path / "train.json").read_text())
    assert len(steps) == 73  # every agent step is written, ...
    train = [s for s in steps if s["kept"]]
    assert len(train) == 73 - 5  # ... but Alice's first message of each game is not kept, and has no reward
    assert all(s["turn"] > 0 for s in train) and all(s["reward"] is None and s["turn"] == 0 for s in steps if not s["kept"])
    assert all(0.0 <= s["reward"] <= 1.0 for s in train) and min(s["reward"] for s in train) == 0.0
    assert json.loads((tmp_path / "selection.json").read_text())["chosen"]["k"] == {"alice_pool": 3, "bob_pool": 3}


QUESTIONS = ["Question: Is it alive?", "Question: Is it an animal?", "Question: Is it man-made?",
             "Question: Is it bigger than a car?", "Question: Is it a fruit?", "Question: Can you eat it?",
             "Question: Is it made of metal?", "Question: Is it found in a kitchen?", "Question: Is it red?",
             "Question: Is it electronic?", "tell me the answer"]


@pytest.fixture(scope="module")
def twenty_questions_games(tmp_path_factory, twenty_questions, game_configs) -> Path:
    """24 games collected with a scripted policy against the knowledge-base oracle; every third wins."""
    rng = np.random.default_rng(3)
    targets = target_schedule(twenty_questions.targets, 24, seed=5)
    script = {}
    for i, target in enumerate(targets):
        questions = [QUESTIONS[j] for j in rng.integers(0, len(QUESTIONS), int(rng.integers(2, 6)))]
        if i % 3 == 0:
            questions.append(f"Question: Is it a {target.name.lower()}?")
        script[game_id("twenty_questions", 5, i)] = questions
    out = tmp_path_factory.mktemp("tq") / "games.jsonl"
    oracle = build_oracle({"name": "knowledge_base"}, game_configs["twenty_questions"])
    play_games(twenty_questions, ScriptedPolicy(script), oracle, out, num_games=24, seed=5, batch_size=8, progress=False)
    return out


def tq_config(run_dir: Path, games: Path, sentence_model: Path, *extra: str) -> dict:
    return config("game=twenty_questions", f"input={games}", f"run_dir={run_dir}", f"embedder.model={sentence_model}",
                  "clustering.k_max=12", *extra)


def test_twenty_questions_games_end_to_end(tmp_path, twenty_questions_games, tiny_sentence_model_dir, twenty_questions):
    cfg = tq_config(tmp_path, twenty_questions_games, tiny_sentence_model_dir)
    echoed = []
    run_all(cfg, echoed.append)
    summary = json.loads((tmp_path / "utterances.json").read_text())
    assert list(summary["pools"]) == ["questions"]  # answers are labelled yes/no/other, not clustered
    records = [json.loads(line) for line in (tmp_path / "labelled.jsonl").read_text().splitlines()]
    assert len(records) == 24
    for record in records:
        for turn in record["turns"]:
            assert turn["intention"]["observation_label"] == {"Yes.": 0, "No.": 1}.get(turn["observation"], 2)
    # Step returns: γ^(T−t) for won games, 0 for lost ones.
    won = next(r for r in records if r["success"])
    T = won["num_turns"]
    assert [t["intention"]["step_return"] for t in won["turns"]] == pytest.approx([0.95 ** (T - t) for t in range(1, T + 1)])
    train = json.loads((tmp_path / "train.json").read_text())
    assert len(train) == sum(r["num_turns"] for r in records)
    # The observation is the prompt the policy saw: re-render it from the game history.
    sample = next(s for s in train if s["turn"] == 2)
    record = next(r for r in records if r["game_id"] == sample["game_id"])
    history = [(t["question"] or t["action"], t["observation"]) for t in record["turns"][:2]]
    assert sample["observation"] == twenty_questions.render_prompt(history)
    assert sample["action"] == record["turns"][2]["action"]
    # The embedding cache is reused: a changed selection setting re-runs step 2 only.
    cache = list((tmp_path / "embedding_cache").glob("*.npz"))
    assert len(cache) == 1
    echoed.clear()
    run_all({**cfg, "selection": {**cfg["selection"], "criterion": "silhouette"}}, echoed.append)
    assert "up to date" in echoed[0] and "silhouette chose" in echoed[1]


def test_same_input_and_seed_give_byte_identical_outputs(tmp_path, twenty_questions_games, tiny_sentence_model_dir):
    for name in ("a", "b"):
        run_all(tq_config(tmp_path / name, twenty_questions_games, tiny_sentence_model_dir))
    for name in OUTPUTS:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    run_all(tq_config(tmp_path / "c", twenty_questions_games, tiny_sentence_model_dir, "seed=1"))
    assert (tmp_path / "c" / "labels.npz").read_bytes() != (tmp_path / "a" / "labels.npz").read_bytes()


def test_interrupted_k_sweep_resumes_to_the_same_labels(tmp_path, twenty_questions_games, tiny_sentence_model_dir,
                                                         monkeypatch):
    cfg = tq_config(tmp_path / "full", twenty_questions_games, tiny_sentence_model_dir)
    pipeline.step1_embed_and_cluster(cfg, lambda s: None)
    expected = (tmp_path / "full" / "labels.npz").read_bytes()

    cfg = tq_config(tmp_path / "cut", twenty_questions_games, tiny_sentence_model_dir)
    from aria.intention import cluster

    real = cluster.CLUSTERINGS["kmeans"]

    def dies_after_five(x, ks, **kw):
        for n, item in enumerate(real(x, ks, **kw)):
            if n == 5:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setitem(cluster.CLUSTERINGS, "kmeans", dies_after_five)
    monkeypatch.setattr(pipeline.time, "perf_counter", iter(range(0, 10**6, 100)).__next__)  # save after every k
    with pytest.raises(KeyboardInterrupt):
        pipeline.step1_embed_and_cluster(cfg, lambda s: None)
    partial = np.load(tmp_path / "cut" / "labels.partial.npz")
    assert len([n for n in partial.files if n.startswith("questions/")]) == 5
    monkeypatch.setitem(cluster.CLUSTERINGS, "kmeans", real)
    echoed = []
    pipeline.step1_embed_and_cluster(cfg, echoed.append)
    assert any("5 ks resumed" in line for line in echoed)
    assert (tmp_path / "cut" / "labels.npz").read_bytes() == expected
    assert not (tmp_path / "cut" / "labels.partial.npz").exists()


def test_a_step_1_stopped_under_other_settings_is_not_taken_for_the_finished_one(tmp_path, twenty_questions_games,
                                                                                  tiny_sentence_model_dir, monkeypatch):
    """Step 1 done, then started again under other settings and stopped while clustering (its new
    embeddings.npz written, labels.npz not): the first settings again must not say "up to date"
    over arrays of the second (before: step 2 then refused, and step 1 kept saying up to date)."""
    from aria.intention import cluster

    cfg = tq_config(tmp_path, twenty_questions_games, tiny_sentence_model_dir)
    run_all(cfg)
    expected = (tmp_path / "labels.npz").read_bytes()
    real = cluster.CLUSTERINGS["kmeans"]

    def stopped(x, ks, **kw):
        raise KeyboardInterrupt
        yield

    monkeypatch.setitem(cluster.CLUSTERINGS, "kmeans", stopped)
    with pytest.raises(KeyboardInterrupt):
        pipeline.step1_embed_and_cluster({**cfg, "seed": 5}, lambda s: None)
    assert not (tmp_path / "utterances.json").exists()  # nothing says the half-made step is finished
    monkeypatch.setitem(cluster.CLUSTERINGS, "kmeans", real)
    echoed = []
    run_all(cfg, echoed.append)
    assert not any("[step 1] up to date" in line for line in echoed)
    assert (tmp_path / "labels.npz").read_bytes() == expected


# ---- bad input -----------------------------------------------------------------------------------
def _tq_record(gid: str, turns: list[dict], success: bool = False, status: str = "finished") -> dict:
    return make_record(game_id=gid, game="twenty_questions", target="Cat", turns=turns, success=success, status=status,
                       source="hand-made")


def _turn(q: str, answer: str = "No.") -> dict:
    return {"action": f"Question: {q}", "question": q, "observation": answer, "reward": -1.0}


def test_empty_failed_and_identical_games(tmp_path, tiny_sentence_model_dir):
    games = tmp_path / "games.jsonl"
    write_trajectories(games, [
        _tq_record("empty", []),
        _tq_record("failed", [_turn("Is it alive?")], status="failed"),
        _tq_record("one", [_turn("Is it alive?")]),
        _tq_record("two", [_turn("Is it alive?")]),
    ])
    cfg = tq_config(tmp_path / "run", games, tiny_sentence_model_dir)
    run_all(cfg)
    summary = json.loads((tmp_path / "run" / "utterances.json").read_text())
    assert summary["skipped"] == [{"game_id": "empty", "reason": "no turns"}, {"game_id": "failed", "reason": "failed game"}]
    assert summary["ks"] == [1]  # one distinct question: nothing to split
    train = json.loads((tmp_path / "run" / "train.json").read_text())
    assert [s["game_id"] for s in train] == ["one", "two"] and all(s["reward"] == 0.0 for s in train)


def test_bad_embeddings_name_the_game(tmp_path, negotiation_trajectories):
    records = [json.loads(line) for line in negotiation_trajectories.read_text().splitlines()]
    records[2]["turns"][4]["embedding"] = [0.0] * 1536
    bad = tmp_path / "bad.jsonl"
    write_trajectories(bad, records)
    cfg = config("game=negotiation", f"input={bad}", f"run_dir={tmp_path / 'run'}")
    # found while building the corpus, which sees records, not files: still named at its file and line
    with pytest.raises(DataError, match=re.escape(f"{bad}, line 3, field 'turns[4].embedding': game "
                                                  f"{records[2]['game_id']!r}: an all-zero vector")):
        pipeline.step1_embed_and_cluster(cfg, lambda s: None)
    records[2]["turns"][4]["embedding"] = [1.0] * 10  # another model's width: refused by the writer ...
    with pytest.raises(DataError, match=re.escape("line 3, field 'turns[4].embedding': has 10 numbers, "
                                                  "turns[0].embedding on line 1 has 1536")):
        write_trajectories(bad, records)
    bad.write_text("".join(json.dumps(r) + "\n" for r in records))  # ... and by the reader of step 1
    with pytest.raises(DataError, match=re.escape(f"{bad}, line 3, field 'turns[4].embedding': has 10 numbers")):
        pipeline.step1_embed_and_cluster(cfg, lambda s: None)


def test_a_two_player_game_without_a_round_is_skipped_and_said(negotiation_trajectories):
    """Under discount=original the release counts m = min(#Alice, #Bob) rounds: a game where Bob
    never spoke has none, and is listed as skipped (before: it added no step and no line, and a file
    of such games said "every game empty or failed")."""
    from aria.games.common.base import load_game_config
    from aria.intention.corpus import IntentionSpec, build_corpus

    records = [json.loads(line) for line in negotiation_trajectories.read_text().splitlines()][:3]
    records[1]["turns"] = [t for t in records[1]["turns"] if t["role"] == "alice"]
    spec = IntentionSpec.from_config(load_game_config("negotiation")["intention"], "negotiation")
    corpus = build_corpus(records, spec, use_precomputed=False, discount="original")
    assert corpus.game_ids == [records[0]["game_id"], records[2]["game_id"]]
    assert corpus.skipped == [{"game_id": records[1]["game_id"], "reason": "a player never spoke: no round under discount=original"}]
    assert records[1]["game_id"] in build_corpus(records, spec, use_precomputed=False).game_ids  # the paper's discount keeps it


def test_two_player_game_without_reward_is_rejected(tmp_path, negotiation_trajectories):
    records = [json.loads(line) for line in negotiation_trajectories.read_text().splitlines()]
    del records[1]["role_rewards"]["bob"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = config("game=negotiation", f"input={bad}", f"run_dir={tmp_path / 'run'}")
    with pytest.raises(DataError, match=r"bad.jsonl.*line 2.*role_rewards.bob"):
        pipeline.step1_embed_and_cluster(cfg, lambda s: None)


def test_games_of_another_game_are_refused_at_their_line(tmp_path, negotiation_trajectories):
    """A file of Guess My City games labelled as Twenty Questions would be rendered with the wrong
    game's prompts and trained on without a word: refused at the first such record."""
    games = tmp_path / "games.jsonl"
    write_trajectories(games, [_tq_record("g0", [_turn("Is it red?")]),
                               {**_tq_record("g1", [_turn("Is it red?")]), "game": "guess_my_city"}])
    cfg = config("game=twenty_questions", f"input={games}", f"run_dir={tmp_path / 'run'}")
    with pytest.raises(DataError, match=re.escape(f"{games}, line 2, field 'game': 'guess_my_city', but this run's "
                                                  "game is 'twenty_questions' (give game=guess_my_city")):
        pipeline.step1_embed_and_cluster(cfg, lambda s: None)
    # step 4 given another game than the steps before (before: a train.json of Twenty Questions games
    # with Guess My City's prompts, exit 0)
    games.write_text("".join(line for line in games.read_text().splitlines(keepends=True) if "guess_my_city" not in line))
    run_all(cfg)
    other = config("game=guess_my_city", f"input={games}", f"run_dir={tmp_path / 'run'}")
    (tmp_path / "run" / "train.meta.json").unlink()
    with pytest.raises(DataError, match=re.escape(f"labelled.jsonl, line 1, field 'game': 'twenty_questions', but this "
                                                  "run's game is 'guess_my_city'")):
        pipeline.step4_build_training_set(other, lambda s: None)
    # the same for a two-player file given to a question game's run
    cfg = config("game=twenty_questions", f"input={negotiation_trajectories}", f"run_dir={tmp_path / 'run2'}")
    with pytest.raises(DataError, match=re.escape(f"{negotiation_trajectories}, line 1, field 'game': 'negotiation'")):
        pipeline.step1_embed_and_cluster(cfg, lambda s: None)


def test_a_game_without_its_system_prompt_is_named_in_step_1(tmp_path, negotiation_trajectories):
    """Step 4 renders every trained step's prompt; a record that lacks what it needs is named at its
    file and line before step 1 does any work, not after three steps."""
    records = [json.loads(line) for line in negotiation_trajectories.read_text().splitlines()]
    for key in [k for k in records[3]["meta"] if k.endswith("system_prompt")]:
        del records[3]["meta"][key]
    bad = tmp_path / "bad.jsonl"
    write_trajectories(bad, records)
    cfg = config("game=negotiation", f"input={bad}", f"run_dir={tmp_path / 'run'}")
    with pytest.raises(DataError, match=re.escape(f"{bad}, line 4, field 'meta.") + r"\w+system_prompt'"
                       + re.escape(f": game {records[3]['game_id']!r}: no system prompt for role")):
        pipeline.step1_embed_and_cluster(cfg, lambda s: None)
    assert not (tmp_path / "run" / "utterances.json").exists()


def test_script_reports_bad_input_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "reward_aggregation/1_embed_and_cluster.py"),
                           f"input={tmp_path / 'missing.jsonl'}", f"run_dir={tmp_path}"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: no trajectories file")


@pytest.mark.parametrize(("override", "message"), [
    ("aggregation.discount=nope", "aggregation.discount: unknown 'nope' (known: paper, original)"),
    ("aggregation.mode=nope", "aggregation.mode: unknown 'nope' (known: q, adv)"),  # step 1 embedded and clustered anyway
    ("embedder.batch_size=0", "embedder.batch_size: expected an integer >= 1, got 0"),
    ("embedder.device=gpu", "embedder.device: expected a torch device (cpu, cuda, cuda:1), got 'gpu'"),  # after the embedding
    ("+embedder.bogus=1", "embedder.bogus: not an option of the sentence_transformers embedder (known: "),
    ("clustering.k_max=1", "clustering.k_max: expected an integer >= clustering.k_min (2), got 1"),
])
def test_every_step_refuses_a_name_no_registry_knows_before_reading_anything(tmp_path, override, message):
    """Before: a message without its setting, a traceback, or a whole step 1 done first. The
    trajectories file does not exist: a check after reading would fail on it instead."""
    cfg = config(f"input={tmp_path / 'missing.jsonl'}", f"run_dir={tmp_path / 'run'}", override)
    for step in (pipeline.step1_embed_and_cluster, pipeline.step2_select_k,
                 pipeline.step3_apply_labels, pipeline.step4_build_training_set):
        with pytest.raises(ValueError) as refused:
            step(cfg, lambda line: None)
        assert str(refused.value).startswith(message), step.__name__
    assert not (tmp_path / "run").exists()


# ---- an OpenAI-compatible embeddings endpoint over real HTTP ------------------------------------
class EmbeddingServer:
    """A small /v1/embeddings server on 127.0.0.1 (stands in for OpenAI or vLLM, which cannot run
    here). Vectors are a deterministic function of the text; the first ``fail_first`` requests
    get HTTP 500."""

    def __init__(self, fail_first: int = 0):
        import hashlib
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        server = self
        self.requests: list[list[str]] = []
        self.fail_first = fail_first

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body["input"])
                if len(server.requests) <= server.fail_first:
                    self.send_response(500)
                    self.end_headers()
                    return
                data = [{"object": "embedding", "index": i,
                         "embedding": [b / 255 + 0.01 for b in hashlib.sha256(t.encode()).digest()[:8]]}
                        for i, t in enumerate(body["input"])]
                out = json.dumps({"object": "list", "data": data, "model": body["model"],
                                  "usage": {"prompt_tokens": 0, "total_tokens": 0}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_openai_compatible_embeddings_endpoint_with_retry_and_cache(tmp_path, twenty_questions_games):
    server = EmbeddingServer(fail_first=1)
    try:
        overrides = ["game=twenty_questions", f"input={twenty_questions_games}", f"run_dir={tmp_path}", "embedder=openai",
                     f"embedder.base_url={server.base_url}", "embedder.model=text-embedding-3-small",
                     "embedder.batch_size=5", "embedder.retry_base_delay_s=0.01", "clustering.k_max=5"]
        summary = pipeline.step1_embed_and_cluster(config(*overrides), lambda s: None)
        texts = summary["pools"]["questions"]["texts"]
        assert summary["pools"]["questions"]["embedding"] == "text-embedding-3-small"
        assert summary["pools"]["questions"]["dim"] == 8
        sent = [t for batch in server.requests[1:] for t in batch]
        assert sorted(sent) == sorted(texts) and max(len(b) for b in server.requests) <= 5  # each text once
        # A new run folder with the same cache embeds nothing new.
        before = len(server.requests)
        (tmp_path / "labels.npz").unlink()
        pipeline.step1_embed_and_cluster(config(*overrides, "clustering.k_max=4"), lambda s: None)
        assert len(server.requests) == before
    finally:
        server.close()


def test_embeddings_endpoint_that_keeps_failing_raises_and_keeps_nothing_half_done(tmp_path, twenty_questions_games):
    import openai

    server = EmbeddingServer(fail_first=100)
    try:
        cfg = config("game=twenty_questions", f"input={twenty_questions_games}", f"run_dir={tmp_path}", "embedder=openai",
                     f"embedder.base_url={server.base_url}", "embedder.max_retries=2", "embedder.retry_base_delay_s=0.01")
        with pytest.raises(openai.InternalServerError):
            pipeline.step1_embed_and_cluster(cfg, lambda s: None)
        assert len(server.requests) == 3  # one try + two retries
        assert not (tmp_path / "labels.npz").exists() and not (tmp_path / "utterances.json").exists()
    finally:
        server.close()


class ZeroForAlive:
    """A test embedding backend (a real Embedder, registered for the test) that returns a zero
    vector for one text, as a broken embedding service might."""

    name = "zero-for-alive"

    def __init__(self, **_):
        pass

    def embed(self, texts):
        return np.array([[0.0, 0.0] if "alive" in t else [1.0, float(len(t))] for t in texts], dtype=np.float32)


def test_zero_vector_from_the_embedder_names_the_game(tmp_path, monkeypatch):
    from aria.intention import embed

    monkeypatch.setitem(embed.EMBEDDERS, "zero_for_alive", ZeroForAlive)
    games = tmp_path / "games.jsonl"
    write_trajectories(games, [_tq_record("g0", [_turn("Is it red?")]), _tq_record("g1", [_turn("Is it red?"), _turn("Is it alive?")])])
    cfg = config("game=twenty_questions", f"input={games}", f"run_dir={tmp_path / 'run'}", "embedder=sentence_transformers")
    cfg["embedder"] = {"name": "zero_for_alive"}
    with pytest.raises(DataError, match=re.escape(f"{games}, line 2, field 'embedding': game 'g1', utterance 2: "
                                                  "the embedding of 'Question: Is it alive?' is zero")):
        pipeline.step1_embed_and_cluster(cfg, lambda s: None)


def test_guess_my_city_answers_are_clustered_separately_or_pooled():
    from aria.games.common.base import load_game_config
    from aria.intention.corpus import IntentionSpec, build_corpus

    turns = [{"action": "Question: Is it in Asia?", "question": "Is it in Asia?", "observation": "No, it is in Europe.",
              "reward": -1.0},
             {"action": "Question: Is it Paris?", "question": "Is it Paris?", "observation": "Yes, you guessed it!",
              "reward": 0.0}]
    record = make_record(game_id="g", game="guess_my_city", target="Paris", turns=turns, success=True, source="hand-made")
    separate = build_corpus([record], IntentionSpec.from_config(load_game_config("guess_my_city")["intention"]))
    assert separate.pools == {"questions": ["Question: Is it in Asia?", "Question: Is it Paris?"],
                              "answers": ["No, it is in Europe.", "Yes, you guessed it!"]}
    pooled = build_corpus([record], IntentionSpec.from_config(
        {"channels": {"action": {"cluster": "utterances"}, "observation": {"cluster": "utterances"}}, "trained": ["action"]}))
    assert list(pooled.pools) == ["utterances"] and len(pooled.pools["utterances"]) == 4
    # Only actions are steps; R = 1 for the won game: returns γ^1, γ^0.
    np.testing.assert_allclose(separate.table.step_return, [0.95, 1.0])
    with pytest.raises(ValueError, match="exactly one of"):
        IntentionSpec.from_config({"channels": {"action": {"cluster": "q", "map": "yes_no_other"}}, "trained": ["action"]})
    with pytest.raises(ValueError, match="trained"):
        IntentionSpec.from_config({"channels": {"action": {"cluster": "q"}}, "trained": ["observation"]})


def test_a_pool_with_few_distinct_texts_keeps_its_finest_labelling(tmp_path, tiny_sentence_model_dir):
    answers = ["Yes, it is in Europe.", "No, it is not.", "It is near the sea."]
    records = []
    for g in range(4):
        turns = [{"action": f"Question: Is it city number {g * 2 + i}?", "question": f"Is it city number {g * 2 + i}?",
                  "observation": answers[(g + i) % 3], "reward": -1.0} for i in range(2)]
        records.append(make_record(game_id=f"g{g}", game="guess_my_city", target="Paris", turns=turns, success=g == 0,
                                   source="hand-made"))
    games = tmp_path / "games.jsonl"
    write_trajectories(games, records)
    cfg = config("game=guess_my_city", f"input={games}", f"run_dir={tmp_path / 'run'}",
                 f"embedder.model={tiny_sentence_model_dir}", "clustering.k_max=6")
    summary = pipeline.step1_embed_and_cluster(cfg, lambda s: None)
    assert summary["ks"] == [2, 3, 4, 5, 6]  # 8 distinct questions
    labels = np.load(tmp_path / "run" / "labels.npz")
    assert (labels["answers"][2:] == labels["answers"][1]).all()  # k = 4..6 keep k = 3 (three answers)
    assert len(np.unique(labels["answers"][1])) == 3 and len(np.unique(labels["questions"][4])) == 6
    # one k per pool, as config/intention.yaml documents it (before: refused by the settings' int type)
    fixed = config("game=guess_my_city", f"input={games}", f"run_dir={tmp_path / 'run'}", f"embedder.model={tiny_sentence_model_dir}",
                   "clustering.k_max=6", "selection.fixed_k={questions: 5, answers: 3}")
    assert pipeline.step2_select_k(fixed, lambda s: None)["chosen"]["k"] == {"questions": 5, "answers": 3}
    for bad, message in (({"questions": 5}, r"no k for pool\(s\) \['answers'\]"), (True, "got True"),
                         ({"questions": 5, "answers": 0}, "expected null, a whole number >= 1")):
        with pytest.raises(ConfigError, match=message):
            pipeline.step2_select_k({**fixed, "selection": {**fixed["selection"], "fixed_k": bad}}, lambda s: None)


# ---- issue: variance on one step set, occurrence weights, no model load when cached ---------------
def test_variance_report_compares_the_same_kept_steps(tmp_path, twenty_questions_games, tiny_sentence_model_dir):
    """With n_rollout=2 and no first-action samples, Var(R) and Var(R~) are both over the kept steps.

    The expected values come from step 3's labelled games (each kept turn's step return and R~),
    not from step 2's code.
    """
    cfg = tq_config(tmp_path, twenty_questions_games, tiny_sentence_model_dir, "aggregation.n_rollout=2",
                    "aggregation.include_first_action=false", "selection.fixed_k=4")
    run_all(cfg)
    report = json.loads((tmp_path / "selection.json").read_text())
    at = report["ks"].index(4)
    turns = [t["intention"] for line in (tmp_path / "labelled.jsonl").read_text().splitlines()
             for t in json.loads(line)["turns"]]
    kept = [t for t in turns if t["kept"]]
    assert 0 < len(kept) < len(turns)
    variance = report["variance"]
    assert variance["kept_steps"]["raw"][at] == pytest.approx(np.var([t["step_return"] for t in kept]), abs=1e-12)
    assert variance["kept_steps"]["aggregated"][at] == pytest.approx(np.var([t["q"] for t in kept]), abs=1e-12)
    assert variance["all_steps"]["raw"] == pytest.approx(np.var([t["step_return"] for t in turns]), abs=1e-12)
    assert variance["all_steps"]["aggregated"][at] == pytest.approx(np.var([t["q"] for t in turns]), abs=1e-12)
    assert variance["kept_steps"]["raw"][at] != pytest.approx(variance["all_steps"]["raw"])  # the sets differ here
    assert variance["claim"] == {"statement": "Var(R~) <= Var(R) on the steps kept at each k", "holds": True, "violations": []}
    assert report["curves"]["variance_raw"] == variance["kept_steps"]["raw"]


def test_occurrence_weights_reach_the_clustering(tmp_path, twenty_questions_games, tiny_sentence_model_dir, monkeypatch):
    from aria.intention import cluster

    seen = {}
    real = cluster.CLUSTERINGS["kmeans"]

    def spy(x, ks, sample_weight=None, **kw):
        seen["weight"] = sample_weight
        yield from real(x, ks, sample_weight=sample_weight, **kw)

    monkeypatch.setitem(cluster.CLUSTERINGS, "kmeans", spy)
    records = [json.loads(line) for line in twenty_questions_games.read_text().splitlines()]
    summary = pipeline.step1_embed_and_cluster(tq_config(tmp_path / "occ", twenty_questions_games, tiny_sentence_model_dir),
                                               lambda s: None)
    texts = summary["pools"]["questions"]["texts"]
    counts = {t: 0 for t in texts}
    for record in records:
        for turn in record["turns"]:
            counts[turn["action"]] += 1
    assert seen["weight"].tolist() == [counts[t] for t in texts] and max(counts.values()) > 1
    assert summary["pools"]["questions"]["occurrences"] == sum(counts.values())
    pipeline.step1_embed_and_cluster(tq_config(tmp_path / "distinct", twenty_questions_games, tiny_sentence_model_dir,
                                               "clustering.weight=distinct"), lambda s: None)
    assert seen["weight"] is None


def test_cached_texts_load_no_model_and_cheap_checks_come_first(tmp_path, twenty_questions_games, tiny_sentence_model_dir,
                                                               monkeypatch):
    cfg = tq_config(tmp_path, twenty_questions_games, tiny_sentence_model_dir)
    pipeline.step1_embed_and_cluster(cfg, lambda s: None)

    def no_model(*_):
        raise AssertionError("the embedding model was loaded")

    monkeypatch.setattr(pipeline, "build_embedder", no_model)
    echoed = []
    pipeline.step1_embed_and_cluster({**cfg, "clustering": {**cfg["clustering"], "k_max": 6}}, echoed.append)
    assert any("0 newly embedded" in line for line in echoed)
    for bad, message in ((("method", "dbscan"), "clustering.method: unknown 'dbscan'"), (("k_min", 0), "k_min"),
                         (("weight", "tokens"), "clustering.weight"), (("pca_dim", 0), "clustering.pca_dim")):
        broken = {**cfg, "run_dir": str(tmp_path / "other"), "clustering": {**cfg["clustering"], bad[0]: bad[1]}}
        with pytest.raises(ValueError, match=message):
            pipeline.step1_embed_and_cluster(broken, lambda s: None)
    assert not (tmp_path / "other").exists()  # refused before reading or embedding anything


def test_the_embedding_cache_tells_two_models_of_one_name_apart(tmp_path, twenty_questions_games, tiny_sentence_model_dir):
    """Checkpoints are often all saved as ``.../final``: two models of one folder name must not share
    cached vectors (before: the second run embedded nothing and clustered the first model's vectors)."""
    import shutil

    for name in ("a", "b"):
        shutil.copytree(tiny_sentence_model_dir, tmp_path / name / "final")
    cfg = tq_config(tmp_path / "run", twenty_questions_games, tmp_path / "a" / "final", "clustering.k_max=4")
    pipeline.step1_embed_and_cluster(cfg, lambda s: None)
    echoed = []
    pipeline.step1_embed_and_cluster({**cfg, "embedder": {**cfg["embedder"], "model": str(tmp_path / "b" / "final")}},
                                     echoed.append)
    assert not any(" 0 newly embedded" in line for line in echoed), echoed
    assert len(list((tmp_path / "run" / "embedding_cache").glob("final-*.npz"))) == 2


def test_the_embedding_cache_keeps_texts_exactly(tmp_path):
    """A text ending in NUL (a numpy string array drops it) is found again, so a cached run loads no model."""
    from aria.intention.embed import EmbeddingCache

    class Fixed:
        def embed(self, texts):
            return np.ones((len(texts), 3), dtype=np.float32)

    texts = ["Is it a dog?\x00", "Is it a dog?", "é 🐕"]
    EmbeddingCache(tmp_path, "m").embed(texts, Fixed())
    assert EmbeddingCache(tmp_path, "m").missing(texts) == []


# ---- each step reads what the step before it used ----------------------------------------------
def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / name), *args], capture_output=True, text=True, cwd=REPO)


def test_changed_trajectories_are_refused_naming_the_step_to_rerun(tmp_path, twenty_questions_games, tiny_sentence_model_dir):
    """Removing a game gave 24 of 42 turns another text's label (exit 0); appending games gave an IndexError."""
    games = tmp_path / "games.jsonl"
    lines = twenty_questions_games.read_text().splitlines()
    games.write_text("\n".join(lines) + "\n")
    args = ["game=twenty_questions", f"input={games}", f"run_dir={tmp_path / 'run'}",
            f"embedder.model={tiny_sentence_model_dir}", "clustering.k_max=6"]
    # step 1 in this process (its script is run in test_negotiation_sample_through_the_scripts):
    # what is tested is step 2's script refusing games that are not those step 1 read
    pipeline.step1_embed_and_cluster(compose_config("intention", args), lambda line: None)
    extra = json.dumps({**json.loads(lines[0]), "game_id": "extra-game"})
    for changed in (lines[1:], [*lines, extra]):  # one game removed; one game appended
        games.write_text("\n".join(changed) + "\n")
        done = _script("clustering/2_select_k.py", *args)
        assert done.returncode == 2, done.stdout
        [line] = done.stderr.strip().splitlines()
        assert "are not those step 1 read" in line and "re-run step 1 (reward_aggregation/1_embed_and_cluster.py)" in line
    games.write_text("\n".join(lines) + "\n")
    assert _script("clustering/2_select_k.py", *args).returncode == 0


def test_each_step_checks_the_step_before(tmp_path, twenty_questions_games, tiny_sentence_model_dir):
    cfg = tq_config(tmp_path, twenty_questions_games, tiny_sentence_model_dir, "clustering.k_max=6")
    run_all(cfg)
    # Step 3 after step 1 was re-run with other settings (step 2 not): selection.json is stale.
    pipeline.step1_embed_and_cluster({**cfg, "seed": 1}, lambda s: None)
    with pytest.raises(pipeline.StaleInput, match=r"selection.json was made from another run of step 1.*re-run step 2"):
        pipeline.step3_apply_labels({**cfg, "seed": 1}, lambda s: None)
    # Step 4 after step 2 chose again (step 3 not): labelled.jsonl is stale.
    run_all(cfg)
    pipeline.step2_select_k({**cfg, "selection": {**cfg["selection"], "fixed_k": 3}}, lambda s: None)
    with pytest.raises(pipeline.StaleInput, match=r"labelled.jsonl was made from another selection.json.*re-run step 3"):
        pipeline.step4_build_training_set(cfg, lambda s: None)
    # Step 4 after labelled.jsonl was edited by hand.
    run_all(cfg)
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text(labelled.read_text().replace('"kept": true', '"kept": false', 1))
    (tmp_path / "train.meta.json").unlink()
    with pytest.raises(pipeline.StaleInput, match="changed since step 3 wrote it"):
        pipeline.step4_build_training_set(cfg, lambda s: None)
    # labels.npz from another run of step 1 than utterances.json (a crash between the two writes).
    run_all(cfg)
    stamp = np.load(tmp_path / "labels.npz")
    pipeline._save_npz(tmp_path / "labels.npz", {**{k: stamp[k] for k in stamp.files}, "fingerprint": np.array("other")})
    (tmp_path / "selection.json").unlink()
    with pytest.raises(pipeline.StaleInput, match="labels.npz was not written by the step 1"):
        pipeline.step2_select_k(cfg, lambda s: None)
    # A later step given other settings than the step before it used: refused, not "up to date"
    # over outputs of the first settings or labels of a k chosen under them (before: both).
    run_all(cfg)
    gamma = {**cfg, "aggregation": {**cfg["aggregation"], "gamma": 0.5}}
    with pytest.raises(pipeline.StaleInput, match=r"selection.json was made under other settings \(aggregation.gamma "
                                                  r"was 0.95, now 0.5\).*re-run step 2"):
        pipeline.step3_apply_labels(gamma, lambda s: None)
    with pytest.raises(pipeline.StaleInput, match=r"aggregation.gamma was 0.95, now 0.5"):
        pipeline.preflight(gamma, [2])
    with pytest.raises(pipeline.StaleInput, match=r"utterances.json was made under other settings of step 1.*re-run step 1"):
        pipeline.step2_select_k({**cfg, "clustering": {**cfg["clustering"], "k_max": 5}}, lambda s: None)
    with pytest.raises(pipeline.StaleInput, match=r"other settings of step 1"):
        pipeline.step2_select_k({**cfg, "seed": 7}, lambda s: None)
    # A step whose input is missing says which step to run.
    with pytest.raises(pipeline.StaleInput, match=r"no utterances.json in .*re-run step 1"):
        pipeline.step2_select_k({**cfg, "run_dir": str(tmp_path / "empty")}, lambda s: None)
    # Step 4 given other trajectories than steps 1-3 read (before: "up to date" where steps 2 and 3 refuse).
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(Path(cfg["input"]).read_text().splitlines()[1:]) + "\n")
    with pytest.raises(pipeline.StaleInput, match=r"are not those step 1 read.*re-run step 1"):
        pipeline.step4_build_training_set({**cfg, "input": str(other)}, lambda s: None)
    # Step 2 over labels.npz damaged since it ran (before: "up to date", and step 3 refused).
    labels = tmp_path / "labels.npz"
    labels.write_bytes(labels.read_bytes()[:100])
    with pytest.raises(pipeline.StaleInput, match=r"labels.npz cannot be read as step 1's arrays.*re-run step 1"):
        pipeline.step2_select_k(cfg, lambda s: None)


def test_a_run_folder_file_that_is_not_its_steps_output_is_named(tmp_path, twenty_questions_games, tiny_sentence_model_dir):
    """Run folders are copied and edited: a step's output replaced by something else is a refusal
    naming the file and the step to re-run, not a traceback; a step's own stale output of another
    shape is made again."""
    cfg = tq_config(tmp_path, twenty_questions_games, tiny_sentence_model_dir, "clustering.k_max=6")
    run_all(cfg)
    cases = [("selection.json", "[]", pipeline.step3_apply_labels, r"selection.json is not an output of step 2.*re-run step 2"),
             ("utterances.json", '{"x": 1}', pipeline.step2_select_k, r"utterances.json is not an output of step 1.*re-run step 1"),
             ("labels.npz", "", pipeline.step3_apply_labels, r"labels.npz cannot be read as step 1's arrays \(EOFError.*re-run step 1"),
             ("labels.npz", "garbage", pipeline.step3_apply_labels, r"labels.npz cannot be read as step 1's arrays.*re-run step 1"),
             ("labelled.meta.json", "[]", pipeline.step4_build_training_set, r"labelled.meta.json is not an output of step 3")]
    for name, content, step, message in cases:
        kept = (tmp_path / name).read_bytes()
        (tmp_path / name).write_text(content)
        (tmp_path / "train.meta.json").unlink(missing_ok=True)
        with pytest.raises(pipeline.StaleInput, match=message):
            step(cfg, lambda s: None)
        (tmp_path / name).write_bytes(kept)
    # the chosen k edited by hand: one step 1 did not cluster, or not a k per pool
    kept = (tmp_path / "selection.json").read_text()
    for chosen, message in [(99, r"selection.json, field 'chosen.k.questions': k = 99 was not clustered by step 1 "
                                 r"\(it clustered k = 2..6, 5 values\)"),
                            ("8", r"selection.json, field 'chosen.k': 8 is not a k per pool")]:
        report = json.loads(kept)
        report["chosen"]["k"] = {"questions": chosen} if chosen == 99 else int(chosen)
        (tmp_path / "selection.json").write_text(json.dumps(report))
        with pytest.raises(DataError, match=message):
            pipeline.step3_apply_labels(cfg, lambda s: None)
    # a k that step 1 clustered, chosen by hand (the release has its users pick k): step 4 refuses the
    # labels of the old k, step 3 labels again at the new one (before: "up to date" at the old k)
    report = json.loads(kept)
    old_k = report["chosen"]["k"]["questions"]
    report["chosen"]["k"] = {"questions": 2 if old_k != 2 else 3}
    (tmp_path / "selection.json").write_text(json.dumps(report))
    with pytest.raises(pipeline.StaleInput, match=rf"labelled.jsonl was labelled at k = \{{'questions': {old_k}\}}, "
                                                  r"selection.json now chooses \{'questions': [23]\}.*re-run step 3"):
        pipeline.step4_build_training_set(cfg, lambda s: None)
    pipeline.step3_apply_labels(cfg, lambda s: None)
    assert json.loads((tmp_path / "labelled.meta.json").read_text())["k"] == report["chosen"]["k"]
    (tmp_path / "selection.json").write_text(kept)
    # step 2's own output in another shape: made again
    (tmp_path / "selection.json").write_text("[]")
    assert pipeline.step2_select_k(cfg, lambda s: None)["chosen"]


# ---- known intentions: does the intention space find them? ---------------------------------------
def test_intention_recovery_by_hand():
    from aria.intention.select import intention_recovery

    assert intention_recovery(["a", "a", "b", "b"], np.array([1, 1, 0, 0])) == {"ari": 1.0, "nmi": 1.0}
    # Each label splits both intentions: all pairs agree 0 times, 2 expected of the 6 pairs:
    # ARI = (0 - 2*2/6) / ((2+2)/2 - 2*2/6) = -0.5; the labels say nothing of the intention: NMI = 0.
    crossed = intention_recovery(["a", "a", "b", "b"], np.array([0, 1, 0, 1]))
    assert crossed["ari"] == pytest.approx(-0.5) and crossed["nmi"] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError):
        intention_recovery(["a"], np.array([0, 1]))


def test_step_2_scores_the_labels_against_recorded_intentions(tmp_path, tiny_sentence_model_dir):
    """Three questions, each its own recorded intention (and one turn that records none): at
    k = 3 every text is its own cluster, so the labels are the intentions exactly."""
    questions = {"Is it alive?": "fact:alive", "Is it made of metal?": "fact:metal", "Is it a kind of fruit?": "fact:fruit"}
    records = []
    for g in range(6):
        turns = [{**_turn(q), "intention": questions[q]} for q in list(questions)[g % 3:] + list(questions)[:g % 3]]
        turns.append(_turn("Is it alive?"))  # no intention recorded
        records.append(_tq_record(f"g{g}", turns))
    games = tmp_path / "games.jsonl"
    write_trajectories(games, records)
    cfg = tq_config(tmp_path / "run", games, tiny_sentence_model_dir, "clustering.k_max=3")
    pipeline.step1_embed_and_cluster(cfg, lambda s: None)
    report = pipeline.step2_select_k(cfg, lambda s: None)
    recovery = report["intention_recovery"]
    assert report["ks"] == [2, 3] and recovery["steps"] == 18 and recovery["intentions"] == 3
    assert recovery["ari"][1] == pytest.approx(1.0) and recovery["nmi"][1] == pytest.approx(1.0)
    assert recovery["ari"][0] < 1.0 and recovery["nmi"][0] < 1.0  # two of the three questions share a cluster
    saved = json.loads((tmp_path / "run" / "selection.json").read_text())
    assert saved["intention_recovery"] == recovery
    # Without recorded intentions the report has no such section.
    for r in records:
        for t in r["turns"]:
            t.pop("intention", None)
    write_trajectories(tmp_path / "plain.jsonl", records)
    plain = tq_config(tmp_path / "plain", tmp_path / "plain.jsonl", tiny_sentence_model_dir, "clustering.k_max=3")
    pipeline.step1_embed_and_cluster(plain, lambda s: None)
    assert "intention_recovery" not in pipeline.step2_select_k(plain, lambda s: None)


def test_a_turn_intention_must_be_a_string(tmp_path):
    from aria.trajectories import validate_record

    record = _tq_record("g", [{**_turn("Is it alive?"), "intention": 3}])
    with pytest.raises(DataError, match=r"turns\[0\]\.intention"):
        validate_record(record, tmp_path / "games.jsonl", 1)


# ---- behavioural intentions (aria/intention/behaviour.py) in the pipeline -------------------------
def _behaviour_run(tmp_path) -> dict:
    """The config of a run over three games of twenty_questions_subset whose five texts make three
    behavioural intentions (see the test below)."""
    animal, animal2, dog, hmm, think = ("Question: Is it an animal?", "Is it an animal?", "Question: Is it a dog?",
                                        "hmm", "I think so")
    vectors = {text: np.eye(5)[i].tolist() for i, text in enumerate((animal, dog, animal2, hmm, think))}

    def turn(action: str, answer: str) -> dict:
        return {"action": action, "observation": answer, "reward": -1.0, "embedding": vectors[action]}

    def record(gid, target, turns, success):
        return make_record(game_id=gid, game="twenty_questions_subset", target=target, turns=turns, success=success,
                           source="hand-made")  # a made-up game: not played by the rules (aria.intention.pipeline._check_records)

    games = tmp_path / "games.jsonl"
    write_trajectories(games, [
        record("g1", "Dog", [turn(animal, "Yes."), turn(dog, "Yes.")], True),                         # R = 1, T = 2
        record("g2", "Dog", [turn(animal2, "Yes."), turn(hmm, "Invalid Question."), turn(dog, "Yes.")], True),  # T = 3
        record("g3", "Chair", [turn(think, "Invalid Question."), turn(animal2, "No.")], False),       # R = 0
    ])
    cfg = config("game=twenty_questions_subset", f"input={games}", f"run_dir={tmp_path / 'run'}", "clustering.k_max=5")
    return cfg


def test_behavioural_intentions_in_steps_2_and_3_by_hand(tmp_path):
    """Five texts, three behavioural intentions under the game's knowledge base: "Is it an animal?"
    with and without the "Question:" prefix (one question), the guess of the dog, and two outputs
    with no question. Each text has its own one-hot embedding, so at k = 5 the clusters are the
    texts. Figures by hand: returns gamma^(T-t) with gamma 0.95; R~ under the behavioural labels
    pools the first steps of g1 and g2 (one intention, two texts)."""
    cfg = _behaviour_run(tmp_path)
    pipeline.step1_embed_and_cluster(cfg, lambda s: None)
    saved = json.loads((tmp_path / "run" / "behaviour.json").read_text())
    assert saved["pools"]["questions"]["labels"] == [0, 1, 0, 2, 2]  # texts in first-seen order: animal, dog, animal2, hmm, think
    assert saved["summary"]["questions"] == {"texts": 5, "intentions": 3, "questions": 3, "answered_alike": 0}

    report = pipeline.step2_select_k(cfg, lambda s: None)
    behaviour = report["behaviour"]
    assert report["ks"] == [2, 3, 4, 5] and behaviour["step_intentions"] == 3
    # k = 5: clusters are the texts. Steps' actions: animal dog | animal2 hmm dog | think animal2;
    # intentions {animal, animal2 x2}, {dog x2}, {hmm, think}. Contingency pairs: 1 (animal2) + 1 (dog)
    # = 2; rows 3, 2, 2 give 3 + 1 + 1 = 5 pairs; columns 1, 2, 2, 1, 1 give 2; 21 pairs in all.
    # ARI = (2 - 5 * 2 / 21) / ((5 + 2) / 2 - 5 * 2 / 21) = 32 / 63.5.
    assert behaviour["ari"][3] == pytest.approx(32 / 63.5)
    # R~ at k = 5 against R~ under the behavioural labels: they differ only at the first steps of g1
    # and g2 (returns 0.95 and 0.9025, pooled to their mean 0.92625 by the behavioural labels).
    # Both are in one behavioural key whose mean they keep: no bias, only variance within the key.
    assert behaviour["bias_squared"][3] == pytest.approx(0.0, abs=1e-12)
    assert behaviour["variance_within"][3] == pytest.approx(2 * 0.02375**2 / 7)
    assert behaviour["mse"][3] == pytest.approx(2 * 0.02375**2 / 7)
    assert behaviour["mean_abs_difference"][3] == pytest.approx(2 * 0.02375 / 7)
    returns = np.array([0.95, 1.0, 0.9025, 0.95, 1.0, 0.0, 0.0])
    pooled = returns.copy()
    pooled[[0, 2]] = 0.92625
    assert behaviour["variance"][3] == pytest.approx(returns.var())
    assert behaviour["variance_behavioural"] == pytest.approx(pooled.var())
    assert behaviour["sharing_behavioural"]["shared"] == pytest.approx(2 / 7)

    # labels: behavioural -> steps 3 and 4 aggregate with the exact partition
    exact = dict(cfg, labels="behavioural")
    pipeline.step2_select_k(exact, lambda s: None)
    pipeline.step3_apply_labels(exact, lambda s: None)
    labelled = [json.loads(line) for line in (tmp_path / "run" / "labelled.jsonl").read_text().splitlines()]
    rewards = [t["intention"]["reward"] for r in labelled for t in r["turns"]]
    assert rewards == pytest.approx(pooled.tolist())
    assert labelled[0]["intention"]["labels"] == "behavioural" and labelled[0]["intention"]["k"] == {"questions": 3}
    pipeline.step4_build_training_set(exact, lambda s: None)
    # step 4 refuses a labelled.jsonl made under the other labels
    with pytest.raises(pipeline.StaleInput, match="another selection.json or under other labels"):
        pipeline.step4_build_training_set(cfg, lambda s: None)
    # the pre-flight has a row for the behavioural intentions: 2 of 7 steps share their key
    rows = pipeline.preflight(cfg, [])["rows"]
    assert rows[-1]["labels"] == "behavioural" and rows[-1]["k"] == {"questions": 3}
    assert rows[-1]["shared"] == pytest.approx(2 / 7)
    again = pipeline.preflight(cfg, [rows[0]["k"]["questions"]])["rows"]  # the chosen k named as a fixed one too
    assert [r["k"] for r in again if r.get("labels") is None] == [rows[0]["k"]]  # one row, not two alike
    # which row the training set used: the chosen k under labels: clusters, the behavioural row under
    # labels: behavioural (step 2's choice still marked as such, but not trained on)
    other = next(k for k in report["ks"] if k != rows[0]["k"]["questions"])
    fixed = pipeline.preflight(cfg, [other])
    assert fixed["labels"] == "clusters" and [(r["chosen"], r["trained"]) for r in fixed["rows"]] == [
        (True, True), (False, False), (False, False)]
    ceiling = pipeline.preflight(exact, [other])
    assert ceiling["labels"] == "behavioural" and [(r["chosen"], r["trained"]) for r in ceiling["rows"]] == [
        (True, False), (False, False), (False, True)]
    # aggregation.window = 0: a step's key is its action's intention alone. Animal: 0.95, 0.9025, 0
    # (g3's second step); the dog: 1, 1; no question: 0.95 (g2), 0 (g3).
    action_only = dict(exact, aggregation={**exact["aggregation"], "window": 0})
    pipeline.step2_select_k(action_only, lambda s: None)
    pipeline.step3_apply_labels(action_only, lambda s: None)
    labelled = [json.loads(line) for line in (tmp_path / "run" / "labelled.jsonl").read_text().splitlines()]
    animal_q, none_q = (0.95 + 0.9025) / 3, 0.95 / 2
    assert [t["intention"]["reward"] for r in labelled for t in r["turns"]] == pytest.approx(
        [animal_q, 1.0, animal_q, none_q, 1.0, none_q, animal_q])
    with pytest.raises(ValueError, match=re.escape("aggregation.window: expected an integer >= 0 (null: the whole history), got -1")):
        pipeline.check_settings(dict(cfg, aggregation={**cfg["aggregation"], "window": -1}))


def test_behavioural_labels_need_an_offline_oracle(tmp_path, negotiation_trajectories):
    cfg = config("game=negotiation", f"input={negotiation_trajectories}", f"run_dir={tmp_path}", "labels=behavioural")
    with pytest.raises(ValueError, match="no offline oracle"):
        pipeline.step1_embed_and_cluster(cfg, lambda s: None)
    with pytest.raises(ValueError, match=re.escape("intention: labels: expected one of clusters, behavioural, got 'exact'")):
        pipeline.check_settings(dict(cfg, labels="exact"))
    with pytest.raises(ValueError, match=re.escape("behaviour: expected one of auto, required, never, got 'always'")):
        pipeline.check_settings(dict(cfg, behaviour="always"))


def test_grouping_schemes_side_by_side(tmp_path, tiny_model_dir):
    """aria/experiment/grouping.py on the hand-made run above. Under the behavioural intentions with
    whole-history keys the first steps of g1 and g2 share (2 of 7); with the action alone (window 0)
    every step shares (animal x3, the dog x2, no question x2). GiGPO's anchor states: the first
    steps of g1 and g2 (target Dog, the same opening prompt) share, g3's (Chair) does not: 2 of 7."""
    from aria.experiment.grouping import compare, markdown, run_config

    cfg = _behaviour_run(tmp_path)
    run_all(cfg)
    found = compare(run_config(tmp_path / "run"), window=0, threshold=0.9)
    rows = found["schemes"]
    assert list(rows) == ["aria", "aria_window0", "aria_behavioural", "aria_behavioural_window0", "gigpo", "gigpo_similar",
                          "no_aggregation"]
    alone = rows["no_aggregation"]  # R itself: no step shares, and its whole error is variance within
    assert alone["shared"] == 0 and alone["variance_ratio"] == pytest.approx(1.0)
    assert alone["bias_squared"] == pytest.approx(0.0, abs=1e-15) and alone["mse"] == pytest.approx(alone["variance_within"])
    assert alone["mse"] > rows["aria_behavioural"]["mse"]
    assert rows["aria_behavioural"]["shared"] == pytest.approx(2 / 7)
    assert rows["aria_behavioural"]["bias_squared"] == pytest.approx(0.0, abs=1e-15)  # the reference itself
    assert rows["aria_behavioural_window0"]["shared"] == pytest.approx(1.0)
    assert rows["gigpo"]["shared"] == pytest.approx(2 / 7) and rows["gigpo"]["shared_by_turn"]["0"] == pytest.approx(2 / 3)
    assert "bias_squared" not in rows["gigpo"]  # state groups: a baseline, not an R~
    for name in ("aria", "aria_window0", "aria_behavioural_window0"):
        r = rows[name]
        assert r["mse"] == pytest.approx(r["bias_squared"] + r["variance_within"])
    # how much of the outcome each weighting keeps. Steps: g1 animal .95, dog 1 | g2 animal2 .9025, hmm .95,
    # dog 1 (both won) | g3 think 0, animal2 0 (lost). R itself: correlation with [1,1,1,1,1,0,0] is
    # cov 0.196020 / sqrt(0.189235 * 10/49) = 0.9975; with the action alone, R~ = a, 1, a, n, 1, n, a
    # (a = (.95 + .9025 + 0)/3, n = .95/2): cov 0.039949 / sqrt(0.042902 * 10/49) = 0.4269. The two won
    # games' last steps (the dog) get 1 under both; GiGPO's advantages are not in return units.
    assert alone["outcome_correlation"] == pytest.approx(0.9975, abs=1e-4) and alone["won_last_step"] == 1.0
    action_only = rows["aria_behavioural_window0"]
    assert action_only["outcome_correlation"] == pytest.approx(0.4269, abs=1e-4) and action_only["won_last_step"] == 1.0
    assert rows["gigpo"]["won_last_step"] is None and -1 <= rows["gigpo"]["outcome_correlation"] <= 1
    assert "| aria_behavioural_window0 | history+action | 100.0% |" in markdown(found)
    assert "| 0.427 | 1.000 |" in markdown(found)
    rows["aria"].update(snr=0.005, snr_corrected=0.001, snr_corrected_ci95=[-0.0005, 0.0025], snr_difference=-0.0002,
                        snr_difference_ci95=[-0.0012, 0.0008])
    assert "| 0.005 | 1.00 (-0.50 to 2.50) | -0.20 (-1.20 to 0.80) |" in markdown(found)
    from in_process import run_script

    done = run_script(REPO / "scripts/grouping_schemes.py", str(tmp_path / "run"), "--window", "0", "--out", str(tmp_path / "g.json"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "g.json").read_text())["schemes"]["gigpo"]["shared"] == pytest.approx(2 / 7)
    # with a policy: every weighting's SNR with its bootstrap interval, the raw return's ratio exactly 1
    done = run_script(REPO / "scripts/grouping_schemes.py", str(tmp_path / "run"), "--model", str(tiny_model_dir),
                      "--samples", "7", "--bootstrap", "30", "--out", str(tmp_path / "g.json"))
    assert done.returncode == 0, done.stderr
    schemes = json.loads((tmp_path / "g.json").read_text())["schemes"]
    assert schemes["no_aggregation"]["snr_difference"] == 0
    assert schemes["no_aggregation"]["snr_difference_ci95"] == pytest.approx([0.0, 0.0], abs=1e-12)
    for name, row in schemes.items():
        low, high = row["snr_corrected_ci95"]
        assert row["snr_corrected"] == pytest.approx(row["snr"] * 6 / 7 - 1 / 7) and low <= high, name
    kept = np.load(tmp_path / "g.gram.npz")
    assert kept["gram"].shape == (7, 7) and len(kept["weights_weighting_aria"]) == 7
    # --threshold reaches the SNR's weights too (before: always 0.9 there), and one command gives one SNR
    # (before: the LoRA adapter's random A made two runs differ)
    from aria.data import read_training_set
    from aria.trainers.methods import method_weights

    done = run_script(REPO / "scripts/grouping_schemes.py", str(tmp_path / "run"), "--model", str(tiny_model_dir),
                      "--samples", "7", "--bootstrap", "0", "--threshold", "0.5", "--out", str(tmp_path / "t0.5.json"))
    assert done.returncode == 0, done.stderr
    samples = read_training_set(tmp_path / "run" / "train.json")
    at_half, at_default = (method_weights("gigpo_similar", samples, threshold=t) for t in (0.5, 0.9))
    assert not np.allclose(at_half, at_default)  # the threshold matters on these steps
    gradients = json.loads((tmp_path / "t0.5.json").read_text())["gradients"]
    assert "snr_weighting_gigpo_similar" in gradients and "snr_method_gigpo_similar" not in gradients
    first = json.loads((tmp_path / "t0.5.json").read_text())["schemes"]
    done = run_script(REPO / "scripts/grouping_schemes.py", str(tmp_path / "run"), "--model", str(tiny_model_dir),
                      "--samples", "7", "--bootstrap", "5", "--threshold", "0.5", "--out", str(tmp_path / "t.json"))
    assert done.returncode == 0, done.stderr
    again = json.loads((tmp_path / "t.json").read_text())["schemes"]
    assert all(again[name]["snr"] == first[name]["snr"] for name in first)
    weights = np.load(tmp_path / "t.gram.npz")["weights_weighting_gigpo_similar"]
    np.testing.assert_allclose(weights, at_half)  # all 7 samples, in their order


def test_grouping_schemes_reads_the_run_as_it_ran_and_refuses_stale_steps(tmp_path):
    """The run's own game settings (two targets here), not the game's defaults; a run whose later
    steps no longer match is refused in one line, and nothing is rewritten under other settings."""
    from aria.experiment.grouping import compare, run_config

    cfg = _behaviour_run(tmp_path)
    cfg["game"]["targets_only"] = ["Dog", "Chair"]
    run_all(cfg)
    behaviour = tmp_path / "run" / "behaviour.json"
    assert json.loads(behaviour.read_text())["targets"] == 2
    rebuilt = run_config(tmp_path / "run")
    assert rebuilt["game"]["targets_only"] == ["Dog", "Chair"] and rebuilt["labels"] == "clusters"
    assert compare(rebuilt)["schemes"]["aria_behavioural"]["shared"] == pytest.approx(2 / 7)
    assert json.loads(behaviour.read_text())["targets"] == 2
    import shutil  # a folder whose name Hydra would parse as a list (before: ConfigCompositionException)

    shutil.copytree(tmp_path / "run", tmp_path / "co,mma")
    assert compare(run_config(tmp_path / "co,mma"))["schemes"]["gigpo"]["shared"] == pytest.approx(2 / 7)
    # a run written before step 1 recorded its settings: the defaults are refused by step 4's fingerprint
    # before behaviour.json is touched (before: rewritten over the default ten targets)
    utterances = tmp_path / "run" / "utterances.json"
    summary = json.loads(utterances.read_text())
    utterances.write_text(json.dumps({k: v for k, v in summary.items() if k != "made_under"}))
    with pytest.raises(pipeline.StaleInput, match=r"train.json is missing, was made from another labelled.jsonl or game "
                                                  r"settings.*re-run step 4"):
        compare(run_config(tmp_path / "run"))
    assert json.loads(behaviour.read_text())["targets"] == 2
    utterances.write_text(json.dumps(summary))
    # a training set edited by hand
    train = tmp_path / "run" / "train.json"
    train.write_text(train.read_text() + " ")
    with pytest.raises(pipeline.StaleInput, match=r"re-run step 4"):
        compare(run_config(tmp_path / "run"))
    pipeline.step4_build_training_set(cfg, lambda s: None)
    # step 2 re-run under another gamma: the labels and the training set are of the old selection
    cfg["aggregation"]["gamma"] = 0.9
    pipeline.step2_select_k(cfg, lambda s: None)
    with pytest.raises(pipeline.StaleInput, match=r"labelled.jsonl was made from another selection.json.*re-run step 3"):
        compare(run_config(tmp_path / "run"))


def test_selection_keys_whole_history_chooses_the_papers_k_and_trains_under_the_window(
        tmp_path, twenty_questions_games, tiny_sentence_model_dir):
    """``selection.keys: whole_history``: SplitScore scores each k with R~ under the paper's whole-history
    keys, so a windowed variant trains at the k the paper's keys choose; its rewards (steps 3-4) are still
    aggregated under the window. Default (``aggregation``): SplitScore under the window's own keys."""
    quiet = lambda line: None  # noqa: E731
    paper = tq_config(tmp_path, twenty_questions_games, tiny_sentence_model_dir)
    pipeline.step1_embed_and_cluster(paper, quiet)
    chosen_by_paper = pipeline.step2_select_k(paper, quiet)
    on_window = pipeline.step2_select_k(tq_config(tmp_path, twenty_questions_games, tiny_sentence_model_dir,
                                                  "aggregation.window=0"), quiet)
    variant = tq_config(tmp_path, twenty_questions_games, tiny_sentence_model_dir, "aggregation.window=0",
                        "selection.keys=whole_history")
    chosen_by_variant = pipeline.step2_select_k(variant, quiet)
    curve = lambda report: np.array(report["curves"]["split_score"][:-1])  # noqa: E731  (the last k has none)
    # the window changes SplitScore on these games; whole_history scores exactly as the paper's run does
    assert not np.allclose(curve(on_window), curve(chosen_by_paper))
    np.testing.assert_array_equal(curve(chosen_by_variant), curve(chosen_by_paper))
    assert chosen_by_variant["chosen"] == chosen_by_paper["chosen"]
    assert chosen_by_variant["settings"]["selection"]["keys"] == "whole_history"
    # its training rewards are the window's at that k: as a run with the window and that k fixed
    k = next(iter(chosen_by_paper["chosen"]["k"].values()))

    def rewards(cfg: dict) -> list[float]:
        pipeline.step2_select_k(cfg, quiet)
        pipeline.step3_apply_labels(cfg, quiet)
        return [t["intention"]["reward"] for line in (tmp_path / "labelled.jsonl").read_text().splitlines()
                for t in json.loads(line)["turns"]]

    trained = rewards(variant)
    assert trained == rewards(tq_config(tmp_path, twenty_questions_games, tiny_sentence_model_dir,
                                        "aggregation.window=0", f"selection.fixed_k={k}"))
    assert trained != rewards(tq_config(tmp_path, twenty_questions_games, tiny_sentence_model_dir, f"selection.fixed_k={k}"))
    # a step 2 made before the setting existed records no keys: read as the default, not as stale
    pipeline.step2_select_k(paper, quiet)
    report = json.loads((tmp_path / "selection.json").read_text())
    del report["settings"]["selection"]["keys"]
    (tmp_path / "selection.json").write_text(json.dumps(report))
    assert pipeline.step2_select_k(paper, quiet)["fingerprint"] == report["fingerprint"]  # up to date, not redone
    pipeline.step3_apply_labels(paper, quiet)
    # without a window the keys change nothing: step 2 stays up to date and step 3 agrees with it
    same = tq_config(tmp_path, twenty_questions_games, tiny_sentence_model_dir, "selection.keys=whole_history")
    assert pipeline.step2_select_k(same, quiet)["fingerprint"] == report["fingerprint"]
    pipeline.step3_apply_labels(same, quiet)
    with pytest.raises(ValueError, match="selection.keys: expected one of aggregation, whole_history, got 'last'"):
        pipeline.check_settings(dict(paper, selection={**paper["selection"], "keys": "last"}))
