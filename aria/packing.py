"""Prefix-tree packing: the steps of a game computed over their shared history once.

Every agent step is its own sample whose prompt repeats the game so far (the original's prompt
shape: a header, the history, then a fixed closing request), so consecutive steps of a game share
the header and the history, and every game of a testbed shares the header. Encoded one row per
sample, a 17-turn game costs about 17 prompts' worth of tokens; merged along their shared token
prefixes into one tree, it costs its longest prompt plus each other step's closing request and
action. Scoring (:func:`aria.trainers.reward_model.score_prefix_trees`) and every trainer
(:func:`collate_tree`, read by :func:`aria.llm.policy.action_logprobs` and
:func:`aria.trainers.reward_model.reward_scores`) use the one tree built here.

Why the result is exact: every distinct prefix is one node; a node attends to itself and its
ancestors only (a 4D attention mask) and sits at its depth (its position id). So a causal
model's hidden state at a node is the one it has at that position in every sample through it,
and a sample's log-probabilities and score read off its own path are those of its own row, up to
float summation order. Gradients follow: the loss is the same function of the weights, and
backpropagation through a shared node adds up what each sample through it sends back.

A micro-batch is one padded batch of such trees (:func:`collate_tree`): a sample that shares
less than half its tokens with the samples before it starts a tree of its own
(:data:`MIN_SHARED`), because a tree's attention is dense, so merging samples that share little
costs more than it saves. Prompts are whole, as played (:mod:`aria.llm.policy`); a prompt cut on the
left (``data.over_long=cut_left``, the release's 512) starts inside the history and shares
nothing, so it is a tree of its own; :func:`packing_stats` counts them.
Small trees share a row of the batch, side by side (:func:`tree_rows`): a row is as long as the
largest tree anyway, and a tree sees only its own nodes.

Trees are not always cheaper. A micro-batch whose samples share little (another game in every
sample, prompts cut on the left) saves few tokens, and a long tree's dense attention costs more
per token than a short row's. :func:`cheaper_layout` counts both layouts' compute (the weights'
share per token, and attention over each token's row: :func:`layout_cost`) and
:func:`aria.llm.policy.collate_as` lays such a micro-batch out in padded rows. The two layouts give
the same values, so the choice changes time and memory only.

Which samples share a micro-batch: :func:`game_ordered_batches` puts each game whole in one
(sharing happens only inside one forward pass, so a game split over two micro-batches would
compute its history twice), where the padded layout sorts samples by length. Micro-batches then
hold ``micro_batch_size`` samples on average, not each; the loss of each is scaled to that
nominal size (:func:`nominal_scale`), so every sample weighs what it weighs in rows.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, partial
from typing import Hashable, Sequence

import numpy as np
import torch
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): transformers


@dataclass(frozen=True)
class PrefixTreePack:
    """Samples merged into one sequence along their shared token prefixes (a prefix tree, flattened).

    * ``input_ids`` [N]: each node's token; ``positions`` [N]: its depth (the position it has in
      each sample that passes through it).
    * ``attends`` [N, N] bool: node i sees node j iff j is i or an ancestor of i: exactly the
      tokens before it in every sample through it.
    * ``trunk``: nodes ``0 .. trunk-1`` are the pack's longest sample, in order (a plain causal
      sequence); the other nodes branch off it.
    * ``samples`` [S]: the indices (in the caller's list) of the samples in this pack, in the
      order they were merged; ``paths[k]`` [len]: the node of every token of ``samples[k]``;
      ``leaves`` [S]: the node of each one's last token.
    """

    input_ids: np.ndarray
    positions: np.ndarray
    attends: np.ndarray
    trunk: int
    samples: np.ndarray
    leaves: np.ndarray
    paths: tuple[np.ndarray, ...] = ()


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def prefix_tree(sequences: Sequence[Sequence[int]], members: Sequence[int] | None = None) -> PrefixTreePack:
    """One pack of ``sequences[i]`` for every ``i`` in ``members`` (default: all of them).

    The longest member is the trunk (nodes 0..T-1); walking the members in lexicographic order,
    a token is the previous member's node where the two agree so far, the trunk's where the
    member agrees with the trunk so far, and a new branch node otherwise (in lexicographic order
    a sequence's longest shared prefix with any earlier one is the one with its predecessor)."""
    members = list(range(len(sequences))) if members is None else list(members)
    if not members:
        raise ValueError("a prefix tree needs at least one sequence")
    if any(len(sequences[i]) == 0 for i in members):
        raise ValueError("every sequence needs at least one token")
    members.sort(key=lambda i: list(sequences[i]))
    trunk = list(sequences[max(members, key=lambda i: len(sequences[i]))])
    ids: list[int] = list(trunk)
    parents: list[int] = list(range(-1, len(trunk) - 1))
    previous: Sequence[int] = ()
    path: list[int] = []  # the node of each token of the previous member
    paths, leaves = [], []
    for i in members:
        seq = sequences[i]
        shared, on_trunk = _common_prefix(previous, seq), _common_prefix(trunk, seq)
        path = path[:shared]
        for j in range(shared, len(seq)):
            if j < on_trunk:
                path.append(j)
            else:
                parents.append(path[-1] if path else -1)
                ids.append(seq[j])
                path.append(len(ids) - 1)
        previous = seq
        paths.append(np.asarray(path, dtype=np.int64))
        leaves.append(path[-1])
    n = len(ids)
    attends = np.zeros((n, n), dtype=bool)
    positions = np.zeros(n, dtype=np.int64)
    for node, parent in enumerate(parents):  # a parent always comes before its children
        if parent >= 0:
            attends[node] = attends[parent]
            positions[node] = positions[parent] + 1
        attends[node, node] = True
    return PrefixTreePack(np.asarray(ids, dtype=np.int64), positions, attends, len(trunk),
                          np.asarray(members, dtype=np.int64), np.asarray(leaves, dtype=np.int64), tuple(paths))


def prefix_tree_packs(sequences: Sequence[Sequence[int]], max_tokens: int) -> list[PrefixTreePack]:
    """The sequences merged into prefix-tree packs of at most ``max_tokens`` nodes each (a longer
    sequence gets a pack of its own), in lexicographic order, so each sequence adds only what
    follows its shared prefix with its predecessor."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if any(len(s) == 0 for s in sequences):
        raise ValueError("every sequence needs at least one token")
    order = sorted(range(len(sequences)), key=lambda i: list(sequences[i]))
    packs: list[list[int]] = []
    nodes = 0
    previous: Sequence[int] = ()
    for i in order:
        shared = _common_prefix(previous, sequences[i]) if packs else 0
        if not packs or nodes + len(sequences[i]) - shared > max_tokens:
            packs.append([])
            nodes, shared = 0, 0
        packs[-1].append(i)
        nodes += len(sequences[i]) - shared
        previous = sequences[i]
    return [prefix_tree(sequences, members) for members in packs]


def tree_tokens(sequences: Sequence[Sequence[int]]) -> int:
    """Nodes of the one prefix tree of ``sequences``, without building it."""
    ordered = sorted((list(s) for s in sequences))
    total, previous = 0, []
    for seq in ordered:
        total += len(seq) - _common_prefix(previous, seq)
        previous = seq
    return total


def micro_batch_tokens(sequences: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(nodes, cells) of a micro-batch laid out by :func:`collate_tree`: the nodes of its trees,
    and the cells of their padded batch (rows x the largest tree, :func:`tree_rows`)."""
    sizes = [tree_tokens([sequences[i] for i in group]) for group in tree_groups(sequences)]
    return sum(sizes), len(tree_rows(sizes)) * max(sizes)


def tree_rows(sizes: Sequence[int]) -> list[list[int]]:
    """The trees (indices into ``sizes``, their node counts) placed side by side in rows as long as
    the largest tree, first fit in decreasing size. Every row of the padded batch costs the full
    length (attention under a dense mask computes padding too), so fewer rows are less work; a
    tree in a row attends only to its own nodes, so the values do not change."""
    width = max(sizes)
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        row = next((r for r, room in enumerate(free) if room >= sizes[i]), None)
        if row is None:
            rows.append([])
            free.append(width)
            row = len(rows) - 1
        rows[row].append(i)
        free[row] -= sizes[i]
    return rows


# ---- which layout costs less ------------------------------------------------------------------------
def model_config(model):
    """The model's Hugging Face config, also through a DDP or DeepSpeed wrapper (``.module``); None if it has none."""
    return getattr(model, "config", None) or getattr(getattr(model, "module", None), "config", None)


def attention_break_even(model) -> float | None:
    """The context length at which a token's attention costs as much as its pass through the
    weights: 2 FLOPs per weight of the transformer body against 4 · hidden size FLOPs per earlier
    token per layer (scores and the weighted sum), so ``body weights / (2 · hidden · layers)``
    (SmolLM2-135M: about 3,070 tokens; an 8B Llama: about 27,000). None when the model's config
    does not say its hidden size and layers: then trees are always used."""
    config = model_config(model)
    hidden, layers = getattr(config, "hidden_size", None), getattr(config, "num_hidden_layers", None)
    if not hidden or not layers:
        return None
    def size(p):  # DeepSpeed ZeRO-3 leaves a partitioned weight empty and keeps its size aside
        return getattr(p, "ds_numel", p.numel())

    total = sum(size(p) for p in model.parameters())
    embeddings = {id(m.weight): size(m.weight) for m in (model.get_input_embeddings(), model.get_output_embeddings())
                  if m is not None and getattr(m, "weight", None) is not None}  # a tied head counted once
    body = total - sum(embeddings.values())
    return body / (2.0 * hidden * layers) if body > 0 else None


def layout_cost(rows: int, length: int, break_even: float) -> float:
    """Compute of a padded batch of ``rows`` x ``length`` cells, in units of one token's pass
    through the weights: every cell passes through them and attends to its whole row (a dense or
    padded mask computes the masked scores too)."""
    return rows * length * (1.0 + length / break_even)


def cheaper_layout(sequences: Sequence[Sequence[int]], break_even: float | None) -> str:
    """``prefix_tree`` or ``padded``: the layout of a micro-batch of ``sequences`` that costs less
    (:func:`layout_cost`); trees when ``break_even`` is None."""
    if break_even is None:
        return "prefix_tree"
    sizes = [tree_tokens([sequences[i] for i in group]) for group in tree_groups(sequences)]
    trees = layout_cost(len(tree_rows(sizes)), max(sizes), break_even)
    rows = layout_cost(len(sequences), max(len(s) for s in sequences), break_even)
    return "prefix_tree" if trees <= rows else "padded"


# ---- training batches --------------------------------------------------------------------------------
#: A sample joins the tree of the samples before it (in token order) when it shares at least this
#: share of its own tokens with its predecessor; otherwise it starts a tree of its own. The steps of
#: one game share nearly all their tokens and stay in one tree; samples that share little (a
#: left-truncated prompt, another game past the common header) would cost more in the tree's
#: dense attention (quadratic in its size) than they save in shared tokens.
MIN_SHARED = 0.5


def tree_groups(sequences: Sequence[Sequence[int]], min_shared: float = MIN_SHARED) -> list[list[int]]:
    """The sequences (indices) split into the trees of one micro-batch (:data:`MIN_SHARED`), in
    lexicographic order."""
    order = sorted(range(len(sequences)), key=lambda i: list(sequences[i]))
    groups: list[list[int]] = []
    previous: Sequence[int] = ()
    for i in order:
        if not groups or _common_prefix(previous, sequences[i]) < min_shared * len(sequences[i]):
            groups.append([])
        groups[-1].append(i)
        previous = sequences[i]
    return groups


def check_micro_batch(samples: Sequence) -> None:
    """A micro-batch has samples, each with a prompt token before its action (whose logits predict it)."""
    if not samples:
        raise ValueError("an empty micro-batch")
    for i, s in enumerate(samples):
        if s.prompt_len < 1:
            raise ValueError(f"sample {i} of the micro-batch has no prompt token before its action")


def empty_rows(k: int, n: int, pad_id: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """K rows of N padding nodes: token ids, positions, and a mask where each node sees only itself
    (a padding node then has no empty softmax row)."""
    input_ids = np.full((k, n), pad_id if pad_id is not None else 0, dtype=np.int64)
    positions = np.zeros((k, n), dtype=np.int64)
    mask = np.zeros((k, 1, n, n), dtype=bool)
    mask[:, 0, np.arange(n), np.arange(n)] = True
    return input_ids, positions, mask


def collate_tree(samples: Sequence, pad_id: int | None = None) -> dict[str, torch.Tensor]:
    """A micro-batch of encoded samples (:class:`aria.llm.policy.EncodedSample`) as prefix trees: its
    samples split into trees (:func:`tree_groups`), the trees side by side in K rows as long as
    the largest tree, N nodes (:func:`tree_rows`), one right-padded batch.

    Returns the model's inputs, ``input_ids`` and ``position_ids`` [K, N] and a boolean
    ``attention_mask`` [K, 1, N, N] (True: may attend; a padding node sees only itself), and what
    reads the outputs back, as indices into the batch's K·N nodes in row-major order:

    * ``logit_nodes`` [K, N] bool: the nodes whose next-token logits some action token needs
      (the model computes logits there only); ``target_rows`` [M], ``target_ids`` [M],
      ``target_sample`` [M]: for every action token of every sample, the row of its logits among
      the kept nodes, its token and its sample (a node where samples branch serves each of them
      with its own next token);
    * ``score_nodes`` [B]: the node a score head reads for each sample: its last token that is
      not ``pad_id``, the token transformers' sequence-classification models read in a
      right-padded row (with ``pad_id=None``: the last token);
    * ``num_samples`` [] and ``sample_tokens`` [] (the tokens of the samples' own rows).
    """
    check_micro_batch(samples)
    sequences = [s.input_ids for s in samples]
    trees = [prefix_tree(sequences, members) for members in tree_groups(sequences)]
    rows = tree_rows([len(t.input_ids) for t in trees])
    k, n = len(rows), max(len(t.input_ids) for t in trees)
    input_ids, positions, mask = empty_rows(k, n, pad_id)
    keep = np.zeros((k, n), dtype=bool)
    predictors, targets, owners = [], [], []
    score_nodes = np.zeros(len(samples), dtype=np.int64)
    for r, row in enumerate(rows):
        start = 0  # where the next tree of the row begins
        for tree in (trees[t] for t in row):
            end = start + len(tree.input_ids)
            input_ids[r, start:end], positions[r, start:end] = tree.input_ids, tree.positions
            mask[r, 0, start:end, start:end] = tree.attends
            for i, path in zip(tree.samples.tolist(), tree.paths):
                ids, first, nodes = samples[i].input_ids, samples[i].prompt_len, r * n + start + path
                predictors.append(nodes[first - 1 : len(ids) - 1])
                targets.append(np.asarray(ids[first:], dtype=np.int64))
                owners.append(np.full(len(ids) - first, i, dtype=np.int64))
                score_nodes[i] = nodes[score_position(ids, pad_id)]
            start = end
    predictors = np.concatenate(predictors)
    keep.reshape(-1)[predictors] = True
    row_of = np.cumsum(keep.reshape(-1)) - 1  # a kept node's row among the kept nodes
    return {
        "input_ids": torch.from_numpy(input_ids),
        "position_ids": torch.from_numpy(positions),
        "attention_mask": torch.from_numpy(mask),
        "logit_nodes": torch.from_numpy(keep),
        "target_rows": torch.from_numpy(row_of[predictors]),
        "target_ids": torch.from_numpy(np.concatenate(targets)),
        "target_sample": torch.from_numpy(np.concatenate(owners)),
        "score_nodes": torch.from_numpy(score_nodes),
        "num_samples": torch.tensor(len(samples)),
        "sample_tokens": torch.tensor(sum(len(s) for s in sequences)),
        "tree_tokens": torch.tensor(sum(len(t.input_ids) for t in trees)),
    }


def score_position(ids: Sequence[int], pad_id: int | None) -> int:
    """Where a sequence-classification head reads a sample: its last token that is not
    ``pad_id`` (0 if every token is), as transformers' models read a right-padded row; with
    ``pad_id=None`` the last token. (With ``append_eos`` and the pad token equal to the
    end-of-turn token, that is the action's last token before it.)"""
    if pad_id is not None:
        for j in range(len(ids) - 1, -1, -1):
            if ids[j] != pad_id:
                return j
        return 0
    return len(ids) - 1


def is_tree_batch(batch: dict) -> bool:
    return "logit_nodes" in batch


def model_mask(model, mask: torch.Tensor) -> torch.Tensor:
    """The tree's boolean mask as the model's attention takes it: as it is for ``sdpa`` (and
    ``flex_attention``), additive (0 or the dtype's minimum) for ``eager``; other kernels
    (FlashAttention) take no arbitrary mask, so prefix-tree packing refuses them."""
    config = model_config(model)
    implementation = getattr(config, "_attn_implementation", "sdpa") or "sdpa"
    if implementation in ("sdpa", "flex_attention"):
        return mask
    if implementation == "eager":
        dtype = next(model.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)
    raise ValueError(f"prefix-tree packing needs an attention that takes a 4D mask (sdpa or eager), not "
                     f"{implementation!r}: set train.packing=padded")


# ---- attention whose cost follows the tree ---------------------------------------------------------
#: How a tree's attention is computed (environment ``ARIA_TREE_ATTENTION``): ``blocks`` (default):
#: the leading causal part of the micro-batch (the first tree's trunk, a plain causal sequence)
#: by SDPA's causal kernel, which skips the scores above the diagonal, and the other nodes (the
#: branches) in blocks, each against the part of the trunk it sees and its own nodes only
#: (:func:`branch_blocks`; in float32 only, see :func:`tree_trunk_attention`); ``trunk``: the same
#: trunk, the branches against every key under the mask; ``dense``: every node against every node
#: under the mask. The same values (tested);
#: docs/benchmarks.md "Whole histories" measures the three.
TREE_ATTENTIONS = ("blocks", "trunk", "dense")
#: At most this many blocks a forward (adjacent blocks are merged beyond it): each is an SDPA call a layer.
MAX_BLOCKS = 64


def tree_attention_way() -> str:
    way = os.environ.get("ARIA_TREE_ATTENTION", "blocks")
    if way not in TREE_ATTENTIONS:
        raise ValueError(f"ARIA_TREE_ATTENTION: unknown {way!r} (known: {', '.join(TREE_ATTENTIONS)})")
    return way


def causal_prefix(mask: torch.Tensor) -> int:
    """How many leading nodes of a boolean [K, 1, N, N] mask attend causally, in every row of the
    batch: node i to exactly nodes 0..i. In a tree laid out by :func:`collate_tree` that is the
    first tree's trunk (its longest sample, in order)."""
    n = mask.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()
    rows_alike = (mask[:, 0] == causal).all(dim=0).all(dim=-1)  # [N]: node i attends causally in every row
    return int(rows_alike.long().cumprod(0).sum())


def branch_blocks(mask: torch.Tensor, trunk: int) -> list[tuple[int, int, int]] | None:
    """The nodes after the ``trunk`` of a boolean [K, 1, N, N] tree mask as blocks ``(a, b, p)``:
    nodes ``a..b-1``, which in every row attend only to the trunk's first ``p`` nodes and to nodes
    of their own block. A branch of a tree sees the trunk up to where it leaves it, and itself:
    on a Guess My City game (each step's closing request and reply, ~45 nodes, off a trunk of
    ~1,000) the blocks hold about a third of the scores of the branches against every node.
    ``None`` where that saves nothing."""
    seen = mask[:, 0].any(dim=0)  # [N, N]: i attends to j in some row
    n = seen.shape[0]
    if trunk >= n:
        return []
    rest, nodes = seen[trunk:], torch.arange(n, device=mask.device)
    if (torch.where(rest[:, trunk:], nodes[trunk:], -1).amax(dim=1) > nodes[trunk:]).any():
        return None  # a node that sees a later one: not a tree laid out parents first
    lowest = torch.where(rest[:, trunk:], nodes[trunk:], n).amin(dim=1)  # the first non-trunk node each one sees
    reach = torch.where(rest[:, :trunk], nodes[:trunk] + 1, 0).amax(dim=1)  # how much of the trunk it sees
    # a block may begin at node j when no node from j on sees a non-trunk node before j
    later = torch.flip(torch.cummin(torch.flip(lowest, [0]), 0).values, [0])
    starts = [trunk + r for r in torch.nonzero(later >= nodes[trunk:]).squeeze(1).tolist()] + [n]
    if len(starts) - 1 > MAX_BLOCKS:  # fewer, larger blocks: as many SDPA calls as blocks, each layer
        step = -(-(len(starts) - 1) // MAX_BLOCKS)
        starts = starts[:-1:step] + [n]
    blocks = [(a, b, int(reach[a - trunk : b - trunk].max())) for a, b in zip(starts, starts[1:])]
    if sum((b - a) * (p + b - a) for a, b, p in blocks) >= 0.8 * (n - trunk) * n:
        return None
    return blocks


def tree_trunk_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, *,
                         trunk: int, find_blocks=None, **kwargs):
    """Scaled dot-product attention of a tree in calls of transformers' own SDPA function (so
    heads, grouped keys and scaling are as in ``sdpa``): the ``trunk`` leading nodes, which attend
    causally (:func:`causal_prefix`), with the causal kernel and no mask; the rest of the nodes
    under the mask, in the blocks ``find_blocks()`` gives (:func:`branch_blocks`, found at the
    first float32 layer and kept) against the keys each block sees, or all of them against all
    keys (no ``find_blocks``, its ``None``, or another dtype). The scores left out are ones the
    mask removes, so the output equals dense SDPA's."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def sdpa(q, k, v, m, causal=False):
        return sdpa_attention_forward(module, q, k, v, m, dropout=dropout, scaling=scaling, is_causal=causal, **kwargs)[0]

    n = query.shape[2]
    if trunk < 2 or key.shape[2] != n or attention_mask is None or attention_mask.shape[-1] != n:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    parts = [sdpa(query[:, :, :trunk], key[:, :, :trunk], value[:, :, :trunk], None, causal=True)]
    if trunk >= n:  # one sample alone, or trees without branches: the causal part is all there is
        return parts[0], None
    # Measured on an AVX512-BF16 CPU (docs/benchmarks.md "Whole histories"): in bfloat16 the
    # blocks' masked calls lost to one masked call (91 s an epoch against 82), in float32 they won.
    # Under autocast (accelerate's mixed precision wraps the forward) SDPA computes in the autocast
    # dtype although the query arrives in float32 (Llama's rotary embedding promotes it), so the
    # dtype is read here, in the layer, and the blocks found at the first layer that uses them.
    device = query.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else query.dtype
    blocks = find_blocks() if find_blocks is not None and dtype == torch.float32 else None
    if blocks is None:
        parts.append(sdpa(query[:, :, trunk:], key, value, attention_mask[:, :, trunk:]))
    for a, b, p in blocks or []:
        q, m = query[:, :, a:b], attention_mask[:, :, a:b]
        if p == 0:
            parts.append(sdpa(q, key[:, :, a:b], value[:, :, a:b], m[..., a:b]))
        else:
            parts.append(sdpa(q, torch.cat([key[:, :, :p], key[:, :, a:b]], dim=2),
                              torch.cat([value[:, :, :p], value[:, :, a:b]], dim=2),
                              torch.cat([m[..., :p], m[..., a:b]], dim=-1)))
    return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0], None  # [B, N, heads, dim]


@contextmanager
def tree_attention(model, mask: torch.Tensor):
    """The model's attention as :func:`tree_trunk_attention` for the forward passes inside, over the
    boolean tree ``mask`` (its causal prefix and blocks found once, not once a layer), where the
    model runs ``sdpa`` and the way is not ``dense``; else as it is. Backward calls no attention of its own
    (gradient checkpointing's recomputation runs plain SDPA: the same values)."""
    config = model_config(model)
    way = tree_attention_way()
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa" or way == "dense" \
            or mask.dtype != torch.bool:
        yield
        return
    from transformers import AttentionInterface

    trunk = causal_prefix(mask)
    find_blocks = cache(partial(branch_blocks, mask, trunk)) if way == "blocks" else None
    AttentionInterface.register("aria_tree_trunk", partial(tree_trunk_attention, trunk=trunk, find_blocks=find_blocks))
    configs = list({id(c): c for c in _configs_of(model)}.values())
    for c in configs:
        c._attn_implementation = "aria_tree_trunk"
    try:
        yield
    finally:
        for c in configs:
            c._attn_implementation = "sdpa"


def _configs_of(model):
    """Every config a module of ``model`` reads its attention implementation from (peft and other
    wrappers keep the inner model's; some models give sub-modules configs of their own)."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            yield config


def tree_action_logits(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The next-token logits that predict every action token, [M, V] in float32, in the order of
    :func:`collate_tree` (each sample's tokens in action order; the samples in tree order)."""
    mask = model_mask(model, batch["attention_mask"])
    with tree_attention(model, mask):
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask,
                       logits_to_keep=batch["logit_nodes"]).logits
    return logits.reshape(-1, logits.shape[-1])[batch["target_rows"]].float()  # the kept nodes, in row-major order


def tree_action_token_logprobs(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(token | its own prefix) of every action token, [M], and its sample, [M], in the order of
    :func:`collate_tree`."""
    rows = tree_action_logits(model, batch)
    picked = torch.log_softmax(rows, dim=-1).gather(-1, batch["target_ids"].unsqueeze(-1)).squeeze(-1)
    return picked, batch["target_sample"]


def tree_scores(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each sample's score from a one-output sequence-classification model, from one forward
    pass over the tree: shape [B], float32. The head's output at every node is taken from the
    head itself (a forward hook on the module named ``score``, through any wrapper: peft, DDP,
    DeepSpeed), since the model's own pooled output reads one position per row."""
    head = score_head(model)
    seen: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda module, args, output: seen.append(output))
    try:
        mask = model_mask(model, batch["attention_mask"])
        with tree_attention(model, mask):
            model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask)
    finally:
        handle.remove()
    return seen[-1].reshape(-1)[batch["score_nodes"]].float()


def score_head(model) -> torch.nn.Module:
    """The outermost module named ``score`` (transformers' sequence-classification head; under
    peft, the wrapper that routes to the trained copy)."""
    named = [(name, module) for name, module in model.named_modules() if name == "score" or name.endswith(".score")]
    if not named:
        raise ValueError("prefix-tree packing of a score model needs a head named 'score' (transformers' "
                         "sequence-classification models): set train.packing=padded")
    return min(named, key=lambda item: item[0].count("."))[1]


# ---- which samples share a micro-batch -------------------------------------------------------------
def game_ordered_batches(groups: Sequence[Hashable], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Micro-batches of whole games, ``batch_size`` sample indices each on average.

    ``groups[i]`` is sample i's game. The games are put in a seeded order (deterministic in
    (seed, epoch), so a resumed run sees the same batches), each game's samples follow in file
    order, and the run is cut at the game boundary nearest each multiple of ``batch_size`` (a tie
    goes to the earlier boundary). So every game lies whole in one micro-batch, one prefix tree:
    its history is computed once an epoch, and an epoch computes about the sum of the games' own
    trees (:func:`games_floor`), where cutting every ``batch_size`` samples computed a game split
    over two micro-batches twice. An epoch has about as many micro-batches as rows would (fewer
    where games are longer than ``batch_size``), and the trainer scales each micro-batch's mean
    loss by its size over ``batch_size`` (:func:`nominal_scale`), so every sample weighs the same
    in every optimizer step whatever the size of its micro-batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    games = list(members)
    order = np.random.default_rng([seed, epoch, 1]).permutation(len(games))
    flat = [i for g in order for i in members[games[g]]]
    ends = np.cumsum([len(members[games[g]]) for g in order])  # where each game ends in the run
    cuts = {int(ends[np.argmin(np.abs(ends - target))]) for target in range(batch_size, len(flat), batch_size)}
    cuts = sorted(cuts | {len(flat)})
    return [flat[a:b] for a, b in zip([0, *cuts[:-1]], cuts)]


def nominal_scale(batch: Sequence[int], batch_size: int) -> float:
    """What a micro-batch's mean loss is multiplied by so that it counts as its samples' share of a
    ``batch_size`` micro-batch (:func:`game_ordered_batches` makes micro-batches of varying sizes):
    every sample then weighs 1 / (batch_size × accumulation × processes) in its optimizer step, as
    in micro-batches of equal size."""
    return len(batch) / batch_size


def games_floor(sequences: Sequence[Sequence[int]], groups: Sequence[Hashable]) -> int:
    """The tokens an epoch must compute at least: each game's steps as one prefix tree, its history
    once (:func:`tree_tokens` of each game's sequences, summed)."""
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    return sum(tree_tokens([sequences[i] for i in game]) for game in members.values())


def sample_groups(samples: Sequence[dict]) -> list[Hashable]:
    """Each sample's game: its ``game_id``, with its ``role`` in a two-player game (the two
    players' prompts differ from the first token on), else a group of its own."""
    return [(s["game_id"], s.get("role")) if s.get("game_id") is not None else ("#", i) for i, s in enumerate(samples)]


def packing_stats(samples: Sequence, batches: Sequence[Sequence[int]], break_even: float | None = None) -> dict[str, int | float]:
    """What prefix-tree packing saves on ``batches`` of encoded samples: tokens of the samples'
    own rows against nodes of the micro-batches' trees (and the cells of their padded batches),
    the left-truncated prompts (a tree of their own each), and with the model's ``break_even``
    the micro-batches laid out in rows instead (:func:`cheaper_layout`) and the tokens computed
    in the layout each micro-batch gets."""
    nodes = cells = rows = computed = in_rows = 0
    for batch in batches:
        sequences = [samples[i].input_ids for i in batch]
        batch_nodes, batch_cells = micro_batch_tokens(sequences)
        batch_rows = sum(len(s) for s in sequences)
        trees = cheaper_layout(sequences, break_even) == "prefix_tree"
        nodes, cells, rows = nodes + batch_nodes, cells + batch_cells, rows + batch_rows
        computed += batch_nodes if trees else batch_rows
        in_rows += not trees
    return {"row_tokens": rows, "tree_tokens": nodes, "tree_cells": cells, "saving": round(rows / max(nodes, 1), 3),
            "truncated_prompts": sum(bool(getattr(samples[i], "truncated", False)) for batch in batches for i in batch),
            "micro_batches_in_rows": in_rows, "computed_tokens": computed}


#: How a trainer lays a micro-batch out for the model (config ``train.packing``).
PACKINGS = ("prefix_tree", "padded")
