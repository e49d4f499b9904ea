"""Training methods by name: ARIA, its ablation and the baselines, as weights on the same steps.

Every method here is a pure function from the agent steps of a set of labelled games to what
it trains on, of one of two kinds:

* ``weights``: one weight per step (NaN: not trained on), trained with the REINFORCE loss of
  :mod:`aria.trainers.losses` (``−mean(w · Σ_t log π)``; a weight of 1 on every kept step is
  supervised fine-tuning) by :class:`aria.trainers.offline.OfflineTrainer`. One training set, one
  trainer, one loss: these methods differ only in the weights, so a comparison between them
  measures the credit assignment and nothing else;
* ``pairs``: pairs of (chosen, rejected) trajectories, each a tuple of step indices, trained with
  the DPO loss by :class:`aria.trainers.dpo.TrajectoryDPOTrainer` (``traj_dpo``).

A step is a dict with the fields step 4 of the pipeline writes (``aria.intention.pipeline``):

* ``game_id``, ``role``, ``turn`` — which game, which player, which of its turns;
* ``observation`` — the prompt the step was taken from (the game's history, rendered);
* ``final_reward`` — R of docs/method.md §3: the game's (or the role's) final reward;
* ``step_return`` — R_t = γ^(T−t)·R of docs/method.md §3 (the discount convention of the run);
* ``reward`` — ARIA's aggregated reward R̃_t (``None`` where the step was not kept);
* ``q``, ``v``, ``kept`` — the aggregation's Q and V of the step and whether it was kept;
* ``target`` — what the game was about (the object, the city, the configuration): the group of
  games that started from the same state;
* ``success`` — whether the game was won (by this role).

Registry as in verl's ``register_adv_est``: :func:`register_method` adds a method,
:func:`get_method` returns it and rejects unknown names; :func:`trainer_for` picks the trainer
from the kind. ArCHer is a ``weights`` method too: its critic is trained first
(:mod:`aria.trainers.archer`, ``scripts/train_critic.py``), which writes each step's
``advantage``; ``archer`` here trains the token-level actor on those advantages.
"""
from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher
from os.path import commonprefix
from typing import Callable, Sequence, Union

import numpy as np

from aria.intention.aggregate import AGGREGATION_MODES
from aria.io import is_finite_number
from aria.registry import load_object

#: GRPO / GiGPO's ε in (x − mean)/(std + ε).
EPSILON = 1e-6


#: A trajectory: the indices of one role's steps in one game; a pair: (chosen, rejected).
Pair = tuple[tuple[int, ...], tuple[int, ...]]
#: What a method trains on, by kind.
KINDS = ("weights", "pairs")
#: The offline trainer of each kind ("module:Class", imported when chosen: the trainers import this module).
TRAINERS = {"weights": "aria.trainers.offline:OfflineTrainer",  # REINFORCE on per-step weights
            "pairs": "aria.trainers.dpo:TrajectoryDPOTrainer"}  # trajectory DPO on pairs


@dataclass(frozen=True)
class Method:
    name: str
    fn: Callable[[Sequence[dict]], Union[np.ndarray, list[Pair]]]  # steps -> weights [n_steps] (NaN = not
    # trained on), or pairs
    needs: tuple[str, ...]  # step fields the method reads
    source: str  # where the method comes from
    sft_marker: bool = False  # a weight of exactly −1 marks a demonstration (the release's ARIA files)
    kind: str = "weights"  # one of KINDS
    made_by: str = "pipeline step 4"  # what writes the fields it needs


METHODS: dict[str, Method] = {}


def register_method(name: str, needs: tuple[str, ...], source: str, sft_marker: bool = False, kind: str = "weights",
                    made_by: str = "pipeline step 4"):
    """Decorator: register ``fn(steps)`` (weights, or pairs when ``kind="pairs"``) as the method ``name``."""
    if kind not in KINDS:
        raise ValueError(f"method {name!r}: unknown kind {kind!r} (known: {', '.join(KINDS)})")

    def wrap(fn: Callable) -> Callable:
        if name in METHODS:
            raise ValueError(f"method {name!r} is registered twice")
        METHODS[name] = Method(name, fn, needs, source, sft_marker, kind, made_by)
        return fn
    return wrap


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise KeyError(f"unknown method {name!r} (known: {', '.join(sorted(METHODS))})")
    return METHODS[name]


