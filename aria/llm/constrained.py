"""Grammar-constrained decoding for the local model: only tokens that keep the reply valid.

A reply under an :class:`~aria.llm.base.OutputFormat` (a JSON schema or a regex) is generated
token by token as usual, but before each token is chosen, every token that cannot continue a
valid reply gets logit −inf. The grammar engine is **llguidance** (the engine behind vLLM's and
llama.cpp's structured outputs): a Rust wheel with no Python dependencies that computes a
token mask in well under a millisecond (``benchmarks/constrained_decoding.py`` measures it
against xgrammar, the other maintained engine, whose wheel pulls triton on Linux). Its bitmask is
unpacked onto the logits with three torch operations (its own torch kernel needs
``torch.compile``, and its numpy kernel was 4x slower here).

Per row of a batch a matcher of :class:`BatchConstraint` follows the tokens generated so far; rows without a
format are left alone. Compiled grammars are cached per format, and each reply starts from a
copy, so a batch of games pays the compilation once per schema.
"""
from __future__ import annotations

import logging
from typing import Sequence

import llguidance
import torch
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from aria.llm.base import OutputFormat
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): transformers

log = logging.getLogger(__name__)

# Replies are compact JSON: with free whitespace a small model can fill its whole token budget with
# spaces or newlines inside a valid object, which is a legal but useless reply.
_JSON_OPTIONS = {"whitespace_flexible": False}


class Grammars:
    """Compiled grammars of one tokenizer, per format (compiling a tokenizer takes about 1 s)."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: Sequence[int]):
        import llguidance.hf

        self._llg = llguidance
        self.vocab_size = vocab_size
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos_ids))
        self._compiled: dict[OutputFormat, object] = {}

    def matcher(self, fmt: OutputFormat):
        """A fresh matcher at the start of a reply under ``fmt`` (ValueError for a bad schema or regex)."""
        if fmt not in self._compiled:
            LLMatcher = self._llg.LLMatcher
            grammar = (LLMatcher.grammar_from_json_schema(fmt.spec, defaults=_JSON_OPTIONS) if fmt.kind == "json_schema"
                       else LLMatcher.grammar_from_regex(fmt.spec))
            matcher = LLMatcher(self.tokenizer, grammar, log_level=0)
            if matcher.is_error():
                raise ValueError(f"cannot compile the {fmt.kind} {fmt.spec[:200]!r}: {matcher.get_error()}")
            self._compiled[fmt] = matcher
        return self._compiled[fmt].deep_copy()


class BatchConstraint:
    """The grammars of one batch's rows while they are decoded (module doc).

    Args:
        grammars: the model's :class:`Grammars`.
        formats: one format (or None, free text) per row of the batch, in the batch's order.
    """

    def __init__(self, grammars: Grammars, formats: Sequence[OutputFormat | None]):
        self.grammars = grammars
        self.matchers = [grammars.matcher(f) if f is not None else None for f in formats]
        self._mask = allocate_token_bitmask(len(formats), grammars.vocab_size)
        self._bits = torch.tensor([1 << j for j in range(32)], dtype=torch.int64).to(torch.int32)

    def apply(self, rows: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        """Set to −inf the logits ([len(rows), V], float32 on the CPU) of tokens a row's grammar
        forbids; ``rows`` maps each logits row to its batch row. Returns the logits."""
        constrained = [(i, self.matchers[r]) for i, r in enumerate(rows) if self.matchers[r] is not None]
        if not constrained:
            return logits
        mask = self._mask[: len(rows)]
        mask.fill(-1)  # every token allowed
        for i, matcher in constrained:
            fill_next_token_bitmask(matcher, mask, i)
        # Bit j of word w allows token 32·w + j. Unpacked with torch: llguidance's numpy kernel took
        # 6.9 ms per step for 16 rows over SmolLM2's 49,152 tokens on 2 cores, this 1.7 ms (same masks).
        words = torch.from_numpy(mask).to(logits.device)
        allowed = (words.unsqueeze(-1) & self._bits.to(logits.device)).ne(0).view(len(rows), -1)
        width = min(allowed.shape[1], logits.shape[1])
        logits[:, :width].masked_fill_(~allowed[:, :width], float("-inf"))
        if width < logits.shape[1]:  # padding beyond the tokenizer's vocabulary, in constrained rows only
            logits[[i for i, _ in constrained], width:] = float("-inf")
        return logits

    def advance(self, rows: Sequence[int], tokens: Sequence[int]) -> list[bool]:
        """Feed each row its chosen token; True where the row's reply is complete (its grammar
        accepts nothing more) and generation should stop."""
        finished = []
        for r, token in zip(rows, tokens):
            matcher = self.matchers[r]
            if matcher is None:
                finished.append(False)
                continue
            if not matcher.consume_token(token):
                log.warning("constrained decoding: token %d rejected by the grammar (%s); the reply ends here",
                            token, matcher.get_error())
                finished.append(True)
                continue
            finished.append(matcher.is_stopped())
        return finished
