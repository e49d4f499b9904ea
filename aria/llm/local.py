"""A local Hugging Face causal LM as a batched chat policy, with per-game prompt-cache reuse.

Why the cache: in a multi-turn game the prompt of turn t+1 is the prompt of turn t with one more
question and answer added, so most of its tokens were already encoded one turn ago. On a CPU the
prompt encoding (prefill) dominates the cost of a turn, while decoding gains a lot from batching.
This backend keeps, per game key, the key/value cache of that game's last prompt; the next turn
reuses its longest common token prefix and encodes only the new tokens. Games in one batch
have different cached lengths, so the batch is laid out as::

    [pad..pad | cached prefix of game i | pad..pad | new prompt tokens of game i]

with the attention mask zero on padding. A game on its first turn borrows the prefix of another
game's cache (all first prompts share the same instructions). Position ids follow from the mask, so every token gets
the position it would have without padding; ``tests/test_local_policy.py`` checks that greedy
outputs equal those of unbatched, uncached generation. ``reuse_cache=False`` turns this off
(plain left-padded batched ``generate``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from transformers import (AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList, StaticCache,
                          TemperatureLogitsWarper, TopPLogitsWarper)

from aria.io import ConfigError, model_digest
from aria.llm.base import Completion, Message, OutputFormat
from aria.llm.constrained import BatchConstraint, Grammars
from aria.llm.embedded import resolve_model_path
from aria.llm.policy import cache_keyword

log = logging.getLogger(__name__)


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """``"auto"``: bfloat16 on a CUDA device that supports it or a CPU with oneDNN bfloat16
    kernels (AVX-512 class), float32 elsewhere, where bfloat16 would be emulated and slower.

    Measured on the development CPU (2 AVX-512-BF16 cores, SmolLM2-135M, 111-token prompts):
    bfloat16 decodes 1.5-1.6x and encodes prompts about 3x faster than float32, at batch 1 and 16.
    """
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if native_bf16("cpu") else torch.float32


def native_bf16(device: str) -> bool:
    """Whether ``device`` computes bfloat16 natively (a CUDA GPU with bf16, or a CPU with oneDNN
    bfloat16 kernels); elsewhere bfloat16 is emulated and slower than float32."""
    if device.startswith("cuda"):
        return torch.cuda.is_bf16_supported()
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


class InverseCdfSampler(LogitsProcessor):
    """Draws the next token from softmax(scores) by inverse-CDF sampling and leaves only it.

    Used as the last logits processor under greedy decoding, this samples exactly the
    distribution that ``do_sample=True`` samples (temperature and top-p are applied before it
    by transformers' own warpers), but ``torch.multinomial`` costs about 14 ms per step for 16
    rows over a 49k vocabulary on a 2-core CPU and this about 0.4 ms.
    """

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        cdf = torch.softmax(scores.float(), dim=-1).cumsum(dim=-1)
        u = torch.rand(scores.shape[0], 1, device=scores.device) * cdf[:, -1:]
        # right=True: u in [cdf[i-1], cdf[i]) picks i; tokens of probability 0 are never picked.
        chosen = torch.searchsorted(cdf, u, right=True).clamp_(max=scores.shape[-1] - 1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, chosen, 0.0)


def sampling_processors(temperature: float, top_p: float) -> LogitsProcessorList:
    """Temperature, top-p, then :class:`InverseCdfSampler`; empty for greedy (temperature 0)."""
    if temperature <= 0:
        return LogitsProcessorList()
    warpers = [TemperatureLogitsWarper(temperature)]
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    return LogitsProcessorList([*warpers, InverseCdfSampler()])


@dataclass
class _PromptCache:
    token_ids: list[int]
    keys: list[torch.Tensor]  # per layer, [1, kv_heads, len, head_dim]
    values: list[torch.Tensor]


def _keep_rows(past, keep: torch.Tensor) -> None:
    """Keep only the batch rows ``keep`` of every layer of the KV cache ``past`` (in place)."""
    for layer in past.layers:
        layer.keys = layer.keys.index_select(0, keep)
        layer.values = layer.values.index_select(0, keep)


class LocalChatModel:
    """Batched chat generation with a local transformers model (see module doc).

    Args:
        model_path: Hugging Face model folder; ``"embedded"`` = converted SmolLM2-135M-Instruct.
        max_new_tokens: tokens generated per turn at most.
        temperature: sampling temperature; 0 means greedy decoding.
        top_p: nucleus sampling mass (1.0 = off).
        max_prompt_tokens: prompts longer than this are truncated on the left.
        reuse_cache: keep each game's prompt KV cache between turns.
        dtype: ``"auto"`` (bfloat16 where the hardware computes it natively, else float32),
            ``"float32"`` or ``"bfloat16"``.
        seed: seeds torch's generator once at start, for reproducible sampling.
    """

    def __init__(
        self,
        model_path: str | None = "embedded",
        max_new_tokens: int = 48,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_prompt_tokens: int = 2048,
        reuse_cache: bool = True,
        dtype: str = "auto",
        seed: int | None = 0,
        name: str | None = None,
        device: str = "cpu",
    ):
        path = resolve_model_path(model_path)
        if not path.is_dir():
            raise ConfigError(f"policy.model_path: {model_path!r} is no model folder (give a Hugging Face model folder, or embedded)")
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, device)).to(device).eval()
        self._setup(model, tokenizer, name or path.name, max_new_tokens, temperature, top_p, max_prompt_tokens,
                    reuse_cache, seed, device)
        # the name is a folder's: trained models are all ".../model" or ".../final"
        self.settings["weights"] = model_digest(path)

    @classmethod
    def from_model(cls, model, tokenizer, name: str = "policy", max_new_tokens: int = 48, temperature: float = 1.0,
                   top_p: float = 1.0, max_prompt_tokens: int = 2048, reuse_cache: bool = True,
                   seed: int | None = None, device: str | torch.device = "cpu") -> "LocalChatModel":
        """Generate with a model already in memory (the online trainer's policy, LoRA included).

        The model is used as it is (its dtype, its device, its current weights); the caller puts
        it in eval mode and calls :meth:`release_all` whenever the weights change, since a kept
        prompt cache holds keys and values of the old weights. ``seed=None`` leaves torch's
        generator alone (the trainer owns it).
        """
        self = cls.__new__(cls)
        self._setup(model, tokenizer, name, max_new_tokens, temperature, top_p, max_prompt_tokens, reuse_cache, seed,
                    str(device))
        return self

    def _setup(self, model, tokenizer, name, max_new_tokens, temperature, top_p, max_prompt_tokens, reuse_cache,
               seed, device) -> None:
        self.name = name
        # What produced a game (recorded beside resumable transcripts).
        self.settings = {"engine": "local", "model": name, "max_new_tokens": max_new_tokens, "temperature": temperature,
                         "top_p": top_p, "max_prompt_tokens": max_prompt_tokens,
                         "dtype": str(getattr(model, "dtype", "")).replace("torch.", "")}
        self.tokenizer = tokenizer
        self.model = model
        self.device = device
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        self.max_prompt_tokens = max_prompt_tokens
        self.reuse_cache = reuse_cache
        # Sampling runs through logits processors under greedy selection (see InverseCdfSampler).
        self.logits_processor = sampling_processors(temperature, top_p)
        self.max_new_tokens = max_new_tokens
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos)
        self._caches: dict[str, _PromptCache] = {}
        self._last_released: _PromptCache | None = None
        self._grammar_cache = None
        # What generation cost so far (reply tokens, end-of-sequence excluded; wall seconds in generate).
        self.generated_tokens, self.generation_seconds = 0, 0.0
        if seed is not None:
            torch.manual_seed(seed)

    # ---- public API -------------------------------------------------------------------
    def release_all(self) -> None:
        """Forget every kept prompt cache (after the model's weights changed)."""
        self._caches.clear()
        self._last_released = None

    def release(self, key: str) -> None:
        entry = self._caches.pop(key, None)
        if entry is not None:
            self._last_released = entry  # its prompt prefix is shared by the games that start next

    def encode(self, conversation: list[Message]) -> list[int]:
        """Token ids of the chat-templated prompt, truncated on the left."""
        ids = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        return list(ids)[-self.max_prompt_tokens :]

    @torch.no_grad()
    def generate(self, conversations: Sequence[list[Message]], keys: Sequence[str] | None = None,
                 formats: Sequence[OutputFormat | None] | None = None) -> list[Completion]:
        """One reply per conversation; ``formats`` constrains replies (:mod:`aria.llm.constrained`)."""
        if not conversations:
            return []
        start = time.perf_counter()
        if formats is not None and len(formats) != len(conversations):
            raise ValueError(f"{len(formats)} formats for {len(conversations)} conversations")
        constraint = None
        if formats is not None and any(f is not None for f in formats):
            constraint = BatchConstraint(self._grammars(), formats)
        prompts = [self.encode(c) for c in conversations]
        use_cache = self.reuse_cache and keys is not None
        cached = [self._reusable(k, p) if use_cache else None for k, p in zip(keys or [None] * len(prompts), prompts)]
        reused = [len(c.token_ids) if c else 0 for c in cached]
        input_ids, attention_mask, past = self._layout(prompts, cached, reused)
        width = input_ids.shape[1]
        replies = self._decode(input_ids, attention_mask, past, constraint)
        self.generated_tokens += sum(len(r) for r in replies)
        texts = [self.tokenizer.decode(reply, skip_special_tokens=True).strip() for reply in replies]
        if use_cache:
            self._store(keys, prompts, reused, past, width)
        self.generation_seconds += time.perf_counter() - start
        return [Completion(t) for t in texts]

    def _grammars(self):
        """The tokenizer's compiled grammars (built on the first constrained reply, about 1 s)."""
        if self._grammar_cache is None:
            self._grammar_cache = Grammars(self.tokenizer, self.model.config.vocab_size, self.eos_ids)
        return self._grammar_cache

    def _decode(self, input_ids, attention_mask, past, constraint=None) -> list[list[int]]:
        """Encode the batch, then decode token by token, dropping rows that have finished.

        Rows that reached an end-of-sequence token leave the batch (their cache rows are
        compacted away once a quarter of the batch is done), so the step cost falls as replies
        end instead of staying at the full batch until the longest reply is done. Row ``i`` of
        ``past`` keeps its prompt positions for :meth:`_store`: compaction works on a view of
        the cache that is written back at the end.

        With ``constraint`` (:class:`~aria.llm.constrained.BatchConstraint`), tokens a row's
        grammar forbids are masked before sampling, and a row ends once its grammar is complete.

        Returns the generated token ids of each row, end-of-sequence token excluded.
        """
        eos = torch.tensor(self.eos_ids, device=self.device)
        batch = input_ids.shape[0]
        position_ids = (attention_mask.cumsum(-1) - 1).clamp_(min=0)
        rows = torch.arange(batch, device=self.device)  # batch row -> original row
        replies: list[list[int]] = [[] for _ in range(batch)]
        cached = past.get_seq_length()  # the pre-filled prefix; only the positions after it are encoded
        with_cache = {cache_keyword(self.model): past}
        logits = self.model(input_ids=input_ids[:, cached:], attention_mask=attention_mask, position_ids=position_ids[:, cached:],
                            use_cache=True, logits_to_keep=1, **with_cache).logits[:, -1, :]
        full_layers = [(layer.keys, layer.values) for layer in past.layers]
        next_position = position_ids[:, -1:] + 1
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        for step in range(self.max_new_tokens):
            logits = logits.float()
            if constraint is not None:
                logits = constraint.apply(rows.tolist(), logits)
            scores = self.logits_processor(input_ids, logits)
            tokens = scores.argmax(-1)
            finished = torch.isin(tokens, eos)
            # A finished row stays in the batch until compaction; nothing it "says" after its
            # end-of-sequence token belongs to its reply.
            live = [(i, row, token) for i, (row, token, end, was_done)
                    in enumerate(zip(rows.tolist(), tokens.tolist(), finished.tolist(), done.tolist()))
                    if not (end or was_done)]
            for _, row, token in live:
                replies[row].append(token)
            if constraint is not None and live:
                complete = constraint.advance([row for _, row, _ in live], [token for _, _, token in live])
                for (i, _, _), stop in zip(live, complete):
                    if stop:
                        finished[i] = True
            done |= finished
            if bool(done.all()) or step == self.max_new_tokens - 1:
                break
            attention_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
            if int(done.sum()) * 4 >= len(rows):
                keep = (~done).nonzero().squeeze(1)
                rows, tokens, done = rows[keep], tokens[keep], done[keep]
                attention_mask, next_position = attention_mask[keep], next_position[keep]
                _keep_rows(past, keep)
            logits = self.model(input_ids=tokens.unsqueeze(1), attention_mask=attention_mask, position_ids=next_position,
                                use_cache=True, **with_cache).logits[:, -1, :]
            next_position = next_position + 1
        for layer, (keys, values) in zip(past.layers, full_layers):
            layer.keys, layer.values = keys, values
        return replies

    # ---- cache handling ---------------------------------------------------------------
    def _reusable(self, key: str, prompt: list[int]) -> _PromptCache | None:
        """The longest cached prefix of ``prompt`` (at least one token is left to encode).

        A game's own cache comes first. A game with none yet (its first turn) borrows the
        longest prefix among the other games' caches and the last released one: every game's
        first prompt is the same instructions, so a game that fills a freed slot costs no more
        to encode than the games already running.
        """
        own = self._caches.get(key)
        candidates = [own] if own is not None else [*self._caches.values(), self._last_released]
        best, best_n = None, 0
        for entry in candidates:
            if entry is None:
                continue
            limit = min(len(entry.token_ids), len(prompt) - 1)
            n = 0
            while n < limit and entry.token_ids[n] == prompt[n]:
                n += 1
            if n > best_n:
                best, best_n = entry, n
        if best is None:
            return None
        return _PromptCache(best.token_ids[:best_n], [k[:, :, :best_n] for k in best.keys], [v[:, :, :best_n] for v in best.values])

    def _layout(self, prompts, cached, reused):
        """Input ids, attention mask and a pre-filled batched cache for the layout in the module doc.

        The cache is a :class:`~transformers.StaticCache` sized for the whole call, so decoding
        writes each new token in place instead of re-concatenating every row's (long) cache at
        every step.
        """
        cache_width = max(reused)
        new_width = max(len(p) - r for p, r in zip(prompts, reused))
        ids, mask = [], []
        for prompt, r in zip(prompts, reused):
            n_new = len(prompt) - r
            ids.append([self.pad_id] * (cache_width - r) + prompt[:r] + [self.pad_id] * (new_width - n_new) + prompt[r:])
            mask.append([0] * (cache_width - r) + [1] * r + [0] * (new_width - n_new) + [1] * n_new)
        input_ids = torch.tensor(ids, device=self.device)
        attention_mask = torch.tensor(mask, device=self.device)
        past = StaticCache(config=self.model.config, max_cache_len=cache_width + new_width + self.max_new_tokens)
        if cache_width == 0:
            return input_ids, attention_mask, past
        template = next(c for c in cached if c)
        for layer in range(len(template.keys)):
            keys, values = [], []
            for entry, r in zip(cached, reused):
                if entry is None:
                    k = template.keys[layer][:, :, :0]
                    v = template.values[layer][:, :, :0]
                else:
                    k, v = entry.keys[layer], entry.values[layer]
                keys.append(F.pad(k, (0, 0, cache_width - r, 0)))
                values.append(F.pad(v, (0, 0, cache_width - r, 0)))
            past.update(torch.cat(keys), torch.cat(values), layer)
        return input_ids, attention_mask, past

    def _store(self, keys, prompts, reused, past, width) -> None:
        """Keep each row's prompt positions of the returned cache (padding and reply dropped)."""
        cache_width = max(reused)
        layer_kv = [(layer.keys, layer.values) for layer in past.layers]
        for row, (key, prompt, r) in enumerate(zip(keys, prompts, reused)):
            n_new = len(prompt) - r
            index = torch.cat([
                torch.arange(cache_width - r, cache_width),
                torch.arange(width - n_new, width),
            ]).to(self.device)
            self._caches[key] = _PromptCache(
                list(prompt),
                [k[row : row + 1].index_select(2, index).clone() for k, _ in layer_kv],
                [v[row : row + 1].index_select(2, index).clone() for _, v in layer_kv],
            )