#: What each step field a method reads must hold (the module doc's list), as (test, what it expects).
#: A file made elsewhere can carry a string "1", a NaN or a "false" the methods would silently
#: misread (a truthy "false" is a won game to filtered_bc; a NaN return drops the step).
FIELD_TYPES: dict[str, tuple[Callable[[object], bool], str]] = {
    "reward": (lambda v: v is None or is_finite_number(v), "a finite number or null (a step not kept)"),
    **{field: (is_finite_number, "a finite number") for field in ("step_return", "final_reward", "q", "v", "advantage")},
    **{field: (lambda v: isinstance(v, bool), "true or false") for field in ("kept", "success")},
    "turn": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a whole number >= 0"),
    "target": (lambda v: v is None or isinstance(v, str), "a string or null"),
    **{field: (lambda v: isinstance(v, str), "a string") for field in ("game_id", "observation", "action", "role")},
}


def _checked(name: str, kind: str, steps: Sequence[dict]) -> Method:
    method = get_method(name)
    if method.kind != kind:
        raise KeyError(f"method {name!r} trains on {method.kind}, not on {kind}")
    for i, step in enumerate(steps):
        for field in method.needs:
            if field not in step:
                raise KeyError(f"step {i}: no {field!r}, which method {name!r} needs (re-run {method.made_by})")
            test, expected = FIELD_TYPES.get(field, (None, ""))
            if test is not None and not test(step[field]):
                raise KeyError(f"step {i}: {field!r} expected {expected}, got {step[field]!r:.80}")
        # optional everywhere (a single-agent file has none), read by every method that groups
        if "role" in step and not isinstance(step["role"], str):
            raise KeyError(f"step {i}: 'role' expected a string, got {step['role']!r:.80}")
    return method


def method_weights(name: str, steps: Sequence[dict], **options) -> np.ndarray:
    """The weights of method ``name`` on ``steps``, after checking every step has the fields it
    reads; ``options`` go to the method (``threshold=`` of ``gigpo_similar``)."""
    return np.asarray(_checked(name, "weights", steps).fn(steps, **options), dtype=np.float64)


def method_pairs(name: str, steps: Sequence[dict]) -> list[Pair]:
    """The (chosen, rejected) trajectory pairs of method ``name`` on ``steps`` (checked as above)."""
    return list(_checked(name, "pairs", steps).fn(steps))


# ---- helpers -------------------------------------------------------------------------------------
def _group_ids(keys: Sequence) -> np.ndarray:
    """Index of each key's group, in first-seen order."""
    index: dict = {}
    return np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)


def _normalized(values: np.ndarray, groups: np.ndarray, single: str) -> np.ndarray:
    """(x − mean_g)/(std_g + ε) within each group, std unbiased (torch's), 0 where a group's values are equal.

    ``single``: what a group of one gets — ``"zero"`` (its own mean) or ``"raw"`` (mean 0 and
    std 1, verl-agent's episode level: the value itself).
    """
    out = np.zeros(len(values), dtype=np.float64)
    for g in np.unique(groups):
        members = groups == g
        x = values[members]
        if len(x) == 1:
            out[members] = x if single == "raw" else 0.0
            continue
        std = x.std(ddof=1)
        out[members] = 0.0 if std <= EPSILON else (x - x.mean()) / (std + EPSILON)
    return out


# ---- the methods ------------------------------------------------------------------------------------
@register_method("aria", needs=("reward",), source="ARIA (paper §3.4-3.5): the intention-aggregated reward R̃_t",
                 sft_marker=True)
def aria(steps: Sequence[dict]) -> np.ndarray:
    return np.array([np.nan if s["reward"] is None else float(s["reward"]) for s in steps])


@register_method("aria_adv", needs=("q", "v", "kept"),
                 source="the original release's adv mode: A = Q − V, z-scored over the kept steps, min-max scaled")
def aria_adv(steps: Sequence[dict]) -> np.ndarray:
    q = np.array([float(s["q"]) for s in steps])
    v = np.array([float(s["v"]) for s in steps])
    kept = np.array([bool(s["kept"]) for s in steps])
    return AGGREGATION_MODES["adv"](q, v, kept)


@register_method("no_aggregation", needs=("step_return",),
                 source="the paper's ablation (§4.4): the same REINFORCE on the raw discounted return R_t")
def no_aggregation(steps: Sequence[dict]) -> np.ndarray:
    return np.array([float(s["step_return"]) for s in steps])


