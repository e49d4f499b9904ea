"""Intention-level reward aggregation (``docs/method.md`` §3), as pure array functions.

A dataset of games is flattened into *utterances* (every action and observation, or every
player's message, in speaking order) and *agent steps* (the utterances that are trained on).
Given one cluster label per utterance, the intention history of a step is the label sequence of
the utterances before it in its game, and (history, action) is the label sequence up to and
including the step's own utterance. Label sequences are prefixes, i.e. nodes of a tree; each
node gets an integer id by :func:`prefix_nodes`, level by level with ``np.unique``, so
aggregating 30,000 utterances for all 99 values of k takes a few seconds.

The aggregated reward of a step is the mean step return of every step (of the same role) at the
same node (docs/method.md §3, the paper's default; the release's ``q`` mode is the same mean, of returns
discounted by its own convention, ``discount="original"`` in :func:`step_returns`). ``adv`` mode
subtracts the mean return at the history node, z-scores and min-max scales to [0, 1].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class StepTable:
    """Every utterance and every agent step of a dataset, as flat arrays.

    Utterance arrays have shape ``[n_utterances]``; step arrays ``[n_steps]``.

    Attributes:
        utterance_game: game index of each utterance (0..n_games-1).
        utterance_position: 0-based speaking position of the utterance within its game;
            positions of one game are 0, 1, ..., n-1.
        utterance_channel: small int naming what the utterance is (e.g. 0 = the agent's question,
            1 = the oracle's answer; or 0 = Alice, 1 = Bob). Part of every tree key, so two
            channels never share a node even when their label spaces overlap.
        step_utterance: index of the utterance that is the step's action.
        step_role: role index of the step (0 for single-agent games; 0/1 for Alice/Bob).
        step_return: discounted step return R_t = γ^(T−t)·R (see :func:`discounted_returns`).
    """

    utterance_game: np.ndarray
    utterance_position: np.ndarray
    utterance_channel: np.ndarray
    step_utterance: np.ndarray
    step_role: np.ndarray
    step_return: np.ndarray

    def __post_init__(self):
        n = len(self.utterance_game)
        if not (len(self.utterance_position) == len(self.utterance_channel) == n):
            raise ValueError("utterance arrays differ in length")
        if not (len(self.step_utterance) == len(self.step_role) == len(self.step_return)):
            raise ValueError("step arrays differ in length")

    @property
    def num_steps(self) -> int:
        return len(self.step_utterance)


def discounted_returns(final_reward: np.ndarray, step_index: np.ndarray, num_steps: np.ndarray, gamma: float) -> np.ndarray:
    """Step returns R_t = γ^(T−t)·R (docs/method.md §3, the paper's convention).

    Args:
        final_reward: R of the step's game (and role), shape [n_steps].
        step_index: t, 1-based index of the step among its role's steps in the game.
        num_steps: T, the number of steps of that role in that game.
        gamma: discount, 0.95 in the paper and the original code.
    """
    return step_returns(final_reward, step_index, num_steps, gamma, "paper")


def _paper_exponent(t: np.ndarray, num_steps: np.ndarray, rounds: np.ndarray, seat: np.ndarray) -> np.ndarray:
    return num_steps - t


def _original_exponent(t: np.ndarray, num_steps: np.ndarray, rounds: np.ndarray, seat: np.ndarray) -> np.ndarray:
    """The release's exponents (rhyang2021/ARIA ``reward_aggregation/reward_utils.py``, ``q`` mode).

    Single agent (seat −1): ``min_length - len(sequence)//2`` = T − s with a 0-based turn s = t − 1,
    i.e. γ^(T−t+1): every reward is γ × the paper's, so the largest is 0.95, as in the released
    samples. First mover (Alice, seat 0): ``min_length - len(sequence)`` = m − (2s + 1), floored at
    0, with m = min(#Alice, #Bob) turns. Second mover (Bob, seat 1): no discount.
    """
    single = num_steps - t + 1
    first_mover = np.maximum(rounds - 2 * t + 1, 0)
    return np.where(seat < 0, single, np.where(seat == 0, first_mover, 0))


#: Discount conventions by name (``aggregation.discount``; docs/method.md §3 and §7): the exponent e of
#: R_t = γ^e · R from (t, T, m, seat); t is 1-based among the role's steps, T their number, m the
#: game's rounds (min over the two players' turns; T for single-agent games), seat −1 for a
#: single-agent game, else the role's speaking order (0 = first mover).
DISCOUNTS: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "paper": _paper_exponent,
    "original": _original_exponent,
}


def step_returns(final_reward: np.ndarray, step_index: np.ndarray, num_steps: np.ndarray, gamma: float,
                 convention: str = "paper", seat: np.ndarray | None = None, rounds: np.ndarray | None = None) -> np.ndarray:
    """Step returns R_t = γ^e·R under a discount convention of :data:`DISCOUNTS` (shape [n_steps]).

    ``paper`` (default): e = T − t. ``original``: the release's exponents (see
    :func:`_original_exponent`). ``seat`` defaults to −1 (single agent) and ``rounds`` to T.
    """
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    if convention not in DISCOUNTS:
        raise ValueError(f"unknown discount convention {convention!r}; known: {sorted(DISCOUNTS)}")
    t = np.asarray(step_index, dtype=np.int64)
    total = np.asarray(num_steps, dtype=np.int64)
    if np.any(t < 1) or np.any(t > total):
        raise ValueError("step_index must lie in 1..num_steps")
    seat = np.full(len(t), -1, dtype=np.int64) if seat is None else np.asarray(seat, dtype=np.int64)
    rounds = total if rounds is None else np.asarray(rounds, dtype=np.int64)
    exponent = DISCOUNTS[convention](t, total, rounds, seat).astype(np.float64)
    return np.asarray(final_reward, dtype=np.float64) * gamma**exponent


def prefix_nodes(table: StepTable, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tree node ids of label-sequence prefixes.

    Returns ``(node, parent)``, both ``[n_utterances]``: ``node[u]`` identifies the label
    sequence of ``u``'s game up to and including ``u`` (its (history, action) key when ``u`` is an
    action); ``parent[u]`` identifies the sequence before ``u`` (its history), 0 being the empty
    history. Equal ids ⇔ equal (channel, label) sequences.
    """
    labels = np.asarray(labels, dtype=np.int64)
    channel = np.asarray(table.utterance_channel, dtype=np.int64)
    if len(labels) != len(channel):
        raise ValueError(f"{len(labels)} labels for {len(channel)} utterances")
    symbols = labels * (int(channel.max(initial=0)) + 1) + channel
    radix = int(symbols.max(initial=0)) + 1
    position = np.asarray(table.utterance_position, dtype=np.int64)
    game = np.asarray(table.utterance_game, dtype=np.int64)
    n_games = int(game.max(initial=-1)) + 1
    node = np.zeros(len(labels), dtype=np.int64)
    parent = np.zeros(len(labels), dtype=np.int64)
    current = np.zeros(n_games, dtype=np.int64)  # node each game has reached; 0 = root
    next_id = 1
    order = np.argsort(position, kind="stable")
    bounds = np.searchsorted(position[order], np.arange(int(position.max(initial=-1)) + 2))
    for depth in range(len(bounds) - 1):
        at = order[bounds[depth] : bounds[depth + 1]]
        if len(at) == 0:
            continue
        g = game[at]
        parent[at] = current[g]
        _, inverse = np.unique(current[g] * radix + symbols[at], return_inverse=True)
        node[at] = next_id + inverse
        next_id += int(inverse.max()) + 1
        current[g] = node[at]
    return node, parent


def window_keys(table: StepTable, labels: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Per step, ids of its windowed (history, action) key and of its windowed history.

    Ours, not the paper's (whose keys hold the whole history, ``window=None`` in
    :func:`aggregate`): the history is cut to the last ``window`` turns of the step's role, i.e. to
    what was said from that role's ``window``-th previous step on, so steps that reach the same
    intentions by different early turns can share a key. ``window=0`` keeps the action alone; a
    window as long as the game is the paper's key. Returns ``(step_key, step_history)``, both
    ``[n_steps]``; equal ids <=> equal role, (channel, label) window and action.
    """
    if window < 0:
        raise ValueError(f"window must be >= 0 (or None for the whole history), got {window}")
    labels = np.asarray(labels, dtype=np.int64)
    channel = np.asarray(table.utterance_channel, dtype=np.int64)
    if len(labels) != len(channel):
        raise ValueError(f"{len(labels)} labels for {len(channel)} utterances")
    symbols = (labels * (int(channel.max(initial=0)) + 1) + channel).tolist()
    game = np.asarray(table.utterance_game, dtype=np.int64)
    position = np.asarray(table.utterance_position, dtype=np.int64)
    spoken: dict[int, list[int]] = {}  # game -> its utterances in speaking order
    for u in np.lexsort((position, game)).tolist():
        spoken.setdefault(int(game[u]), []).append(u)
    earlier: dict[tuple[int, int], list[int]] = {}  # (game, role) -> positions of that role's steps so far
    ids: dict[tuple, int] = {}
    key = np.empty(table.num_steps, dtype=np.int64)
    history = np.empty(table.num_steps, dtype=np.int64)
    steps = np.asarray(table.step_utterance, dtype=np.int64)
    for s in np.lexsort((position[steps], game[steps])).tolist():
        u, role = int(steps[s]), int(table.step_role[s])
        g, at = int(game[u]), int(position[u])
        before = earlier.setdefault((g, role), [])
        start = before[-window] if window and len(before) >= window else (0 if window else at)
        seen = tuple(symbols[v] for v in spoken[g][start:at])
        history[s] = ids.setdefault((role, seen), len(ids))
        key[s] = ids.setdefault((role, seen, symbols[u]), len(ids))
        before.append(at)
    return key, history


def step_keys(table: StepTable, labels: np.ndarray, window: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per step, ids of its (history, action) key and of its history, role included: the groups
    :func:`aggregate` averages over. ``window`` as in :func:`aggregate`."""
    if window is None:
        node, parent = prefix_nodes(table, labels)
        step_node, step_parent = node[table.step_utterance], parent[table.step_utterance]
    else:
        step_node, step_parent = window_keys(table, labels, window)
    role = np.asarray(table.step_role, dtype=np.int64)
    n_roles = int(role.max(initial=0)) + 1
    return step_node * n_roles + role, step_parent * n_roles + role


def error_against(table: StepTable, q: np.ndarray, reference_labels: np.ndarray, window: int | None = None) -> dict:
    """How far R̃ = ``q`` (from some labels) is from R̃ under ``reference_labels`` (the behavioural
    intentions: the partition any clustering tries to recover), as a bias-variance decomposition
    over the steps. Let m be the mean of ``q`` over the steps of one reference key. Then
    ``mse`` = mean (q − R̃_ref)² = ``bias_squared`` + ``variance_within``, with ``bias_squared`` =
    mean (m − R̃_ref)² (clusters that merge intentions pull a key towards other intentions'
    returns) and ``variance_within`` = mean (q − m)² (clusters that split an intention scatter its
    steps over smaller, noisier keys). The plain mean of q − R̃_ref is zero for any labels (both
    are conditional means of the same returns), so it says nothing."""
    return errors_against(table, [q], reference_labels, window)[0]


def errors_against(table: StepTable, qs, reference_labels: np.ndarray, window: int | None = None) -> list[dict]:
    """:func:`error_against` for several R̃ (one per k, say), the reference keys computed once."""
    key, _ = step_keys(table, reference_labels, window)
    reference, _ = group_mean(key, np.asarray(table.step_return, dtype=np.float64))
    found = []
    for q in qs:
        q = np.asarray(q, dtype=np.float64)
        m, _ = group_mean(key, q)
        bias_squared, variance_within = float(np.mean((m - reference) ** 2)), float(np.mean((q - m) ** 2))
        found.append({"mse": float(np.mean((q - reference) ** 2)), "bias_squared": bias_squared,
                      "variance_within": variance_within})
    return found


def group_mean(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per element: the mean of ``values`` over all elements with the same key, and that count."""
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=values)
    return (sums / counts)[inverse], counts[inverse]


def _q_mode(q: np.ndarray, v: np.ndarray, kept: np.ndarray) -> np.ndarray:
    return q


def _adv_mode(q: np.ndarray, v: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """A = Q − V, z-scored over the kept steps, then min-max scaled to [0, 1] (original code).

    A constant A (zero spread) maps to 0.5 everywhere instead of dividing by zero.
    """
    advantage = q - v
    out = np.full_like(advantage, np.nan)
    a = advantage[kept]
    if a.size == 0:
        return out
    std = a.std()
    z = (a - a.mean()) / std if std > 0 else np.zeros_like(a)
    span = z.max() - z.min()
    out[kept] = (z - z.min()) / span if span > 0 else 0.5
    return out


#: Aggregation modes by name (docs/method.md §3): the reward each kept step receives.
AGGREGATION_MODES: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
    "q": _q_mode,
    "adv": _adv_mode,
}


@dataclass(frozen=True)
class Aggregation:
    """Aggregated rewards of every step, shape [n_steps].

    Attributes:
        reward: the training reward (``q``: R̃ = Q; ``adv``: scaled advantage); NaN where not kept.
        q: R̃(h̃, ã), the mean return at the step's (history, action) node (docs/method.md §3).
        v: V(h̃), the mean return of the steps at the step's history node.
        count: how many steps share the step's (history, action) node.
        kept: the step is a training sample (n_rollout filter and first-action option).
    """

    reward: np.ndarray
    q: np.ndarray
    v: np.ndarray
    count: np.ndarray
    kept: np.ndarray


def aggregate(
    table: StepTable,
    labels: np.ndarray,
    mode: str = "q",
    n_rollout: int = 1,
    include_first_action: bool = True,
    window: int | None = None,
) -> Aggregation:
    """Aggregate step returns in intention space (docs/method.md §3).

    Args:
        table: utterances and steps of the dataset.
        labels: one cluster label per utterance (shape [n_utterances]) at one k.
        mode: ``"q"`` (default) or ``"adv"``; see :data:`AGGREGATION_MODES`.
        n_rollout: steps whose (history, action) node was seen fewer times are not kept
            (the original's ``n_rollout`` filter; 1 keeps everything).
        include_first_action: keep steps with an empty history (a game's first utterance). The
            original drops them for single-agent games and for Alice; ``False`` reproduces that.
            They count towards every mean either way.
        window: ``None`` (the paper): a step's key is its whole intention history and action; an
            int m: only the last m turns of its role's history (:func:`window_keys`, ours).

    Means are taken per role: a node of Alice's steps never mixes with Bob's.
    """
    if mode not in AGGREGATION_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; known: {sorted(AGGREGATION_MODES)}")
    if n_rollout < 1:
        raise ValueError(f"n_rollout must be >= 1, got {n_rollout}")
    key, history = step_keys(table, labels, window)
    returns = np.asarray(table.step_return, dtype=np.float64)
    q, count = group_mean(key, returns)
    v, _ = group_mean(history, returns)
    kept = count >= n_rollout
    if not include_first_action:
        kept &= np.asarray(table.utterance_position)[table.step_utterance] > 0
    reward = AGGREGATION_MODES[mode](q, v, kept)
    reward = np.where(kept, reward, np.nan)
    return Aggregation(reward=reward, q=q, v=v, count=count, kept=kept)


def key_sharing(table: StepTable, labels: np.ndarray, step_turn: np.ndarray, last_turn: int = 5,
                window: int | None = None) -> dict:
    """How much aggregation can do at one k, before any training: where a step is alone at its
    (history, action) node, R̃ is its own return and ARIA trains exactly as its ablation.

    Returns the share of steps whose node holds at least one other step of the same role
    (``shared``), that share per turn (``shared_by_turn``, turns ``last_turn`` and later
    together under ``"{last_turn}+"``), the mean |R̃ − R_t| over the steps, and Var(R̃)/Var(R)
    over every step (None when every return is equal).
    """
    key, _ = step_keys(table, labels, window)
    return group_sharing(key, table.step_return, step_turn, last_turn)


def group_sharing(groups: np.ndarray, returns: np.ndarray, step_turn: np.ndarray, last_turn: int = 5) -> dict:
    """:func:`key_sharing` for any grouping of the steps (one group id per step): the share of
    steps in a group of two or more, by turn, the mean group size a step sees, and the group mean
    of the returns against the returns (mean |difference|, variance ratio)."""
    groups = np.asarray(groups)
    returns = np.asarray(returns, dtype=np.float64)
    mean, count = group_mean(groups, returns)
    shared = count >= 2
    turn = np.minimum(np.asarray(step_turn, dtype=np.int64), last_turn)
    by_turn = {(f"{t}+" if t == last_turn else str(t)): float(shared[turn == t].mean()) for t in np.unique(turn).tolist()}
    raw_var = float(returns.var())
    return {"shared": float(shared.mean()) if len(shared) else None, "shared_by_turn": by_turn,
            "mean_group_size": float(count.mean()) if len(count) else None,
            "mean_abs_change": float(np.abs(mean - returns).mean()) if len(returns) else None,
            "variance_ratio": float(mean.var()) / raw_var if raw_var > 0 else None}
