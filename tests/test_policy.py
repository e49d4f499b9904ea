"""Action log-probabilities (aria/llm/policy.py) are exact: a right-padded batch of samples with
different prompt and action lengths gives, per sample, the same sum of action-token log-probs as
running that sample alone with no padding at all."""
from __future__ import annotations

import json

import torch

from aria.llm.policy import action_logprobs, collate, encode_sample, load_policy, padded_fraction

SAMPLES = [
    ("Let's play a game of Twenty Questions. Guess the object.", "Question: Is it an animal?"),
    ("Hi", "Question: Is it a fruit? It is round."),
    ("Here is the game history: Question: Is it alive? Answer: No. Now, please proceed by asking your next question.",
     "Yes"),
    ("Guess the object.", "Question: Is it bigger than a car?"),
]


def reference_logprob(model, sample) -> float:
    ids = torch.tensor([sample.input_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
    targets = ids[0, 1:]
    return float(sum(logp[j - 1, targets[j - 1]] for j in range(sample.prompt_len, len(sample.input_ids))))


def test_batched_logprobs_equal_one_sample_at_a_time(tiny_model_dir):
    tokenizer, model = load_policy(str(tiny_model_dir))
    model.eval()
    encoded = [encode_sample(tokenizer, o, a, max_prompt_tokens=512) for o, a in SAMPLES]
    assert len({e.prompt_len for e in encoded}) > 1 and len({e.action_len for e in encoded}) > 1
    batch = collate(encoded, tokenizer.pad_token_id)
    with torch.no_grad():
        batched = action_logprobs(model, batch)
        expected = [reference_logprob(model, e) for e in encoded]
    torch.testing.assert_close(batched.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-4, rtol=1e-5)
    assert (batched < 0).all()


def test_padded_rows_send_only_the_positions_that_predict_an_action_token_through_the_head(tiny_model_dir):
    """The LM head sees one row per action token, not every position from the shortest prompt on
    (whole Guess My City prompts in rows made that 8 GB of logits)."""
    tokenizer, model = load_policy(str(tiny_model_dir))
    encoded = [encode_sample(tokenizer, o, a, max_prompt_tokens=512) for o, a in SAMPLES]
    batch = collate(encoded, tokenizer.pad_token_id)
    seen = []
    hook = model.get_output_embeddings().register_forward_hook(lambda module, args, out: seen.append(args[0].shape))
    try:
        with torch.no_grad():
            action_logprobs(model, batch)
    finally:
        hook.remove()
    action_tokens = sum(e.action_len for e in encoded)
    assert action_tokens < len(encoded) * (batch["input_ids"].shape[1] - min(e.prompt_len for e in encoded))
    assert [s[:-1] for s in seen] == [torch.Size([action_tokens])]


def test_layout_prompt_then_action_then_right_padding(tiny_model_dir):
    tokenizer, _ = load_policy(str(tiny_model_dir))
    encoded = [encode_sample(tokenizer, o, a, max_prompt_tokens=512) for o, a in SAMPLES]
    batch = collate(encoded, tokenizer.pad_token_id)
    for i, e in enumerate(encoded):
        n = len(e.input_ids)
        assert batch["attention_mask"][i, :n].all() and not batch["attention_mask"][i, n:].any()
        assert batch["action_mask"][i].nonzero().squeeze(1).tolist() == list(range(e.prompt_len, n))
        assert batch["input_ids"][i, n - 1] == tokenizer.eos_token_id  # the action ends with end-of-turn
    width = batch["input_ids"].shape[1]
    assert padded_fraction(encoded) == 1 - sum(len(e.input_ids) for e in encoded) / (width * len(encoded))


def test_over_long_prompt_is_refused_or_cut_on_the_left_as_asked(tiny_model_dir):
    import pytest

    from aria.llm.policy import PromptTooLong

    tokenizer, _ = load_policy(str(tiny_model_dir))
    full = encode_sample(tokenizer, SAMPLES[2][0], "Yes", max_prompt_tokens=10_000)
    with pytest.raises(PromptTooLong, match=f"its prompt is {full.prompt_len} tokens, over the cutoff of 12"):
        encode_sample(tokenizer, SAMPLES[2][0], "Yes", max_prompt_tokens=12)
    cut = encode_sample(tokenizer, SAMPLES[2][0], "Yes", max_prompt_tokens=12, over_long="cut_left")
    assert cut.prompt_len == 12 and cut.truncated and not full.truncated
    assert cut.input_ids == full.input_ids[full.prompt_len - 12 :]


def test_merge_lora_writes_a_plain_model_with_the_adapters_log_probs(tiny_model_dir, tmp_path):
    import pytest

    from aria.llm.policy import merge_lora

    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    tokenizer, model = load_policy(str(tiny_model_dir), lora=lora)
    torch.manual_seed(0)
    with torch.no_grad():  # a trained-looking adapter: lora_B starts at zero, which would merge to nothing
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.save_pretrained(tmp_path / "adapter")
    batch = collate([encode_sample(tokenizer, o, a, max_prompt_tokens=512) for o, a in SAMPLES], tokenizer.pad_token_id)
    model.eval()
    with torch.no_grad():
        with_adapter = action_logprobs(model, batch)
        base = action_logprobs(load_policy(str(tiny_model_dir))[1].eval(), batch)

    out = merge_lora(tmp_path / "adapter", tmp_path / "merged", base=str(tiny_model_dir))
    assert out == tmp_path / "merged" and not (tmp_path / "merged.tmp").exists()
    assert not (out / "adapter_config.json").exists() and (out / "tokenizer_config.json").is_file()
    with torch.no_grad():
        merged = action_logprobs(load_policy(str(out))[1].eval(), batch)
    torch.testing.assert_close(merged, with_adapter, atol=1e-4, rtol=1e-5)
    assert (merged - base).abs().max() > 1e-2  # the adapter mattered
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        merge_lora(tmp_path / "merged", tmp_path / "again")

    from aria.io import ConfigError

    with pytest.raises(ConfigError, match=r"^--base: '/no/model' is no model folder"):
        merge_lora(tmp_path / "adapter", tmp_path / "again", base="/no/model")
    (tmp_path / "a_file").write_text("keep me")  # a file where the folder goes is refused, not moved aside
    with pytest.raises(ConfigError, match="a_file is a file, not a folder"):
        merge_lora(tmp_path / "adapter", tmp_path / "a_file", base=str(tiny_model_dir))
    assert (tmp_path / "a_file").read_text() == "keep me" and not (tmp_path / "a_file.tmp").exists()


def test_merge_lora_never_replaces_its_adapter_its_base_or_other_files(tiny_model_dir, tmp_path):
    """The merge's output may replace an earlier merge only: the adapter itself, a folder inside it,
    the base model, or a folder of other files are refused in one line before any model loads, and
    left as they were (before: ADAPTER ADAPTER replaced the adapter with the merged model)."""
    import pytest

    from aria.io import ConfigError, model_digest
    from aria.llm.policy import merge_lora

    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
    _, model = load_policy(str(tiny_model_dir), lora=lora)
    adapter = tmp_path / "adapter"
    model.save_pretrained(adapter)
    before = model_digest(adapter)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "results.txt").write_text("mine")
    for out, message in [(adapter, "is .*adapter itself"), (adapter / "merged", "lies inside .*adapter"),
                         (tiny_model_dir, "is .* itself"), (tmp_path, "holds .*adapter"),
                         (tmp_path / "notes", "holds files that are not a previous merged model")]:
        with pytest.raises(ConfigError, match=f"^OUT_DIR: .*{message}"):
            merge_lora(adapter, out, base=str(tiny_model_dir))
    assert model_digest(adapter) == before and (adapter / "adapter_config.json").is_file()
    assert (tmp_path / "notes" / "results.txt").read_text() == "mine" and not (adapter / "merged").exists()
    merge_lora(adapter, tmp_path / "merged", base=str(tiny_model_dir))
    merge_lora(adapter, tmp_path / "merged", base=str(tiny_model_dir))  # an earlier merge is replaced


def test_a_base_with_a_config_json_of_no_model_is_one_line_before_loading(tiny_model_dir, tmp_path):
    """Before: transformers' traceback after the merge started (the adversarial pass gave --base a
    folder whose config.json was no model's). Each base below is refused naming it; a model
    setting of a trainer takes the same check (aria.llm.policy.model_folder)."""
    import pytest

    from aria.io import ConfigError
    from aria.llm.policy import merge_lora, model_folder

    _, model = load_policy(str(tiny_model_dir), lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"]})
    model.save_pretrained(tmp_path / "adapter")
    cases = {"not_json": ("{torn", "is no model's config"), "no_type": ('{"hidden_size": 8}', "is no model's config"),
             "no_weights": (json.dumps({"model_type": "llama"}), "holds a config.json but no weights")}
    for name, (text, message) in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(text)
        with pytest.raises(ConfigError, match=f"^--base: .*{name}.* {message}"):
            merge_lora(tmp_path / "adapter", tmp_path / "merged", base=str(tmp_path / name))
        with pytest.raises(ConfigError, match=f"^model.path: .*{name}.* {message}"):
            model_folder(str(tmp_path / name), "model.path")
    assert not (tmp_path / "merged").exists()
    assert model_folder(str(tiny_model_dir), "model.path") == tiny_model_dir  # a real model passes


def test_a_new_adapter_on_an_adapter_is_refused_before_loading(tiny_model_dir, tmp_path):
    """Before: run_offline with model.path an adapter trained (exit 0) a second adapter on the first,
    saved only the second, and its merge lost the first (the adversarial pass). Loaded without a new
    adapter (to play or score) an adapter folder is still fine."""
    import pytest

    from aria.io import ConfigError

    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"]}
    tokenizer, model = load_policy(str(tiny_model_dir), lora=lora)
    model.save_pretrained(tmp_path / "adapter")
    tokenizer.save_pretrained(tmp_path / "adapter")  # as the trainers save it
    with pytest.raises(ConfigError, match=r"^model.path: .*adapter' is a LoRA adapter, .* merge it first"):
        load_policy(str(tmp_path / "adapter"), lora=lora)
    load_policy(str(tmp_path / "adapter"))


def test_a_saved_encoding_is_read_back_and_a_bad_one_is_named(tmp_path):
    import json

    import pytest

    from aria.io import DataError
    from aria.llm.policy import ENCODING_FILE, Encoding

    assert Encoding.saved_in(tmp_path, Encoding(7, False)) == Encoding(7, False)  # none saved: the default
    Encoding(64, True, "Be brief.").save(tmp_path)
    assert Encoding.saved_in(tmp_path, Encoding()) == Encoding(64, True, "Be brief.")
    (tmp_path / ENCODING_FILE).write_text(json.dumps({"max_prompt_tokens": "64", "append_eos": True, "system_prompt": None}))
    with pytest.raises(DataError, match=ENCODING_FILE):
        Encoding.saved_in(tmp_path, Encoding())


def test_lora_target_modules_that_name_no_module_are_one_line(tiny_model_dir):
    """Before: peft's NoMatchingPeftModuleError traceback (the adversarial pass)."""
    import pytest

    from aria.io import ConfigError

    lora = {"r": 4, "alpha": 8, "dropout": 0.0}
    for targets, message in [(["nope_proj"], r"\['nope_proj'\] names no module"), ([], r"\[\] is empty")]:
        with pytest.raises(ConfigError, match=rf"^model.lora.target_modules: {message}"):
            load_policy(str(tiny_model_dir), lora={**lora, "target_modules": targets})
    _, model = load_policy(str(tiny_model_dir), lora={**lora, "target_modules": ["q_proj", "model.layers.0.mlp.up_proj"]})
    assert any("lora_A" in name for name, _ in model.named_parameters())