@register_method("bc", needs=(), source="behaviour cloning: supervised fine-tuning on every agent step")
def bc(steps: Sequence[dict]) -> np.ndarray:
    return np.ones(len(steps))


@register_method("filtered_bc", needs=("success",),
                 source="filtered BC (ArCHer, Zhou et al. 2024): supervised fine-tuning on the steps of won games only")
def filtered_bc(steps: Sequence[dict]) -> np.ndarray:
    return np.array([1.0 if s["success"] else np.nan for s in steps])


@register_method("starpo", needs=("game_id", "final_reward", "target"),
                 source="StarPO with the GRPO estimator (RAGEN, ctx_manager._normalize_score_tensor, method=mean_std): "
                        "each game's R normalised within the games of the same target, on all its steps")
def starpo(steps: Sequence[dict]) -> np.ndarray:
    """One value per game, (R − mean)/(std + ε) over the games (not steps) of a group; a group of
    one game, or of equal returns, gets 0 (RAGEN's std ≤ 1e-6 rule) — unless every group has one
    game, where RAGEN skips the normalisation and R itself is the advantage."""
    # A trajectory is one role's play of one game (two-player games hold two, with their own R).
    key = [(s["game_id"], s.get("role", "")) for s in steps]
    first = {k: s for k, s in reversed(list(zip(key, steps)))}
    for i, (k, s) in enumerate(zip(key, steps)):  # one R and one group per trajectory, or which one counts?
        for field in ("final_reward", "target"):
            if s[field] != first[k][field]:
                raise KeyError(f"step {i}: {field!r} is {s[field]!r:.80}, but an earlier step of game {k[0]!r} "
                               f"has {first[k][field]!r:.80}")
    trajectories = list(dict.fromkeys(key))
    groups = _group_ids([(first[t]["target"], t[1]) for t in trajectories])
    returns = np.array([float(first[t]["final_reward"]) for t in trajectories])
    advantage = returns if len(np.unique(groups)) == len(trajectories) else _normalized(returns, groups, single="zero")
    per_trajectory = dict(zip(trajectories, advantage))
    return np.array([per_trajectory[k] for k in key])


@register_method("gigpo", needs=("final_reward", "step_return", "target", "observation"),
                 source="GiGPO (Feng et al. 2025; verl-agent gigpo/core_gigpo.py, mode mean_std_norm, ω = 1)")
def gigpo(steps: Sequence[dict], omega: float = 1.0) -> np.ndarray:
    """A = A^E + ω·A^S.

    Episode level (``episode_norm_reward``): every step's score is its game's R, normalised over
    the *steps* of the games with the same target (verl-agent's default
    ``compute_mean_std_cross_steps``); a group of one step keeps its raw score. Step level
    (``step_norm_reward``): within each such group, steps whose history text (``observation``)
    is exactly equal form an anchor group, and their step returns R_t are normalised there; a
    group of one gets 0.

    Departure: verl-agent anchors on the current raw observation; in these dialogue games the
    state is the whole history (the answer alone, "Yes.", is not a state), so the anchor is the
    rendered history, as the issue asks (HGPO groups the same way). The step return is the
    run's R_t (one terminal reward R, discounted), so GiGPO sees exactly ARIA's rewards.
    """
    return _gigpo(steps, omega, similarity=None)


#: verl-agent's similarity threshold in its example scripts (its function's default is 0.95).
GIGPO_SIMILARITY = 0.9


@register_method("gigpo_similar", needs=("final_reward", "step_return", "target", "observation"),
                 source="GiGPO with similarity-based anchor groups (verl-agent gigpo/core_gigpo.py build_step_group, "
                        "enable_similarity, similarity_thresh 0.9 as its example scripts)")
def gigpo_similar(steps: Sequence[dict], omega: float = 1.0, threshold: float = GIGPO_SIMILARITY) -> np.ndarray:
    """:func:`gigpo` whose anchor groups join states whose texts are similar rather than equal
    (:func:`similarity_groups`). Departure: the texts compared are the histories after the
    prompt they all open with (the game's rules), which would otherwise make every history of a
    game similar; verl-agent compares its environments' observations, which carry no such prompt."""
    return _gigpo(steps, omega, similarity=threshold)


