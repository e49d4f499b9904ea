"""Where an experiment's files live (its run folder) and how many iterations each method runs.

Shared by the runner (:mod:`aria.experiment.runner`) and the report (:mod:`aria.experiment.report`),
which reads what the runner wrote.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from aria.experiment.settings import ExperimentSettings, PlaySettings
from aria.games.family import family_of
from aria.io import ConfigError, atomic_folder, check_output_folder, file_digest


# ---- where things live ------------------------------------------------------------------------------
class Layout:
    """Every path of an experiment's run folder (``run_dir``)."""

    def __init__(self, cfg: ExperimentSettings):
        self.root = Path(cfg.run_dir)
        self.family = family_of(cfg.game)
        self.variants = set(cfg.variants)

    @property
    def warm(self) -> Path:
        return self.root / "warm"

    def arm(self, method: str, seed: int, iteration: int) -> Path:
        """The folder of one method's iteration (iteration 1's games and labels live in :meth:`shared`)."""
        return self.root / f"s{seed}" / method / f"it{iteration}"

    def shared(self, seed: int) -> Path:
        return self.root / f"s{seed}" / "it1-shared"

    def collection_dir(self, method: str, seed: int, iteration: int) -> Path:
        return self.shared(seed) if iteration == 1 else self.arm(method, seed, iteration)

    def intention(self, method: str, seed: int, iteration: int) -> Path:
        """Pipeline steps 1-4 on a collection: iteration 1's labels are shared by the methods of a
        seed, except a variant's (``variants``), which labels the shared games its own way."""
        own = iteration == 1 and method in self.variants
        return self.collection_dir(method, seed, iteration) / (f"intention-{method}" if own else "intention")

    def model(self, method: str, seed: int, iteration: int) -> Path:
        return self.warm / "model" if iteration == 0 else self.arm(method, seed, iteration) / "model"

    def movement(self, method: str, seed: int, iteration: int) -> Path:
        """How far an arm's model moved from its parent (:mod:`aria.experiment.movement`)."""
        return self.arm(method, seed, iteration) / "movement.json"

    def holds_model(self, recorded: str) -> bool:
        """Whether ``recorded``, a model's path as the run's records hold it, names one of this run's
        models (the warm start's, an arm's): relative to the run folder, or inside it. A base model
        given as a relative path (``models/chat``) names none."""
        path = Path(recorded)
        if path.is_absolute():
            return path.resolve().is_relative_to(self.root.resolve())
        parts = path.parts
        return parts == ("warm", "model") or (len(parts) == 4 and parts[0][:1] == "s" and parts[0][1:].isdigit()
                                              and parts[2][:2] == "it" and parts[2][2:].isdigit() and parts[3] == "model")

    def evaluation(self, method: str, seed: int, iteration: int) -> Path:
        """A question game's evaluation file; for a two-player game the folder of its two files,
        ``as_alice.jsonl`` and ``as_bob.jsonl`` (the policy in each seat against the opponent)."""
        where = self.root / "eval" / "it0" if iteration == 0 else self.arm(method, seed, iteration) / "eval"
        return self.family.evaluation_output(where)


# ---- how the run's records name a model (producers, training markers, movement keys) ------------------
def recorded_path(cfg: ExperimentSettings, path: Path) -> str:
    """``path`` as the run's records (producers, training markers) hold it: relative to ``run_dir``
    when inside it, so a run folder copied or moved elsewhere resumes instead of redoing its work."""
    root, resolved = Path(cfg.run_dir).resolve(), Path(path).resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)


def model_version(model_dir: Path) -> str:
    """Which training made ``model_dir``: a digest of the ``trained_on.json`` beside it (the
    experiment's models), or the folder itself (a model the experiment did not train)."""
    marker = Path(model_dir).parent / "trained_on.json"
    return file_digest(marker) if marker.is_file() else str(model_dir)


def method_of(cfg: ExperimentSettings, arm: str) -> str:
    """The training method of an arm: the arm's own name, or a variant's ``method``."""
    variant = cfg.variants.get(arm)
    return variant.method if variant else arm


def intention_overrides_of(cfg: ExperimentSettings, arm: str) -> list[str]:
    """The pipeline overrides an arm labels its games with: ``intention_overrides``, then a variant's own."""
    variant = cfg.variants.get(arm)
    return [*cfg.intention_overrides, *(variant.intention_overrides if variant else [])]


def train_overrides_of(cfg: ExperimentSettings, arm: str) -> list[str]:
    """The trainer overrides an arm trains with: ``train_overrides``, then its method's own
    (``train_overrides_by_method``; a variant has its method's)."""
    return [*cfg.train_overrides, *cfg.train_overrides_by_method.get(method_of(cfg, arm), [])]


