"""Shared fixtures: a tiny random chat model and a tiny random sentence-embedding model built in
the test session, a scripted policy, and game configs.

The tiny model is a real ``LlamaForCausalLM`` with a real byte-level BPE tokenizer trained here
on a few sentences and a ChatML chat template, saved with ``save_pretrained`` and loaded back
through ``from_pretrained`` like any checkpoint. Its weights are random (no weights can be
downloaded here), so its outputs are gibberish, which is exactly what exercises the invalid-
question paths of the games.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from aria.games.common.base import load_game_config
from aria.games.question.game import load_game


def pytest_configure(config):
    """Under pytest-xdist (``scripts/run_tests.sh`` runs three workers on two cores), each
    worker and the processes its tests start compute on one thread: the tiny models gain nothing
    from a second thread, and workers of two OpenMP threads each wait on each other's spinning
    threads. A vLLM server a test starts (scripts/serve_vllm.sh) computes on the last core alone,
    where its busy threads leave the other workers the first core."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) > 1:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(cores[-1]))
        import sys

        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Files with the most ``slow`` tests run first (order kept otherwise): with one file per
    worker, a long file handed out last would keep one worker busy while the other waits, and the
    file of vLLM servers (every test slow) is the longest."""
    from collections import Counter

    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])

# Verbatim samples of the original release's data formats (copied from the project's shared
# data, so that a clone alone runs every test)
ORIGINAL_SAMPLES = Path(__file__).resolve().parent / "data" / "original"

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_chat_model(folder: Path, seed: int = 0, hidden_size: int = 32, heads: int = 4) -> Path:
    """Save a tiny random Llama + tokenizer to ``folder`` and return it. vLLM's CPU attention
    takes head sizes from 32 up: ``hidden_size=128, heads=2`` is a tiny model it can serve."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    corpus = [
        "Question: Is it an animal? Answer: No. Question: Is it a fruit? Answer: Yes.",
        "Let's play a game of Twenty Questions. Guess the object. Is your city in Asia?",
        "Here is the game history: Now, please proceed by asking your next question.",
    ] * 5
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHATML
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=max(heads // 2, 1), max_position_embeddings=4096,
        # Large random weights make replies depend on the whole context (positions, cache
        # contents), so exactness tests catch a misplaced cache row or position.
        initializer_range=0.5,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def build_tiny_sentence_model(folder: Path, seed: int = 0) -> Path:
    """Save a tiny random BERT + WordPiece tokenizer as a sentence-transformers folder (mean pooling)."""
    import string

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    torch.manual_seed(seed)
    raw = folder / "bert"
    raw.mkdir(parents=True, exist_ok=True)
    words = "is it a an the object animal city in on of made alive food fruit big small red round yes no your".split()
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *chars, *[f"##{c}" for c in chars]]
    tokenizer = BertTokenizerFast(vocab={w: i for i, w in enumerate(dict.fromkeys(vocab))}, do_lower_case=True)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=256)
    BertModel(config).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    transformer = Transformer(str(raw), max_seq_length=128)
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    out = folder / "sentence-model"
    SentenceTransformer(modules=[transformer, pooling], device="cpu").save(str(out))
    return out


class ScriptedPolicy:
    """A deterministic policy that replies from a per-game script (a test policy, not a mock:
    it implements the ChatModel protocol fully, so the rollout code runs unchanged)."""

    name = "scripted"

    def __init__(self, script):
        self.script = script  # game_id -> list of replies, repeated from the last one
        self.calls: list[int] = []

    def generate(self, conversations, keys=None):
        from aria.llm.base import Completion

        self.calls.append(len(conversations))
        replies = []
        for conversation, key in zip(conversations, keys):
            turn = conversation[-1]["content"].count("\nAnswer: ")
            lines = self.script[key]
            replies.append(Completion(lines[min(turn, len(lines) - 1)]))
        return replies

    def release(self, key):
        pass


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Every test starts with no accelerate state: it is one per process, and a training test
    must not run under the device or precision an earlier test chose."""
    yield
    import sys

    if "accelerate.state" in sys.modules:
        sys.modules["accelerate.state"].AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="session")
def tiny_sentence_model_dir(tmp_path_factory) -> Path:
    return build_tiny_sentence_model(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def twenty_questions():
    return load_game("twenty_questions")


@pytest.fixture(scope="session")
def guess_my_city():
    return load_game("guess_my_city")


@pytest.fixture(scope="session")
def game_configs() -> dict:
    return {name: load_game_config(name) for name in ("twenty_questions", "guess_my_city")}


def naive_action_logprob(model, encoded):
    """Σ log p(action token | everything before it) for one encoded sample, computed the plain way:
    one unpadded forward pass and a loop over the action's positions. An independent reference
    for the trainers' batched, padded :func:`aria.llm.policy.action_logprobs` (a tensor with grad)."""
    import torch

    ids = torch.tensor([encoded.input_ids])
    logits = model(input_ids=ids).logits[0].float()
    total = torch.zeros((), dtype=torch.float32)
    for position in range(encoded.prompt_len, len(encoded.input_ids)):
        total = total + torch.log_softmax(logits[position - 1], dim=-1)[encoded.input_ids[position]]
    return total


# ---- where the suite's CPU goes (benchmarks/suite_cpu.py) -----------------------------------------
# Wall time per test says little on two cores shared by three workers; CPU seconds do. With
# ARIA_TEST_CPU_PROFILE=DIR each worker writes, per test, the CPU seconds of its own process and
# of the child processes it waited for (commands, accelerate launches). A vLLM server is started
# in a session of its own and never waited for, so its CPU is not in these figures.
_cpu_rows: list[dict] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not os.environ.get("ARIA_TEST_CPU_PROFILE"):
        yield
        return
    import resource
    import time

    def cpu(who) -> float:
        usage = resource.getrusage(who)
        return usage.ru_utime + usage.ru_stime

    own, children, start = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.monotonic()
    yield
    _cpu_rows.append({"test": item.nodeid, "own": cpu(resource.RUSAGE_SELF) - own,
                      "children": cpu(resource.RUSAGE_CHILDREN) - children, "wall": time.monotonic() - start})


def pytest_sessionfinish(session):
    folder = os.environ.get("ARIA_TEST_CPU_PROFILE")
    if folder and _cpu_rows:
        import json

        Path(folder).mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (Path(folder) / f"cpu-{worker}.json").write_text(json.dumps(_cpu_rows))
