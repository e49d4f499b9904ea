"""Online ARIA (aria/trainers/online.py) and reward-model scoring in process and over HTTP
(aria/trainers/reward_service.py), on tiny random models built in the tests.

The tiny policy's replies are gibberish, so its games are all lost and every aggregated reward
is 0; these tests check the loop's mechanics (rollout -> score -> update -> refresh ->
checkpoint -> resume), not learning. Learning of the reward model itself is tested in
test_reward_model.py.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aria.resources import compose_config
from aria.trainers.reward_service import HttpScorer, InProcessScorer, ScoringError, make_server, merge_if_adapter
from aria.trainers.online import OnlineTrainer, update_batches


def online_config(tmp_path: Path, model_dir: Path, sentence_dir: Path, *overrides: str) -> dict:
    return compose_config("onlinereinforce_llm", [
        f"model.path={model_dir}", f"output_dir={tmp_path / 'online'}", "device=cpu", "train.mixed_precision=no",
        "train.micro_batch_size=4", "train.gradient_accumulation_steps=2", "train.lr=1e-2",
        "online.rollout_size=3", "online.rollout_batch_size=3", "online.actor_updates=2", "online.iterations=1",
        "online.rm_refresh=2", "rollout.max_new_tokens=6", "logging.progress=false",
        # 5 questions a game, not 20: the tiny random model never wins, so every game runs to the limit
        "online.max_turns=5",
        # float32 scores on every CPU (auto is bfloat16 where the CPU has AVX512-BF16), as the test recomputes them
        "reward_model.dtype=float32",
        f"online.intention_overrides=['embedder.model={sentence_dir}','clustering.k_max=4']",
        "reward_model.train_overrides=['device=cpu','train.mixed_precision=no','train.epochs=1','train.micro_batch_size=8',"
        "'train.gradient_accumulation_steps=1','data.eval_fraction=0.34']",
        *overrides])


def trainable(trainer: OnlineTrainer) -> dict[str, torch.Tensor]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_update_batches_cycle_a_seeded_order_and_sort_by_length():
    plan = update_batches(5, updates=3, batch_size=4, micro_batch_size=2, seed=[0, 1], lengths=[5, 1, 4, 2, 3])
    assert [len(step) for step in plan] == [2, 2, 2] and all(len(mb) == 2 for step in plan for mb in step)
    flat = [i for step in plan for mb in step for i in mb]
    assert sorted(flat[:5]) == [0, 1, 2, 3, 4]  # the first pass covers every sample once
    lengths = [5, 1, 4, 2, 3]
    for step in plan:  # longest first within a step
        order = [i for mb in step for i in mb]
        assert [lengths[i] for i in order] == sorted((lengths[i] for i in order), reverse=True)
    assert plan == update_batches(5, 3, 4, 2, seed=[0, 1], lengths=lengths)
    assert update_batches(0, 3, 4, 2, seed=0) == []


def test_packed_update_batches_keep_each_games_steps_together():
    """With the samples' games (prefix-tree packing), a seeded order of whole games, each game's
    steps in order, cycled: a micro-batch holds consecutive steps of a game."""
    groups = ["a", "a", "a", "b", "b", "c", "c", "c", "c"]
    plan = update_batches(9, updates=3, batch_size=6, micro_batch_size=3, seed=[0, 2], lengths=list(range(9)),
                          groups=groups)
    flat = [i for step in plan for mb in step for i in mb]
    assert sorted(flat[:9]) == list(range(9))  # the first pass covers every sample once
    for game in "abc":
        first_pass = [i for i in flat[:9] if groups[i] == game]
        assert first_pass == sorted(first_pass)  # in file order
    runs = [groups[i] for i in flat[:9]]
    assert sum(a != b for a, b in zip(runs, runs[1:])) == 2  # each game one contiguous run
    assert plan == update_batches(9, 3, 6, 3, seed=[0, 2], groups=groups)


def test_one_iteration_end_to_end_with_a_reward_model_refresh(tmp_path, tiny_model_dir, tiny_sentence_model_dir):
    # The first reward model learns from an offline aggregated-reward set (reward_model.train_file).
    offline = [{"observation": f"Question {i}: Is it an animal?", "action": "Question: Is it a fruit?" if i % 2 else "Yes.",
                "reward": float(i % 2), "game_id": f"g{i // 2}", "turn": i % 2} for i in range(12)]
    (tmp_path / "offline.json").write_text(json.dumps(offline))
    cfg = online_config(tmp_path, tiny_model_dir, tiny_sentence_model_dir, f"reward_model.train_file={tmp_path / 'offline.json'}")
    trainer = OnlineTrainer(cfg)
    before = trainable(trainer)
    result = trainer.train()
    out = tmp_path / "online"
    assert result["iterations"] == 1 and result["steps"] == 2

    # The rollout buffer: 3 finished games of the iteration, in the trajectory schema.
    games = [json.loads(line) for line in (out / "rollouts" / "iter-00000" / "twenty_questions.rank0.jsonl").read_text().splitlines()]
    assert len(games) == 3 and all(g["status"] == "finished" for g in games)
    assert all(g["num_turns"] == 5 for g in games)  # online.max_turns=5; a random tiny model never wins early
    steps = sum(g["num_turns"] for g in games)

    # The first reward model was trained on the offline set; the refresh due at step 2
    # (rm_refresh=2) trained the next one from it on iteration 0's rollouts, aggregated.
    first = json.loads((out / "rm_refresh" / "step-000000" / "refresh.json").read_text())
    second = json.loads((out / "rm_refresh" / "step-000002" / "refresh.json").read_text())
    assert first["rm_train_samples"] == 12 and "rm_window" not in first
    assert second["rm_train_samples"] == steps and second["rm_window"] == [0, 0] and "eval_loss" in second
    train_rm_args = json.loads((out / "rm_refresh" / "step-000002" / "reward_model" / "final" / "aria_training.json").read_text())
    assert train_rm_args["config"]["model"]["path"] == str(out / "rm_refresh" / "step-000000" / "reward_model" / "final")
    assert result["reward_model"] == str(out / "rm_refresh" / "step-000002" / "reward_model" / "final")
    # Steps 1-4 ran on the rollouts (labels, selection, training set) in the refresh's folder.
    assert (out / "rm_refresh" / "step-000002" / "twenty_questions" / "selection.json").is_file()

    # One metrics line: rollout success, RM scores of every step, the update, the refresh.
    (metrics,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics["twenty_questions/games"] == 3 and metrics["twenty_questions/success_rate"] == 0.0
    assert metrics["score_n"] == steps and metrics["step"] == 2 and metrics["loss"] is not None
    assert metrics["rm_refresh"]["rm_train_samples"] == steps

    # The scores the update used are the first reward model's on those steps.
    scorer = InProcessScorer(out / "rm_refresh" / "step-000000" / "reward_model" / "final", 512)
    scores = scorer.score(trainer.step_samples(games))
    assert metrics["score_mean"] == pytest.approx(float(scores.mean()), abs=1e-5)

    # The actor moved, and the final adapter and a checkpoint were written.
    after = trainable(trainer)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert (out / "final" / "adapter_config.json").is_file()
    assert (out / "checkpoints" / "step-2" / "trainer_state.json").is_file()


def test_interrupted_run_resumes_to_the_same_weights(tmp_path, tiny_model_dir, tiny_sentence_model_dir):
    # No reward model is given: the first one learns from iteration 0's own rollouts, aggregated.
    common = ["online.iterations=2", "online.rm_refresh=0", "train.threads=1"]  # one thread whatever the load
    full_cfg = online_config(tmp_path / "full", tiny_model_dir, tiny_sentence_model_dir, *common)
    OnlineTrainer(full_cfg).train()

    class Interrupt(Exception):
        pass

    def stop_after_first(iteration):
        if iteration == 0:
            raise Interrupt

    cut_cfg = online_config(tmp_path / "cut", tiny_model_dir, tiny_sentence_model_dir, *common)
    with pytest.raises(Interrupt):
        OnlineTrainer(cut_cfg, on_iteration=stop_after_first).train()
    # A half-played next iteration left behind is played again with the restored state.
    stale = tmp_path / "cut" / "online" / "rollouts" / "iter-00001" / "twenty_questions.rank0.jsonl"
    stale.parent.mkdir(parents=True)
    stale.write_text("{not a finished game\n")
    resumed = OnlineTrainer(cut_cfg).train()
    assert resumed["resumed_from"].endswith("step-2") and resumed["iterations"] == 2 and resumed["steps"] == 4

    a = load_file(str(tmp_path / "full" / "online" / "final" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "online" / "final" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.endswith("lora_B.weight") and a[k].abs().sum() > 0 for k in a)  # LoRA B starts at zero: it was trained
    lines = [json.loads(x) for x in (tmp_path / "cut" / "online" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [0, 1]
    full_lines = [json.loads(x) for x in (tmp_path / "full" / "online" / "metrics.jsonl").read_text().splitlines()]
    assert [m["score_mean"] for m in lines] == [m["score_mean"] for m in full_lines]
    assert lines[0]["rm_refresh"]["rm_window"] == [0, 0] and "rm_refresh" not in lines[1]


@pytest.fixture(scope="module")
def rm_dirs(tmp_path_factory, tiny_model_dir):
    """Two fixed reward models (a scalar head on the tiny Llama, saved once so that every load
    gives the same weights)."""
    from aria.trainers.reward_model import load_reward_model

    folders = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        tokenizer, model = load_reward_model(str(tiny_model_dir))
        folder = tmp_path_factory.mktemp(f"rm{seed}")
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(folder)
    return folders


SAMPLES = [{"observation": "Let's play a game. Question: Is it an animal?", "action": "Question: Is it a fruit?"},
           {"observation": "Here is the game history:", "action": "Yes."},
           {"observation": "Guess the object. " * 5, "action": "Question: Is it big?"}]


def test_http_scoring_service_matches_in_process_scores(rm_dirs):
    local = InProcessScorer(rm_dirs[0], 512, batch_size=2)
    expected = local.score(SAMPLES)
    server = make_server(InProcessScorer(rm_dirs[0], 512), port=0, load_root=Path(rm_dirs[1]).parent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = HttpScorer(f"http://127.0.0.1:{server.server_address[1]}", timeout=30, retries=0, batch_size=2)
        # two requests of 2 and 1 samples, where the local scorer may pack all 3 in one prefix-tree
        # pass: the same scores up to float rounding (up to 1.4e-6 apart on a 2-core Sapphire Rapids,
        # within 1e-6 on the AVX2 EPYC)
        assert client.score(SAMPLES) == pytest.approx(expected, abs=1e-5)
        assert client.health() == {"model": Path(rm_dirs[0]).name, "scored": 3}
        client.load(rm_dirs[1])  # what the online trainer does after a refresh
        assert client.score(SAMPLES) == pytest.approx(InProcessScorer(rm_dirs[1], 512).score(SAMPLES), abs=1e-5)
        with pytest.raises(ScoringError, match=r"samples\[1\]\.action"):
            client._request("POST", "/score", {"samples": [SAMPLES[0], {"observation": "o"}]})
        with pytest.raises(ScoringError, match="outside the folder this service may load from"):
            client._request("POST", "/load", {"path": "/no/such/model"})
    finally:
        server.shutdown()
        server.server_close()


def test_http_scorer_names_an_unreachable_service():
    client = HttpScorer("http://127.0.0.1:9", timeout=2, retries=1, backoff=0.01)
    with pytest.raises(ScoringError, match=r"http://127.0.0.1:9/score: no answer after 2 attempt\(s\)"):
        client.score(SAMPLES)


def test_online_loop_scores_through_the_http_service(tmp_path, tiny_model_dir, tiny_sentence_model_dir, rm_dirs):
    server = make_server(InProcessScorer(rm_dirs[0], 512), port=0, load_root=Path(rm_dirs[0]).parent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        cfg = online_config(tmp_path, tiny_model_dir, tiny_sentence_model_dir, "online.rm_refresh=0",
                            "reward_model.serve.name=http", f"reward_model.serve.url={url}",
                            f"reward_model.init_path={rm_dirs[0]}")
        result = OnlineTrainer(cfg).train()
        health = HttpScorer(url).health()
    finally:
        server.shutdown()
        server.server_close()
    (metrics,) = [json.loads(x) for x in (tmp_path / "online" / "metrics.jsonl").read_text().splitlines()]
    assert health["model"] == Path(rm_dirs[0]).name and health["scored"] == metrics["score_n"] > 0
    assert result["reward_model"] == str(rm_dirs[0]) and not (tmp_path / "online" / "rm_refresh").exists()


def test_merge_if_adapter_makes_a_full_reward_model(tmp_path, tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from aria.trainers.reward_model import load_reward_model

    tokenizer, model = load_reward_model(str(tiny_model_dir))
    base = tmp_path / "base"
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    torch.manual_seed(3)
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], task_type="SEQ_CLS",
                                                  init_lora_weights=False))
    final = tmp_path / "final"
    peft_model.save_pretrained(final)
    # the adapter records where its base is
    config_path = final / "adapter_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "base_model_name_or_path": str(base)}))
    tokenizer.save_pretrained(final)
    adapter_scores = InProcessScorer(final, 512).score(SAMPLES)
    assert merge_if_adapter(final) == final
    assert not (final / "adapter_config.json").exists() and (tmp_path / "final.adapter" / "adapter_config.json").is_file()
    assert InProcessScorer(final, 512).score(SAMPLES) == pytest.approx(adapter_scores, abs=1e-5)
    assert not np.allclose(adapter_scores, InProcessScorer(base, 512).score(SAMPLES))


def test_two_processes_share_the_games_and_refresh_once(tmp_path, tiny_model_dir, tiny_sentence_model_dir, rm_dirs):
    """accelerate launch with two CPU processes (torchrun, gloo): each plays its share of the
    games; the main process aggregates both shares for the refresh while the other waits."""
    import os
    import subprocess
    import sys

    from aria.resources import REPO_ROOT

    out = tmp_path / "online"
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO_ROOT / "config/accelerate/cpu_2proc.yaml"),
         str(REPO_ROOT / "scripts/run_online.py"), f"model.path={tiny_model_dir}", f"output_dir={out}", "device=cpu",
         "train.mixed_precision=no", "train.micro_batch_size=2", "train.gradient_accumulation_steps=2",
         "online.rollout_size=4", "online.rollout_batch_size=2", "online.actor_updates=1", "online.iterations=1",
         "online.rm_refresh=1", "rollout.max_new_tokens=6", "logging.progress=false", f"reward_model.init_path={rm_dirs[0]}",
         "online.max_turns=5",
         f"online.intention_overrides=['embedder.model={tiny_sentence_model_dir}','clustering.k_max=4']",
         "reward_model.train_overrides=['device=cpu','train.mixed_precision=no','train.epochs=1',"
         "'train.micro_batch_size=8','train.gradient_accumulation_steps=1','data.eval_fraction=0.25']"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    shares = [[json.loads(x) for x in (out / "rollouts" / "iter-00000" / f"twenty_questions.rank{r}.jsonl").read_text().splitlines()]
              for r in (0, 1)]
    assert [len(s) for s in shares] == [2, 2]
    assert not {g["game_id"] for g in shares[0]} & {g["game_id"] for g in shares[1]}
    steps = sum(g["num_turns"] for s in shares for g in s)
    (metrics,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics["twenty_questions/games"] == 4 and metrics["step"] == 1
    assert metrics["rm_refresh"]["rm_train_samples"] == steps  # both processes' rollouts, aggregated together
    state = json.loads((out / "checkpoints" / "step-1" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["rm_path"] == str(out / "rm_refresh" / "step-000001" / "reward_model" / "final")


def test_paper_preset_is_table_4():
    cfg = compose_config("onlinereinforce_llm", ["online_scale=paper", "model.path=/models/llama-3-8b-instruct"])
    o, t = cfg["online"], cfg["train"]
    assert (o["rollout_size"], o["actor_updates"], o["iterations"], o["rm_refresh"]) == (32, 10, 150, 50)
    assert t["lr"] == 3e-6 and t["micro_batch_size"] * t["gradient_accumulation_steps"] * 8 == 64  # on 8 GPUs
    assert cfg["model"]["lora"]["r"] == 8 and cfg["model"]["lora"]["alpha"] == 16
    assert cfg["model"]["lora"]["target_modules"] == ["q_proj", "k_proj", "v_proj"]
    rm = compose_config("reward_model", ["model.path=/models/llama-3.1-8b-instruct", *cfg["reward_model"]["train_overrides"]])
    assert rm["train"]["lr"] == 2e-5 and rm["train"]["epochs"] == 3
    assert rm["train"]["micro_batch_size"] * rm["train"]["gradient_accumulation_steps"] == 64
    cpu = compose_config("onlinereinforce_llm", [])
    assert cpu["model"]["path"] == "embedded" and cpu["online"]["games"] == ["twenty_questions"]
    # the preset's values win over the base config's
    assert (cpu["online"]["iterations"], cpu["online"]["rollout_size"], cpu["online"]["actor_updates"]) == (4, 16, 2)
    assert cpu["rollout"]["dtype"] == "auto" and "data.max_samples=128" in cpu["reward_model"]["train_overrides"]


def test_rollout_copy_has_the_live_policy_weights(tmp_path, tiny_model_dir, tiny_sentence_model_dir):
    """After an update, the inference copy (rollout.dtype) computes what the LoRA policy computes,
    and syncing leaves the policy's own weights untouched."""
    from aria.trainers.online import sync_weights

    cfg = online_config(tmp_path, tiny_model_dir, tiny_sentence_model_dir, "rollout.dtype=float32")
    trainer = OnlineTrainer(cfg)
    policy = trainer.accelerator.unwrap_model(trainer.model)
    samples = [{"observation": "Is it an animal?", "action": "Question: Is it a fruit?"}] * 4
    trainer.actor_update(samples, np.array([1.0, -1.0, 0.5, 2.0]), iteration=0)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    copy = trainer.rollout_model()
    ids = torch.tensor([[5, 17, 40, 3, 99, 12]])
    with torch.no_grad():
        expected = policy(input_ids=ids).logits
        got = copy(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-4) and not torch.allclose(got, type(copy).from_pretrained(tiny_model_dir)(input_ids=ids).logits, atol=1e-3)
    assert all(torch.equal(before[n], p) for n, p in policy.named_parameters())
    with pytest.raises(Exception):
        sync_weights(policy, torch.nn.Linear(2, 2))  # a copy of another architecture is refused


