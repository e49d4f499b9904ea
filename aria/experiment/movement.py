"""Did training move the policy? A trained model (the child) against the model it started from
(the parent).

An experiment whose arms never left their starting point measures its evaluation's noise, not
its methods. Three measures, on the same steps for every arm:
* **Token KL**: the mean, over the action tokens of held-out steps (teacher-forced: the prompt the
  policy saw and the action it took), of KL(child || parent) between the two models' whole
  next-token distributions at that position. It is 0 exactly when both predict the same
  distribution at every one of those positions. Its 95% interval treats the games as the sample
  (the tokens of one game are alike): the ratio estimator's standard error
  sqrt(G/(G−1) · Σ_g (K_g − KL·T_g)²) / Σ_g T_g over the G games' KL sums K_g and token counts T_g
  (each step its own cluster where steps name no game).
* **Log-prob change**: the mean over steps of log π_child(action | prompt) − log π_parent(action |
  prompt), the action's tokens summed, separately for steps of won and of lost games. Training
  that rewards winning should raise the first more than the second.
* **Weight change share**: the share of weight elements whose value differs from the parent's
  once both are cast to the precision the model is served in. An update smaller than that
  precision's step is rounded away by the server (bfloat16 keeps 8 significant bits). A merged
  LoRA update changes every element of the projections it adapts however small it is, so the share
  alone cannot fail for it; the *kept share* (elements changed at the served precision over those
  changed in float32) can: it is what of the update the server plays.

The prompts are encoded as the child was trained (:class:`aria.llm.policy.Encoding`, saved beside
it), in float32; the steps of one game are one prefix tree (:mod:`aria.packing`: the same values
as rows, the shared history computed once).
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from aria.io import ConfigError, DataError
from aria.llm.embedded import resolve_model_path
from aria.llm.policy import Encoding, collate, load_policy
from aria.packing import collate_tree, is_tree_batch, sample_groups, tree_action_logits

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _tensors(folder: Path) -> dict[str, Path]:
    """Every tensor name of a saved model and the safetensors file that holds it."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors file (a model saved with save_pretrained)")
    where = {}
    for file in files:
        with safe_open(str(file), "pt") as f:
            where.update({name: file for name in f.keys()})
    return where


def weight_change_share(parent: Path, child: Path, dtype: str = "float32") -> dict[str, Any]:
    """Elements of the child's weights that differ from the parent's once both are cast to
    ``dtype`` (module doc): counts, their share, and the same count in float32 for comparison."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: unknown {dtype!r} (known: {', '.join(DTYPES)})")
    theirs, ours = _tensors(parent), _tensors(child)
    if set(theirs) != set(ours):  # not a model and its trained copy: the caller's arguments
        raise ConfigError(f"{child} and {parent} hold different tensors: only in the child "
                         f"{sorted(set(ours) - set(theirs))[:3]}, only in the parent {sorted(set(theirs) - set(ours))[:3]}")
    elements = changed = changed_float32 = 0
    for name in sorted(ours):
        with safe_open(str(theirs[name]), "pt") as a, safe_open(str(ours[name]), "pt") as b:
            before, after = a.get_tensor(name), b.get_tensor(name)
        if before.shape != after.shape:
            raise ConfigError(f"{child}: tensor {name} has shape {tuple(after.shape)}, the parent's {tuple(before.shape)}")
        elements += after.numel()
        changed_float32 += int((before.float() != after.float()).sum())
        changed += int((before.to(DTYPES[dtype]) != after.to(DTYPES[dtype])).sum())
    return {"dtype": dtype, "elements": elements, "changed": changed, "share": changed / elements,
            "changed_float32": changed_float32, "share_float32": changed_float32 / elements,
            "kept_share": changed / changed_float32 if changed_float32 else 0.0}


@torch.no_grad()
def _action_distributions(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities over the vocabulary at every action position ([T, V], float32), the
    action tokens ([T]) and the sample of each ([T], its index in the batch); ``batch`` is padded
    rows (:func:`aria.llm.policy.collate`) or prefix trees (:func:`aria.packing.collate_tree`)."""
    if is_tree_batch(batch):
        return torch.log_softmax(tree_action_logits(model, batch), dim=-1), batch["target_ids"], batch["target_sample"]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    mask = batch["action_mask"][:, 1:]  # position j predicts token j + 1
    return (torch.log_softmax(logits[:, :-1][mask].float(), dim=-1), batch["input_ids"][:, 1:][mask],
            torch.nonzero(mask)[:, 0])


