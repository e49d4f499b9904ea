"""The causal-LM policy for training: samples -> token ids, and exact action log-probabilities.

Spec ``aria_method.md`` §5. A sample ``(observation, action)`` becomes one sequence::

    [chat-templated prompt, truncated on the left to max_prompt_tokens] [action tokens] [eos]

with the action tokens directly after the prompt. A batch pads sequences on the right only, so
no padding ever sits between a prompt and its action (the original left-padded prompt and
action separately and concatenated them, which put pad tokens in between). Log-probabilities are
``log_softmax`` of the logits (not ``log(softmax)``), taken only at action positions, and summed
per sample. ``tests/test_policy.py`` checks a padded batch against one sample at a time.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch


@dataclass(frozen=True)
class EncodedSample:
    input_ids: list[int]  # prompt then action
    prompt_len: int

    @property
    def action_len(self) -> int:
        return len(self.input_ids) - self.prompt_len


def prompt_ids(tokenizer, observation: str, max_prompt_tokens: int, system_prompt: str | None = None) -> list[int]:
    """The chat-templated prompt (with the assistant header), truncated on the left."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": observation})
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    return list(ids)[-max_prompt_tokens:]


def action_ids(tokenizer, action: str, append_eos: bool = True) -> list[int]:
    """The action's tokens as the model would emit them, ending with the end-of-turn token."""
    ids = list(tokenizer(action, add_special_tokens=False)["input_ids"])
    if append_eos and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return ids


def encode_sample(tokenizer, observation: str, action: str, max_prompt_tokens: int, append_eos: bool = True,
                  system_prompt: str | None = None) -> EncodedSample:
    prompt = prompt_ids(tokenizer, observation, max_prompt_tokens, system_prompt)
    return EncodedSample(prompt + action_ids(tokenizer, action, append_eos), len(prompt))


def collate(samples: Sequence[EncodedSample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``action_mask`` ([B, L]), plus
    ``prompt_len`` ([B])."""
    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    action = torch.zeros((len(samples), width), dtype=torch.bool)
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids)
        attention[i, :n] = 1
        action[i, s.prompt_len : n] = True
    return {"input_ids": ids, "attention_mask": attention, "action_mask": action,
            "prompt_len": torch.tensor([s.prompt_len for s in samples])}


def action_logprobs(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Σ over action tokens of log π(token | everything before it), per sample: shape [B].

    Only the last positions that predict some action token go through the LM head
    (``logits_to_keep``), and ``log_softmax`` runs only at action positions.
    """
    input_ids, action_mask = batch["input_ids"], batch["action_mask"]
    width = input_ids.shape[1]
    first_action = int(batch["prompt_len"].min())
    keep = width - first_action + 1  # logits at positions first_action-1 .. width-1
    logits = model(input_ids=input_ids, attention_mask=batch["attention_mask"], logits_to_keep=keep).logits
    predicted = logits[:, :-1]  # position j predicts token j + 1
    targets = input_ids[:, first_action:]
    mask = action_mask[:, first_action:]
    picked = torch.log_softmax(predicted[mask].float(), dim=-1).gather(-1, targets[mask].unsqueeze(-1)).squeeze(-1)
    rows = torch.nonzero(mask)[:, 0]
    return torch.zeros(len(input_ids), dtype=picked.dtype, device=picked.device).index_add(0, rows, picked)


def padded_fraction(samples: Sequence[EncodedSample]) -> float:
    """Share of the batch's [B, L] tokens that are padding."""
    width = max(len(s.input_ids) for s in samples)
    return 1.0 - sum(len(s.input_ids) for s in samples) / (width * len(samples))


def load_policy(model_path: str, dtype: str = "float32", lora: dict[str, Any] | None = None, gradient_checkpointing: bool = False):
    """Tokenizer and model from a local folder (``"embedded"`` = SmolLM2-135M-Instruct), with a
    LoRA adapter from peft when ``lora`` is given (keys: r, alpha, dropout, target_modules)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aria.llm.embedded import resolve_model_path

    path = resolve_model_path(model_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora.get("dropout", 0.0),
                                                 target_modules=list(lora["target_modules"]), task_type="CAUSAL_LM"))
    return tokenizer, model


def merge_lora(adapter_dir: Path, out_dir: Path, base: str | None = None, dtype: str = "float32") -> Path:
    """Merge the LoRA adapter in ``adapter_dir`` into its base model; write a full model folder
    (tokenizer included) to ``out_dir`` atomically (temporary folder, then rename)."""
    import json
    import shutil

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aria.llm.embedded import resolve_model_path

    config_path = adapter_dir / "adapter_config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{adapter_dir} has no adapter_config.json (is it a LoRA output?)")
    base_path = resolve_model_path(base or json.loads(config_path.read_text())["base_model_name_or_path"])
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=getattr(torch, dtype))
    merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else base_path)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir
