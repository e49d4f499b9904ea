"""The GPU paths, checked on a CUDA machine: what the CPU tests prove, measured again on a GPU.

The test suite runs on CPUs only (CI has no GPU, and every test pins ``device=cpu``). This script
runs the same exactness properties on a CUDA device, with the tests' tiny random model
(``tests/conftest.py``) and the tests' samples, and writes what it found, property by property,
to one JSON file. It asserts nothing: on a GPU some properties hold only up to rounding
(bfloat16, non-deterministic kernels), and the point is to record by how much.

* ``generation``: the local policy's batched generation with per-game KV reuse against plain
  unbatched, uncached generation, greedy, in float32 and bfloat16 (``tests/test_local_policy.py``).
* ``packing``: log-probs, loss and LoRA gradient of prefix trees against padded rows, for the
  packing tests' five micro-batches, with SDPA and eager attention, in float32 and under bfloat16
  autocast as mixed-precision training runs them (``tests/test_packing.py``).
* ``trainers``: each trainer's step packed and padded (REINFORCE, reward model, trajectory DPO),
  float32 on the GPU.
* ``resume``: offline REINFORCE in bfloat16 mixed precision (``mixed_precision=auto``), run whole
  and run cut at step 2 then resumed: are the final weights bit-identical?
* ``merge``: a merged LoRA model's log-probs against the adapter's, in float32 and bfloat16.
* ``online``: one iteration of online ARIA (rollouts, reward-model refresh, update) with every
  setting left at ``auto``.
* ``deepspeed``: offline REINFORCE launched as the paper's scale launches it, ``accelerate launch``
  with ``config/accelerate/deepspeed_zero3.yaml`` (ZeRO-3, parameters and optimizer offloaded to
  the CPU, bf16) on one process: does it train, save and reload a final model, resume from a
  checkpoint to the same weights, and how far are its weights from the same run without DeepSpeed?
  Needs ``deepspeed`` installed (it builds its CPU Adam at first use).
* ``archer``: ArCHer's critic (``aria/trainers/archer.py``) with ``device=auto`` and
  ``mixed_precision=auto`` on the tests' planted games (``tests/test_archer.py``): the hand values
  it should reach with the encoder learning and with the encoder frozen, a run cut at step 3 and
  resumed against the whole run, and two actor steps of ``method=archer`` on the GPU (the
  higher-advantage action's log-prob should rise, the other's fall).
* ``archer_speed`` (with ``--critic-set``): seconds per optimizer step of the critic at the
  release's settings (micro-batch 8, 32 accumulated, histories up to 512 tokens) on a real
  collection's steps, the encoder learning and the heads alone, float32 and bf16. The encoder is
  ``--critic-encoder`` (a folder with an encoder's ``config.json`` and tokenizer; weights are drawn
  at random when it has none: a step's time does not depend on their values).

    python benchmarks/gpu_paths.py --out benchmarks/results/gpu_paths.json

Training speed on a GPU is ``benchmarks/training_packing.py --device auto``.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the tests' tiny model and samples

from aria.io import atomic_write_json  # noqa: E402


def to(batch: dict, device: str) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def played_samples(model_dir: Path, work: Path, device: str) -> list[dict]:
    """The packing tests' samples: four games the tiny model played, as pipeline step 4 renders them."""
    from aria.games.common.base import load_game_config
    from aria.games.family import family_of
    from aria.games.question.game import build_game
    from aria.games.question.oracle import build_oracle
    from aria.games.question.play import play_games
    from aria.llm.local import LocalChatModel
    from aria.trajectories import read_trajectories

    game_cfg = {**load_game_config("twenty_questions_subset"), "max_turns": 6}
    out = work / "games.jsonl"
    policy = LocalChatModel(str(model_dir), max_new_tokens=12, seed=0, dtype="float32", device=device)
    play_games(build_game(game_cfg), policy, build_oracle({"name": "knowledge_base"}, game_cfg), out, num_games=4,
               seed=0, batch_size=4, progress=False)
    render = family_of(game_cfg).observation_renderer(game_cfg)
    return [{"observation": render(r, i), "action": t["action"], "reward": -1.0 + 0.25 * i,
             "step_return": -float(len(r["turns"]) - i), "game_id": r["game_id"], "turn": i}
            for r in read_trajectories(out) for i, t in enumerate(r["turns"])]


