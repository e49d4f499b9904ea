"""The original Twenty Questions oracle of ArCHer / LMRL-Gym: a fine-tuned flan-t5-small (``oracle=flan_t5``).

Reference: YifeiZhou02/ArCHer, ``archer/environment/twenty_questions.py``
(``BatchedTwentyQuestionsEnv.generate_answers`` and ``TwentyQuestionsEnv._step``):

- input: ``f"The object is {word}." + question`` -- the object's first name lower-cased, then
  the question with no space after the full stop;
- greedy decoding (``do_sample=False``), ``max_new_tokens=16``, special tokens skipped;
- post-processing: "yes" anywhere in the lower-cased reply -> "Yes.", else "no" anywhere ->
  "No.", else "Invalid Question.".

The fine-tuned weights (``20q_t5_oracle.pt``, distributed with ArCHer's data, outside this
repository) are a torch checkpoint whose ``model_state_dict`` entry is the state dict; a bare
state dict is accepted too. Nothing is ever downloaded: the flan-t5-small config and tokenizer
come from a local folder.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from aria.games.question.oracle import OracleRequest, normalize_yes_no
from aria.llm.base import Completion
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): transformers

TWENTY_QUESTIONS = "twenty_questions"
log = logging.getLogger(__name__)


def oracle_input(target: str, question: str) -> str:
    """The original's encoder input for one question (see the module docstring)."""
    return f"The object is {target.lower()}." + question


def original_answer(reply: str, invalid: str) -> str:
    """The original's post-processing: substring "yes", then substring "no", else ``invalid``."""
    lowered = reply.strip().lower()
    if "yes" in lowered:
        return "Yes."
    if "no" in lowered:
        return "No."
    return invalid


def _existing(path: str | Path | None, key: str, what: str) -> Path:
    """``path`` as a Path; FileNotFoundError naming the config key when unset or missing."""
    if path is None:
        raise FileNotFoundError(f"{key} is not set; point it at {what}")
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise FileNotFoundError(f"{key}={resolved} does not exist; point it at {what}")
    return resolved


def _state_dict(checkpoint: Any) -> Mapping[str, torch.Tensor]:
    """The model weights in a checkpoint: its ``model_state_dict`` entry, or the whole thing."""
    if isinstance(checkpoint, Mapping) and "model_state_dict" in checkpoint:
        return checkpoint["model_state_dict"]
    return checkpoint


class FlanT5Oracle:
    """ArCHer's fine-tuned flan-t5-small Twenty Questions oracle, run locally in batches.

    Args:
        game_cfg: the Twenty Questions config (supplies ``invalid_answer``).
        checkpoint_path: the fine-tuned weights, ``20q_t5_oracle.pt``.
        base_model_dir: a local folder with flan-t5-small's ``config.json`` and tokenizer files.
        device: torch device to run on.
        batch_size: questions per forward pass.
        max_new_tokens: generation length (16 in the original).
    """

    name = "flan_t5"

    def __init__(
        self,
        game_cfg: Mapping[str, Any],
        checkpoint_path: str | Path | None,
        base_model_dir: str | Path | None,
        device: str = "cpu",
        batch_size: int = 32,
        max_new_tokens: int = 16,
    ):
        if (game_cfg.get("family") or game_cfg.get("name")) != TWENTY_QUESTIONS:
            raise ValueError(f"the flan_t5 oracle only plays {TWENTY_QUESTIONS}, not {game_cfg.get('name')!r}")
        self.game = str(game_cfg["name"])  # the name requests carry (a subset testbed included)
        self.invalid_answer = str(game_cfg["invalid_answer"])
        self.batch_size = int(batch_size)
        self.max_new_tokens = int(max_new_tokens)
        self.device = torch.device(device)
        # Imported here: build_oracle imports every oracle module, and transformers takes seconds.
        from transformers import AutoConfig, AutoTokenizer, T5ForConditionalGeneration

        checkpoint = _existing(checkpoint_path, "oracle.checkpoint_path", "ArCHer's 20q_t5_oracle.pt")
        base_dir = _existing(base_model_dir, "oracle.base_model_dir", "a local copy of google/flan-t5-small")
        self.settings = {"name": self.name, "checkpoint": str(checkpoint), "base_model": str(base_dir)}
        self.tokenizer = AutoTokenizer.from_pretrained(base_dir, local_files_only=True)
        config = AutoConfig.from_pretrained(base_dir, local_files_only=True)
        self.model = T5ForConditionalGeneration(config)
        self._load_weights(checkpoint)
        self.model.to(self.device).eval()

    def _load_weights(self, checkpoint: Path) -> None:
        """Load the fine-tuned weights; every model parameter must be in the checkpoint."""
        state = _state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
        result = self.model.load_state_dict(state, strict=False)
        if result.missing_keys:
            raise ValueError(f"{checkpoint} lacks weights for {result.missing_keys[:5]} (and maybe more)")
        if result.unexpected_keys:
            log.warning(
                "ignoring %d unexpected keys in %s, e.g. %s",
                len(result.unexpected_keys), checkpoint, result.unexpected_keys[:3],
            )

    def answer(self, requests: Sequence[OracleRequest]) -> list[Completion]:
        """One answer per request, in order: "Yes.", "No." or the game's invalid answer."""
        for request in requests:
            if request.game != self.game:
                raise ValueError(f"the flan_t5 oracle only answers {TWENTY_QUESTIONS} questions, got {request.game!r}")
        inputs = [oracle_input(r.target, r.question) for r in requests]
        replies: list[str] = []
        for start in range(0, len(inputs), self.batch_size):
            replies += self._generate(inputs[start : start + self.batch_size])
        answers = (original_answer(reply, self.invalid_answer) for reply in replies)
        return [Completion(text=normalize_yes_no(answer, self.invalid_answer)) for answer in answers]

    @torch.inference_mode()
    def _generate(self, inputs: list[str]) -> list[str]:
        """Greedy replies for one batch of encoder inputs, as the original decodes them."""
        encoded = self.tokenizer(inputs, padding=True, return_tensors="pt").to(self.device)
        output = self.model.generate(
            input_ids=encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
        )
        return self.tokenizer.batch_decode(output, skip_special_tokens=True)
