"""Benchmark: the offline trainer against a bare training loop and against fixed-length padding.

Trains the embedded default model (SmolLM2-135M-Instruct, LoRA r8 on q/k/v as in the CPU
preset) on the same 64 samples three ways and writes tokens/s (real, non-padding tokens per
second) of each to JSON:

  (a) ``trainer``: :class:`aria.trainers.offline.OfflineTrainer`, everything on (accelerate,
      length bucketing, logging, scheduler, clipping; checkpoints off);
  (b) ``bare``: the same micro-batches (same order, same collate) as a plain forward +
      backward + optimizer step loop with no trainer around it;
  (c) ``fixed_padding``: the bare loop with every sequence padded to a fixed length, as the
      original did (prompt padded to ``--prompt-len`` on the left, action to ``--action-len``).

Targets: (a) within 15 % of (b); (a) at least 1.5x (c). Samples come from ``--train-file``
(pipeline step 4's output). Each variant runs ``--repeats`` times; medians are reported.

    python benchmarks/offline_trainer_vs_bare.py --train-file outputs/intention/twenty_questions/train.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from aria.data import read_training_set
from aria.io import atomic_write_json
from aria.llm.policy import action_logprobs, collate, encode_sample, load_policy
from aria.resources import REPO_ROOT
from aria.trainers.offline import OfflineTrainer, reinforce_loss, resolve_mixed_precision


def trainer_config(train_file: Path, out: Path, micro: int, accumulation: int) -> dict:
    with initialize_config_dir(config_dir=str(REPO_ROOT / "config"), version_base="1.3"):
        cfg = compose("reinforce_llm", overrides=[f"data.train_file={train_file}", f"output_dir={out}", "train.epochs=1",
                                                  f"train.micro_batch_size={micro}",
                                                  f"train.gradient_accumulation_steps={accumulation}",
                                                  "train.save_freq=1000000",
                                                  # the bare loop runs padded rows: so does the trainer here
                                                  # (prefix-tree packing: benchmarks/training_packing.py)
                                                  "train.packing=padded"])
    return OmegaConf.to_container(cfg, resolve=True)


def run_trainer(cfg: dict) -> tuple[float, int]:
    trainer = OfflineTrainer(cfg)
    trainer.save_final = lambda: Path(cfg["output_dir"])  # writing the final model is not training
    tokens = sum(len(e.input_ids) for e in trainer.encoded)
    start = time.perf_counter()
    trainer.train()
    return time.perf_counter() - start, tokens


def run_bare(cfg: dict, fixed: tuple[int, int] | None) -> tuple[float, int]:
    """The same batches as the trainer, through a plain loop (optionally padded to fixed lengths)."""
    trainer = OfflineTrainer(cfg)  # only to reuse its data, batches, model and optimizer set-up
    model, tokenizer = trainer.accelerator.unwrap_model(trainer.model), trainer.tokenizer
    t = cfg["train"]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=t["lr"], betas=tuple(t["betas"]),
                                  eps=t["eps"], weight_decay=t["weight_decay"])
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(resolve_mixed_precision(cfg["train"]["mixed_precision"]))
    batches = trainer._epoch_batches(0)
    accumulation = cfg["train"]["gradient_accumulation_steps"]
    tokens = 0
    model.train()
    start = time.perf_counter()
    for n, indices in enumerate(batches):
        items = [trainer.encoded[i] for i in indices]
        batch = collate(items, tokenizer.pad_token_id) if fixed is None else fixed_collate(items, tokenizer.pad_token_id, *fixed)
        tokens += sum(len(e.input_ids) for e in items)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = reinforce_loss(action_logprobs(model, batch), trainer.rewards[indices]) / accumulation
        loss.backward()
        if (n + 1) % accumulation == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    return time.perf_counter() - start, tokens


def fixed_collate(items, pad_id: int, prompt_len: int, action_len: int) -> dict:
    """The original's layout: prompt left-padded to ``prompt_len``, action right-padded to
    ``action_len``, so every row is ``prompt_len + action_len`` long. Log-probs still count only
    action tokens; what this measures is the cost of the padding."""
    rows, attention, action, plens = [], [], [], []
    for e in items:
        prompt = e.input_ids[: e.prompt_len][-prompt_len:]
        act = e.input_ids[e.prompt_len :][:action_len]
        pad_left = prompt_len - len(prompt)
        rows.append([pad_id] * pad_left + prompt + act + [pad_id] * (action_len - len(act)))
        attention.append([0] * pad_left + [1] * (len(prompt) + len(act)) + [0] * (action_len - len(act)))
        action.append([False] * prompt_len + [True] * len(act) + [False] * (action_len - len(act)))
        plens.append(prompt_len)
    return {"input_ids": torch.tensor(rows), "attention_mask": torch.tensor(attention),
            "action_mask": torch.tensor(action), "prompt_len": torch.tensor(plens)}


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary row of a report."""
    tokens_per_s = report["median_tokens_per_s"]
    return [{"compares": f"the offline trainer against a bare training loop and against fixed-length padding "
                         f"(the original's), {report['samples']} samples",
             "result": f"{tokens_per_s['trainer'] / tokens_per_s['bare']:.2f}x the bare loop's tokens/s, "
                       f"{tokens_per_s['trainer'] / tokens_per_s['fixed_padding']:.2f}x fixed padding's"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-file", default=str(REPO_ROOT / "outputs/intention/twenty_questions/train.json"))
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=512, help="the original's fixed prompt length")
    parser.add_argument("--action-len", type=int, default=128, help="the original's fixed action length")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks/results/offline_trainer_vs_bare.json"))
    args = parser.parse_args()

    samples = read_training_set(args.train_file)[: args.samples]
    with tempfile.TemporaryDirectory() as tmp:
        train_file = Path(tmp) / "train.json"
        train_file.write_text(json.dumps(samples))
        runs: dict[str, list[float]] = {"trainer": [], "bare": [], "fixed_padding": []}
        tokens = {}
        for r in range(args.repeats):
            for name in runs:
                cfg = trainer_config(train_file, Path(tmp) / f"{name}-{r}", args.micro_batch, args.accumulation)
                seconds, n = run_trainer(cfg) if name == "trainer" else \
                    run_bare(cfg, (args.prompt_len, args.action_len) if name == "fixed_padding" else None)
                runs[name].append(n / seconds)
                tokens[name] = n
                print(f"[bench] repeat {r} {name}: {n} tokens in {seconds:.1f}s = {n / seconds:.1f} tokens/s", flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    tokenizer = load_policy("embedded")[0]
    lengths = [len(encode_sample(tokenizer, s["observation"], s["action"], 512).input_ids) for s in samples[:8]]
    result = {
        "benchmark": "offline_trainer_vs_bare", "model": "SmolLM2-135M-Instruct (embedded), LoRA r8 q/k/v",
        "samples": len(samples), "train_file": args.train_file, "micro_batch": args.micro_batch,
        "accumulation": args.accumulation, "mixed_precision": resolve_mixed_precision("auto"),
        "fixed_padding": {"prompt_len": args.prompt_len, "action_len": args.action_len},
        "example_sequence_lengths": lengths,
        "tokens_per_s": {k: [round(x, 1) for x in v] for k, v in runs.items()},
        "median_tokens_per_s": {k: round(v, 1) for k, v in med.items()},
        "trainer_over_bare": round(med["trainer"] / med["bare"], 3),
        "trainer_over_fixed_padding": round(med["trainer"] / med["fixed_padding"], 3),
        "targets": {"trainer_over_bare_at_least": 0.85, "trainer_over_fixed_padding_at_least": 1.5},
        "machine": {"python": sys.version.split()[0], "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "platform": platform.platform()},
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    atomic_write_json(args.out, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