def check_generation(model_dir: Path, device: str) -> dict:
    from aria.llm.local import LocalChatModel

    found = {}
    for dtype in ("float32", "bfloat16"):
        cached = LocalChatModel(str(model_dir), max_new_tokens=6, temperature=0, reuse_cache=True, dtype=dtype, device=device)
        plain = LocalChatModel(str(model_dir), max_new_tokens=6, temperature=0, reuse_cache=False, dtype=dtype, device=device)
        keys = ["a", "b", "c"]
        prompts = ["Is it an animal?", "Let's play a game of Twenty Questions. Guess the object.", "Hi"]
        equal_turns = 0
        for _ in range(3):
            conversations = [[{"role": "user", "content": p}] for p in prompts]
            batched = [c.text for c in cached.generate(conversations, keys=keys)]
            one_by_one = [plain.generate([c])[0].text for c in conversations]
            equal_turns += batched == one_by_one
            prompts = [p + f"\nQuestion: {reply}\nAnswer: No." + " Yes." * i for i, (p, reply) in enumerate(zip(prompts, batched))]
        found[dtype] = {"turns": 3, "turns_with_equal_replies": equal_turns}
    return found


def check_packing(model_dir: Path, samples: list[dict], device: str) -> dict:
    from peft import LoraConfig, get_peft_model

    from aria.llm.policy import action_logprobs, collate, load_policy
    from aria.packing import collate_tree
    from aria.trainers.losses import reinforce_loss
    from test_packing import cases, gradients

    found = {}
    for attention in ("sdpa", "eager"):
        for precision in ("float32", "bf16_autocast"):
            tokenizer, model = load_policy(str(model_dir))
            model.config._attn_implementation = attention
            torch.manual_seed(0)
            model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                     init_lora_weights=False)).to(device)
            for case, encoded in cases(tokenizer, samples).items():
                reward = torch.linspace(-1.0, 1.0, len(encoded), device=device)
                tree = to(collate_tree(encoded, tokenizer.pad_token_id), device)
                rows = to(collate(encoded, tokenizer.pad_token_id), device)
                results = []
                for batch in (rows, tree):
                    model.zero_grad()
                    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=precision == "bf16_autocast"):
                        logp = action_logprobs(model, batch)
                        loss = reinforce_loss(logp, reward)
                    loss.backward()
                    results.append((logp.detach().float(), float(loss), gradients(model).float()))
                (lp_r, loss_r, g_r), (lp_t, loss_t, g_t) = results
                found[f"{attention}/{precision}/{case}"] = {
                    "logp_max_abs_diff": float((lp_t - lp_r).abs().max()),
                    "logp_max_abs": float(lp_r.abs().max()),
                    "loss_rel_diff": abs(loss_t - loss_r) / max(abs(loss_r), 1e-12),
                    "grad_rel_diff": float((g_t - g_r).norm() / g_r.norm()),
                    "tree_tokens": int(tree["input_ids"].numel()), "row_tokens": int(sum(len(e.input_ids) for e in encoded)),
                }
    return found


def trainer_config(work: Path, model_dir: Path, data: list[dict], name: str, *overrides: str) -> dict:
    from aria.resources import compose_config

    work.mkdir(parents=True, exist_ok=True)
    (work / "train.json").write_text(json.dumps(data))
    return compose_config(name, [f"model.path={model_dir}", f"data.train_file={work / 'train.json'}", f"output_dir={work / 'out'}",
                                 "train.warmup_ratio=0", "train.lr_scheduler=constant", "logging.report_to=null", *overrides])


