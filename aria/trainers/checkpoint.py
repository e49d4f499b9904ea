"""Checkpoints of the trainers (offline, reward model, online): one format, no pickle.

A checkpoint is a folder ``output_dir/checkpoints/step-<n>/``:

* ``model/`` — the Hugging Face adapter or model (``save_pretrained``, safetensors);
* ``trainable.safetensors`` — the exact trainable tensors;
* ``optimizer.safetensors``, ``scheduler.safetensors``, ``rng_state_<rank>.safetensors`` — nested
  state written by :func:`save_state`: its tensors (and numpy arrays) as safetensors tensors, the
  rest (numbers, strings, lists, tuples, dicts with integer keys) as tagged JSON in the file's
  metadata. Loading one runs no code: a checkpoint from someone else is data, not a program.
  (Before, these were ``torch.save`` pickles read with ``weights_only=False``.)
* ``trainer_state.json`` — the trainer's own plain state.

It is written into ``step-<n>.tmp/`` and renamed when complete, so a folder without the suffix is
a whole checkpoint; the newest ``keep`` are kept. Under DeepSpeed, accelerate's ``save_state``
writes the sharded model and optimizer in its own format (:class:`OfflineTrainer`).
"""
from __future__ import annotations

import json
import random
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from aria.io import ResumeMismatch, atomic_write_json, atomic_write_text, differences, model_digest, replace_folder
from aria.llm.embedded import resolve_model_path
from aria.trainers.engine import RUN_RECORD, TrainState
from aria.trainers.settings import CriticTrainerSettings, TrainerSettings


_META_KEY = "aria_state"


# ---- nested state without pickle -------------------------------------------------------------
def save_state(path: str | Path, state: Any) -> None:
    """Write nested state (dicts, lists, tuples, numbers, strings, None, tensors, numpy arrays)."""
    tensors: dict[str, torch.Tensor] = {}

    def encode(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            key = f"t{len(tensors)}"
            tensors[key] = obj.detach().cpu().contiguous()
            return {"__tensor__": key}
        if isinstance(obj, np.ndarray):
            key = f"t{len(tensors)}"
            tensors[key] = torch.from_numpy(np.ascontiguousarray(obj))
            return {"__ndarray__": key}
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, dict):
            return {"__dict__": [[encode(k), encode(v)] for k, v in obj.items()]}
        if isinstance(obj, tuple):
            return {"__tuple__": [encode(v) for v in obj]}
        if isinstance(obj, list):
            return [encode(v) for v in obj]
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        raise TypeError(f"cannot store a {type(obj).__name__} in a checkpoint")

    plain = json.dumps(encode(state))
    save_file(tensors, str(path), metadata={_META_KEY: plain})


def load_state(path: str | Path) -> Any:
    """Inverse of :func:`save_state`; reads tensors and JSON only."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    if _META_KEY not in metadata:
        raise ValueError(f"{path}: not a checkpoint state file (no {_META_KEY!r} metadata)")

    def decode(obj: Any) -> Any:
        if isinstance(obj, list):
            return [decode(v) for v in obj]
        if isinstance(obj, dict):
            if "__tensor__" in obj:
                return tensors[obj["__tensor__"]]
            if "__ndarray__" in obj:
                return tensors[obj["__ndarray__"]].numpy()
            if "__tuple__" in obj:
                return tuple(decode(v) for v in obj["__tuple__"])
            if "__dict__" in obj:
                return {decode(k): decode(v) for k, v in obj["__dict__"]}
            raise ValueError(f"{path}: unknown entry {sorted(obj)} in the checkpoint state")
        return obj

    return decode(json.loads(metadata[_META_KEY]))


# ---- random generators -----------------------------------------------------------------------
def rng_state() -> dict:
    """Python's, numpy's and torch's (CPU and CUDA) generator states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- checkpoint folders ----------------------------------------------------------------------