def test_an_online_step_raises_the_favoured_action(tmp_path, tiny_model_dir, tiny_sentence_model_dir):
    """Two replies to one prompt, advantages +1 and −1: one actor update must raise the log-prob of
    the first relative to the second (log-probs measured with an independent computation). With
    the advantages' sign flipped, the gap would shrink."""
    from aria.llm.policy import encode_sample
    from conftest import naive_action_logprob

    cfg = online_config(tmp_path, tiny_model_dir, tiny_sentence_model_dir, "online.actor_updates=1",
                        "train.micro_batch_size=2", "train.gradient_accumulation_steps=1", "train.lr=1e-2")
    trainer = OnlineTrainer(cfg)
    model = trainer.accelerator.unwrap_model(trainer.model)
    prompt = "Let's play a game of Twenty Questions. Here is the game history:"
    replies = ["Question: Is it an animal?", "Question: Is it a fruit? Yes. Yes."]
    samples = [{"observation": prompt, "action": a} for a in replies]
    encoded = [encode_sample(trainer.tokenizer, prompt, a, 512, cfg["data"]["append_eos"]) for a in replies]

    def logps():
        model.eval()
        with torch.no_grad():
            return [float(naive_action_logprob(model, e)) for e in encoded]

    before = logps()
    trainer.actor_update(samples, np.array([1.0, -1.0]), iteration=0)
    after = logps()
    assert after[0] > before[0] and after[1] < before[1]
    assert (after[0] - after[1]) - (before[0] - before[1]) > 0.05


