"""ArCHer's utterance-level critic: the high level of its hierarchy (Zhou et al., 2024, arXiv 2402.19446).

ArCHer learns values over whole utterances: ``Q(s, a)`` of a history ``s`` and the agent's next
utterance ``a``, and ``V(s)`` of a history. Its low level, the token policy, is then trained with
the advantage ``A(s, a) = Q(s, a) − V(s)`` of each utterance. ARIA instead averages returns over
steps that share an intention-level history; ArCHer learns a function of the text that
generalises across histories. This module is the critic and its temporal-difference targets, as
pure functions of tensors, so that each can be checked by hand.

A transition is one agent step: its history ``s``, its utterance ``a``, the game's reward ``r`` for
the turn, the history ``s'`` at the agent's next turn and ``done`` (no next turn). The critic has
two Q heads and two V heads (double learning) on one text encoder, and a target copy of all of
it. One critic update minimises, each head toward a target computed with the target copy::

    Q_i(s, a) → r + γ · (1 − done) · V̄_i(s')
    V_i(s)    → Q̄_i(s, a_π)              v_target = "paired" (the original release)
              → min(Q̄_1, Q̄_2)(s, a_π)    v_target = "min"
    θ̄ ← (1 − τ) · θ̄ + τ · θ              after every update (Polyak averaging)

where ``a_π`` is an utterance of the current policy for ``s``. The actor's advantage is
``A(s, a) = min(Q_1, Q_2)(s, a) − min(V_1, V_2)(s)``. The release's settings: γ = 0.95, τ = 0.1,
RoBERTa-base encoding the history (cut on the left to 512 tokens) and the utterance separately,
and each head a 3-layer MLP on the pooled encodings (Q: on both, concatenated; V: on the
history's). Here the encoder is any Hugging Face encoder by path, by default the embedded
all-MiniLM-L6-v2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from aria.intention.embed import embedded_sentence_model_dir
from aria.io import ConfigError
from aria.trainers.settings import V_TARGETS
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): transformers


@dataclass(frozen=True)
class Transitions:
    """The transitions of a list of agent steps: ``next_index[i]`` is the step of the same game and
    role at that role's next turn (−1 where there is none), ``done[i]`` is 1.0 where there is none."""

    next_index: torch.Tensor  # long [n]
    done: torch.Tensor  # float [n]


def transitions(steps: Sequence[dict]) -> Transitions:
    """Link each step to the same role's next step in the same game (by ``turn``), in any order.

    A step names its game (``game_id``), its player (``role``; one player when absent) and its
    ``turn``; two steps of one player with the same turn in one game are an error (the file holds
    a game twice)."""
    by_player: dict[tuple, list[tuple[int, int]]] = {}
    for i, step in enumerate(steps):
        by_player.setdefault((step["game_id"], step.get("role")), []).append((int(step["turn"]), i))
    next_index = torch.full((len(steps),), -1, dtype=torch.long)
    for (game, role), turns in by_player.items():
        turns.sort()
        for (turn, i), (later, j) in zip(turns, turns[1:]):
            if later == turn:
                raise ValueError(f"game {game!r}{'' if role is None else f', role {role!r}'}: two steps at turn {turn}")
            next_index[i] = j
    return Transitions(next_index, (next_index < 0).to(torch.float32))


def q_targets(reward: torch.Tensor, done: torch.Tensor, next_v_target: torch.Tensor, gamma: float) -> torch.Tensor:
    """``r + γ · (1 − done) · V̄(s')``: the target of a Q head (``next_v_target`` is read as 0
    where ``done``, whatever it holds)."""
    return reward + gamma * (1.0 - done) * torch.where(done > 0, torch.zeros_like(next_v_target), next_v_target)


def v_targets(target_q1: torch.Tensor, target_q2: torch.Tensor, mode: str = "paired") -> tuple[torch.Tensor, torch.Tensor]:
    """The targets of the two V heads from the target Q heads at the policy's utterance."""
    if mode == "paired":
        return target_q1, target_q2
    if mode == "min":
        low = torch.minimum(target_q1, target_q2)
        return low, low
    raise ValueError(f"v_target: unknown {mode!r} (known: {', '.join(V_TARGETS)})")


def advantages(q1: torch.Tensor, q2: torch.Tensor, v1: torch.Tensor, v2: torch.Tensor) -> torch.Tensor:
    """``min(Q_1, Q_2) − min(V_1, V_2)``: the pessimistic value of the utterance over the history's."""
    return torch.minimum(q1, q2) - torch.minimum(v1, v2)


