"""Pipeline steps 1-4 over files (docs/method.md §2): the numbered scripts are thin wrappers of these.

Everything a run writes goes to ``run_dir`` (default ``outputs/intention/<game>``)::

    utterances.json      step 1: what was read, the distinct texts of every pool, skipped games
    embedding_cache/     step 1: text -> vector per embedding model (a re-run embeds nothing new)
    embeddings.npz       step 1: one float32 matrix per pool, rows aligned with the pool's texts
    labels.npz           step 1: ``ks`` and one int array [len(ks), n_texts] per pool
    selection.json/.png  step 2: every criterion and the variances for every k, the chosen k
    labelled.jsonl       step 3: the trajectories with labels, step returns and aggregated rewards
    train.json           step 4: the training set

Each step records a fingerprint of its inputs and settings; re-running a step whose outputs
match does nothing ("up to date"), and the k sweep of step 1 saves its progress and resumes.
Outputs are written atomically; the same input and seed give byte-identical files.

Each step also checks that what it reads is what the step before it used: step 1 records the
digest of the trajectory files and of every pool's texts, and stamps ``labels.npz`` and
``embeddings.npz`` with its fingerprint; steps 2 and 3 re-read the trajectories and refuse if
they or the pools changed, step 3 refuses a ``selection.json`` made from another step 1, and step
4 a ``labelled.jsonl`` made from another selection or edited since. The refusal is one line that
names the step to re-run (:class:`StaleStep`).
"""
from __future__ import annotations

import glob
import io
import json
import logging
import sys
import time
import zipfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from aria.cli import command, openai_errors
from aria.games.family import checked_game, family_of
from aria.games.question.game import build_game
from aria.games.question.oracle import build_oracle
from aria.games.two_player.glee import winner
from aria.intention.aggregate import AGGREGATION_MODES, DISCOUNTS, aggregate, errors_against, key_sharing
from aria.intention.behaviour import partition, signatures
from aria.intention.cluster import CLUSTERINGS, cluster_all_k, distinct_points, k_range
from aria.intention.corpus import Corpus, IntentionSpec, build_corpus
from aria.intention.embed import (EmbeddingCache, build_embedder, check_embedder, embedder_key, embedder_name,
                                  text_digest)
from aria.intention.report import plot_selection
from aria.intention.select import SELECTORS, ClusterQuality, choose_k, intention_recovery, split_scores
from aria.intention.settings import (LABELS, AggregationSettings, ClusteringSettings, IntentionSettings,
                                     SelectionSettings)
from aria.io import (ConfigError, DataError, StaleInput, atomic_write_bytes, atomic_write_json, atomic_write_json_rows,
                     atomic_write_jsonl, differences, file_digest, hold_folder, iter_jsonl, json_digest, located,
                     read_json, writer_of)
from aria.resources import check_overrides, dataset_file, load
from aria.settings import typed
from aria.trajectories import VectorWidth, iter_trajectories, read_producer

log = logging.getLogger(__name__)
Printer = Callable[[str], None]
#: Part of every fingerprint: bump it when what a step computes changes, so old outputs are redone.
PIPELINE_VERSION = 3
#: Part of step 2's fingerprint: bump it when what selection.json reports changes (its choice of k
#: does not depend on it, so the labels and the training set stay byte-identical).
SELECTION_VERSION = 2
#: What step 4 writes: 2 = every agent step with the fields of aria.trainers.methods (1: kept steps only).
TRAIN_FORMAT = 2


# ---- inputs ------------------------------------------------------------------------------
def input_files(pattern: str | list[str]) -> list[Path]:
    """Trajectory files from a path, a glob, or a list of either (sorted, de-duplicated)."""
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    files: list[Path] = []
    for p in patterns:
        matches = sorted(glob.glob(str(p))) if any(ch in str(p) for ch in "*?[") else [str(p)]
        for m in matches:
            if not Path(m).is_file():
                raise FileNotFoundError(f"no trajectories file {m!r} (input: {pattern!r})")
            if Path(m) not in files:
                files.append(Path(m))
    if not files:
        raise FileNotFoundError(f"no trajectories file matches {pattern!r}")
    return files


def read_inputs(files: list[Path], game: str | None = None) -> tuple[list[dict], dict[str, tuple[Path, int]]]:
    """The records of ``files`` (all of ``game`` where given), and each game's file and line, so
    that a problem found later in a record (the corpus, a prompt) names where it is."""
    records: list[dict] = []
    sources: dict[str, tuple[Path, int]] = {}
    widths = VectorWidth()  # one embedding model for all files
    for path in files:
        if holder := writer_of(path):
            raise DataError(path, None, None, f"is being written by {holder}: wait for it to end (read now, it "
                                              "would hold only the games finished so far)")
        for line, record in iter_trajectories(path, widths=widths, game=game):
            if record["game_id"] in sources:
                raise DataError(path, line, "game_id", f"{record['game_id']!r} is also in {sources[record['game_id']][0]}")
            sources[record["game_id"]] = (path, line)
            records.append(record)
    return records, sources


#: The numbered scripts, to name in a refusal.
STEP_SCRIPTS = {1: "reward_aggregation/1_embed_and_cluster.py", 2: "clustering/2_select_k.py",
                3: "clustering/3_apply_labels.py", 4: "clustering/4_build_training_set.py"}


class StaleStep(StaleInput):
    """What a step reads does not match what the step before it used."""

    def __init__(self, step: int, problem: str):
        super().__init__(f"{problem}: re-run step {step} ({STEP_SCRIPTS[step]}) with the same overrides, then the "
                         f"steps after it")


def step_output(path: Path, step: int) -> dict:
    """A JSON output of ``step``, or a one-line refusal saying to run that step first."""
    if not path.is_file():
        raise StaleStep(step, f"no {path.name} in {path.parent}")
    found = read_json(path)
    if not isinstance(found, dict) or not isinstance(found.get("fingerprint"), str):
        raise StaleStep(step, f"{path} is not an output of step {step} (no fingerprint)")
    return found


def _up_to_date_json(path: Path, fingerprint: str) -> dict | None:
    """A step's own JSON output if it was made under ``fingerprint`` (anything else at ``path``,
    whatever its shape, is made again)."""
    found = read_json(path) if path.is_file() else None
    return found if isinstance(found, dict) and found.get("fingerprint") == fingerprint else None


def _check_inputs(summary: dict, corpus: Corpus, files: list[Path]) -> None:
    """The trajectories and the pools are those step 1 read (see the module doc)."""
    if file_digest(files) != summary.get("input_digest"):
        raise StaleStep(1, f"the trajectories ({', '.join(map(str, files))}) are not those step 1 read")
    pools = {p: text_digest(t) for p, t in corpus.pools.items()}
    if pools != summary.get("pool_digests"):
        raise StaleStep(1, f"the game's utterance pools ({sorted(pools)}) are not those step 1 clustered "
                            f"({sorted(summary.get('pool_digests') or {})}), or their texts changed")


