"""Benchmark: an evaluation through a vLLM server, played the old way and the new way, and the floor.

The experiment evaluates every model by playing ``--games`` games of ``--game`` (seeded targets,
temperature 1, ``--max-tokens`` per reply) through a vLLM server of its own
(:mod:`aria.llm.served`). Ways, each with a fresh server on the same model, in one run:

* ``in_step_block128_c16`` (before): 16 games at once, every turn one batch of requests, the
  next turn when the slowest game of the batch has its reply; the CPU build's default KV block
  of 128 tokens;
* ``each_game_block128_c16``: every game sends its next request as soon as its own reply and
  answer are in (:mod:`aria.scheduler`);
* ``each_game_block32_c16``: the same with KV blocks of 32 tokens (``scripts/serve_vllm.sh``'s
  default now), so the prefix cache reuses a game's history up to 31 tokens short of where the
  new turn starts instead of up to 127 (the CPU build's attention takes only multiples of 32:
  ``--block-size 16`` fails at start);
* ``each_game_block32_c48`` (now, the experiment presets): 48 games at once;
* ``each_game_block32_c48_compiled`` (not run by default): vLLM's compiled graphs
  (``VLLM_EAGER=0``), which take longer to start.

For each: wall seconds, turns/s, wins, and from the server's own Prometheus counters (``/metrics``
read before and after): prompt tokens, prefix-cache hit rate (``prefix_cache_hits`` /
``prefix_cache_queries``), prompt tokens computed per turn (prompt tokens not served from the
cache), generated tokens per turn, and the share of quarter-second samples with at most one
request running.

**The floor.** What no engine can beat on this CPU for these games: from the transcripts of the
``now`` way, with the model's tokenizer, every turn's prompt is compared with the prompts before
it (its game's previous turn; the first turn with every earlier game's first turn); only what
follows the longest shared prefix has to be computed, token by token (a perfect prefix cache).
Those tokens and the generated ones cost 2 FLOPs per weight of the transformer body, the
generated ones also the LM head, and each token its attention over its context
(4 · context · hidden per layer). At the CPU's measured float32 matrix-product rate (a
[1024 x hidden] x [hidden x intermediate] product, all cores, median of 5) that is the compute
floor; the bandwidth floor is one read of every weight per decode step, with the ``now`` way's
games in one step (measured copy bandwidth). The floor is the larger of the two. The CPU's rates
are measured first, before any server runs.

    python benchmarks/served_evaluation.py --model /path/to/warm/model     # -> benchmarks/results/served_evaluation.json
    python benchmarks/served_evaluation.py --model M --ways each_game_block32_c48 --games 20

The JSON is written after every way; the CPU's model and flags are recorded with the figures.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from aria.io import atomic_write_json
from aria.llm.served import server_metrics as read_metrics
from aria.llm.hardware import describe

WAYS = {
    "in_step_block128_c16": {"scheduling": "in_step", "block_size": 128, "concurrency": 16},
    "each_game_block128_c16": {"scheduling": "each_game", "block_size": 128, "concurrency": 16},
    "each_game_block32_c16": {"scheduling": "each_game", "block_size": 32, "concurrency": 16},
    "each_game_block32_c48": {"scheduling": "each_game", "block_size": 32, "concurrency": 48},
    "each_game_block32_c48_compiled": {"scheduling": "each_game", "block_size": 32, "concurrency": 48, "eager": False},
}
DEFAULT_WAYS = ("in_step_block128_c16", "each_game_block128_c16", "each_game_block32_c16", "each_game_block32_c48")
BEFORE, NOW = "in_step_block128_c16", "each_game_block32_c48"


# ---- the server's counters ------------------------------------------------------------------------
class RunningSampler:
    """Samples ``vllm:num_requests_running`` every ``period`` seconds in a thread."""

    def __init__(self, base_url: str, period: float = 0.25):
        self.base_url, self.period, self.samples = base_url, period, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.samples.append(read_metrics(self.base_url).get("vllm:num_requests_running", 0.0))
            except OSError:
                pass

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# ---- one way ----------------------------------------------------------------------------------------
def run_way(name: str, args, out_dir: Path) -> tuple[dict, Path]:
    from aria.games.common.base import load_game_config
    from aria.games.question.game import build_game
    from aria.games.question.oracle import build_oracle
    from aria.games.question.play import play_games, reply_format
    from aria.llm.endpoint import EndpointChatModel
    from aria.llm.served import free_port, start_server, stop_server

    way = WAYS[name]
    game_cfg = load_game_config(args.game)
    start = time.perf_counter()
    info = start_server(Path(args.model), "policy", free_port(), out_dir / f"{name}.vllm.log", eager=way.get("eager", True),
                        dtype=args.dtype, block_size=way["block_size"])
    started = time.perf_counter() - start
    try:
        policy = EndpointChatModel(info["BASE_URL"], info["MODEL_NAME"], temperature=1.0, max_tokens=args.max_tokens,
                                   concurrency=way["concurrency"], timeout_s=300)
        if way["scheduling"] == "in_step":
            policy.concurrent = False  # the scheduler then plays every turn of all live games as one batch
        games = out_dir / f"{name}.jsonl"
        before = read_metrics(info["BASE_URL"])
        with RunningSampler(info["BASE_URL"]) as sampler:
            summary = play_games(build_game(game_cfg), policy, build_oracle({"name": "knowledge_base"}, game_cfg), games,
                                 num_games=args.games, seed=args.seed, batch_size=way["concurrency"], progress=False,
                                 force_new=True, reply_format=reply_format(game_cfg))
        after = read_metrics(info["BASE_URL"])
    finally:
        stop_server(info["PID"])
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    prompt, hits = delta.get("vllm:prompt_tokens_total", 0.0), delta.get("vllm:prefix_cache_hits_total", 0.0)
    queries = delta.get("vllm:prefix_cache_queries_total", 0.0)
    requests = delta.get("vllm:request_success_total", 0.0) or summary.turns
    running = sampler.samples
    row = {"way": name, "eager": True, **way, "server_start_seconds": round(started, 1), "seconds": round(summary.seconds, 1),
           "games": summary.played, "failed": summary.failed, "wins": summary.counts["successes"], "turns": summary.turns,
           "turns_per_s": round(summary.turns_per_s, 2), "requests": int(requests),
           "prompt_tokens": int(prompt), "prefix_cache_hit_rate": round(hits / queries, 4) if queries else None,
           "prompt_tokens_computed_per_turn": round((prompt - hits) / requests, 1) if requests else None,
           "generated_tokens_per_turn": round(delta.get("vllm:generation_tokens_total", 0.0) / requests, 1) if requests else None,
           "share_of_samples_with_at_most_one_running": round(sum(r <= 1 for r in running) / len(running), 3) if running else None,
           "mean_requests_running": round(statistics.mean(running), 2) if running else None}
    return row, games


# ---- the floor ----------------------------------------------------------------------------------------
def matmul_gflops(hidden: int, intermediate: int, repeats: int = 5) -> float:
    """float32 matrix-product rate of this CPU at the model's shapes, all cores (median of ``repeats``)."""
    a, b = torch.randn(1024, hidden), torch.randn(hidden, intermediate)
    for _ in range(3):
        a @ b
    rates = []
    for _ in range(repeats):
        n = 20
        start = time.perf_counter()
        for _ in range(n):
            a @ b
        rates.append(2 * 1024 * hidden * intermediate * n / (time.perf_counter() - start) / 1e9)
    return statistics.median(rates)