def critic_loss(q: tuple[torch.Tensor, torch.Tensor], v: tuple[torch.Tensor, torch.Tensor],
                q_target: tuple[torch.Tensor, torch.Tensor], v_target: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The sum of the four heads' mean squared errors (the targets carry no gradient)."""
    mse = torch.nn.functional.mse_loss
    return sum(mse(pred, target.detach()) for pred, target in zip((*q, *v), (*q_target, *v_target)))


@torch.no_grad()
def polyak_update(target: torch.nn.Module, online: torch.nn.Module, tau: float) -> None:
    """``θ̄ ← (1 − τ) · θ̄ + τ · θ`` for every parameter (τ = 1 copies ``online``)."""
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau: expected a number in (0, 1], got {tau!r}")
    for t, o in zip(target.parameters(), online.parameters(), strict=True):
        t.lerp_(o, tau)


class DoubleCritic(torch.nn.Module):
    """Twin Q heads and twin V heads on one text encoder (the release's ``DoubleCritic``, with any
    Hugging Face encoder and mean pooling in place of RoBERTa's pooler).

    ``encoder_path``: a Hugging Face encoder folder, or ``None`` for the embedded
    all-MiniLM-L6-v2. The history and the utterance are encoded separately (histories cut on the
    left, at ``max_tokens``); each head is a 3-layer MLP of width ``hidden`` (default: the
    encoder's width)."""

    def __init__(self, encoder_path: str | None = None, hidden: int | None = None, max_tokens: int = 512):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        if encoder_path is None:
            encoder_path = str(embedded_sentence_model_dir())
        self.tokenizer = AutoTokenizer.from_pretrained(encoder_path)
        self.tokenizer.truncation_side = "left"  # a history's newest turns matter most
        self.encoder = AutoModel.from_pretrained(encoder_path, dtype=torch.float32)
        if getattr(self.encoder, "pooler", None) is not None:
            # mean pooling reads the hidden states; an unused pooler would get no gradient, which
            # multi-process training (DDP) refuses
            self.encoder.pooler = None
        context = getattr(self.encoder.config, "max_position_embeddings", None)
        if context is not None and max_tokens > context:  # else a shape error inside the encoder's first batch

            raise ConfigError(f"critic.max_tokens: {max_tokens} is more than the encoder's {context} positions "
                              f"({encoder_path}); set critic.max_tokens={context} or less")
        self.max_tokens = max_tokens
        width = self.encoder.config.hidden_size
        hidden = hidden or width

        def head(inputs: int) -> torch.nn.Sequential:
            return torch.nn.Sequential(torch.nn.Linear(inputs, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                       torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

        self.q1, self.q2 = head(2 * width), head(2 * width)
        self.v1, self.v2 = head(width), head(width)

    def freeze_encoder(self, cache: dict | None = None) -> dict:
        """Train the heads only: the encoder's weights stay, so each text is encoded once, alone, and
        kept in ``cache`` (returned; give the target copy the same one)."""
        self.encoder.requires_grad_(False)
        self.cache = {} if cache is None else cache
        return self.cache

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Mean of the encoder's last hidden states over each text's tokens: [len(texts), width]."""
        cache = getattr(self, "cache", None)
        if cache is not None:  # a frozen encoder: each text once
            missing = list(dict.fromkeys(t for t in texts if t not in cache))
            if missing:  # without dropout: a kept encoding must not keep one draw of its noise
                training = self.encoder.training
                self.encoder.eval()
                with torch.no_grad():
                    # each text alone: padded beside longer texts it encodes a little differently
                    # (float32 too), and a run resumed from a checkpoint, first needing the text in
                    # another batch, would train on other numbers than the run it continues
                    cache.update((text, self._encode([text])[0].float()) for text in missing)
                self.encoder.train(training)
            return torch.stack([cache[t] for t in texts])
        return self._encode(texts)

    def _encode(self, texts: Sequence[str]) -> torch.Tensor:
        device = next(self.parameters()).device
        batch = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_tokens,
                               return_tensors="pt").to(device)
        states = self.encoder(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
        return (states * mask).sum(1) / mask.sum(1).clamp(min=1.0)

    def values(self, histories: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(V_1, V_2)`` of histories alone (the next state's values in a Q target)."""
        s = self.encode(histories)
        return self.v1(s).squeeze(-1), self.v2(s).squeeze(-1)

    def forward(self, histories: Sequence[str], utterances: Sequence[str]) -> tuple[torch.Tensor, ...]:
        """``(Q_1, Q_2, V_1, V_2)``, each of shape [batch]."""
        s, a = self.encode(histories), self.encode(utterances)
        sa = torch.cat([s, a], dim=-1)
        return tuple(h(x).squeeze(-1) for h, x in ((self.q1, sa), (self.q2, sa), (self.v1, s), (self.v2, s)))
