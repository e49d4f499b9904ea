"""Benchmark: the same games through every generation engine, at the concurrencies the project uses.

Engines (the embedded SmolLM2-135M-Instruct in each):

* ``local`` — the project's :class:`aria.llm.local.LocalChatModel` (batched decoding, finished
  rows leave the batch, each game's prompt KV cache kept between turns);
* ``local_no_reuse`` — the same without the KV-cache reuse;
* ``generate`` — plain transformers ``model.generate`` on the left-padded batch (no reuse);
* ``vllm_float32``, ``vllm_bfloat16`` — a real vLLM server (``scripts/serve_vllm.sh``,
  ``VLLM_DTYPE``) through :class:`aria.llm.endpoint.EndpointChatModel` with as many requests in
  flight as games, in eager mode; ``..._compiled``: the same with vLLM's compiled graphs
  (``VLLM_EAGER=0``). Every vLLM row records the server's start-up seconds. bfloat16 runs only where the CPU computes it natively
  (:mod:`aria.llm.hardware`); elsewhere the row says why it was not run.

Workloads, played for real through the project's schedulers, at temperature 1 and 48 new tokens
per turn (collection's settings): ``twenty_questions`` (``--turns`` turns per game, so the prompt
grows turn after turn) against the knowledge-base oracle, and ``bargaining`` self-play on the
first configurations of eval48 cut to ``--rounds`` rounds (long prompts, re-prompts; 12 rounds
of up to three attempts each would take an hour per engine on two cores). ``--concurrency``
games at once (1: three games one after another).

For every (engine, workload, concurrency): generated tokens/s (tokens counted with the model's
tokenizer, the same for every engine), turns/s, and the floor: one decode step reads every weight
once, so at the machine's measured memory bandwidth B (a 1 GiB tensor copy, median of 5) no
engine can take more than B / weight_bytes decode steps per second; with ``c`` games in one batch,
tokens/s ÷ c estimates the steps/s, and ``floor_fraction`` = that ÷ the bound (an estimate: rows
that finish early make the true batch smaller).

    python benchmarks/generation_engines.py                     # -> benchmarks/results/generation_engines.json
    python benchmarks/generation_engines.py --engines local generate --concurrency 1 16

The file is written after every row, and a re-run with the same settings keeps the rows it holds
and measures only the missing ones (a run of all engines takes about an hour on two cores); a
re-run with other settings (or on another CPU) is refused rather than mixed in.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch

from aria.io import atomic_write_json
from aria.llm.base import Completion
from aria.llm.hardware import describe
from aria.resources import REPO_ROOT

ENGINES = ("local", "local_no_reuse", "generate", "vllm_float32", "vllm_bfloat16", "vllm_float32_compiled",
           "vllm_bfloat16_compiled")
DEFAULT_ENGINES = ("local", "generate", "vllm_float32", "vllm_bfloat16")  # reuse's own gain: rollout benchmark
WORKLOADS = ("twenty_questions", "bargaining")


class Counting:
    """A chat model that counts the tokens it generated (with one tokenizer for every engine)."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.name, self.settings = model.name, getattr(model, "settings", {"name": model.name})
        self.tokens = self.calls = 0

    def generate(self, conversations, keys=None) -> list[Completion]:
        replies = self.model.generate(conversations, keys=keys)
        self.calls += 1
        self.tokens += sum(len(self.tokenizer(r.text, add_special_tokens=False)["input_ids"]) for r in replies if r.ok)
        return replies

    def release(self, key: str) -> None:
        self.model.release(key)

    def release_all(self) -> None:
        getattr(self.model, "release_all", lambda: None)()


class TransformersGenerate:
    """Plain ``model.generate`` on a left-padded batch: what a user would write first."""

    def __init__(self, model, tokenizer, max_new_tokens: int, temperature: float):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self.name, self.settings = "generate", {"name": "generate"}
        tokenizer.padding_side = "left"

    def generate(self, conversations, keys=None) -> list[Completion]:
        texts = [self.tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations]
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = self.model.generate(**batch, max_new_tokens=self.max_new_tokens, do_sample=True,
                                      temperature=self.temperature, top_p=1.0, pad_token_id=self.tokenizer.pad_token_id)
        new = out[:, batch["input_ids"].shape[1]:]
        return [Completion(self.tokenizer.decode(row, skip_special_tokens=True).strip()) for row in new]

    def release(self, key: str) -> None:
        pass