def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete and intact checkpoint folder, or None. A damaged one (a file cut short
    by a full disk, a state torn by a copy) is passed over for the one before, and said so on
    stderr. A folder of the old pickle format is refused."""
    folder = output_dir / "checkpoints"
    done = [p for p in folder.glob("step-*") if not p.name.endswith(".tmp") and (p / "trainer_state.json").is_file()] \
        if folder.is_dir() else []
    for newest in sorted(done, key=lambda p: int(p.name.split("-")[1]), reverse=True):
        if (newest / "optimizer.pt").is_file() or any(newest.glob("rng_state_*.pt")):
            raise ValueError(f"{newest} holds pickle files (.pt) of an older version, which are not loaded (they could "
                             f"run code): use a new output_dir, or delete {folder} to start over")
        if why := checkpoint_damage(newest):
            print(f"[checkpoint] {newest} is damaged ({why}): not resumed from; trying the one before", file=sys.stderr)
            continue
        return newest
    if done:  # damaged, every one: starting over would silently drop the run's progress
        raise ValueError(f"every checkpoint in {folder} is damaged (above): nothing to resume from; delete {folder} "
                         "to start over")
    return None


def checkpoint_damage(folder: Path) -> str | None:
    """Why ``folder`` cannot be resumed from: a trainer state that is not whole JSON, or a tensor
    file whose header or data is cut short; None when it is intact."""
    try:
        state = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
        if not isinstance(state, dict) or "step" not in state:
            return "trainer_state.json holds no step"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"trainer_state.json is not whole JSON: {err}"
    for file in sorted(folder.rglob("*.safetensors")):
        try:
            with safe_open(str(file), "pt"):
                pass
        except Exception as err:  # noqa: BLE001 - safetensors' own error types differ between versions
            return f"{file.relative_to(folder)}: {' '.join(str(err).split())[:160]}"
    return None


def begin_checkpoint(accelerator, output_dir: Path, step: int) -> tuple[Path, Path]:
    """(temporary folder, final folder) of the checkpoint at ``step``; every process has saved
    its RNG state into the temporary folder when this returns."""
    final = output_dir / "checkpoints" / f"step-{step}"
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    save_state(tmp / f"rng_state_{accelerator.process_index}.safetensors", rng_state())
    return tmp, final


def save_plain_state(folder: Path, model, tokenizer, optimizer, scheduler) -> None:
    """The Hugging Face model (adapter or full) in ``model/``, the exact trainable tensors, the
    optimizer and the scheduler (main process; not under DeepSpeed)."""
    model.save_pretrained(folder / "model", safe_serialization=True)
    tokenizer.save_pretrained(folder / "model")
    trainable = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    save_file(trainable, str(folder / "trainable.safetensors"))
    save_state(folder / "optimizer.safetensors", optimizer.state_dict())
    save_state(folder / "scheduler.safetensors", scheduler.state_dict())


def finish_checkpoint(accelerator, tmp: Path, final: Path, state: dict, keep: int | None) -> Path:
    """Write ``trainer_state.json``, rename the folder to its final name (a checkpoint exists only
    once complete) and keep the newest ``keep`` checkpoints."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        atomic_write_json(tmp / "trainer_state.json", state)
        replace_folder(tmp, final)
        folders = sorted((p for p in final.parent.glob("step-*") if not p.name.endswith(".tmp")),
                         key=lambda p: int(p.name.split("-")[1]))
        for old in folders[:-keep] if keep else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_plain_state(checkpoint: Path, model, optimizer, scheduler) -> None:
    """Inverse of :func:`save_plain_state`: trainable tensors, optimizer and scheduler."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in load_file(str(checkpoint / "trainable.safetensors")).items():
            params[name].copy_(value.to(params[name].device))
    optimizer.load_state_dict(load_state(checkpoint / "optimizer.safetensors"))
    scheduler.load_state_dict(load_state(checkpoint / "scheduler.safetensors"))


def load_rng_state(checkpoint: Path, rank: int) -> dict:
    return load_state(checkpoint / f"rng_state_{rank}.safetensors")


def trim_metrics(path: Path, keep: Callable[[dict], bool]) -> None:
    """Drop the metric lines of work a resumed run redoes."""
    if path.is_file():
        kept = [line for line in path.read_text().splitlines() if keep(json.loads(line))]
        atomic_write_text(path, "".join(line + "\n" for line in kept))


# ---- resuming ------------------------------------------------------------------------------------
#: Settings that do not change what training computes: where it writes, how often it saves or logs,
#: and where the data and the model are read from (their contents are checked instead, so a copied
#: run folder resumes).
NOT_RESUME_SETTINGS = ("output_dir", "scale_name", "logging", "grad_variance", "device", "train.save_freq",
                       "train.keep_checkpoints", "data.train_file", "model.path")


def resume_settings(cfg: TrainerSettings | CriticTrainerSettings, micro_per_epoch: int | None = None) -> dict:
    """What a checkpoint's run and the run resuming it must share, besides the data: every setting
    but :data:`NOT_RESUME_SETTINGS`, the weights the training started from (``model.weights``,
    :func:`aria.io.model_digest`) and the micro-batches of an epoch (a position in the epoch means
    nothing under another batching). Before, a checkpoint's optimizer and scheduler silently
    replaced a changed lr, a changed seed reordered the rest of the data, and another base model
    carried the adapter over."""
    settings = json.loads(json.dumps(asdict(cfg), default=str))  # a plain copy
    for key in NOT_RESUME_SETTINGS:
        *parents, last = key.split(".")
        section = settings
        for name in parents:
            section = section.get(name) if isinstance(section, dict) else None
        if isinstance(section, dict):
            section.pop(last, None)
    if isinstance(cfg, TrainerSettings):  # the critic's encoder is named by its own settings
        settings["model"]["weights"] = model_digest(resolve_model_path(cfg.model.path))
    if micro_per_epoch is not None:
        settings["micro_per_epoch"] = micro_per_epoch
    return settings


def read_trainer_state(checkpoint: Path, accelerator, data_digest: str, total_steps: int,
                       settings: dict | None = None) -> dict:
    """``trainer_state.json`` of ``checkpoint``, refused (:class:`~aria.io.ResumeMismatch`, one
    line) when another number of processes wrote it or it was trained on other data or under other
    ``settings`` (:func:`resume_settings`; a checkpoint written before they were recorded is
    checked on its data alone): a resume must never mix two runs."""
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    if state["world_size"] != accelerator.num_processes:
        raise ResumeMismatch(f"{checkpoint} was written by {state['world_size']} process(es); resume it with the same number")
    if state.get("data_digest") != data_digest or state["total_steps"] != total_steps:
        raise ResumeMismatch(f"{checkpoint} was trained on other data or settings (data digest {state.get('data_digest')}, "
                             f"{state['total_steps']} steps; now {data_digest}, {total_steps} steps): "
                             f"use a new output_dir, or delete {checkpoint.parent} to start over")
    check_resume_settings(checkpoint, state, settings)
    return state


def check_resume_settings(checkpoint: Path, state: dict, settings: dict | None) -> None:
    """Refuse (one line) a checkpoint whose recorded settings differ from ``settings``."""
    if settings is not None and "settings" in state:
        changed = differences(state["settings"], settings)
        if changed:
            raise ResumeMismatch(f"{checkpoint} was trained under other settings ({'; '.join(changed[:3])}"
                                 f"{'; ...' if len(changed) > 3 else ''}): re-run with those, use a new output_dir, "
                                 f"or delete {checkpoint.parent} to start over")


def run_record(settings: dict, data_digest: str) -> dict:
    """What :data:`RUN_RECORD` holds: :func:`resume_settings` and the data digest of the run."""
    return {"settings": settings, "data_digest": data_digest}


def start_fresh(output_dir: Path, accelerator, settings: dict, data_digest: str) -> None:
    """Before a run with no checkpoint to resume: refuse (one line) an ``output_dir`` whose
    ``final/`` another run made, under other settings or on other data, which this run would
    replace without a word; and drop the metric lines of an earlier attempt that stopped before
    its first checkpoint (the steps restart at 1)."""
    record = output_dir / "final" / RUN_RECORD
    if record.is_file():
        made = json.loads(record.read_text(encoding="utf-8"))
        changed = differences(made["settings"], settings)
        if made["data_digest"] != data_digest:
            changed = [*changed, "the samples or their weights differ"]
        if changed:
            raise another_runs_final(output_dir, changed)
    if accelerator.is_main_process:
        trim_metrics(output_dir / "metrics.jsonl", lambda line: False)


class StepTrainer(Protocol):
    """What :func:`checkpoint_to_resume` and :func:`checkpoint_record` read of a trainer that
    checkpoints by optimizer step (the offline trainer, ArCHer's critic)."""
    output_dir: Path
    accelerator: Any
    cfg: dict
    micro_per_epoch: int
    data_digest: str
    total_steps: int
    state: Any  # aria.trainers.engine.TrainState


def checkpoint_to_resume(trainer: StepTrainer) -> tuple[Path, dict] | None:
    """Where ``trainer`` goes on from: the newest intact checkpoint of its ``output_dir`` and its
    trainer state, both checked against this run (:func:`read_trainer_state`); or None, the run
    starting fresh (:func:`start_fresh`: not over another run's ``final/``)."""
    settings = resume_settings(trainer.cfg, trainer.micro_per_epoch)
    checkpoint = latest_checkpoint(trainer.output_dir)
    if checkpoint is None:
        start_fresh(trainer.output_dir, trainer.accelerator, settings, trainer.data_digest)
        return None
    return checkpoint, read_trainer_state(checkpoint, trainer.accelerator, trainer.data_digest, trainer.total_steps, settings)


def save_step_checkpoint(trainer: StepTrainer, save: Callable[[Path], None]) -> Path:
    """A checkpoint of ``trainer`` at its step: ``save(folder)`` writes its weights and optimizer
    state into the folder being made (each process its part); the trainer state, the folder's
    rename into place and the rotation of old checkpoints are every step trainer's alike."""
    acc = trainer.accelerator
    tmp, final = begin_checkpoint(acc, trainer.output_dir, trainer.state.step)
    save(tmp)
    return finish_checkpoint(acc, tmp, final, checkpoint_record(trainer), trainer.cfg.train.keep_checkpoints)


def resume_step_trainer(trainer: StepTrainer, load: Callable[[Path], None], who: str) -> Path | None:
    """Resume ``trainer`` from its newest checkpoint (:func:`checkpoint_to_resume`): ``load(checkpoint)``
    restores its weights and optimizer state, then its position and random state; the checkpoint,
    or None where the run starts fresh."""
    found = checkpoint_to_resume(trainer)
    if found is None:
        return None
    checkpoint, state = found
    load(checkpoint)
    trainer.state = resume_position(checkpoint, trainer.accelerator, state, trainer.output_dir,
                                    trainer.micro_per_epoch, who)
    return checkpoint


def checkpoint_record(trainer: StepTrainer) -> dict:
    """What a checkpoint's ``trainer_state.json`` holds: the position, the number of processes, and
    what a resume must share (the data's digest, the steps, :func:`resume_settings`)."""
    return {**trainer.state.__dict__, "world_size": trainer.accelerator.num_processes, "total_steps": trainer.total_steps,
            "data_digest": trainer.data_digest, "settings": resume_settings(trainer.cfg, trainer.micro_per_epoch)}


def check_output_dir_early(output_dir: Path, settings: dict) -> None:
    """Before the model loads, the part of :func:`start_fresh`'s and :func:`read_trainer_state`'s
    refusals that needs no model: an ``output_dir`` whose ``final/`` or newest checkpoint another
    run made under other ``settings`` (:func:`resume_settings` without the micro-batches) is one
    line in seconds, not after the model, the data's encoding and the first digests. What needs
    the tokenizer (the data digest, the micro-batches of an epoch) is still checked there."""
    def recorded(path: Path) -> dict | None:
        try:
            made = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None  # a damaged file is the later check's to name (or to pass over)
        return {k: v for k, v in made["settings"].items() if k != "micro_per_epoch"} \
            if isinstance(made, dict) and isinstance(made.get("settings"), dict) else None

    folder = output_dir / "checkpoints"
    steps = sorted((p for p in folder.glob("step-*") if not p.name.endswith(".tmp") and p.name[5:].isdigit()),
                   key=lambda p: int(p.name[5:]), reverse=True) if folder.is_dir() else []
    for checkpoint in steps:
        made = recorded(checkpoint / "trainer_state.json")
        if made is not None:
            check_resume_settings(checkpoint, {"settings": made}, settings)
            return
    if not steps and (made := recorded(output_dir / "final" / RUN_RECORD)) is not None:
        if changed := differences(made, settings):
            raise another_runs_final(output_dir, changed)


def another_runs_final(output_dir: Path, changed: list[str]) -> ResumeMismatch:
    """The refusal of an ``output_dir`` whose ``final/`` another run made (what ``changed``)."""
    return ResumeMismatch(f"{output_dir / 'final'} holds the model of another run ({'; '.join(changed[:3])}"
                          f"{'; ...' if len(changed) > 3 else ''}): use another output_dir, or delete "
                          f"{output_dir / 'final'} to train here")


def resume_position(checkpoint: Path, accelerator, state: dict, output_dir: Path, micro_per_epoch: int, who: str):
    """After the weights: every process's random state back and the metric lines of the steps
    that will be redone dropped; returns the :class:`~aria.trainers.engine.TrainState` to go on
    from (the next epoch when the checkpoint was saved at the very end of one)."""
    set_rng_state(load_rng_state(checkpoint, accelerator.process_index))
    position = TrainState(step=state["step"], epoch=state["epoch"], micro=state["micro"])
    if accelerator.is_main_process:
        trim_metrics(output_dir / "metrics.jsonl", lambda line: line["step"] <= position.step)
    if position.micro >= micro_per_epoch:
        position = TrainState(step=position.step, epoch=position.epoch + 1, micro=0)
    if accelerator.is_main_process:
        print(f"[{who}] resumed from {checkpoint} (step {position.step}/{state['total_steps']})")
    return position
