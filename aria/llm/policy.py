"""The causal-LM policy for training: samples -> token ids, and exact action log-probabilities.

``docs/method.md`` §5. A sample ``(observation, action)`` becomes one sequence::

    [chat-templated prompt, whole] [action tokens] [eos]

with the action tokens directly after the prompt. The prompt is the one the policy played with,
whole: a prompt longer than the cutoff (``data.max_prompt_tokens``, the paper's 4096, capped at
the model's context) is refused by name (:class:`PromptTooLong`, then file and sample in the
trainer's one line), never cut silently. The release cut every prompt on the left to 512 tokens,
dropping the system prompt and the game's rules from long histories; that stays available as
``data.max_prompt_tokens=512 data.over_long=cut_left`` (``docs/method.md`` §7). A batch pads sequences on the right only, so
no padding ever sits between a prompt and its action (the original left-padded prompt and
action separately and concatenated them, which put pad tokens in between). Log-probabilities are
``log_softmax`` of the logits (not ``log(softmax)``), taken only at action positions, and summed
per sample. ``tests/test_policy.py`` checks a padded batch against one sample at a time.
"""
from __future__ import annotations

import inspect
import json
import shutil
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from aria.io import ConfigError, DataError, atomic_folder, atomic_write_json, check_output_folder, read_json
from aria.llm.embedded import resolve_model_path
from aria.llm.merge_record import MERGE_FILE, write_merge_record
from aria.packing import PACKINGS, cheaper_layout, collate_tree, is_tree_batch, model_config, tree_action_token_logprobs
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): accelerate, peft, transformers


@dataclass(frozen=True)
class EncodedSample:
    input_ids: list[int]  # prompt then action
    prompt_len: int
    truncated: bool = False  # the prompt was cut on the left to max_prompt_tokens (over_long=cut_left)

    @property
    def action_len(self) -> int:
        return len(self.input_ids) - self.prompt_len


def full_prompt_ids(tokenizer, observation: str, system_prompt: str | None = None) -> list[int]:
    """The chat-templated prompt (with the assistant header), whole."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": observation})
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])


def action_ids(tokenizer, action: str, append_eos: bool = True) -> list[int]:
    """The action's tokens as the model would emit them, ending with the end-of-turn token."""
    ids = list(tokenizer(action, add_special_tokens=False)["input_ids"])
    if append_eos and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return ids


#: What a prompt longer than the cutoff gets (config ``data.over_long``): ``refuse``, named with its
#: length (the policy played it whole, so a cut would train on an input it never saw), or
#: ``cut_left``, its last ``max_prompt_tokens`` tokens (the release's behaviour, and the online
#: actor's, whose policy plays with the same cut).
OVER_LONG = ("refuse", "cut_left")


class PromptTooLong(ValueError):
    """A prompt longer than the cutoff under ``over_long=refuse``; the trainer names its file and sample."""

    def __init__(self, length: int, limit: int, what: str = "prompt"):
        self.length, self.limit = length, limit
        super().__init__(f"its {what} is {length} tokens, over the cutoff of {limit}")


def encode_sample(tokenizer, observation: str, action: str, max_prompt_tokens: int, append_eos: bool = True,
                  system_prompt: str | None = None, over_long: str = "refuse", context: int | None = None) -> EncodedSample:
    """Prompt then action, as the policy played them. ``context``: the model's positions; a
    sample that does not fit them whole is refused whatever ``over_long`` says."""
    whole = full_prompt_ids(tokenizer, observation, system_prompt)
    if len(whole) > max_prompt_tokens and over_long == "refuse":
        raise PromptTooLong(len(whole), max_prompt_tokens)
    prompt = whole[-max_prompt_tokens:]
    sample = EncodedSample(prompt + action_ids(tokenizer, action, append_eos), len(prompt), len(whole) > len(prompt))
    if context is not None and len(sample.input_ids) > context:
        raise PromptTooLong(len(sample.input_ids), context, "prompt with its action")
    return sample


def model_context(model) -> int | None:
    """The positions the model was built for (``max_position_embeddings``), through any wrapper; None if unsaid."""
    return getattr(model_config(model), "max_position_embeddings", None)


#: The file beside every trained model that says how its samples were encoded.
ENCODING_FILE = "aria_encoding.json"