def memory_bandwidth_gbps(repeats: int = 5) -> float:
    """Bytes read + written per second by a 1 GiB tensor copy, median of ``repeats``."""
    src = torch.ones(256 * 1024 * 1024, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages first
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * src.element_size() / statistics.median(times) / 1e9


def serve(dtype: str, port: int, eager: bool = True) -> dict:
    """Start vLLM on the embedded model; the answer carries ``start_seconds`` (until it answers)."""
    from aria.llm.embedded import embedded_model_dir
    from aria.llm.served import start_server

    start = time.perf_counter()
    info = start_server(embedded_model_dir(), embedded_model_dir().name, port, eager=eager, dtype=dtype)
    return {**info, "start_seconds": round(time.perf_counter() - start, 1)}


def play(workload: str, policy, concurrency: int, turns: int, rounds: int, seed: int) -> dict:
    """Play ``workload`` with ``policy``; returns turns, generated tokens and seconds."""
    from aria.games.common.base import load_game_config
    from aria.games.question.game import build_game

    games = 3 if concurrency == 1 else concurrency
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "games.jsonl"
        if workload == "twenty_questions":
            from aria.games.question.oracle import build_oracle
            from aria.games.question.play import play_games

            game_cfg = {**load_game_config("twenty_questions"), "max_turns": turns}
            oracle = build_oracle({"name": "knowledge_base"}, game_cfg)
            summary = play_games(build_game(game_cfg), policy, oracle, out, num_games=games, seed=seed,
                                 batch_size=concurrency, progress=False)
        else:
            from aria.games.two_player.glee import config_set
            from aria.games.two_player.play import PolicyPlayer, play_two_player

            game_cfg = load_game_config("bargaining")
            configs = [dataclasses.replace(c, max_rounds=rounds) for c in config_set(game_cfg, "eval48")[:games]]
            player = PolicyPlayer(policy)
            summary = play_two_player(game_cfg, configs, {"alice": player, "bob": player}, out, seed=seed,
                                      batch_size=concurrency, progress=False)
    return {"turns": summary.turns, "seconds": summary.seconds}


def measure(engine: str, workloads: Sequence[str], levels: Sequence[int], args, tokenizer, weight_bytes: dict,
            bandwidth: float, done: set, save) -> list[dict]:
    from transformers import AutoModelForCausalLM

    from aria.llm.embedded import embedded_model_dir
    from aria.llm.endpoint import EndpointChatModel
    from aria.llm.local import LocalChatModel, resolve_dtype

    flags = describe()
    rows, server = [], None
    todo = [(w, c) for c in levels for w in workloads if (engine, w, c) not in done]
    if not todo:
        return rows
    levels = sorted({c for _, c in todo})
    if engine.startswith("vllm_bfloat16") and flags["vllm_cpu_dtype"] != "bfloat16":
        return [{"engine": engine, "skipped": f"this CPU has no avx512_bf16 / amx_bf16 (flags: {', '.join(flags['flags'])}): "
                                              "vLLM's bfloat16 would be emulated"}]
    try:
        if engine.startswith("vllm"):
            dtype = engine.split("_")[1]
            server = serve(dtype, args.port, eager=not engine.endswith("_compiled"))
        else:
            dtype = str(resolve_dtype("auto", "cpu")).replace("torch.", "")
        for level in levels:
            if engine.startswith("vllm"):
                base = EndpointChatModel(server["BASE_URL"], server["MODEL_NAME"], temperature=1.0, top_p=1.0,
                                         max_tokens=args.max_new_tokens, concurrency=level, timeout_s=600)
            elif engine == "generate":
                model = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=getattr(torch, dtype)).eval()
                base = TransformersGenerate(model, tokenizer, args.max_new_tokens, 1.0)
            else:
                base = LocalChatModel("embedded", max_new_tokens=args.max_new_tokens, temperature=1.0,
                                      reuse_cache=engine == "local", dtype=dtype, seed=args.seed)
            for workload in workloads:
                if (workload, level) not in todo:
                    continue
                policy = Counting(base, tokenizer)
                torch.manual_seed(args.seed)
                played = play(workload, policy, level, args.turns, args.rounds, args.seed)
                tokens_per_s = policy.tokens / played["seconds"]
                bound = bandwidth * 1e9 / weight_bytes[dtype]
                row = {"engine": engine, "dtype": dtype, "workload": workload, "concurrency": level,
                       "turns": played["turns"], "generated_tokens": policy.tokens, "seconds": round(played["seconds"], 2),
                       "tokens_per_s": round(tokens_per_s, 1), "turns_per_s": round(played["turns"] / played["seconds"], 3),
                       "decode_steps_per_s_est": round(tokens_per_s / level, 2),
                       "bandwidth_bound_steps_per_s": round(bound, 1),
                       "floor_fraction": round(tokens_per_s / level / bound, 4)}
                if server:
                    row["server_start_seconds"] = server["start_seconds"]
                rows.append(row)
                save(row)
                print(json.dumps(row), flush=True)
    finally:
        if server:
            from aria.llm.served import stop_server

            stop_server(server["PID"])
    return rows


WORKLOAD_NAMES = {"twenty_questions": "Twenty Questions", "bargaining": "bargaining"}


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary of a report: vLLM against the local policy, or, for a report of the
    compiled engine, compiled vLLM against eager (and the generated tokens that repay its longer start)."""
    rows = {(r["engine"], r["workload"], r["concurrency"]): r for r in report["rows"] if "skipped" not in r}
    tokens_per_s = {key: row["tokens_per_s"] for key, row in rows.items()}
    if any(engine.endswith("_compiled") for engine, _, _ in rows):
        levels = sorted(c for e, w, c in rows if e == "vllm_float32_compiled" and w == "twenty_questions")
        eager = {c: rows[("vllm_float32", "twenty_questions", c)] for c in levels}
        compiled = {c: rows[("vllm_float32_compiled", "twenty_questions", c)] for c in levels}
        top = levels[-1]
        extra_start = compiled[top]["server_start_seconds"] - eager[top]["server_start_seconds"]
        # the generated tokens after which the faster generation has saved the longer start
        repaid = extra_start / (1 / eager[top]["tokens_per_s"] - 1 / compiled[top]["tokens_per_s"])
        ratios = ", ".join(f"{compiled[c]['tokens_per_s'] / eager[c]['tokens_per_s']:.2f}x with {c}" for c in levels)
        return [{"compares": "vLLM compiled (`VLLM_EAGER=0`) against eager",
                 "result": f"compiled over eager, tokens/s: {ratios} games in flight; its start {extra_start:.0f} s longer, "
                           f"repaid after about {round(repaid, -3):,.0f} tokens"}]
    parts = []
    for workload, name in WORKLOAD_NAMES.items():
        levels = sorted(c for e, w, c in rows if e == "vllm_float32" and w == workload and ("local", w, c) in rows)
        if levels:
            ratio = [tokens_per_s[("vllm_float32", workload, c)] / tokens_per_s[("local", workload, c)]
                     for c in (levels[0], levels[-1])]
            parts.append(f"{ratio[0]:.2f}x with {levels[0]}, {ratio[1]:.2f}x with {levels[-1]} games at once ({name})")
    return [{"compares": "vLLM (float32, eager) against the local policy, the same games",
             "result": "vLLM over the local policy, tokens/s: " + "; ".join(parts)}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", default=list(DEFAULT_ENGINES), choices=ENGINES)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16, 48])
    parser.add_argument("--turns", type=int, default=6, help="Twenty Questions turns per game")
    parser.add_argument("--rounds", type=int, default=2, help="Bargaining rounds per game")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks/results/generation_engines.json"))
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aria.llm.embedded import embedded_model_dir

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir())
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = {"float32": 4 * params, "bfloat16": 2 * params}
    del model
    settings = {k: v for k in ("turns", "rounds", "max_new_tokens", "seed") for v in [getattr(args, k)]}
    machine = describe()
    result = {"machine": machine, "settings": settings, "parameters": params, "rows": []}
    if Path(args.out).is_file():  # resume: keep the rows measured with the same settings on the same CPU
        old = json.loads(Path(args.out).read_text())
        if old.get("settings") != settings or {k: old["machine"].get(k) for k in machine} != machine:
            sys.exit(f"{args.out} holds rows of other settings or another CPU ({old.get('settings')}, "
                     f"{old['machine'].get('cpu_model')}); use another --out")
        result = old
    done = {(r["engine"], r.get("workload"), r.get("concurrency")) for r in result["rows"]}
    bandwidth = memory_bandwidth_gbps()
    result["machine"].update(memory_bandwidth_gbps=round(bandwidth, 2), torch=torch.__version__,
                             python=sys.version.split()[0])
    print(f"[bench] memory bandwidth {bandwidth:.1f} GB/s; {params / 1e6:.1f} M parameters; "
          f"{len(done)} rows already measured", flush=True)

    def save(row: dict) -> None:
        result["rows"].append(row)
        atomic_write_json(args.out, result)

    for engine in args.engines:
        skipped = [r for r in measure(engine, args.workloads, args.concurrency, args, tokenizer, weight_bytes,
                                      bandwidth, done, save) if "skipped" in r]
        for row in skipped:
            result["rows"] = [r for r in result["rows"] if r["engine"] != engine] + [row]
    atomic_write_json(args.out, result)
    print(f"[bench] wrote {args.out}")


if __name__ == "__main__":
    main()
