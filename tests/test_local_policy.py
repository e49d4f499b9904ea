"""The local policy's batched generation with per-game prompt-cache reuse is exact.

Greedy decoding must give the same replies as plain unbatched, uncached ``generate`` over
several turns in which each game's prompt grows by a different amount (so cached prefixes and
new parts have different lengths across the batch).
"""
from __future__ import annotations

import torch

from aria.llm.local import LocalChatModel


def test_cached_batched_generation_equals_unbatched_uncached(tiny_model_dir):
    # float32: exactness is a property of the maths; bfloat16 rounding differs with batch shape.
    cached = LocalChatModel(str(tiny_model_dir), max_new_tokens=6, temperature=0, reuse_cache=True, dtype="float32")
    plain = LocalChatModel(str(tiny_model_dir), max_new_tokens=6, temperature=0, reuse_cache=False, dtype="float32")
    keys = ["a", "b", "c"]
    prompts = ["Is it an animal?", "Let's play a game of Twenty Questions. Guess the object.", "Hi"]
    for turn in range(3):
        conversations = [[{"role": "user", "content": p}] for p in prompts]
        batched = [c.text for c in cached.generate(conversations, keys=keys)]
        one_by_one = [plain.generate([c])[0].text for c in conversations]
        assert batched == one_by_one, f"turn {turn}"
        # The cache holds each game's whole prompt after the call.
        assert [len(cached._caches[k].token_ids) for k in keys] == [len(cached.encode(c)) for c in conversations]
        prompts = [p + f"\nQuestion: {reply}\nAnswer: No." + " Yes." * i for i, (p, reply) in enumerate(zip(prompts, batched))]


def test_release_forgets_a_game(tiny_model_dir):
    policy = LocalChatModel(str(tiny_model_dir), max_new_tokens=2, temperature=0)
    policy.generate([[{"role": "user", "content": "Hello"}]], keys=["g"])
    assert "g" in policy._caches
    policy.release("g")
    assert "g" not in policy._caches


def test_inverse_cdf_sampler_samples_the_softmax_distribution():
    import torch

    from aria.llm.local import InverseCdfSampler

    torch.manual_seed(0)
    scores = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.1, 0.0, 0.9]]))
    n = 20000
    counts = torch.zeros_like(scores)
    sampler = InverseCdfSampler()
    for _ in range(n):
        out = sampler(None, scores.clone())
        counts += (out == 0).float()
    assert torch.all(counts.sum(dim=1) == n)               # exactly one token left per row
    assert counts[0, 3] == 0 and counts[1, 0] == 0 and counts[1, 2] == 0  # probability 0: never
    expected = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.1, 0.0, 0.9]])
    assert torch.allclose(counts / n, expected, atol=0.015)  # 4+ standard errors at n=20000


def test_rows_that_finish_early_leave_the_batch_without_changing_any_reply(tiny_model_dir):
    """Early-finishing rows are compacted out of the batch; every reply still equals plain
    transformers ``generate`` on that prompt alone with the same end-of-sequence tokens."""
    policy = LocalChatModel(str(tiny_model_dir), max_new_tokens=8, temperature=0, dtype="float32")
    # Eight rows: one finished row is less than a quarter of the batch, so it stays in the batch
    # (uncompacted) for some steps, and nothing after its end may reach its reply.
    conversations = [[{"role": "user", "content": p}] for p in
                     ["Is it an animal?", "Guess the object in twenty questions.", "Hi", "Is it made of metal or wood?",
                      "Is it alive?", "Question: Is it a fruit?", "Answer: No.", "Let's play a game of Twenty Questions."]]

    def reference(eos_ids):
        replies = []
        for conversation in conversations:
            ids = torch.tensor([policy.encode(conversation)])
            out = policy.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                        do_sample=False, eos_token_id=eos_ids, pad_token_id=policy.pad_id)
            replies.append([t for t in out[0, ids.shape[1]:].tolist() if t not in eos_ids and t != policy.pad_id])
        return replies

    # A token row 0 says mid-reply ends that reply early; the other rows end where (if) they say it.
    policy.eos_ids = [reference([policy.pad_id])[0][3]]
    expected = reference(policy.eos_ids)
    lengths = [len(r) for r in expected]
    assert min(lengths) < 8 and max(lengths) == 8, lengths  # rows really end at different steps

    replies = policy.generate(conversations, keys=[str(i) for i in range(len(conversations))])
    assert [r.text for r in replies] == [policy.tokenizer.decode(r, skip_special_tokens=True).strip() for r in expected]


def test_a_games_producer_names_the_weights_not_only_the_folder(tmp_path, tiny_model_dir):
    """Trained models are all ".../model" or ".../final": a games file resumed with another model
    of the same folder name must not be continued as if it were the same (the producer differs),
    and the same weights copied elsewhere are the same producer."""
    import shutil

    from safetensors.torch import load_file, save_file

    from aria.trajectories import describe

    for name in ("a", "b", "copy"):
        shutil.copytree(tiny_model_dir, tmp_path / name / "model")
    tensors = load_file(str(tmp_path / "b" / "model" / "model.safetensors"))
    save_file({k: v + 0.01 for k, v in tensors.items()}, str(tmp_path / "b" / "model" / "model.safetensors"))
    a, b, copy = (describe(LocalChatModel(str(tmp_path / n / "model"), max_new_tokens=2)) for n in ("a", "b", "copy"))
    assert a["model"] == b["model"] == "model" and a != b and a["weights"] != b["weights"]
    assert a == copy