def _gigpo(steps: Sequence[dict], omega: float, similarity: float | None) -> np.ndarray:
    episode_group, anchor = gigpo_groups(steps, similarity)
    score = np.array([float(s["final_reward"]) for s in steps])
    episode = _normalized(score, episode_group, single="raw")
    step = _normalized(np.array([float(s["step_return"]) for s in steps]), anchor, single="zero")
    return episode + omega * step


def gigpo_groups(steps: Sequence[dict], similarity: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """GiGPO's two groupings of ``steps``: the episode group of each (its target and role) and its
    anchor-state group inside it, of equal histories (``similarity=None``) or of similar ones
    (:func:`similarity_groups` at that threshold)."""
    episode_group = _group_ids([(s["target"], s.get("role", "")) for s in steps])
    if similarity is None:
        return episode_group, _group_ids([(int(g), s["observation"]) for g, s in zip(episode_group, steps)])
    anchor = np.empty(len(steps), dtype=np.int64)
    for g in np.unique(episode_group):
        members = np.flatnonzero(episode_group == g)
        anchor[members] = similarity_groups([steps[i]["observation"] for i in members], similarity) + len(steps) * int(g)
    return episode_group, anchor


def similarity_groups(texts: Sequence[str], threshold: float) -> np.ndarray:
    """verl-agent's similarity grouping of one episode group's states: in order, each text joins
    the first group whose first text it matches with ``difflib.SequenceMatcher`` ratio >=
    ``threshold``, else starts a group. The texts are compared after the prefix they all share
    (see :func:`gigpo_similar`). ``quick_ratio`` bounds the ratio from above, so it only skips
    comparisons that cannot match."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"similarity threshold must be in (0, 1) (verl-agent's rule), got {threshold}")
    cut = len(commonprefix(list(texts))) if len(texts) > 1 else 0
    firsts: list[str] = []
    out = np.empty(len(texts), dtype=np.int64)
    for i, text in enumerate(texts):
        text = text[cut:]
        for g, first in enumerate(firsts):
            matcher = SequenceMatcher(None, text, first)
            if matcher.quick_ratio() >= threshold and matcher.ratio() >= threshold:
                out[i] = g
                break
        else:
            out[i] = len(firsts)
            firsts.append(text)
    return out


@register_method("archer", needs=("advantage",), made_by="scripts/train_critic.py on this training set",
                 source="ArCHer (Zhou et al. 2024): the utterance critic's advantage min Q − min V as each step's weight")
def archer(steps: Sequence[dict]) -> np.ndarray:
    return np.array([float(s["advantage"]) for s in steps])


@register_method("traj_dpo", needs=("game_id", "success", "target"), kind="pairs",
                 source="trajectory-wise DPO (ETO, Song et al. 2024): a won and a lost game with the same target, "
                        "the DPO loss on the summed log-probs of the agent's tokens")
def traj_dpo(steps: Sequence[dict]) -> list[Pair]:
    """Pairs of a won (chosen) and a lost (rejected) trajectory from the same group — the games of
    one target, and one role in two-player games — so both started from the same state.

    In a group with won trajectories W_0..W_{n−1} and lost ones L_0..L_{m−1} (file order), pair j
    is (W_{j mod n}, L_{j mod m}) for j < max(n, m): every game of the group is in some pair and
    the number of pairs grows linearly (ETO pairs each failed exploration with the expert's
    trajectory of its task). A group without a win or without a loss, a group of one, gives no pair.
    """
    trajectories: dict[tuple, list[int]] = {}
    for i, s in enumerate(steps):
        trajectories.setdefault((s["game_id"], s.get("role", "")), []).append(i)
    groups: dict[tuple, tuple[list, list]] = {}
    for (game, role), members in trajectories.items():
        first = steps[members[0]]
        won, lost = groups.setdefault((first["target"], role), ([], []))
        (won if first["success"] else lost).append(tuple(members))
    pairs: list[Pair] = []
    for won, lost in groups.values():
        if won and lost:
            pairs += [(won[j % len(won)], lost[j % len(lost)]) for j in range(max(len(won), len(lost)))]
    return pairs


def trainer_for(cfg: dict) -> type:
    """The offline trainer of the configured method's kind (:data:`TRAINERS`): REINFORCE on
    per-step weights, or trajectory DPO on pairs. An unknown method is the REINFORCE trainer's to
    reject (one line, before any model loads)."""
    method = METHODS.get(cfg["method"])
    return load_object(TRAINERS[method.kind if method is not None else "weights"])