def floor(args, games: Path, generated_tokens: int, rates: dict) -> dict:
    """The compute and bandwidth floors of these games (module doc)."""
    from transformers import AutoConfig, AutoTokenizer

    from aria.games.common.base import load_game_config
    from aria.games.question.game import build_game
    from aria.llm.policy import full_prompt_ids
    from aria.packing import _common_prefix
    from aria.trajectories import read_trajectories

    config = AutoConfig.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    game = build_game(load_game_config(args.game))
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    kv = config.num_key_value_heads * head_dim
    body = layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * config.intermediate_size)  # q,o,k,v, MLP
    attention_width = config.num_attention_heads * head_dim
    new_tokens = attention = 0.0
    first_prompts: list[list[int]] = []
    records = [r for r in read_trajectories(games) if r["status"] == "finished"]
    for record in records:
        previous: list[int] = []
        for t in range(len(record["turns"])):
            ids = full_prompt_ids(tokenizer, game.prompt_before_turn(record["turns"], t))
            seen = [previous] if t else first_prompts
            shared = max((_common_prefix(p, ids) for p in seen), default=0)
            new_tokens += len(ids) - shared
            attention += sum(4 * position * attention_width * layers for position in range(shared, len(ids)))
            if t == 0:
                first_prompts.append(ids)
            previous = ids
            reply = len(tokenizer(record["turns"][t]["action"], add_special_tokens=False)["input_ids"]) + 1
            attention += sum(4 * (len(ids) + i) * attention_width * layers for i in range(reply))
    flops = 2 * body * (new_tokens + generated_tokens) + 2 * vocab * hidden * generated_tokens + attention
    rate, bandwidth_gbps = rates["matmul_gflops"], rates["bandwidth_gbps"]
    weight_bytes = (body + vocab * hidden) * (2 if args.dtype == "bfloat16" else 4)
    compute_s = flops / (rate * 1e9)
    bandwidth_s = generated_tokens / WAYS[NOW]["concurrency"] * weight_bytes / (bandwidth_gbps * 1e9)
    turns = sum(len(r["turns"]) for r in records)
    return {"turns": turns, "new_prompt_tokens_per_turn": round(new_tokens / turns, 1),
            "generated_tokens_per_turn": round(generated_tokens / turns, 1), "gflop": round(flops / 1e9, 1),
            "matmul_gflops": round(rate, 1), "bandwidth_gbps": round(bandwidth_gbps, 1),
            "compute_floor_seconds": round(compute_s, 1), "bandwidth_floor_seconds": round(bandwidth_s, 1),
            "floor_seconds": round(max(compute_s, bandwidth_s), 1)}