def _stamp(path: Path) -> str | None:
    """The fingerprint inside a step's arrays (read alone), or None where there is none to read."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return str(data["fingerprint"].item())
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return None


def _check_stamp(arrays: dict[str, np.ndarray], name: str, summary: dict) -> None:
    if arrays.get("fingerprint", np.array("")).item() != summary["fingerprint"]:
        raise StaleStep(1, f"{name} was not written by the step 1 that wrote utterances.json")


def _up_to_date(out_path: Path, meta_path: Path, fingerprint: str, digest_key: str) -> bool:
    """The output exists, was made from these inputs and settings, and is as it was written."""
    if not (out_path.is_file() and meta_path.is_file()):
        return False
    meta = _up_to_date_json(meta_path, fingerprint)
    return meta is not None and meta.get(digest_key) == file_digest([out_path])


def game_spec(cfg: IntentionSettings) -> IntentionSpec:
    return IntentionSpec.from_config(cfg.game.get("intention"), cfg.game["name"])


def load_corpus(cfg: IntentionSettings) -> tuple[Corpus, list[dict], list[Path]]:
    files = input_files(cfg.input)
    records, sources = read_inputs(files, cfg.game["name"])
    agg = cfg.aggregation
    # The release's adv mode averages undiscounted rewards (reward_utils.py appends the raw reward
    # unless value_type == 'q'), so its discount convention for adv is gamma = 1.
    gamma = 1.0 if agg.discount == "original" and agg.mode == "adv" else agg.gamma
    corpus = build_corpus(records, game_spec(cfg), gamma=gamma, use_precomputed=cfg.embedding.use_precomputed,
                          discount=agg.discount, sources=sources)
    if corpus.table.num_steps == 0:
        raise DataError(files[0], None, None, "no agent steps to aggregate (every game empty or failed)")
    return corpus, records, files


def _check_records(cfg: IntentionSettings, records: list[dict], sources: Mapping[str, tuple[Any, int]]) -> None:
    """Before three steps of work, each finished game named at its file and line where: a trained
    step's prompt cannot be rendered (step 4 renders them; a two-player game's system prompt
    missing from ``meta``), or a game this code played (``source: collected``) breaks the rules it
    was played under (a ``success: true`` whose last question names no target would be labelled a
    win; the length rule with the ``max_turns`` of the file's producer record, where it has one).
    Imported games keep the outcome their importer decided."""
    family = family_of(cfg.game)
    render = family.observation_renderer(cfg.game)
    trained = set(game_spec(cfg).trained)
    rules: dict[Path, Callable[[dict], str | None]] = {}
    for record in records:
        if record.get("status") == "failed":
            continue
        path, line = sources[record["game_id"]]
        if path not in rules:
            rules[path] = family.rules(cfg.game, read_producer(path))
        if record.get("source") == "collected" and (problem := rules[path](record)):
            raise DataError(path, line, None, f"game {record['game_id']!r} {problem} (the file's games are "
                                                 "checked against the rules they were played under)")
        with located(path, line):
            for i, turn in enumerate(record["turns"]):
                if "players" not in record or turn["role"] in trained:
                    render(record, i)


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` layout with fixed zip timestamps, so equal arrays give byte-equal files."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with archive.open(info, "w", force_zip64=True) as handle:
                np.lib.format.write_array(handle, np.asarray(arrays[name]), allow_pickle=False)
    atomic_write_bytes(path, buffer.getvalue())


def _load_npz(path: Path, step: int) -> dict[str, np.ndarray]:
    """The arrays step ``step`` wrote to ``path``; a file that is not such an archive (empty,
    truncated, replaced) is a refusal naming it and the step to re-run."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise StaleStep(step, f"no {path.name} in {path.parent}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise StaleStep(step, f"{path} cannot be read as step {step}'s arrays ({type(error).__name__}: {error})") from None


# ---- step 1: preprocess -> embed -> cluster every k -------------------------------------
def check_settings(cfg: Mapping | IntentionSettings) -> IntentionSettings:
    """The labelling's settings (a composed config, a dict a caller built, or settings already
    checked) checked in one line naming the setting before any step reads or embeds anything: their
    types and ranges (:mod:`aria.intention.settings`), then what they name from a registry or from
    each other. Every step and every reader of a labelled run starts here."""
    game = cfg.game if isinstance(cfg, IntentionSettings) else cfg["game"]
    cfg = replace(typed(IntentionSettings, cfg, "intention"), game=game)  # the game as its family checked it
    check_clustering(cfg.clustering)
    check_labels(cfg)
    check_selection(cfg)
    agg = cfg.aggregation
    if agg.discount not in DISCOUNTS:
        raise ConfigError(f"aggregation.discount: unknown {agg.discount!r} (known: {', '.join(DISCOUNTS)})")
    if agg.mode not in AGGREGATION_MODES:
        raise ConfigError(f"aggregation.mode: unknown {agg.mode!r} (known: {', '.join(AGGREGATION_MODES)})")
    check_embedder(cfg.embedder)
    return cfg


def _settings(cfg: Mapping | IntentionSettings) -> IntentionSettings:
    """Settings a step has checked already (an :class:`IntentionSettings`) as they are; a mapping
    from another caller (the grouping tool, the runner's pre-flight) checked first."""
    return cfg if isinstance(cfg, IntentionSettings) else check_settings(cfg)


def check_overrides_of(game: str, overrides: list[str], setting: str) -> IntentionSettings:
    """The labelling another command runs for ``game`` under ``overrides`` (the experiment's
    ``intention_overrides``, the online trainer's), composed and checked as :func:`check_settings`
    checks a step's, a problem one line naming ``setting``: before any training, not at the
    labelling an iteration or two in."""
    composed = check_overrides("intention", [f"game={game}", "input=games.jsonl", *overrides], setting)
    try:
        return check_settings(composed)
    except ValueError as err:  # ConfigError included
        raise ConfigError(f"{setting}: {str(err).removeprefix('intention: ')}") from None


def check_clustering(clustering: ClusteringSettings) -> None:
    """Reject a bad clustering section in one line, before anything is read or embedded (its
    ranges were checked with its types, :mod:`aria.intention.settings`)."""
    if clustering.method not in CLUSTERINGS:
        raise ValueError(f"clustering.method: unknown {clustering.method!r} (known: {sorted(CLUSTERINGS)})")
    if clustering.k_max < clustering.k_min:
        raise ValueError(f"clustering.k_max: expected an integer >= clustering.k_min ({clustering.k_min}), "
                         f"got {clustering.k_max}")


def _step1_settings(cfg: IntentionSettings, corpus: Corpus, files: list[Path]) -> dict:
    """What step 1's outputs are made from (their fingerprint is its digest)."""
    return {"version": PIPELINE_VERSION, "input": file_digest(files), "pools": {p: text_digest(t) for p, t in corpus.pools.items()},
            "embedder": cfg.embedder, "use_precomputed": cfg.embedding.use_precomputed,
            "clustering": asdict(cfg.clustering), "seed": cfg.seed}


def step1_embed_and_cluster(cfg: Mapping | IntentionSettings, echo: Printer = print) -> dict:
    cfg = check_settings(cfg)
    run_dir = Path(cfg.run_dir)
    corpus, records, files = load_corpus(cfg)
    # here only: the later steps refuse trajectories other than those step 1 read
    _check_records(cfg, records, corpus.sources)
    settings = _step1_settings(cfg, corpus, files)
    fingerprint = json_digest(settings)
    summary_path, labels_path = run_dir / "utterances.json", run_dir / "labels.npz"
    if (summary := _up_to_date_json(summary_path, fingerprint)) is not None \
            and _stamp(labels_path) == _stamp(run_dir / "embeddings.npz") == fingerprint:
        echo(f"[step 1] up to date: {labels_path}")
        behavioural_labels(cfg, corpus, echo)
        return summary
    # utterances.json is written last and says the arrays beside it are complete: gone until they
    # are, so a run stopped half-way under other settings is never taken for a finished one
    summary_path.unlink(missing_ok=True)

    embeddings, sources = _embed_pools(cfg, corpus, run_dir, echo)
    _save_npz(run_dir / "embeddings.npz", {**{pool: x for pool, x in embeddings.items()}, "fingerprint": np.array(fingerprint)})
    ks, labels, distinct, info = _cluster_pools(cfg, corpus, embeddings, run_dir / "labels.partial.npz", fingerprint, echo)
    dtype = np.int16 if max(ks) < 2**15 else np.int32
    _save_npz(labels_path, {"ks": np.array(ks, dtype=np.int32), **{p: a.astype(dtype) for p, a in labels.items()},
                            "fingerprint": np.array(fingerprint)})
    (run_dir / "labels.partial.npz").unlink(missing_ok=True)
    summary = {
        "fingerprint": fingerprint, "game": cfg.game["name"], "inputs": [str(f) for f in files],
        "input_digest": settings["input"], "pool_digests": settings["pools"],
        "num_games": len(corpus.game_ids), "num_steps": int(corpus.table.num_steps),
        "num_utterances": int(len(corpus.table.utterance_game)),
        "skipped": corpus.skipped,
        "pools": {p: {"texts": t, "embedding": sources[p], "dim": int(embeddings[p].shape[1]),
                      "distinct_vectors": distinct[p], "occurrences": int(corpus.text_counts(p).sum()),
                      "clustering": info[p]} for p, t in corpus.pools.items()},
        "ks": ks, "clustering": asdict(cfg.clustering),
        # what a tool reading this run later rebuilds its config from (aria.experiment.grouping.run_config):
        # the game as it ran (targets, trained roles), not the game's defaults
        "made_under": {"game": cfg.game, "embedding": asdict(cfg.embedding), "behaviour": cfg.behaviour},
    }
    atomic_write_json(summary_path, summary)
    behavioural_labels(cfg, corpus, echo)
    if corpus.skipped:
        echo(f"[step 1] skipped {len(corpus.skipped)} game(s): " + ", ".join(
            f"{s['game_id']} ({s['reason']})" for s in corpus.skipped[:5]) + (" ..." if len(corpus.skipped) > 5 else ""))
    echo(f"[step 1] wrote {summary_path}, {run_dir / 'embeddings.npz'}, {labels_path} "
         f"({len(corpus.game_ids)} games, {corpus.table.num_steps} steps, k={ks[0]}..{ks[-1]})")
    return summary


def _embed_pools(cfg: IntentionSettings, corpus: Corpus, run_dir: Path, echo: Printer) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every pool's vectors, and where they came from: each distinct text embedded once (the model
    loaded only if a text is not in the run's cache), or the trajectories' own precomputed vectors."""
    embeddings: dict[str, np.ndarray] = {}
    sources: dict[str, str] = {}
    embedder = None

    def get_embedder():
        nonlocal embedder
        if embedder is None:
            embedder = build_embedder(cfg.embedder)
        return embedder

    for pool, texts in corpus.pools.items():
        if corpus.precomputed.get(pool) is not None:
            embeddings[pool] = corpus.precomputed[pool]
            sources[pool] = "precomputed (from the trajectories)"
            continue
        name = embedder_name(cfg.embedder)
        cache = EmbeddingCache(run_dir / "embedding_cache", embedder_key(cfg.embedder))
        start = time.perf_counter()
        embeddings[pool], new = cache.embed(texts, get_embedder, batch_size=cfg.embedding.save_every,
                                            progress=lambda d, n: echo(f"[step 1] {pool}: embedded {d}/{n} new texts"))
        sources[pool] = name
        echo(f"[step 1] {pool}: {len(texts)} distinct texts, {new} newly embedded with {name} "
             f"in {time.perf_counter() - start:.1f}s")
    for pool, x in embeddings.items():
        _check_matrix(corpus, pool, x)
    return embeddings, sources


def _cluster_pools(cfg: IntentionSettings, corpus: Corpus, embeddings: dict[str, np.ndarray], partial_path: Path, fingerprint: str,
                   echo: Printer) -> tuple[list[int], dict[str, np.ndarray], dict[str, int], dict[str, dict]]:
    """Every pool clustered for every k: the ks, each pool's labels (one row a k), its distinct
    vectors, and what its sweep did. Progress is kept in ``partial_path``. The range is clipped to
    the largest pool; a pool with fewer distinct vectors than k keeps its finest labelling (Guess
    My City's oracle answers are far fewer than its questions)."""
    clustering = cfg.clustering
    distinct = {pool: distinct_points(x) for pool, x in embeddings.items()}
    ks = k_range(clustering.k_min, clustering.k_max, max(distinct.values()))
    try:
        partial = _load_npz(partial_path, 1) if partial_path.is_file() else {}
    except StaleInput:  # progress only: start the sweep again
        echo(f"[step 1] {partial_path} cannot be read: clustering every k again")
        partial = {}
    if partial.get("fingerprint", np.array("")).item() != fingerprint:
        partial = {}
    labels: dict[str, np.ndarray] = {}
    by_occurrence = clustering.weight == "occurrences"
    info: dict[str, dict] = {}  # what each pool's sweep did (k-means: the PCA's kept variance)
    for pool, x in embeddings.items():
        done = {int(k): partial[f"{pool}/{k}"] for k in ks if f"{pool}/{k}" in partial}
        start = time.perf_counter()
        last_save = [time.perf_counter()]

        def keep(k: int, lab: np.ndarray, pool: str = pool) -> None:
            partial[f"{pool}/{k}"] = lab
            if time.perf_counter() - last_save[0] > 20:
                _save_npz(partial_path, {**partial, "fingerprint": np.array(fingerprint)})
                last_save[0] = time.perf_counter()
                echo(f"[step 1] {pool}: clustered k={k} ({len([n for n in partial if n.startswith(pool + '/')])}/{len(ks)})")

        pool_ks = [k for k in ks if k <= distinct[pool]] or [1]
        weight = corpus.text_counts(pool) if by_occurrence else None
        info[pool] = {}
        pool_labels = cluster_all_k(x, pool_ks, clustering.method, seed=cfg.seed, done=done, on_result=keep,
                                    sample_weight=weight, info=info[pool], **clustering.sweep_options())
        labels[pool] = np.stack([pool_labels[min(i, len(pool_ks) - 1)] for i in range(len(ks))])
        projected = (f" on {info[pool]['pca_dim']} principal components ({info[pool]['pca_variance_kept']:.0%} of the "
                     f"variance)" if info[pool].get("pca_dim") else "")
        echo(f"[step 1] {pool}: {clustering.method}{projected} for k={pool_ks[0]}..{pool_ks[-1]} in {time.perf_counter() - start:.1f}s"
             + (f" (only {distinct[pool]} distinct vectors: larger k keep k={pool_ks[-1]})" if pool_ks[-1] < ks[-1] else "")
             + (f" ({len(done)} ks resumed)" if done else ""))
    return ks, labels, distinct, info


def _check_matrix(corpus: Corpus, pool: str, x: np.ndarray) -> None:
    """Reject zero or non-finite embeddings, naming a game and turn where the text occurs."""
    if x.ndim != 2 or len(x) != len(corpus.pools[pool]):
        raise ValueError(f"pool {pool!r}: expected {len(corpus.pools[pool])} embeddings, got shape {x.shape}")
    bad = ~np.isfinite(x).all(axis=1) | ~np.any(x, axis=1)
    if bad.any():
        text = int(np.argmax(bad))
        u = int(np.flatnonzero((corpus.utterance_pool == list(corpus.pools).index(pool)) & (corpus.utterance_value == text))[0])
        game = corpus.game_ids[int(corpus.table.utterance_game[u])]
        path, line = corpus.sources.get(game, (None, None))
        raise DataError(path, line, "embedding", f"game {game!r}, utterance {int(corpus.table.utterance_position[u])}: "
                        f"the embedding of {corpus.pools[pool][text][:60]!r} is zero or not finite")


# ---- behavioural intentions: the exact partition of a question game (docs/method.md §4) ----
#: Part of behaviour.json's fingerprint: bump it when what a signature holds changes.
BEHAVIOUR_VERSION = 1


def check_labels(cfg: IntentionSettings) -> None:
    """Reject ``labels`` and ``behaviour`` settings that contradict each other or the game in one
    line, before anything is read: behavioural labels without behavioural intentions, or on a game
    that cannot have them (each one's own values are checked with its type)."""
    if cfg.labels == "behavioural" and cfg.behaviour == "never":
        raise ValueError("labels: behavioural needs the behavioural intentions; set behaviour: auto (not never)")
    if (cfg.labels == "behavioural" or cfg.behaviour == "required") and not has_offline_oracle(cfg.game):
        raise ValueError(f"game {cfg.game['name']}: no offline oracle (facts_file) to compute behavioural intentions "
                         f"from; use labels: clusters and behaviour: auto")


def has_offline_oracle(game_cfg: dict) -> bool:
    """Whether behavioural intentions can be computed for the game: a question game with a facts file."""
    return family_of(game_cfg).kind == "question" and bool(game_cfg.get("facts_file"))


def behavioural_labels(cfg: Mapping | IntentionSettings, corpus: Corpus, echo: Printer = print) -> dict[str, np.ndarray] | None:
    """One behavioural intention id per distinct text of every pool (:mod:`aria.intention.behaviour`),
    or None where they are not computed (``behaviour: never``, or ``auto`` on a game without an
    offline oracle). The pools of trained channels are partitioned by their answer signatures over
    every target; other pools (Guess My City's free-form answers) by their exact text, since the
    oracle's answer is a function of (question, target). Cached in ``run_dir/behaviour.json`` under a
    fingerprint of the pools' texts and the game, so the oracle answers each text once."""
    cfg = _settings(cfg)
    game_cfg = dict(cfg.game)
    if cfg.behaviour == "never" or not has_offline_oracle(game_cfg):  # check_labels refused what needs them
        return None

    path = Path(cfg.run_dir) / "behaviour.json"
    fingerprint = json_digest({"version": BEHAVIOUR_VERSION, "pools": {p: text_digest(t) for p, t in corpus.pools.items()},
                               "game": game_cfg, "facts": file_digest([dataset_file(game_cfg["facts_file"])])})
    if (cached := _up_to_date_json(path, fingerprint)) is not None:
        return {p: np.asarray(v["labels"], dtype=np.int64) for p, v in cached["pools"].items()}
    spec = game_spec(cfg)
    trained_pools = {spec.rule(c).pool for c in spec.trained}
    game, oracle = build_game(game_cfg), build_oracle({"name": "knowledge_base"}, game_cfg)
    start = time.perf_counter()
    pools, found = {}, {}
    for pool, texts in corpus.pools.items():
        if pool in trained_pools:
            signature = signatures(game, oracle, texts)
            ids = partition(signature)
            pools[pool] = {"kind": "answer signature over every target", "labels": [ids[t] for t in texts]}
            asked = [t for t in texts if game.extract_question(t) is not None]
            alike = [t for t in asked if len(set(signature[t].answers)) == 1 and not signature[t].wins]
            found[pool] = {"texts": len(texts), "intentions": len(set(ids.values())), "questions": len(asked),
                           "answered_alike": len(alike)}
        else:
            pools[pool] = {"kind": "exact text", "labels": list(range(len(texts)))}
            found[pool] = {"texts": len(texts), "intentions": len(texts)}
    atomic_write_json(path, {"fingerprint": fingerprint, "game": game_cfg["name"], "targets": len(game.targets),
                             "summary": found, "pools": pools})
    counts = ", ".join(f"{pool}: {f['intentions']} intentions in {f['texts']} texts" for pool, f in found.items())
    echo(f"[behaviour] {counts} ({len(game.targets)} targets, {time.perf_counter() - start:.1f}s); wrote {path}")
    return {p: np.asarray(v["labels"], dtype=np.int64) for p, v in pools.items()}


# ---- step 2: aggregate for every k and choose k ------------------------------------------
def _labels_at(corpus: Corpus, labels: dict[str, np.ndarray], index: dict[str, int]) -> np.ndarray:
    return corpus.utterance_labels({p: labels[p][index[p]] for p in corpus.pools})


def check_selection(cfg: IntentionSettings) -> None:
    """``selection.fixed_k`` (null, an int, or one k per pool of the game) and ``selection.criterion``,
    in one line before any work: step 1 checks them too, so a typo is named before the embedding,
    not after it at step 2."""
    if _fixed_k(cfg.selection, list(game_spec(cfg).pools)) is None and cfg.selection.criterion not in SELECTORS:
        raise ConfigError(f"selection.criterion: unknown {cfg.selection.criterion!r} (known: "
                          f"{', '.join(SELECTORS)}, or set selection.fixed_k)")


def _fixed_k(selection: SelectionSettings, pools: list[str]) -> dict[str, int] | None:
    fixed = selection.fixed_k

    def whole(k) -> bool:
        return isinstance(k, int) and not isinstance(k, bool) and k >= 1

    if fixed is None:
        return None
    if whole(fixed):
        return {p: fixed for p in pools}
    if not isinstance(fixed, Mapping) or not all(whole(k) for k in fixed.values()):
        raise ConfigError(f"selection.fixed_k: expected null, a whole number >= 1 or {{pool: k}}, got {fixed!r}")
    missing, unknown = [p for p in pools if p not in fixed], [p for p in fixed if p not in pools]
    if missing or unknown:
        raise ConfigError("selection.fixed_k: " + (f"no k for pool(s) {missing}" if missing else "")
                          + ("; " if missing and unknown else "") + (f"pool(s) {unknown} not in the game's {pools}" if unknown else ""))
    return {p: int(fixed[p]) for p in pools}


#: What each figure of selection.json is, written into the file beside them.
SELECTION_NOTES = {
    "split_score": "mean |R~(k+1) - R~(k)| over the agent steps kept at both k (docs/method.md §4), R~ under "
                   "the whole-history keys when selection.keys is whole_history; the last k has none",
    "variance_raw": "population variance of the step returns R over the steps kept at each k",
    "variance_aggregated": "population variance of R~ = Q over the same kept steps; Var(R~) <= Var(R) there "
                           "(law of total variance); variance.all_steps gives both over every step",
    "silhouette": "on a seeded sample of silhouette_sample_size utterances per pool; pools averaged",
    "intention_recovery": "adjusted Rand index and normalised mutual information between the labels of "
                          "the agent steps whose turn records its true intention and those intentions, "
                          "at every k (only when some turn records one)",
    "behaviour": "the labels at every k against the game's behavioural intentions (behaviour.json: "
                 "utterances alike when the offline oracle answers them alike for every target): ARI and NMI "
                 "over the agent steps, and R~ at every k against R~ aggregated with the behavioural labels: "
                 "mse = bias_squared (clusters merging intentions) + variance_within (clusters splitting "
                 "them), aria.intention.aggregate.error_against; variance: Var(R~(k)) over every step",
    "indices": "silhouette, Calinski-Harabasz and Davies-Bouldin count every occurrence of a text when "
               "clustering.weight is occurrences (as the clustering does), each text once when distinct",
}


def step2_select_k(cfg: Mapping | IntentionSettings, echo: Printer = print) -> dict:
    cfg = check_settings(cfg)
    run_dir = Path(cfg.run_dir)
    summary = step_output(run_dir / "utterances.json", 1)
    selection_cfg, agg_cfg = cfg.selection, cfg.aggregation
    corpus, _, files = load_corpus(cfg)
    _check_inputs(summary, corpus, files)
    if json_digest(_step1_settings(cfg, corpus, files)) != summary["fingerprint"]:
        raise StaleStep(1, "utterances.json was made under other settings of step 1 than these (embedder, embedding, "
                            f"clustering or seed; it clustered with {summary.get('clustering')})")
    scoring = _deciding_selection(asdict(selection_cfg), agg_cfg.window)
    fingerprint = json_digest({"step1": summary["fingerprint"], "selection": scoring, "aggregation": asdict(agg_cfg),
                               "behaviour": cfg.behaviour, "labels": cfg.labels, "report": SELECTION_VERSION})
    out_path = run_dir / "selection.json"
    if (selection := _step2_up_to_date(out_path, fingerprint, summary)) is not None:
        echo(f"[step 2] up to date: {out_path}")
        return selection
    labels, embeddings = (_load_npz(run_dir / name, 1) for name in ("labels.npz", "embeddings.npz"))
    _check_stamp(labels, "labels.npz", summary)
    _check_stamp(embeddings, "embeddings.npz", summary)
    ks = [int(k) for k in labels["ks"]]

    start = time.perf_counter()
    q_at_k, scored, variance = _aggregate_every_k(corpus, labels, ks, agg_cfg, paper_keys="keys" in scoring)
    aggregation_s = time.perf_counter() - start
    start = time.perf_counter()
    per_pool = _cluster_indices(corpus, embeddings, labels, ks, summary, selection_cfg, cfg.seed)
    metrics_s = time.perf_counter() - start
    curves = _curves(ks, scored, per_pool, list(corpus.pools))
    recovery = _intention_recovery(corpus, labels, ks)
    behaviour = behavioural_labels(cfg, corpus, echo)
    against = _against_behaviour(corpus, labels, ks, behaviour, q_at_k, agg_cfg) if behaviour is not None else None
    claim = variance_claim(ks, variance["raw_kept"], variance["aggregated_kept"])
    chosen, choices = _chosen_k(curves, ks, list(corpus.pools), selection_cfg)
    report = {
        "fingerprint": fingerprint, "step1_fingerprint": summary["fingerprint"], "game": summary["game"], "ks": ks,
        "chosen": chosen, "choices_by_criterion": choices,
        "settings": {"aggregation": asdict(agg_cfg), "selection": asdict(selection_cfg)}, "labels": cfg.labels,
        "num_steps": int(corpus.table.num_steps), "num_games": len(corpus.game_ids),
        "curves": {**curves, "variance_raw": variance["raw_kept"], "variance_aggregated": variance["aggregated_kept"],
                   "kept_fraction": variance["kept_fraction"]},
        "variance": {
            "kept_steps": {"raw": variance["raw_kept"], "aggregated": variance["aggregated_kept"]},
            "all_steps": {"raw": float(corpus.table.step_return.var()), "aggregated": variance["aggregated_all"]},
            "claim": claim,
        },
        "per_pool": per_pool,
        **({"intention_recovery": recovery} if recovery else {}),
        **({"behaviour": against} if against else {}),
        "notes": SELECTION_NOTES,
    }

    # the plot first: the report is what a re-run takes as "step 2 done", so it is written last
    plot_selection(report, run_dir / "selection.png")
    atomic_write_json(out_path, report)
    echo(_choice_line(report, variance))
    echo(f"[step 2] wrote {out_path} and {run_dir / 'selection.png'} (aggregation for {len(ks)} ks {aggregation_s:.2f}s, "
         f"cluster indices {metrics_s:.2f}s)")
    return report


def _step2_up_to_date(out_path: Path, fingerprint: str, summary: dict) -> dict | None:
    """Step 2's report when it was made under ``fingerprint`` and the arrays of step 1 beside it are
    intact (step 3 reads the labels too: an archive damaged since is step 1's to make again)."""
    selection = _up_to_date_json(out_path, fingerprint)
    if selection is not None:
        for name in ("labels.npz", "embeddings.npz"):
            if _stamp(out_path.parent / name) != summary["fingerprint"]:
                _check_stamp(_load_npz(out_path.parent / name, 1), name, summary)
    return selection


def _curves(ks: list[int], scored: np.ndarray, per_pool: dict, pools: list[str]) -> dict[str, list[float]]:
    """The criteria's curves over k: SplitScore (none at the last k) and the cluster indices, pools averaged."""
    return {
        "split_score": [*split_scores(ks, scored).tolist(), float("nan")] if len(ks) > 1 else [float("nan")],
        **{m: np.nanmean([per_pool[p][m] for p in pools], axis=0).tolist() if _any_finite(per_pool, pools, m)
           else [float("nan")] * len(ks) for m in ("silhouette", "calinski_harabasz", "davies_bouldin")},
    }


def _choice_line(report: dict, variance: dict[str, list[float]]) -> str:
    """What step 2 chose, and the variances of the steps kept at that k."""
    chosen, claim, ks = report["chosen"], report["variance"]["claim"], report["ks"]
    k_text = ", ".join(f"{p}: k={k}" for p, k in chosen["k"].items())
    at = ks.index(next(iter(chosen["k"].values())))
    return (f"[step 2] {chosen['criterion']} chose {k_text} ({chosen['why']}); on the {variance['kept_fraction'][at]:.0%} "
            f"of steps kept there Var(R)={variance['raw_kept'][at]:.4f}, Var(R~)={variance['aggregated_kept'][at]:.4f}"
            + ("" if claim["holds"] else f"; Var(R~) > Var(R) at k={claim['violations']}"))


def _aggregate_every_k(corpus: Corpus, labels, ks: list[int], agg_cfg: AggregationSettings,
                       paper_keys: bool) -> tuple[np.ndarray, np.ndarray, dict[str, list[float]]]:
    """R~ (as Q) at every k; the R~ SplitScore reads (under the aggregation's own keys, or under the
    paper's whole-history keys, so that a windowed variant trains at the k the paper's method
    chooses: only the keys differ between them); and Var(R), Var(R~) on the steps kept at each k
    (the n_rollout filter and the first-action rule keep whole nodes, so R~ is still a conditional
    mean of R on them)."""
    pools = list(corpus.pools)
    returns = corpus.table.step_return
    q_at_k = np.empty((len(ks), corpus.table.num_steps))
    scored = np.empty((len(ks), corpus.table.num_steps))
    variance: dict[str, list[float]] = {"raw_kept": [], "aggregated_kept": [], "aggregated_all": [], "kept_fraction": []}
    for i in range(len(ks)):
        at_k = _labels_at(corpus, labels, {p: i for p in pools})
        agg = aggregate(corpus.table, at_k, **agg_cfg.aggregate_args())
        q_at_k[i] = agg.q
        scored[i] = aggregate(corpus.table, at_k, **{**agg_cfg.aggregate_args(), "window": None}).reward if paper_keys else agg.reward
        variance["raw_kept"].append(float(returns[agg.kept].var()) if agg.kept.any() else float("nan"))
        variance["aggregated_kept"].append(float(agg.q[agg.kept].var()) if agg.kept.any() else float("nan"))
        variance["aggregated_all"].append(float(agg.q.var()))
        variance["kept_fraction"].append(float(agg.kept.mean()))
    return q_at_k, scored, variance


def _cluster_indices(corpus: Corpus, embeddings, labels, ks: list[int], summary: dict, selection_cfg: SelectionSettings,
                     seed: int) -> dict[str, dict[str, Any]]:
    """Silhouette, Calinski-Harabasz and Davies-Bouldin at every k, per pool, weighted as step 1 clustered."""
    per_pool: dict[str, dict[str, Any]] = {}
    by_occurrence = summary["clustering"].get("weight", "occurrences") == "occurrences"
    for pool in corpus.pools:
        x, lab = embeddings[pool], labels[pool]
        quality = ClusterQuality(x, corpus.text_counts(pool) if by_occurrence else None,
                                 selection_cfg.silhouette_sample, seed)
        scores = [quality.scores(lab[i]) for i in range(len(ks))]
        per_pool[pool] = {
            **{m: [sc[m] for sc in scores] for m in ("silhouette", "calinski_harabasz", "davies_bouldin")},
            "clusters_found": [int(lab[i].max()) + 1 for i in range(len(ks))],
            "silhouette_sample_size": quality.sample_size,
        }
    return per_pool


def _chosen_k(curves: dict, ks: list[int], pools: list[str], selection_cfg: SelectionSettings) -> tuple[dict, dict]:
    """The k each criterion chooses, and the one this run takes: ``selection.fixed_k`` if set, else
    ``selection.criterion``'s."""
    choices = {name: _choice_json(choose_k(name, curves, ks, selection_cfg.epsilon, selection_cfg.tau))
               for name in SELECTORS}
    fixed = _fixed_k(selection_cfg, pools)
    if fixed is not None:
        bad = {p: k for p, k in fixed.items() if k not in ks}
        if bad:
            raise ValueError(f"selection.fixed_k {bad} outside the clustered range {ks[0]}..{ks[-1]}")
        return {"k": fixed, "criterion": "fixed_k", "rule_satisfied": True, "why": "selection.fixed_k"}, choices
    if selection_cfg.criterion not in choices:
        raise ValueError(f"unknown selection.criterion {selection_cfg.criterion!r} (known: {sorted(choices)}, "
                         f"or set selection.fixed_k)")
    c = choices[selection_cfg.criterion]
    return {"k": {p: c["k"] for p in pools}, "criterion": selection_cfg.criterion,
            "rule_satisfied": c["rule_satisfied"], "why": c["why"]}, choices


@dataclass
class LabelledRun:
    """A run whose steps 1 and 2 are done, read and checked to belong together and to the games
    they came from: what the pre-flight, step 3 and the grouping comparison read."""

    run_dir: Path
    summary: dict                  # step 1's utterances.json
    selection: dict                # step 2's selection.json
    corpus: Corpus
    records: list[dict]            # the games, as read
    ks: list[int]                  # the k that step 1 clustered
    labels: dict[str, np.ndarray]  # labels.npz: per pool, one row of labels per k

    @property
    def chosen(self) -> dict[str, int]:
        """Step 2's k, per pool."""
        k = (self.selection.get("chosen") or {}).get("k")
        if not isinstance(k, dict):
            raise DataError(self.run_dir / "selection.json", None, "chosen.k", f"{k!r} is not a k per pool "
                            f"(for example {{\"{next(iter(self.corpus.pools))}\": 8}}); re-run step 2")
        return k

    def labels_at(self, k: dict[str, int]) -> np.ndarray:
        """Every utterance's cluster with each pool cut at its k (a k step 1 clustered)."""
        for pool in self.corpus.pools:
            if k.get(pool) not in self.ks:
                # a selection.json edited by hand, or a fixed k that step 1's range does not hold
                raise DataError(self.run_dir / "selection.json", None, f"chosen.k.{pool}",
                                f"k = {k.get(pool)!r} was not clustered by step 1 (it clustered k = {self.ks[0]}.."
                                f"{self.ks[-1]}, {len(self.ks)} values); choose one of those, or re-run step 1 with a "
                                f"range that holds it")
        return _labels_at(self.corpus, self.labels, {p: self.ks.index(k[p]) for p in self.corpus.pools})


def read_labelled_run(cfg: Mapping | IntentionSettings) -> LabelledRun:
    cfg = _settings(cfg)
    run_dir = Path(cfg.run_dir)
    summary = step_output(run_dir / "utterances.json", 1)
    selection = step_output(run_dir / "selection.json", 2)
    if selection.get("step1_fingerprint") != summary["fingerprint"]:
        raise StaleStep(2, "selection.json was made from another run of step 1")
    corpus, records, files = load_corpus(cfg)
    _check_inputs(summary, corpus, files)
    labels = _load_npz(run_dir / "labels.npz", 1)
    _check_stamp(labels, "labels.npz", summary)
    return LabelledRun(run_dir, summary, selection, corpus, records, [int(k) for k in labels["ks"]], labels)


def preflight(cfg: Mapping | IntentionSettings, fixed_ks: list[int]) -> dict:
    """Intention-key sharing (:func:`~aria.intention.aggregate.key_sharing`) of a labelled run
    (steps 1-2 done) at the chosen k, at each of ``fixed_ks`` that step 1 clustered, and under the
    behavioural intentions where the game has them: whether aggregation can change anything on
    these games, said before any training. Keys as ``aggregation.window`` cuts them."""
    cfg = _settings(cfg)
    run = read_labelled_run(cfg)
    check_step2_settings(run.selection, cfg)
    corpus, window = run.corpus, cfg.aggregation.window

    def row(k: dict, utterance_labels: np.ndarray, **marks) -> dict:
        return {"k": k, **marks, **key_sharing(corpus.table, utterance_labels, corpus.step_turn, window=window)}

    # ``chosen``: step 2's k; ``trained``: the labels step 3 gave the training set (the behavioural row
    # under ``labels: behavioural``, where step 2's choice is reported but not used)
    on_clusters = cfg.labels != "behavioural"
    rows = [row(run.chosen, run.labels_at(run.chosen), chosen=True, trained=on_clusters)]
    for k in fixed_ks:
        fixed = {p: k for p in corpus.pools}
        if k in run.ks and fixed != run.chosen:  # the chosen k has its row already
            rows.append(row(fixed, run.labels_at(fixed), chosen=False, trained=False))
    behaviour = behavioural_labels(cfg, corpus, lambda line: None)
    if behaviour is not None:
        rows.append(row({p: int(len(np.unique(v))) for p, v in behaviour.items()}, corpus.utterance_labels(behaviour),
                        chosen=False, trained=not on_clusters, labels="behavioural"))
    return {"steps": int(corpus.table.num_steps), "games": len(corpus.game_ids), "window": window,
            "labels": cfg.labels, "rows": rows}


def _intention_recovery(corpus, labels: dict[str, np.ndarray], ks: list[int]) -> dict | None:
    """ARI and NMI of the step labels against the recorded intentions at every k (None when no
    step records one). A label is (pool, cluster), so two-player pools never share a label."""
    known = [i for i, x in enumerate(corpus.step_intention) if x is not None]
    if not known:
        return None
    truth = [corpus.step_intention[i] for i in known]
    utterances = corpus.table.step_utterance[known]
    pool_of = corpus.utterance_pool[utterances]
    scores = []
    for i in range(len(ks)):
        step_labels = _labels_at(corpus, labels, {p: i for p in corpus.pools})[utterances]
        scores.append(intention_recovery(truth, pool_of * (max(ks) + 1) + step_labels))
    return {"steps": len(known), "intentions": len(set(truth)),
            "ari": [s["ari"] for s in scores], "nmi": [s["nmi"] for s in scores]}


def _against_behaviour(corpus: Corpus, labels: dict[str, np.ndarray], ks: list[int], behaviour: dict[str, np.ndarray],
                       q_at_k: np.ndarray, agg_cfg: AggregationSettings) -> dict:
    """Step 1's labels at every k against the behavioural partition (the pipeline's ``behaviour``
    section of selection.json). A label is (pool, id), as in :func:`_intention_recovery`."""
    steps = corpus.table.step_utterance
    pool_of = corpus.utterance_pool[steps]
    exact = corpus.utterance_labels(behaviour)
    truth = pool_of * (int(exact.max(initial=0)) + 1) + exact[steps]
    scores = [intention_recovery(truth, pool_of * (max(ks) + 1) + _labels_at(corpus, labels, {p: i for p in corpus.pools})[steps])
              for i in range(len(ks))]
    q_exact = aggregate(corpus.table, exact, **agg_cfg.aggregate_args()).q
    errors = errors_against(corpus.table, q_at_k, exact, agg_cfg.window)
    return {"intentions": {p: int(len(np.unique(v))) for p, v in behaviour.items()},
            "step_intentions": int(len(np.unique(truth))),
            "ari": [s["ari"] for s in scores], "nmi": [s["nmi"] for s in scores],
            **{name: [e[name] for e in errors] for name in ("mse", "bias_squared", "variance_within")},
            "mean_abs_difference": np.abs(q_at_k - q_exact).mean(axis=1).tolist(),
            "variance": q_at_k.var(axis=1).tolist(), "variance_behavioural": float(q_exact.var()),
            "sharing_behavioural": key_sharing(corpus.table, exact, corpus.step_turn, window=agg_cfg.window)}


def variance_claim(ks: list[int], raw: list[float], aggregated: list[float], rtol: float = 1e-9) -> dict:
    """The paper's claim Var(R~) <= Var(R), checked at every k on the same (kept) steps."""
    violations = [k for k, r, a in zip(ks, raw, aggregated) if np.isfinite(r) and np.isfinite(a) and a > r * (1 + rtol) + 1e-15]
    return {"statement": "Var(R~) <= Var(R) on the steps kept at each k", "holds": not violations, "violations": violations}


def _any_finite(per_pool, pools, metric) -> bool:
    return any(np.isfinite(per_pool[p][metric]).any() for p in pools)


def _choice_json(choice) -> dict:
    return {"k": choice.k, "rule_satisfied": choice.rule_satisfied, "why": choice.why}


# ---- step 3: apply the chosen labels -------------------------------------------------------
def step3_apply_labels(cfg: Mapping | IntentionSettings, echo: Printer = print) -> Path:
    cfg = check_settings(cfg)
    run = read_labelled_run(cfg)
    run_dir, selection, corpus, records = run.run_dir, run.selection, run.corpus, run.records
    out_path = run_dir / "labelled.jsonl"
    check_step2_settings(selection, cfg)
    fingerprint = _step3_fingerprint(selection, cfg.labels)
    meta_path = run_dir / "labelled.meta.json"
    chosen = run.chosen
    if _up_to_date(out_path, meta_path, fingerprint, "labelled_digest") and _at_chosen_k(read_json(meta_path), chosen, cfg.labels):
        echo(f"[step 3] up to date: {out_path}")
        return out_path
    if cfg.labels == "behavioural":  # the exact partition instead of the clusters: the ceiling arm
        behaviour = behavioural_labels(cfg, corpus, echo)
        utt_labels = corpus.utterance_labels(behaviour)
        chosen = {p: int(len(np.unique(v))) for p, v in behaviour.items()}
    else:
        utt_labels = run.labels_at(chosen)
    agg = aggregate(corpus.table, utt_labels, **cfg.aggregation.aggregate_args())

    by_id = {r["game_id"]: r for r in records}
    out_records = []
    spec = game_spec(cfg)
    channels = [r.name for r in spec.channels]
    game_utterances: dict[int, list[int]] = {}
    for u, g in enumerate(corpus.table.utterance_game.tolist()):
        game_utterances.setdefault(g, []).append(u)
    step_of_utterance = {int(u): s for s, u in enumerate(corpus.table.step_utterance.tolist())}
    for g, gid in enumerate(corpus.game_ids):
        record = json.loads(json.dumps(by_id[gid]))  # a deep copy
        for u in game_utterances[g]:
            turn_index = _turn_of(record, corpus, u)
            turn = record["turns"][turn_index]
            channel = channels[int(corpus.table.utterance_channel[u])]
            if isinstance(turn.get("intention"), str):  # what the player meant (the scripted expert) stays, as "player"
                turn["intention"] = {"player": turn["intention"]}
            turn.setdefault("intention", {})[f"{channel}_label"] = int(utt_labels[u])
            s = step_of_utterance.get(u)
            if s is not None:
                turn["intention"].update({
                    "role": corpus.roles[int(corpus.table.step_role[s])],
                    "step_return": float(corpus.table.step_return[s]),
                    "q": float(agg.q[s]), "v": float(agg.v[s]), "count": int(agg.count[s]),
                    "kept": bool(agg.kept[s]),
                    "reward": float(agg.reward[s]) if agg.kept[s] else None,
                })
        record["intention"] = {"k": chosen, "mode": cfg.aggregation.mode, "labels": cfg.labels,
                               "criterion": selection["chosen"]["criterion"] if cfg.labels == "clusters" else "behavioural"}
        out_records.append(record)
    atomic_write_jsonl(out_path, out_records)
    atomic_write_json(meta_path, {"fingerprint": fingerprint, "games": len(out_records), "k": chosen, "labels": cfg.labels,
                                  "labelled_digest": file_digest([out_path])})
    at = f"{chosen}" if cfg.labels == "clusters" else f"the behavioural intentions ({chosen})"
    echo(f"[step 3] wrote {out_path} ({len(out_records)} games labelled at {at}, "
         f"{int(agg.kept.sum())}/{len(agg.kept)} steps kept)")
    return out_path


def _deciding_selection(selection: dict, window: int | None) -> dict:
    """The selection settings that decide k: ``keys`` changes nothing unless it is ``whole_history`` under a
    window, so it is left out otherwise (and step 2 runs made before the setting existed stay up to date)."""
    deciding = {k: v for k, v in selection.items() if k != "keys"}
    return {**deciding, "keys": "whole_history"} if selection.get("keys") == "whole_history" and window is not None else deciding


def check_step2_settings(selection: dict, cfg: IntentionSettings) -> None:
    """The aggregation and selection settings are those step 2 chose k under: labels made under
    others would mix two runs (a k chosen for one γ, rewards aggregated with another)."""
    recorded, window = selection.get("settings"), cfg.aggregation.window
    if isinstance(recorded, dict) and isinstance(recorded.get("selection"), dict):
        recorded = {**recorded, "selection": _deciding_selection(recorded["selection"], window)}
    changed = differences(recorded, {"aggregation": asdict(cfg.aggregation),
                                     "selection": _deciding_selection(asdict(cfg.selection), window)})
    if changed:
        raise StaleStep(2, f"selection.json was made under other settings ({'; '.join(changed[:3])})")


def _at_chosen_k(made: dict, chosen: dict, labels: str) -> bool:
    """Step 3's labels are at step 2's chosen k: not part of the fingerprint (a k chosen by hand in
    selection.json, as the release has its users do, keeps step 2's fingerprint), so compared here."""
    return labels != "clusters" or made.get("k") == chosen


def _step3_fingerprint(selection: dict, labels: str) -> str:
    """What labelled.jsonl is made from: step 2's report and the labels chosen (step 4 checks it)."""
    return json_digest({"step2": selection["fingerprint"], "labels": labels})


def step3_labels(run_dir: Path, selection: dict, default: str) -> str:
    """The ``labels`` step 3 ran under, for runs whose step 2 did not record it: the choice whose
    fingerprint labelled.meta.json holds (else ``default``, which a later check of the run refuses)."""
    made = step_output(Path(run_dir) / "labelled.meta.json", 3)
    return next((labels for labels in LABELS if _step3_fingerprint(selection, labels) == made.get("fingerprint")),
                default)


def _turn_of(record: dict, corpus: Corpus, u: int) -> int:
    position = int(corpus.table.utterance_position[u])
    return position if "players" in record else position // 2


# ---- step 4: the training set ----------------------------------------------------------------
def step4_build_training_set(cfg: Mapping | IntentionSettings, echo: Printer = print) -> Path:
    cfg = check_settings(cfg)
    labelled = _checked_labelled(cfg)
    out_path, meta_path, fingerprint = _step4_output(cfg, labelled)
    if _up_to_date(out_path, meta_path, fingerprint, "train_digest"):
        echo(f"[step 4] up to date: {out_path}")
        return out_path
    render = family_of(cfg.game).observation_renderer(cfg.game)
    samples = []
    for line, record in iter_jsonl(labelled):
        if record.get("game") != cfg.game["name"]:  # rendered with another game's prompts otherwise
            raise DataError(labelled, line, "game", f"{record.get('game')!r}, but this run's game is {cfg.game['name']!r} "
                                                    f"(give game={record.get('game')})")
        for i, turn in enumerate(record["turns"]):
            info = turn.get("intention", {})
            if "step_return" not in info:  # not a step of a trained role
                continue
            with located(labelled, line):
                observation = render(record, i)
            samples.append({
                "observation": observation, "action": turn["action"], "reward": info["reward"],
                "step_return": info["step_return"], "q": info["q"], "v": info["v"], "kept": info["kept"],
                "final_reward": _final_reward_of(record, info["role"]), "success": _won(record, info["role"]),
                "target": _target_of(record),
                "game": record["game"], "role": info["role"], "game_id": record["game_id"], "turn": i,
            })
    atomic_write_json_rows(out_path, samples)
    kept = [s for s in samples if s["kept"]]
    atomic_write_json(meta_path, {"fingerprint": fingerprint, "samples": len(samples), "kept": len(kept),
                                  "train_digest": file_digest([out_path])})
    rewards = np.array([s["reward"] for s in kept]) if kept else np.zeros(0)
    stats = f"reward mean {rewards.mean():.4f}, min {rewards.min():.4f}, max {rewards.max():.4f}" if kept else "empty"
    echo(f"[step 4] wrote {out_path}: {len(samples)} agent steps, {len(kept)} kept with an aggregated reward ({stats})")
    return out_path


def _checked_labelled(cfg: IntentionSettings) -> Path:
    """labelled.jsonl, after checking step 3 wrote it from the current selection.json and labels."""
    run_dir = Path(cfg.run_dir)
    labelled = run_dir / "labelled.jsonl"
    summary = step_output(run_dir / "utterances.json", 1)
    files = input_files(cfg.input)
    if file_digest(files) != summary.get("input_digest"):  # as steps 2 and 3 refuse other trajectories
        raise StaleStep(1, f"the trajectories ({', '.join(map(str, files))}) are not those step 1 read")
    made = step_output(run_dir / "labelled.meta.json", 3)
    selection = step_output(run_dir / "selection.json", 2)
    if made.get("fingerprint") != _step3_fingerprint(selection, cfg.labels):
        raise StaleStep(3, "labelled.jsonl was made from another selection.json or under other labels")
    chosen = (selection.get("chosen") or {}).get("k")
    if not _at_chosen_k(made, chosen, cfg.labels):
        raise StaleStep(3, f"labelled.jsonl was labelled at k = {made.get('k')}, selection.json now chooses {chosen}")
    if not labelled.is_file() or file_digest([labelled]) != made.get("labelled_digest"):
        raise StaleStep(3, "labelled.jsonl is missing or changed since step 3 wrote it")
    return labelled


def _step4_output(cfg: IntentionSettings, labelled: Path) -> tuple[Path, Path, str]:
    """train.json, its meta file, and the fingerprint step 4 writes it under."""
    out_path = Path(cfg.train_out or Path(cfg.run_dir) / "train.json")
    # prompts live in the game config; the format names the fields written (format 2: every agent step)
    fingerprint = json_digest({"labelled": file_digest([labelled]), "game": cfg.game, "format": TRAIN_FORMAT})
    return out_path, out_path.with_suffix(".meta.json"), fingerprint


def check_training_set(cfg: Mapping | IntentionSettings) -> Path:
    """train.json of a run, after checking it is step 4's output of the run's current labelled.jsonl
    (itself step 3's of the current selection.json) as written: a tool that reads the training set
    beside a re-run step 1 or 2 would otherwise pair new labels with old samples, without a word."""
    cfg = _settings(cfg)
    out_path, meta_path, fingerprint = _step4_output(cfg, _checked_labelled(cfg))
    if not _up_to_date(out_path, meta_path, fingerprint, "train_digest"):
        raise StaleStep(4, f"{out_path} is missing, was made from another labelled.jsonl or game settings, or changed "
                            "since step 4 wrote it")
    return out_path


def _final_reward_of(record: dict, role: str) -> float:
    """R of docs/method.md §3 for ``role``: the game's final reward, or the role's in a two-player game."""
    return float(record["role_rewards"][role]) if "players" in record else float(record["final_reward"])


def _won(record: dict, role: str) -> bool:
    if "players" not in record:
        return bool(record["success"])

    meta = record.get("meta") or {}
    # the recorded winner (None: a tie), else the role with the strictly higher reward (imported logs)
    return (meta["winner"] if "winner" in meta else winner(record["role_rewards"])) == role


def _target_of(record: dict) -> str | None:
    """What the game started from (its group for StarPO and GiGPO): the target, or the two-player configuration."""
    if record.get("target") is not None:
        return str(record["target"])
    meta = record.get("meta") or {}
    if meta.get("config_id") is not None:
        return str(meta["config_id"])
    return json.dumps(meta["config"], sort_keys=True) if meta.get("config") is not None else None


# ---- the step scripts' entry point ----------------------------------------------------------------------
def run_step(step: Callable[[dict, Printer], Any], cfg) -> None:
    """Entry point of the numbered pipeline scripts (``step`` one of the ``step*`` functions of
    this module): bad input prints one line and exits with status 2; Ctrl-C says
    what was kept (the embedding cache and the k sweep save as they go) and exits 130."""
    try:
        with command(kept=lambda: f"the saved progress in {cfg.run_dir}"):
            settings = load("intention", cfg)
            settings["game"] = checked_game(settings["game"])
            with hold_folder(settings["run_dir"], "run_dir"):  # one step at a time writes a run_dir's files
                step(settings, print)
    except (DataError, FileNotFoundError, ValueError) as err:  # the settings checks of the steps
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except openai_errors() as err:  # the embeddings endpoint kept failing (after its retries)
        url = cfg.embedder.get("base_url", "?")
        print(f"error: embeddings endpoint {url}: {type(err).__name__}: {' '.join(str(err).split())[:300]}", file=sys.stderr)
        sys.exit(1)