def check_trainers(model_dir: Path, samples: list[dict], work: Path) -> dict:
    from aria.trainers.dpo import TrajectoryDPOTrainer
    from aria.trainers.offline import OfflineTrainer
    from aria.trainers.reward_model import RewardModelTrainer

    games = sorted({s["game_id"] for s in samples})
    data = [dict(s, reward=0.1 * (s["turn"] % 7), target="Dog", success=games.index(s["game_id"]) % 2 == 0) for s in samples]
    found = {}
    for name, (cls, cfg_name, extra) in {
            "reinforce": (OfflineTrainer, "reinforce_llm", ["method=no_aggregation"]),
            "reward_model": (RewardModelTrainer, "reward_model", ["data.eval_fraction=0", "model.lora.enabled=true"]),
            "traj_dpo": (TrajectoryDPOTrainer, "reinforce_llm", ["method=traj_dpo"])}.items():
        cfg = trainer_config(work / name, model_dir, data, cfg_name, "device=auto", "train.mixed_precision=no",
                             "train.micro_batch_size=8", "train.gradient_accumulation_steps=1", "train.packing=prefix_tree", *extra)
        trainer = cls(cfg)
        indices = trainer._epoch_batches(0)[0]
        got = {}
        for way in ("prefix_tree", "padded"):
            trainer.packing = way
            trainer.model.zero_grad()
            loss = trainer.micro_loss(trainer.make_batch(indices), indices)
            loss.backward()
            got[way] = (float(loss), torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]))
        (lp, gp), (lr, gr) = got["prefix_tree"], got["padded"]
        found[name] = {"device": str(trainer.accelerator.device), "loss_rel_diff": abs(lp - lr) / max(abs(lr), 1e-12),
                       "grad_rel_diff": float((gp - gr).norm() / gr.norm())}
    return found


def check_resume(model_dir: Path, samples: list[dict], work: Path) -> dict:
    from safetensors.torch import load_file

    from aria.trainers.offline import OfflineTrainer

    common = ["device=auto", "train.mixed_precision=auto", "train.epochs=2", "train.micro_batch_size=4",
              "train.gradient_accumulation_steps=2", "train.save_freq=1", "train.lr=0.005", "model.lora.dropout=0.2",
              "train.keep_checkpoints=null", "train.packing=prefix_tree", "method=no_aggregation"]
    start = time.perf_counter()
    trainer = OfflineTrainer(trainer_config(work / "full", model_dir, samples, "reinforce_llm", *common))
    precision, device = trainer.accelerator.mixed_precision, str(trainer.accelerator.device)
    full = trainer.train()
    seconds = time.perf_counter() - start
    last = f"step-{full['steps']}"
    expected = load_file(str(work / "full" / "out" / "checkpoints" / last / "trainable.safetensors"))

    def crash(step):
        if step == 2:
            raise KeyboardInterrupt

    cut = trainer_config(work / "cut", model_dir, samples, "reinforce_llm", *common)
    try:
        OfflineTrainer(cut, on_step=crash).train()
    except KeyboardInterrupt:
        pass
    resumed = OfflineTrainer(cut).train()
    got = load_file(str(work / "cut" / "out" / "checkpoints" / last / "trainable.safetensors"))
    return {"device": device, "mixed_precision": precision, "steps": full["steps"], "resumed_from": resumed["resumed_from"],
            "bit_identical": all(torch.equal(got[k], expected[k]) for k in expected),
            "max_abs_diff": max(float((got[k].float() - expected[k].float()).abs().max()) for k in expected),
            "whole_run_seconds": round(seconds, 2)}


