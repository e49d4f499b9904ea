"""Training samples ``{observation, action, reward}`` (docs/method.md §2 step 5), one per agent step.

The observation is exactly the prompt the policy saw before the step:

* single-agent games: the game's prompt with the history so far, rendered by
  :meth:`QuestionGame.prompt_before_turn` (the same function the rollout uses);
* two-player games: the role's system prompt, then the transcript so far, laid out as in the
  original's training set (``aria_sample_actor_reinforce_llama3-8b_multi.json``)::

      <system prompt>\n\nAlice: <message>\nBob: <message>\n\nAlice: <message>

  (``transcript:`` in ``config/game/*.yaml`` holds the separators and where the system prompt
  is kept in a record's ``meta``).

Each sample also carries ``step_return`` (the raw discounted return R_t, for comparisons
with the aggregated ``reward``), ``game``, ``role``, ``game_id`` and ``turn`` (index into the
game's ``turns``). The file is a JSON list, the original's shape, which
``datasets.load_dataset("json", data_files=...)`` reads directly.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from aria.io import DataError, is_finite_number, read_json

SAMPLE_FIELDS = ("observation", "action", "reward")


@dataclass(frozen=True)
class Transcript:
    """How a two-player game's prompt and history are shown to a player."""

    names: Mapping[str, str]  # role -> name shown in the transcript
    system_prompt_meta: Mapping[str, str]  # role -> key in record["meta"] holding its system prompt
    after_prompt: str = "\n\n"
    line: str = "{name}: {text}"
    after: Mapping[str, str] | None = None  # role -> separator after its message

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> "Transcript":
        t = cfg["transcript"]
        return cls(names=dict(cfg["display_names"]), system_prompt_meta=dict(t["system_prompt_meta"]),
                   after_prompt=t.get("after_prompt", "\n\n"), line=t.get("line", "{name}: {text}"),
                   after=dict(t.get("after") or {}))

    def render(self, record: dict, index: int) -> str:
        role = record["turns"][index]["role"]
        key = self.system_prompt_meta[role]
        prompt = (record.get("meta") or {}).get(key)
        if not isinstance(prompt, str):
            raise DataError(None, None, f"meta.{key}", f"game {record['game_id']!r}: no system prompt for role {role!r}")
        parts = []
        for turn in record["turns"][:index]:
            # what the other player received ("shown", for games played here), else the raw reply
            text = turn.get("shown", turn["action"])
            parts.append(self.line.format(name=self.names[turn["role"]], text=text))
            parts.append((self.after or {}).get(turn["role"], "\n"))
        if parts:
            parts.pop()  # no separator after the last message shown
        return prompt.lstrip() + self.after_prompt + "".join(parts)


def validate_sample(sample: Any, path: str | os.PathLike | None, index: int) -> dict:
    where = f"sample {index}"
    if not isinstance(sample, dict):
        raise DataError(path, None, where, "expected an object")
    for key in ("observation", "action"):
        if not isinstance(sample.get(key), str):
            raise DataError(path, None, f"{where}.{key}", "missing or not a string")
    # A step the aggregation did not keep (``kept: false``) has no aggregated reward.
    if not is_finite_number(sample.get("reward")) and not (sample.get("reward") is None and sample.get("kept") is False):
        raise DataError(path, None, f"{where}.reward", "missing or not a finite number")
    return sample


def read_training_set(path: str | os.PathLike) -> list[dict]:
    """A training-set JSON list, each sample checked (file and sample index named on error)."""
    data = read_json(path)
    if not isinstance(data, list):
        raise DataError(path, None, None, "expected a JSON list of samples")
    return [validate_sample(s, path, i) for i, s in enumerate(data)]