@dataclass(frozen=True)
class Encoding:
    """How a sample (observation, action) becomes tokens: the ``data`` section's
    ``max_prompt_tokens``, ``over_long``, ``append_eos`` and ``system_prompt``.

    Every trainer encodes with one of these and saves it beside the model it writes
    (:data:`ENCODING_FILE`), and every scorer reads it back, so a model is scored exactly as it
    was trained (a reward model trained without the end-of-turn token must not see one).
    """

    max_prompt_tokens: int = 4096  # the paper's cutoff (Table 4)
    append_eos: bool = True
    system_prompt: str | None = None
    over_long: str = "refuse"  # OVER_LONG
    context: int | None = None  # the model's positions (model_context), when known

    @classmethod
    def of(cls, data) -> "Encoding":
        """From a trainer's typed ``data`` section (:class:`aria.trainers.settings.DataSettings`)."""
        return cls(data.max_prompt_tokens, data.append_eos, data.system_prompt, data.over_long)

    def for_model(self, model) -> "Encoding":
        """This encoding with the cutoff capped at the model's context, which it records."""
        context = model_context(model)
        if context is None:
            return self
        return replace(self, max_prompt_tokens=min(self.max_prompt_tokens, context), context=context)

    def encode(self, tokenizer, observation: str, action: str) -> EncodedSample:
        return encode_sample(tokenizer, observation, action, self.max_prompt_tokens, self.append_eos, self.system_prompt,
                             self.over_long, self.context)

    def save(self, folder: Path) -> None:
        atomic_write_json(Path(folder) / ENCODING_FILE, asdict(self))

    @classmethod
    def saved_in(cls, folder: Path, default: "Encoding") -> "Encoding":
        """The encoding saved in ``folder``, or ``default`` for a model written before it was saved."""
        path = Path(folder) / ENCODING_FILE
        if not path.is_file():
            return default
        saved = read_json(path)
        # a model saved before over_long and context were recorded was trained on prompts cut on the left
        old_keys, keys = {"max_prompt_tokens", "append_eos", "system_prompt"}, set(saved) if isinstance(saved, dict) else set()
        if not isinstance(saved, dict) or keys not in (old_keys, old_keys | {"over_long", "context"}) \
                or not _whole_number(saved["max_prompt_tokens"]) or saved["max_prompt_tokens"] < 1 \
                or not isinstance(saved["append_eos"], bool) or not isinstance(saved["system_prompt"], (str, type(None))) \
                or saved.get("over_long", "cut_left") not in OVER_LONG \
                or not (saved.get("context") is None or _whole_number(saved["context"]) and saved["context"] >= 1):
            raise DataError(path, None, None, "expected {max_prompt_tokens: int >= 1, append_eos: bool, system_prompt: "
                            f"string or null, over_long: {' | '.join(OVER_LONG)}, context: int >= 1 or null}}")
        return cls(**{"over_long": "cut_left", **saved})


def _whole_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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


def collate_as(samples: Sequence[EncodedSample], pad_id: int, packing: str = "padded",
               break_even: float | None = None) -> dict[str, torch.Tensor]:
    """A micro-batch laid out as ``packing`` says (config ``train.packing``): ``padded`` rows
    (:func:`collate`) or prefix trees (:func:`aria.packing.collate_tree`). Both read back to
    the same log-probabilities and scores (:func:`action_logprobs`). Under ``prefix_tree``, a
    micro-batch whose trees would cost more than its rows is laid out in rows
    (:func:`aria.packing.cheaper_layout`, with the model's ``break_even``,
    :func:`aria.packing.attention_break_even`; None: always trees)."""
    if packing not in PACKINGS:
        raise ValueError(f"unknown packing {packing!r} (known: {', '.join(PACKINGS)})")
    if packing == "prefix_tree" and cheaper_layout([s.input_ids for s in samples], break_even) == "prefix_tree":
        return collate_tree(samples, pad_id)
    return collate(samples, pad_id)