def way_words(name: str) -> str:
    """A way in words: "48 games, each on its own, KV blocks of 32"."""
    way = WAYS[name]
    scheduling = "in step" if way["scheduling"] == "in_step" else "each on its own"
    return f"{way['concurrency']} games {scheduling}, KV blocks of {way['block_size']}"


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary row of a report: the way now against the way before where both
    ran, and against the floor."""
    by_way = {r["way"]: r for r in report["ways"]}
    now, floor_s = by_way[NOW], report["floor"]["floor_seconds"]
    games = f"{now['games']} evaluation games in {report['settings']['dtype']}"
    against_floor = f"{now['seconds'] / floor_s:.2f}x the floor ({now['seconds']:.0f} s against {floor_s:.0f} s)"
    if BEFORE in by_way:
        return [{"compares": f"{games}: {way_words(BEFORE)} (before) against {way_words(NOW)} (now)",
                 "result": f"{by_way[BEFORE]['seconds'] / now['seconds']:.2f}x faster; {against_floor}"}]
    return [{"compares": f"{games}, {way_words(NOW)}, against the floor (a perfect prefix cache at the CPU's measured rates)",
             "result": against_floor}]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model folder (the warm-started model)")
    parser.add_argument("--game", default="twenty_questions_subset")
    parser.add_argument("--games", type=int, default=100)
    parser.add_argument("--seed", type=int, default=12345, help="the experiment's evaluation seed")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--ways", nargs="+", default=list(DEFAULT_WAYS), choices=list(WAYS))
    parser.add_argument("--out", default="benchmarks/results/served_evaluation.json")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    from generation_engines import memory_bandwidth_gbps

    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(args.model)
    rates = {"matmul_gflops": matmul_gflops(config.hidden_size, config.intermediate_size),
             "bandwidth_gbps": memory_bandwidth_gbps()}  # measured before any server runs
    result = {"machine": {**describe(), **{k: round(v, 1) for k, v in rates.items()}},
              "settings": {k: v for k, v in vars(args).items() if k != "out"}, "ways": []}
    work = Path(tempfile.mkdtemp(prefix="served_evaluation-"))
    now_games = None
    for name in args.ways:
        row, games = run_way(name, args, work)
        print(json.dumps(row), flush=True)
        result["ways"].append(row)
        if name == NOW or now_games is None:
            now_games, generated = games, row["generated_tokens_per_turn"] * row["requests"]
        atomic_write_json(args.out, result)
    result["floor"] = floor(args, now_games, int(generated), rates)
    by_way = {r["way"]: r for r in result["ways"]}
    if BEFORE in by_way and NOW in by_way:
        result["speedup_now_vs_before"] = round(by_way[BEFORE]["seconds"] / by_way[NOW]["seconds"], 2)
    if NOW in by_way:
        result["now_over_floor"] = round(by_way[NOW]["seconds"] / result["floor"]["floor_seconds"], 2)
    print(json.dumps(result["floor"]))
    atomic_write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