def steps_by_game(games: Sequence) -> dict:
    """Each game (of ``games[i]``, step i's game) and the indices of its steps, in order."""
    steps: dict = {}
    for i, game in enumerate(games):
        steps.setdefault(game, []).append(i)
    return steps


def _batches(encoded: Sequence, games: Sequence | None, batch_size: int) -> list[tuple[list[int], str]]:
    """The steps in micro-batches and their layout: with ``games`` (each step's game), one game's
    steps a prefix tree (its history computed once: about 6x fewer tokens than rows on Twenty
    Questions, benchmarks/movement_layout.py); without, ``batch_size`` padded rows of like length."""
    if games is not None:
        return [(rows, "prefix_tree") for rows in steps_by_game(games).values()]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].input_ids))  # little padding
    return [(order[start:start + batch_size], "padded") for start in range(0, len(order), batch_size)]


@torch.no_grad()
def compare_policies(parent, child, encoded: Sequence, won: Sequence[bool], pad_id: int,
                     batch_size: int = 8, names: tuple[str, str] = ("the parent model", "the trained model"),
                     games: Sequence | None = None) -> dict[str, Any]:
    """Token KL and log-prob change (module doc) of two loaded models on encoded steps
    (:class:`aria.llm.policy.EncodedSample`), ``won[i]`` saying whether step i's game was won, ``games[i]``
    (optional) which game it is of: a game's steps are then computed as one prefix tree. A model
    whose log-probabilities are NaN (weights that diverged) is refused with its name (``names``):
    counted as zero, it would read as a policy that did not move."""
    if len(encoded) != len(won) or (games is not None and len(games) != len(encoded)):
        raise ValueError(f"{len(encoded)} steps but {len(won)} outcomes" + (f" and {len(games)} games" if games is not None else ""))
    if not encoded:
        raise ValueError("no steps to compare the models on")
    kl_sum, tokens = 0.0, 0
    change = torch.zeros(len(encoded), dtype=torch.float64)
    kl_step = torch.zeros(len(encoded), dtype=torch.float64)  # each step's KL summed over its tokens
    tokens_step = torch.zeros(len(encoded), dtype=torch.float64)
    for rows, layout in _batches(encoded, games, batch_size):
        steps = [encoded[i] for i in rows]
        batch = collate_tree(steps, pad_id) if layout == "prefix_tree" else collate(steps, pad_id)
        theirs, targets, row = _action_distributions(parent, batch)
        ours, _, _ = _action_distributions(child, batch)
        for name, logp in zip(names, (theirs, ours)):
            if torch.isnan(logp).any():
                first = rows[int(row[torch.isnan(logp).any(dim=-1)][0])]
                raise ConfigError(f"{name}: its log-probabilities are NaN on step {first} of the sample (weights that "
                                  "hold NaN or inf, a diverged training?), so its movement cannot be measured")
        # p · (log p − log q), with 0 where p underflows to 0 (and log q may be −inf too)
        kl_token = torch.where(ours > -torch.inf, ours.exp() * (ours - theirs), 0.0).sum(dim=-1, dtype=torch.float64)
        kl_sum += float(kl_token.sum())
        tokens += len(targets)
        picked = (ours - theirs).gather(-1, targets.unsqueeze(-1)).squeeze(-1).double()
        change.index_add_(0, torch.tensor(rows)[row], picked)
        kl_step.index_add_(0, torch.tensor(rows)[row], kl_token)
        tokens_step.index_add_(0, torch.tensor(rows)[row], torch.ones(len(row), dtype=torch.float64))
    if tokens == 0:
        raise ValueError("the steps hold no action token to compare the models on")
    won_t = torch.tensor([bool(w) for w in won])
    mean = lambda x: float(x.mean()) if len(x) else None  # noqa: E731
    return {"steps": len(encoded), "tokens": tokens, "token_kl": kl_sum / tokens,
            "token_kl_ci95": ratio_interval(kl_step, tokens_step, games),
            "logprob_change": mean(change), "logprob_change_won": mean(change[won_t]),
            "logprob_change_lost": mean(change[~won_t]), "steps_won": int(won_t.sum())}