def action_logprobs(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Σ over action tokens of log π(token | everything before it), per sample: shape [B].

    Padded rows (:func:`collate`): only the positions that predict an action token go through the
    LM head (``logits_to_keep`` as a boolean mask) and ``log_softmax``.
    A prefix tree (:func:`aria.packing.collate_tree`): one pass over the tree
    (:func:`aria.packing.tree_action_token_logprobs`), the same values up to float rounding.
    """
    picked, sample = action_token_logprobs(model, batch)
    size = int(batch["num_samples"]) if is_tree_batch(batch) else len(batch["input_ids"])
    return torch.zeros(size, dtype=picked.dtype, device=picked.device).index_add(0, sample, picked)


def action_token_logprobs(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(token | everything before it) of every action token of the batch, [M], and the sample
    each belongs to, [M], ordered by sample, then by the token's place in its action: the same
    order whatever the layout (padded rows or prefix trees), so per-token values computed in one
    layout line up with those of another (the clipped loss's reference, :mod:`aria.trainers.offline`)."""
    if is_tree_batch(batch):
        picked, sample = tree_action_token_logprobs(model, batch)
        order = torch.sort(sample, stable=True).indices  # trees hold their samples out of order
        return picked[order], sample[order]
    input_ids, action_mask = batch["input_ids"], batch["action_mask"]
    # Logits only where they predict an action token (position j predicts token j + 1), as a
    # boolean [B, L] mask: the model returns them flattened in row-major order, the order of the
    # action tokens. (Keeping every position from the shortest prompt on held 8 GB of logits for
    # a micro-batch of one Guess My City game's whole prompts.)
    predicts = torch.zeros_like(action_mask)
    predicts[:, :-1] = action_mask[:, 1:]
    logits = model(input_ids=input_ids, attention_mask=batch["attention_mask"], logits_to_keep=predicts).logits
    rows = logits.reshape(-1, logits.shape[-1]).float()  # [M, V]
    picked = torch.log_softmax(rows, dim=-1).gather(-1, input_ids[action_mask].unsqueeze(-1)).squeeze(-1)
    return picked, torch.nonzero(action_mask)[:, 0]  # row-major: by sample, then by position


def padded_fraction(samples: Sequence[EncodedSample]) -> float:
    """Share of the batch's [B, L] tokens that are padding."""
    width = max(len(s.input_ids) for s in samples)
    return 1.0 - sum(len(s.input_ids) for s in samples) / (width * len(samples))


#: Model heads :func:`load_model` builds: the policy's language-model head, or one score.
HEADS = ("causal_lm", "score")


def load_model(model_path: str, head: str = "causal_lm", dtype: str = "float32", lora: dict[str, Any] | None = None,
               gradient_checkpointing: bool = False, require_head: bool = False, setting: str = "model.path",
               head_follows: bool = False):
    """Tokenizer and model from a local folder (``"embedded"`` = SmolLM2-135M-Instruct).

    ``head="causal_lm"``: the policy. ``head="score"``: a one-output sequence-classification
    model, the reward model (a causal-LM folder gets a new, randomly initialised scalar head,
    which reads the last token that is not padding). With ``lora`` (keys: r, alpha, dropout,
    target_modules), a peft adapter on those modules; a score head is then trained in full.
    ``require_head`` (score only): the folder must hold every weight, the score head included
    (a trained reward model, for scoring); a causal-LM folder is refused instead of scored by a
    random head. ``setting``: where ``model_path`` came from, named when it is no model folder.
    A new score head is said in one line, unless ``head_follows`` (the base of a LoRA reward
    model, whose adapter brings the trained head).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if head not in HEADS:
        raise ValueError(f"unknown model head {head!r} (known: {', '.join(HEADS)})")
    path = model_folder(model_path, setting)
    if lora and not (path / "config.json").is_file():
        # transformers would load the adapter onto its base and peft add a second one; the save
        # would then hold the new adapter only, and a merge of it lose the first
        raise ConfigError(f"{setting}: {model_path!r} is a LoRA adapter, and training a new adapter on it would "
                          "save the new one only: merge it first (scripts/merge_lora.py ADAPTER OUT) and train from OUT")
    if lora:
        check_lora_targets(path, list(lora["target_modules"]), model_path, head)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if head == "causal_lm":
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    else:
        model = _score_model(path, dtype, model_path, require_head, head_follows)
        model.config.pad_token_id = tokenizer.pad_token_id
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if lora:
        from peft import LoraConfig, get_peft_model

        targets = list(lora["target_modules"])
        with peft_quietly():
            model = get_peft_model(model, LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                                                     target_modules=targets,
                                                     task_type="CAUSAL_LM" if head == "causal_lm" else "SEQ_CLS"))
    return tokenizer, model


def _score_model(path: Path, dtype: str, model_path: str, require_head: bool, head_follows: bool):
    """A one-output sequence-classification model from ``path`` (:func:`load_model`'s ``score`` head)."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    # transformers logs a many-line "LOAD REPORT" (ANSI colours included) for the head a causal-LM
    # folder lacks, also while it loads the base under a LoRA reward model whose adapter then
    # brings the trained head; what is missing in the end is said here in one line instead
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=getattr(torch, dtype),
                                                                         output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = sorted(info["missing_keys"])
    if require_head and missing:
        raise ValueError(f"the model folder has no trained score head (missing {missing[:3]}): a causal-LM folder? "
                         "Score with a reward model trained by scripts/train_rm.py")
    new_head = all(key.startswith("score.") for key in missing)
    if missing and not (new_head and head_follows):
        print(f"[model] {model_path}: " + ("a new score head, randomly initialised (to be trained)" if new_head else
              f"weights not in the folder, randomly initialised: {', '.join(missing[:5])}"
              f"{' ...' if len(missing) > 5 else ''}"))
    return model


def check_lora_targets(path: Path, targets: list[str], model_path: str, head: str = "causal_lm") -> None:
    """``model.lora.target_modules`` against the modules of the model in ``path``, before its
    weights load: the model is built from its config on the meta device (no memory, a fraction of a
    second even at 8B). peft's own error would be a traceback after the load."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    missing = targets
    if targets:
        with init_empty_weights():
            config = AutoConfig.from_pretrained(path, **({} if head == "causal_lm" else {"num_labels": 1}))
            kind = AutoModelForCausalLM if head == "causal_lm" else AutoModelForSequenceClassification
            skeleton = kind.from_config(config)
        modules = [name for name, _ in skeleton.named_modules()]
        missing = [t for t in targets if not any(name == t or name.endswith("." + t) for name in modules)]
    if not targets or missing:
        raise ConfigError(f"model.lora.target_modules: {targets} " + (f"names no module of {model_path} ({missing})"
                          if targets else "is empty") + "; e.g. [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]")


def cache_keyword(model) -> str:
    """The keyword a model's forward takes its KV cache under: ``cache`` in the transformers
    releases that renamed it (``past_key_values`` then warns on every call, and goes in 5.40),
    ``past_key_values`` before them. A peft wrapper passes it on to the model it wraps."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(inner).forward).parameters else "past_key_values"


@contextmanager
def peft_quietly() -> Iterator[None]:
    """peft reads transformers' deprecated ``is_gradient_checkpointing`` whenever it wraps a model,
    a FutureWarning on every start that is peft's to change, not ours: silenced around peft's calls only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def model_folder(model_path: str, setting: str, adapter: bool = True) -> Path:
    """``model_path`` (a folder, or ``embedded``) as a model folder, checked before anything loads:
    a folder at all (else a traceback from transformers' hub code), with a ``config.json`` (else
    transformers' tokenizer error), or an ``adapter_config.json`` where an adapter may stand
    (``adapter``); a problem is one line naming ``setting``."""
    path = resolve_model_path(model_path)
    if not path.is_dir():
        raise ConfigError(f"{setting}: {model_path!r} is no model folder (give a Hugging Face model folder, or embedded)")
    if not (path / "config.json").is_file():
        if (path / "adapter_config.json").is_file() and not adapter:
            raise ConfigError(f"{setting}: {model_path!r} is a LoRA adapter, not a whole model: give the model it was "
                              "trained from, or its merge (scripts/merge_lora.py)")
        if not (path / "adapter_config.json").is_file():
            raise ConfigError(f"{setting}: {model_path!r} holds no config.json, so it is no Hugging Face model folder "
                              "(give the folder a trained model or merge_lora.py wrote, or embedded)")
    else:
        check_whole_model(path, setting)
    return path


#: The weight files of a whole Hugging Face model folder (one file, or shards with their index).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def check_whole_model(path: Path, setting: str) -> None:
    """A folder with a ``config.json`` is a model only if transformers can read that config and
    the folder holds weights; else transformers fails after other work, with a traceback."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as err:  # bad JSON, no model_type, an unknown architecture
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"{setting}: {path / 'config.json'} is no model's config ({first[:200]})") from None
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ConfigError(f"{setting}: {path} holds a config.json but no weights ({' or '.join(WEIGHT_FILES[::2])})")


def load_policy(model_path: str, dtype: str = "float32", lora: dict[str, Any] | None = None, gradient_checkpointing: bool = False,
                setting: str = "model.path"):
    """:func:`load_model` with the language-model head."""
    return load_model(model_path, "causal_lm", dtype, lora, gradient_checkpointing, setting=setting)


def merge_lora(adapter_dir: Path, out_dir: Path, base: str | None = None, dtype: str = "float32") -> Path:
    """Merge the LoRA adapter in ``adapter_dir`` into its base model; write a full model folder
    (tokenizer included) to ``out_dir``, whole or not at all (:func:`aria.io.atomic_folder`)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config_path = adapter_dir / "adapter_config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{adapter_dir} has no adapter_config.json (is it a LoRA output?)")
    named = base or json.loads(config_path.read_text())["base_model_name_or_path"]
    where = "--base" if base else f"{config_path}: base_model_name_or_path"
    if not resolve_model_path(named).is_dir():
        raise ConfigError(f"{where}: {named!r} is no model folder (give the adapter's base model folder with --base)")
    base_path = model_folder(named, where, adapter=False)  # a whole model: readable config, weights
    # Before the models load: the output may replace an earlier merge, never the adapter, the base, or other files.
    out_dir = check_output_folder(out_dir, [adapter_dir, base_path], "merged model", lambda out: (out / MERGE_FILE).is_file(),
                                  "OUT_DIR")
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=getattr(torch, dtype))
    with peft_quietly():
        merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else base_path)
    with atomic_folder(out_dir) as tmp:
        merged.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if (adapter_dir / ENCODING_FILE).is_file():
            shutil.copy2(adapter_dir / ENCODING_FILE, tmp / ENCODING_FILE)
        write_merge_record(tmp, adapter_dir, base_path, dtype)  # so that a later training of the adapter is noticed
    return out_dir