def check_deepspeed(model_dir: Path, samples: list[dict], work: Path, use_deepspeed: bool = True, offload: bool = True) -> dict:
    """``use_deepspeed=False`` (the CPU dry run) runs every launch without DeepSpeed, to check the check;
    ``offload=False`` is the shipped ZeRO-3 settings without the CPU offload (no CPU Adam to build)."""
    import os
    import shutil
    import subprocess

    from safetensors.torch import load_file

    common = ["device=auto", "train.epochs=2", "train.micro_batch_size=4", "train.gradient_accumulation_steps=2",
              "train.save_freq=1", "train.lr=0.005", "model.lora.dropout=0", "train.keep_checkpoints=null",
              "train.packing=prefix_tree", "method=no_aggregation", "train.warmup_ratio=0", "train.lr_scheduler=constant",
              "logging.report_to=null"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    accelerate_config = REPO / "config/accelerate/deepspeed_zero3.yaml"
    if not offload:
        work.mkdir(parents=True, exist_ok=True)
        ds = json.loads((REPO / "config/deepspeed/zero3_offload.json").read_text())
        for key in ("offload_optimizer", "offload_param"):
            ds["zero_optimization"].pop(key)
        (work / "zero3.json").write_text(json.dumps(ds))
        accelerate_config = work / "zero3.yaml"
        accelerate_config.write_text((REPO / "config/accelerate/deepspeed_zero3.yaml").read_text().replace(
            "config/deepspeed/zero3_offload.json", str(work / "zero3.json")))

    def launch(name: str, *extra: str, deepspeed: bool = True) -> tuple[float, Path]:
        out = work / name
        work.mkdir(parents=True, exist_ok=True)
        (work / "train.json").write_text(json.dumps(samples))
        args = ([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accelerate_config),
                 "--num_processes", "1"] if deepspeed and use_deepspeed else [sys.executable])
        cmd = [*args, str(REPO / "scripts/run_offline.py"), "--config-name", "reinforce_llm", f"model.path={model_dir}",
               f"data.train_file={work / 'train.json'}", f"output_dir={out}", f"hydra.run.dir={work / 'hydra' / name}", *common, *extra]
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        (work / f"{name}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"{name} exited {done.returncode}: {(done.stdout + done.stderr)[-2500:]}")
        return time.perf_counter() - start, out

    def losses(log: Path) -> list[float]:
        """The loss the progress bar showed after each optimizer step."""
        import re

        seen = []
        for value in re.findall(r"loss=(-?[0-9.]+)", log.read_text()):
            if not seen or seen[-1] != value:
                seen.append(value)
        return [float(v) for v in seen]

    def final_weights(out: Path) -> dict:
        files = sorted((out / "final").rglob("*.safetensors"))
        weights = {}
        for f in files:
            weights.update({k: v.float() for k, v in load_file(str(f)).items()})
        return weights

    seconds, ds_out = launch("zero3", "train.mixed_precision=bf16")
    steps = sorted(int(c.name.split("-")[1]) for c in (ds_out / "checkpoints").glob("step-*"))
    ds = final_weights(ds_out)
    plain_seconds, plain_out = launch("plain", "train.mixed_precision=bf16", deepspeed=False)
    plain = final_weights(plain_out)
    shared = sorted(set(ds) & set(plain))
    changed = {k: float((ds[k] - plain[k]).norm() / max(plain[k].norm(), 1e-12)) for k in shared}
    # The scale of bf16's own noise on these weights: the same run without DeepSpeed in float32.
    # Adam turns the sign of a tiny gradient into a full-size step, so LoRA weights after a few
    # steps differ far more than the losses do between two roundings of the same run.
    _, fp32_out = launch("plain_fp32", "train.mixed_precision=no", deepspeed=False)
    fp32 = final_weights(fp32_out)
    rounding = sorted(float((plain[k] - fp32[k]).norm() / max(fp32[k].norm(), 1e-12)) for k in shared)
    found = {"seconds": round(seconds, 2), "plain_seconds": round(plain_seconds, 2), "checkpoints": steps,
             "final_files": sorted(str(f.relative_to(ds_out)) for f in (ds_out / "final").rglob("*") if f.is_file()),
             "tensors_deepspeed": len(ds), "tensors_plain": len(plain), "tensors_shared": len(shared),
             "largest_relative_diff_to_plain": max(changed.values()) if changed else None,
             "median_relative_diff_to_plain": sorted(changed.values())[len(changed) // 2] if changed else None,
             "plain_bf16_vs_fp32_largest_relative_diff": rounding[-1] if rounding else None,
             "plain_bf16_vs_fp32_median_relative_diff": rounding[len(rounding) // 2] if rounding else None,
             "losses": {name: losses(work / f"{name}.log") for name in ("zero3", "plain", "plain_fp32")}}
    # Resume: keep only the checkpoint of step 2 and the final's absence, then run the same command again.
    resumed = work / "zero3_resumed"
    shutil.copytree(ds_out, resumed)
    shutil.rmtree(resumed / "final")
    for c in (resumed / "checkpoints").glob("step-*"):
        if int(c.name.split("-")[1]) != 2:
            shutil.rmtree(c)
    launch("zero3_resumed", "train.mixed_precision=bf16")
    again = final_weights(resumed)
    log = (work / "zero3_resumed.log").read_text()
    found["resumed_from"] = next((line for line in log.splitlines() if "resumed from" in line), None)
    found["resumed_bit_identical"] = set(again) == set(ds) and all(torch.equal(again[k], ds[k]) for k in ds)
    found["resumed_max_abs_diff"] = max(float((again[k] - ds[k]).abs().max()) for k in ds if k in again)
    return found


def check_merge(model_dir: Path, work: Path, device: str) -> dict:
    from aria.llm.policy import action_logprobs, collate, encode_sample, load_policy, merge_lora

    samples = [("Question: Is it an animal?\nAnswer: No.", "Question: Is it a fruit?"),
               ("Let's play a game of Twenty Questions.", "Question: Is it red?")]
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    tokenizer, model = load_policy(str(model_dir), lora=lora)
    torch.manual_seed(0)
    with torch.no_grad():  # a trained-looking adapter (lora_B starts at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.save_pretrained(work / "adapter")
    batch = to(collate([encode_sample(tokenizer, o, a, max_prompt_tokens=512) for o, a in samples], tokenizer.pad_token_id), device)
    found = {}
    with torch.no_grad():
        with_adapter = action_logprobs(model.to(device).eval(), batch)
        for dtype in ("float32", "bfloat16"):
            merged_dir = merge_lora(work / "adapter", work / f"merged-{dtype}", base=str(model_dir), dtype=dtype)
            merged = action_logprobs(load_policy(str(merged_dir), dtype=dtype)[1].to(device).eval(), batch)
            found[dtype] = {"max_abs_diff": float((merged.float() - with_adapter).abs().max()),
                            "logp": [round(float(x), 4) for x in merged], "adapter_logp": [round(float(x), 4) for x in with_adapter]}
    return found


def check_online(model_dir: Path, sentence_dir: Path, work: Path) -> dict:
    from aria.resources import compose_config
    from aria.trainers.online import OnlineTrainer

    offline = [{"observation": f"Question {i}: Is it an animal?", "action": "Question: Is it a fruit?" if i % 2 else "Yes.",
                "reward": float(i % 2), "game_id": f"g{i // 2}", "turn": i % 2} for i in range(12)]
    work.mkdir(parents=True, exist_ok=True)
    (work / "offline.json").write_text(json.dumps(offline))
    cfg = compose_config("onlinereinforce_llm", [
        f"model.path={model_dir}", f"output_dir={work / 'online'}", "device=auto", "train.mixed_precision=auto",
        "train.micro_batch_size=4", "train.gradient_accumulation_steps=2", "train.lr=1e-2",
        "online.rollout_size=8", "online.rollout_batch_size=8", "online.actor_updates=2", "online.iterations=1",
        "online.rm_refresh=2", "rollout.max_new_tokens=6", "logging.progress=false",
        f"online.intention_overrides=['embedder.model={sentence_dir}','clustering.k_max=4']",
        "reward_model.train_overrides=['device=auto','train.epochs=1','train.micro_batch_size=8',"
        "'train.gradient_accumulation_steps=1','data.eval_fraction=0.34']",
        f"reward_model.train_file={work / 'offline.json'}"])
    trainer = OnlineTrainer(cfg)
    before = {n: p.detach().clone() for n, p in trainer.accelerator.unwrap_model(trainer.model).named_parameters() if p.requires_grad}
    start = time.perf_counter()
    result = trainer.train()
    after = dict(trainer.accelerator.unwrap_model(trainer.model).named_parameters())
    [metrics] = [json.loads(line) for line in (work / "online" / "metrics.jsonl").read_text().splitlines()]
    return {"device": str(trainer.accelerator.device), "mixed_precision": trainer.accelerator.mixed_precision,
            "seconds": round(time.perf_counter() - start, 2), "steps": result["steps"], "score_n": metrics.get("score_n"),
            "loss": metrics.get("loss"), "actor_moved": any(not torch.equal(before[k], after[k].detach()) for k in before),
            "reward_model_refreshed": "rm_refresh" in metrics}


def check_archer(model_dir: Path, sentence_dir: Path, work: Path) -> dict:
    from aria.resources import compose_config
    from aria.trainers.archer import CriticTrainer
    from aria.trainers.checkpoint import load_state
    from aria.trainers.offline import OfflineTrainer
    from test_archer import OPENING, planted_games
    from test_offline_trainer import final_logprob

    def critic(folder: Path, steps: list[dict], *overrides: str) -> dict:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "train.json").write_text(json.dumps(steps))
        return compose_config("critic", [f"critic.encoder={sentence_dir}", "critic.hidden=32", "critic.max_tokens=128",
                                         f"data.train_file={folder / 'train.json'}", f"output_dir={folder / 'out'}",
                                         "device=auto", "train.mixed_precision=auto", *overrides])

    # the hand values of planted_games (gamma 0.95), as tests/test_archer.py checks them on the CPU
    by_hand = {(0, True): 0.45125, (0, False): 0.45125, (1, True): 0.475, (1, False): 0.475, (2, True): 1.0, (2, False): 0.0}
    found = {}
    for name, extra in {"encoder_learning": ["train.epochs=25", "train.lr=3e-3"],
                        "encoder_frozen": ["critic.train_encoder=false", "train.epochs=80", "train.lr=1e-2"]}.items():
        cfg = critic(work / name, planted_games(16), *extra, "train.micro_batch_size=12",
                     "train.gradient_accumulation_steps=1", "critic.tau=0.5", "data.eval_fraction=0.25", "train.save_freq=1000")
        start = time.perf_counter()
        trainer = CriticTrainer(cfg)
        result = trainer.train()
        rows = json.loads(Path(result["train_file"]).read_text())
        found[name] = {"device": str(trainer.accelerator.device), "mixed_precision": trainer.accelerator.mixed_precision,
                       "seconds": round(time.perf_counter() - start, 2), "steps": result["steps"],
                       "eval_td_mse": result["eval_td_mse"],
                       "eval_ranking_accuracy_same_turn": result["eval_ranking_accuracy_same_turn"],
                       "largest_q_error_from_hand_values": round(max(abs(r["critic_q"] - by_hand[r["turn"], r["success"]])
                                                                     for r in rows), 4)}
    common = ["train.epochs=2", "train.micro_batch_size=4", "train.gradient_accumulation_steps=2", "train.save_freq=1",
              "train.lr=1e-3", "data.eval_fraction=0.25", "train.keep_checkpoints=null"]
    CriticTrainer(critic(work / "whole", planted_games(8), *common)).train()

    def crash(step):
        if step == 3:
            raise KeyboardInterrupt

    cut = critic(work / "cut", planted_games(8), *common)
    try:
        CriticTrainer(cut, on_step=crash).train()
    except KeyboardInterrupt:
        pass
    (work / "cut" / "out" / "checkpoints" / "step-3").rename(work / "cut" / "step-3-away")
    resumed = CriticTrainer(cut).train()
    whole = load_state(work / "whole" / "out" / "final" / "critic.safetensors")
    again = load_state(work / "cut" / "out" / "final" / "critic.safetensors")
    diffs = [float((again[part][k].float() - v.float()).abs().max()) for part in whole for k, v in whole[part].items()]
    found["resume"] = {"resumed_from": Path(resumed["resumed_from"]).name, "steps": resumed["steps"],
                       "bit_identical": all(torch.equal(again[part][k], v) for part in whole for k, v in whole[part].items()),
                       "largest_abs_diff": max(diffs)}
    good = {"observation": OPENING, "action": "Question: Is it an animal?", "reward": 0.0, "advantage": 0.8,
            "game_id": "g0", "turn": 0}
    bad = {"observation": OPENING, "action": "Question: Is it a car?", "reward": 0.0, "advantage": -0.6,
           "game_id": "g1", "turn": 0}
    (work / "actor").mkdir(parents=True, exist_ok=True)
    (work / "actor" / "train.json").write_text(json.dumps([good, bad]))
    before = [final_logprob(model_dir, model_dir, s) for s in (good, bad)]
    cfg = compose_config("reinforce_llm", [
        f"model.path={model_dir}", f"data.train_file={work / 'actor' / 'train.json'}", f"output_dir={work / 'actor' / 'out'}",
        "device=auto", "train.mixed_precision=auto", "train.warmup_ratio=0", "train.lr_scheduler=constant", "method=archer",
        "train.epochs=2", "train.micro_batch_size=2", "train.gradient_accumulation_steps=1", "train.lr=0.01",
        "train.optimizer=adam"])
    actor = OfflineTrainer(cfg)
    actor.train()
    after = [final_logprob(model_dir, work / "actor" / "out" / "final", s) for s in (good, bad)]
    found["actor"] = {"device": str(actor.accelerator.device), "mixed_precision": actor.accelerator.mixed_precision,
                      "logprob_before": [round(x, 4) for x in before], "logprob_after": [round(x, 4) for x in after],
                      "higher_advantage_rose_other_fell": after[0] > before[0] and after[1] < before[1]}
    return found


def check_archer_speed(train_file: Path, encoder: Path, work: Path, steps: int = 3, overrides: tuple = (),
                       only: tuple | None = None) -> dict:
    from accelerate.state import AcceleratorState
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from aria.resources import compose_config
    from aria.trainers.archer import CriticTrainer

    if not any(encoder.glob("*.safetensors")):  # the architecture with random weights, saved beside its tokenizer
        built = work / "encoder"
        AutoModel.from_config(AutoConfig.from_pretrained(encoder)).save_pretrained(built)
        AutoTokenizer.from_pretrained(encoder).save_pretrained(built)
        encoder = built

    class Enough(Exception):
        pass

    found = {}
    for name, extra in {"encoder_learning_fp32": ["train.mixed_precision=no"],
                        "encoder_learning_bf16": ["train.mixed_precision=bf16"],
                        "heads_only_bf16": ["train.mixed_precision=bf16", "critic.train_encoder=false"]}.items():
        if only is not None and name not in only:
            continue
        times = []

        def timed(step):
            times.append(time.perf_counter())
            if len(times) > steps:
                raise Enough

        cfg = compose_config("critic", [f"critic.encoder={encoder}", f"data.train_file={train_file}",
                                        f"output_dir={work / name}", "device=auto", "train.save_freq=100000", *extra, *overrides])
        trainer = CriticTrainer(cfg, on_step=timed)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            trainer.train()
        except Enough:
            pass
        found[name] = {"device": str(trainer.accelerator.device), "mixed_precision": trainer.accelerator.mixed_precision,
                       "samples_per_step": cfg["train"]["micro_batch_size"] * cfg["train"]["gradient_accumulation_steps"],
                       "first_step_seconds": round(times[0] - start, 2),
                       "seconds_per_step_after_the_first": round((times[-1] - times[0]) / (len(times) - 1), 3),
                       "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if torch.cuda.is_available() else None}
        del trainer
        AcceleratorState._reset_state(reset_partial_state=True)  # the next setting chooses its own precision
    return found


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary rows of a report, one per kind of check it holds (a check that
    raised is said to have failed)."""
    checks = report["checks"]
    failed = [name for name, check in checks.items() if "error" in check]
    result = {name: check["result"] for name, check in checks.items() if "result" in check}
    rows = []
    if "packing" in result:
        float32 = [v for name, v in result["packing"].items() if "/float32/" in name]
        generation = result["generation"].values()  # float32 and bfloat16
        rows.append({"compares": "the CPU tests' exactness properties on the GPU (trees against rows, batched generation "
                                 "against unbatched, a resumed run against a whole one)",
                     "result": f"exactness: float32 trees = rows within {max(v['loss_rel_diff'] for v in float32):.1e} (loss), "
                               f"{max(v['grad_rel_diff'] for v in float32):.1e} (gradient); generation equal on "
                               f"{sum(g['turns_with_equal_replies'] for g in generation)} of {sum(g['turns'] for g in generation)} "
                               f"turns (float32, bfloat16); the resumed bf16 run "
                               f"{'bit-identical' if result['resume']['bit_identical'] else 'not bit-identical'}"})
    if "deepspeed" in result:
        offload, plain = result["deepspeed"], result.get("deepspeed_no_offload")
        without = "" if plain is None else f", {plain['seconds'] / plain['plain_seconds']:.1f}x without offload"
        resumed = "bit-identical" if offload["resumed_bit_identical"] else f"within {offload['resumed_max_abs_diff']:.1e}"
        rows.append({"compares": "offline REINFORCE under DeepSpeed ZeRO-3 (the shipped config, CPU offload) against "
                                 "the same run without, bf16",
                     "result": f"DeepSpeed: {offload['seconds'] / offload['plain_seconds']:.1f}x as long{without}; "
                               f"{len(offload['checkpoints'])} checkpoints saved; resumed {resumed}; LoRA weights a median "
                               f"{offload['median_relative_diff_to_plain']:.0%} apart"})
    if "archer" in result:
        critic = result["archer"]
        rows.append({"compares": "ArCHer's critic (bf16) against the planted games' hand values",
                     "result": f"critic: largest Q error {critic['encoder_learning']['largest_q_error_from_hand_values']:.3f} "
                               f"(encoder learning), {critic['encoder_frozen']['largest_q_error_from_hand_values']:.3f} "
                               f"(encoder frozen); resume {'bit-identical' if critic['resume']['bit_identical'] else 'not bit-identical'}"})
    if "archer_speed" in result:
        settings = dict(result["archer_speed"])
        # a second call in one process, where present: its later settings ran after CUDA's warm-up
        for key, value in sorted(report.get("rerun_in_one_process", {}).get("results", {}).items()):
            settings[key.split("_", 1)[1]] = value
        fp32, bf16 = (settings[name]["seconds_per_step_after_the_first"] for name in ("encoder_learning_fp32", "encoder_learning_bf16"))
        samples = settings["encoder_learning_fp32"]["samples_per_step"]
        rows.append({"compares": f"a critic optimizer step ({samples} samples, encoder learning) in bf16 autocast against float32",
                     "result": f"critic step: bf16 {bf16 / fp32:.2f}x the time of float32 ({bf16:.2f} s against {fp32:.2f} s)"})
    if failed:
        rows.append({"compares": "checks that raised", "result": ", ".join(failed)})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results/gpu_paths.json")
    parser.add_argument("--only", nargs="*", default=None, help="run only these checks")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    parser.add_argument("--critic-set", type=Path, help="a collection's steps (pipeline step 4's train.json) for archer_speed")
    parser.add_argument("--critic-encoder", type=Path, help="archer_speed's encoder folder (default: the embedded MiniLM)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpu_paths.py: no CUDA device here (this script checks the GPU paths)")
    import transformers

    from aria.intention.embed import embedded_sentence_model_dir
    from aria.llm.hardware import describe
    from conftest import build_tiny_chat_model, build_tiny_sentence_model

    device = args.device
    cuda = device.startswith("cuda")
    result = {"gpu": torch.cuda.get_device_name(0) if cuda else None, "bf16_supported": cuda and torch.cuda.is_bf16_supported(),
              "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
              "machine": describe(), "checks": {}}
    work = Path(tempfile.mkdtemp(prefix="gpu_paths-"))
    model_dir = build_tiny_chat_model(work / "tiny-llama")
    samples = played_samples(model_dir, work, device)
    result["samples"] = len(samples)
    checks = {
        "generation": lambda: check_generation(model_dir, device),
        "packing": lambda: check_packing(model_dir, samples, device),
        "trainers": lambda: check_trainers(model_dir, samples, work / "trainers"),
        "resume": lambda: check_resume(model_dir, samples, work / "resume"),
        "merge": lambda: check_merge(model_dir, work / "merge", device),
        "online": lambda: check_online(model_dir, build_tiny_sentence_model(work / "tiny-bert"), work / "online"),
        "archer": lambda: check_archer(model_dir, build_tiny_sentence_model(work / "tiny-bert-archer"), work / "archer"),
        "archer_speed": lambda: check_archer_speed(args.critic_set, args.critic_encoder or embedded_sentence_model_dir(),
                                                   work / "archer_speed"),
        "deepspeed": lambda: check_deepspeed(model_dir, samples, work / "deepspeed", cuda),
        "deepspeed_no_offload": lambda: check_deepspeed(model_dir, samples, work / "deepspeed_no_offload", cuda, offload=False),
    }
    if args.critic_set is None:
        del checks["archer_speed"]
    for name, run in checks.items():
        if args.only is not None and name not in args.only:
            continue
        start = time.perf_counter()
        try:
            result["checks"][name] = {"result": run()}
        except Exception as error:  # recorded, and the next check runs: this is a report, not a test
            result["checks"][name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-3000:]}
        result["checks"][name]["seconds"] = round(time.perf_counter() - start, 2)
        print(name, json.dumps(result["checks"][name])[:2000], flush=True)
        atomic_write_json(args.out, result)
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)  # each check chooses its own device and precision
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