def seeds_of(cfg: ExperimentSettings, method: str) -> list:
    """The seeds ``method`` runs: ``seeds_by_method[method]`` (some of ``seeds``), else ``seeds``; an
    arm outside the paired test may run fewer, its detectable difference stated with its rows."""
    if len(set(cfg.seeds)) != len(cfg.seeds):  # a seed twice would count one training run as two (a false replication)
        raise ConfigError(f"seeds: each seed once, got {cfg.seeds}")
    seeds = cfg.seeds_by_method.get(method, cfg.seeds)
    if not seeds or any(s not in cfg.seeds for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds_by_method.{method}: expected a non-empty list of some of seeds {cfg.seeds}, each once, got {seeds!r}")
    return seeds


def iterations_of(cfg: ExperimentSettings, method: str) -> int:
    """How many iterations ``method`` runs: ``iterations_by_method[method]``, else ``iterations``."""
    n = cfg.iterations_by_method.get(method, cfg.iterations)
    if n < 1:
        setting = f"iterations_by_method.{method}" if method in cfg.iterations_by_method else "iterations"
        raise ConfigError(f"{setting}: expected a whole number >= 1, got {n!r}")
    return n


def games_of(cfg: ExperimentSettings, section: PlaySettings) -> int:
    """How many games a collection or evaluation plays: ``games``, or for a two-player game every
    configuration of ``config_set`` ``games_per_config`` times (per seat, in an evaluation)."""
    return family_of(cfg.game).games_in(cfg.game, section)


# ---- a run folder without its weights -----------------------------------------------------------------
# Left out of a copy: merged models (about 0.5 GB each), the actor's training folder (LoRA adapters and
# their checkpoints), any other trainer's checkpoints (ArCHer's critic), servers' logs, the run's
# lock and step 1's embedding cache (a cache: a third of a labelled seed's bytes, and read only when
# step 1 runs again, which then embeds anew). What stays (games, labels, training markers,
# evaluations, movement, stage times, a critic's final heads and advantages) is what the report
# reads and what tells a resumed run which stages are done.
WEIGHTS_AND_LOGS = ("model", "train", "checkpoints", "*.log", ".lock", "*.lock", "embedding_cache")
#: What a results-only copy also leaves out: the intention steps' data, the training sets and a
#: critic's final weights (ArCHer's: 184 MB at the replicated preset; a later iteration's critic
#: starts from them, so a resumable copy keeps them), which the report never reads (it reads each
#: labelling's preflight.json, selection.json and behaviour.json).
STEP_DATA = ("*.safetensors", "embeddings.npz", "labelled.jsonl", "labelled.meta.json", "labels.npz",
             "utterances.json", "train.json", "train.meta.json", "selection.png")


def left_out(results_only: bool = False) -> tuple[str, ...]:
    """The names a copy of a run leaves out (:func:`copy_without_weights`)."""
    return WEIGHTS_AND_LOGS + (STEP_DATA if results_only else ())


def copy_without_weights(run_dir: Path, dest: Path, results_only: bool = False) -> int:
    """Copy ``run_dir`` to ``dest`` without :data:`WEIGHTS_AND_LOGS`; returns the bytes copied.

    The copy reports (``report_only``) and resumes: an arm whose evaluation and movement are done
    is not trained again for its missing model (:func:`aria.experiment.runner.train`); anything else that
    needs a model (a stage not finished, the warm start as every arm's parent) trains it again,
    from the same marker and data. ``results_only`` also leaves out :data:`STEP_DATA`: the copy
    to commit beside a finished run's results, which reports the same tables. ``dest`` is replaced whole, so a copy cut short never mixes with an older one."""
    run_dir, dest = Path(run_dir), Path(dest)
    if not (run_dir / "experiment.json").is_file():
        raise ConfigError(f"{run_dir}: not an experiment's run folder (no experiment.json)")
    # Only an earlier copy of this same run may be replaced: never the run, another run, or a folder of other files.
    dest = check_output_folder(dest, [run_dir], "copy of this run", lambda out: is_copy_of(out, run_dir))
    with atomic_folder(dest) as tmp:
        shutil.copytree(run_dir, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*left_out(results_only)))
        (tmp / COPY_MARK).write_text(json.dumps({"copied_from": str(run_dir.resolve())}) + "\n", encoding="utf-8")
    return sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())


def is_stage_folder(name: str) -> bool:
    """Whether ``name`` is a folder the stages of a run write in its run folder (:class:`Layout`:
    the warm start, the iteration-0 evaluation, a seed's ``s<N>``)."""
    return name in ("warm", "eval") or (name[:1] == "s" and name[1:].isdigit())


#: Written into a copy by :func:`copy_without_weights`: a later copy may replace it, never a run.
COPY_MARK = ".copy_of_run.json"


def is_copy_of(folder: Path, run_dir: Path) -> bool:
    """Whether ``folder`` is a copy :func:`copy_without_weights` made of the run in ``run_dir``: its
    mark, and the run's own experiment.json."""
    try:
        return (folder / COPY_MARK).is_file() and \
            (folder / "experiment.json").read_bytes() == (Path(run_dir) / "experiment.json").read_bytes()
    except OSError:
        return False