def ratio_interval(sums: torch.Tensor, counts: torch.Tensor, games: Sequence | None, z: float = 1.959963984540054) -> list[float]:
    """The 95% interval of Σ sums / Σ counts with the games (``games[i]``: step i's; each step alone
    without) as the sample (module doc); the lower end clipped at 0, as a KL is; [mean, mean] for a
    single game, whose spread is unknown."""
    keys = games if games is not None else range(len(sums))
    order = {g: i for i, g in enumerate(dict.fromkeys(keys))}
    index = torch.tensor([order[g] for g in keys])
    k = torch.zeros(len(order), dtype=torch.float64).index_add_(0, index, sums.double())
    t = torch.zeros(len(order), dtype=torch.float64).index_add_(0, index, counts.double())
    mean = float(k.sum() / t.sum())
    g = len(order)
    if g < 2:
        return [mean, mean]
    se = float(((k - mean * t) ** 2).sum() * g / (g - 1)) ** 0.5 / float(t.sum())
    return [max(0.0, mean - z * se), mean + z * se]


def whole_games(games: Sequence, won: Sequence[bool], at_least: int, seed: int = 0) -> list[int]:
    """Indices of the steps of whole games, drawn in a seeded order, a won and a lost game in turn
    while both are left, until at least ``at_least`` steps: whole games share their history in a
    prefix tree, and won steps are rare at a weak start (one of 32 random steps at 15% success),
    where the change on won steps is what training should raise most."""
    steps = steps_by_game(games)
    rng = random.Random(seed)
    piles = [[g for g in steps if bool(won[steps[g][0]]) is outcome] for outcome in (True, False)]
    for pile in piles:
        rng.shuffle(pile)
    chosen: list[int] = []
    while len(chosen) < at_least and any(piles):
        for pile in piles:
            if pile and len(chosen) < at_least:
                chosen += steps[pile.pop()]
    return sorted(chosen)


def movement(parent: Path, child: Path, samples: Sequence[dict], served_dtype: str = "float32",
             max_steps: int | None = 256, seed: int = 0, batch_size: int = 8, source: str | None = None) -> dict[str, Any]:
    """All three measures of ``child`` against ``parent`` on pipeline step-4 samples
    (``observation``, ``action``, ``success``; ``source`` names their file in errors). Samples that
    name their game (``game_id``, and ``role`` in two-player games) are compared in whole games, each
    one prefix tree, at least ``max_steps`` steps of them (:func:`whole_games`); others in a seeded
    sample of at most ``max_steps`` steps, in padded rows."""
    parent, child = Path(resolve_model_path(str(parent))), Path(resolve_model_path(str(child)))  # "embedded" too

    for i, s in enumerate(samples):
        for key, kind in (("observation", str), ("action", str), ("success", bool)):
            if not isinstance(s, dict) or not isinstance(s.get(key), kind):
                raise DataError(source, None, f"sample {i}.{key}", f"expected a {kind.__name__} (a pipeline step-4 sample)")
    steps = list(samples)
    if not steps:
        raise DataError(source, None, None, "no steps to compare the models on (an empty list)")
    games = sample_groups(steps) if any(s.get("game_id") is not None for s in steps) else None
    if max_steps is not None and len(steps) > max_steps:
        chosen = whole_games(games, [s["success"] for s in steps], max_steps, seed) if games else \
            sorted(random.Random(seed).sample(range(len(steps)), max_steps))
        steps, games = [steps[i] for i in chosen], [games[i] for i in chosen] if games else None
    # The weights first: they name a tensor of another shape (another vocabulary) in one line, before
    # two models load and their logits disagree in shape.
    weights = weight_change_share(parent, child, served_dtype)
    encoding = Encoding.saved_in(Path(child), Encoding())
    tokenizer, parent_model = load_policy(str(parent), setting="the parent model")
    _, child_model = load_policy(str(child), setting="the trained model")
    encoded = [encoding.encode(tokenizer, s["observation"], s["action"]) for s in steps]
    return {**compare_policies(parent_model.eval(), child_model.eval(), encoded, [s["success"] for s in steps],
                               tokenizer.pad_token_id, batch_size, names=(f"the parent model {parent}", f"the trained model {child}"),
                               games=games),
            "games": len(set(games)) if games else None, "weights": weights}