def test_a_bad_max_turns_is_one_line_before_any_model_loads(tmp_path):
    from aria.io import ConfigError

    with pytest.raises(ConfigError, match=r"online.max_turns: expected an integer >= 1, got 0"):  # where the config enters
        compose_config("onlinereinforce_llm", ["model.path=/no/model", f"output_dir={tmp_path}", "online.max_turns=0"])
    cfg = compose_config("onlinereinforce_llm", ["model.path=/no/model", f"output_dir={tmp_path}"])
    cfg["online"]["max_turns"] = 0  # and a dict a caller built
    with pytest.raises(ConfigError, match=r"online.max_turns: expected an integer >= 1, got 0"):
        OnlineTrainer(cfg)


def test_a_loss_with_a_fixed_reference_is_refused_online(tmp_path):
    """clipped_reinforce reads log-probs computed once on a fixed training set: online, where the
    steps change every iteration, it is one line before any model loads, not a silent misuse."""
    from aria.io import ConfigError

    cfg = compose_config("onlinereinforce_llm", ["model.path=/no/model", f"output_dir={tmp_path}",
                                                 "loss.name=clipped_reinforce"])
    with pytest.raises(ConfigError, match=r"loss.name: 'clipped_reinforce' is a loss of the offline trainer"):
        OnlineTrainer(cfg)
