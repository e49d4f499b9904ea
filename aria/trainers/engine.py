"""The training engine every trainer shares: settings check, accelerator, optimizer and schedule,
one accumulated optimizer step, and the final model folder (``docs/method.md`` §5).

The offline REINFORCE trainer (:mod:`aria.trainers.offline`), the reward-model trainer (a
subclass of it) and the online actor (:mod:`aria.trainers.online`) differ in their data and
their loss (:mod:`aria.trainers.losses`); how a loss becomes an optimizer step is here, once.
Checkpoints and resume are :mod:`aria.trainers.checkpoint`.
"""
from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import torch

from aria import threads
from aria.io import ConfigError, atomic_folder, atomic_write_json, hold_output
from aria.llm.merge_record import stale_merges_of
from aria.packing import PACKINGS
from aria.trainers.losses import LOSS_OPTION_CHECKS
from aria.trainers.settings import CriticTrainerSettings, EngineTrainSettings, TrainerSettings, TrainSettings
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): accelerate, transformers

#: Optimizers by name (config ``train.optimizer``).
OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}


def check_train_settings(cfg: TrainerSettings | CriticTrainerSettings, losses: Mapping[str, Callable], loss_name: str | None = None,
                         check_scheduler: bool = True) -> None:
    """Reject a name no registry knows (packing, optimizer, loss, scheduler), in one line naming
    the setting, before anything loads. The ranges (lr > 0, save_freq >= 1, ...) were checked with
    the types when the config entered (:mod:`aria.trainers.settings`).

    ``loss_name``: the trainer's own loss, when the config's ``loss.name`` does not choose it;
    ``check_scheduler=False`` leaves :func:`check_lr_scheduler` to the caller."""
    t = cfg.train

    if isinstance(t, TrainSettings) and t.packing not in PACKINGS:  # the critic's batches are not packed
        raise ConfigError(f"train.packing: unknown {t.packing!r} (known: {', '.join(PACKINGS)})")
    if t.optimizer not in OPTIMIZERS:
        raise ConfigError(f"train.optimizer: unknown {t.optimizer!r} (known: {', '.join(sorted(OPTIMIZERS))})")
    if loss_name is None and cfg.loss.name not in losses:
        raise ConfigError(f"loss.name: unknown {cfg.loss.name!r} (known: {', '.join(sorted(losses))})")
    name = loss_name or cfg.loss.name
    if name in LOSS_OPTION_CHECKS and (problem := LOSS_OPTION_CHECKS[name](cfg.loss.options(name))):
        raise ConfigError(f"loss.{name}: {problem}")
    if not (t.threads == "auto" or (t.threads.isdigit() and int(t.threads) >= 1)):
        raise ConfigError(f"train.threads: expected auto or a number of threads >= 1, got {t.threads!r}")
    check_mixed_precision(t.mixed_precision, cfg.device)
    if check_scheduler:
        check_lr_scheduler(t)


def check_mixed_precision(value: str, device: str) -> None:
    """fp8 trains only on a CUDA device with transformer_engine or torchao (accelerate's fp8
    backends); elsewhere accelerate would stop with a traceback once the trainer starts."""
    if value != "fp8":
        return
    if device == "cpu" or not torch.cuda.is_available():
        raise ConfigError("train.mixed_precision=fp8 needs a CUDA device (this process sees none or device=cpu); "
                          "use auto, bf16 or no")
    if not any(importlib.util.find_spec(name) for name in ("transformer_engine", "torchao")):
        raise ConfigError("train.mixed_precision=fp8 needs transformer_engine or torchao installed "
                          "(pip install torchao); or use auto, bf16 or fp16")


def check_lr_scheduler(t: EngineTrainSettings) -> None:
    """``train.lr_scheduler`` is one of transformers' schedulers. Its own check because the names
    come with transformers' trainer utilities, which import peft (about 5 s on 2 cores): a trainer
    checks its data before this, so a bad file is one line within seconds."""
    from transformers import SchedulerType

    schedulers = [s.value for s in SchedulerType]
    if t.lr_scheduler not in schedulers:
        raise ConfigError(f"train.lr_scheduler: unknown {t.lr_scheduler!r} (known: {', '.join(schedulers)})")


def resolve_mixed_precision(value: str) -> str:
    """``auto``: bf16 on a GPU or CPU that computes it natively, else no mixed precision."""
    from aria.llm.local import native_bf16

    if value != "auto":
        return value
    if torch.cuda.is_available():
        return "bf16" if native_bf16("cuda") else "fp16"
    return "bf16" if native_bf16("cpu") else "no"


def make_accelerator(cfg: TrainerSettings | CriticTrainerSettings, project_dir: Path | None = None, log_with: str | None = None,
                     output_dir: Path | None = None):
    """The run's :class:`accelerate.Accelerator`: accumulation, mixed precision and device from
    ``cfg``, and the process's training threads (``train.threads``, :mod:`aria.threads`). The main
    process holds ``output_dir`` (:func:`aria.io.hold_output`): a second training into the same
    folder is refused in one line, where both would have written its checkpoints and metrics.

    The scheduler is stepped by hand once per optimizer step (``step_scheduler_with_optimizer=False``):
    accelerate's wrapper would step it once per process, while the trainers count per-process steps.
    """
    from accelerate import Accelerator

    t = cfg.train
    on_cpu = use_cpu(cfg.device)
    threads.configure(t.threads)
    acc = Accelerator(gradient_accumulation_steps=t.gradient_accumulation_steps,
                      mixed_precision=resolve_mixed_precision(t.mixed_precision),
                      cpu=on_cpu, step_scheduler_with_optimizer=False,
                      log_with=log_with or None, project_dir=str(project_dir) if project_dir else None)
    check_one_group(acc.num_processes)
    if output_dir is not None and acc.is_main_process:
        hold_output(output_dir, "output_dir")
    return acc


def use_cpu(device: str) -> bool:
    """Whether ``device`` (config ``device``) trains on the CPU: ``cpu``, or ``auto`` on a machine
    without a GPU. Saying so to accelerate matters beyond placement: only then does it join the
    processes of a CPU launch (``config/accelerate/cpu_2proc.yaml``) into one gloo group."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda: this process sees no CUDA device (torch.cuda.is_available() is false); "
                          "use device=auto or device=cpu")
    return device == "cpu" or not torch.cuda.is_available()


def check_one_group(num_processes: int, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a launch whose processes did not join one group: each would train on all of the
    data, as many times over as there are processes, and write the same output folder."""
    launched = int((os.environ if environ is None else environ).get("WORLD_SIZE", "1") or 1)
    if launched > 1 and num_processes != launched:
        raise ConfigError(f"this launch started {launched} processes, but they did not form one group (accelerate "
                          f"counts {num_processes}): each would train on all of the data; check the accelerate config "
                          "and the device setting")


def fit_accumulation(acc, t: EngineTrainSettings, micro_batches: int, who: str) -> None:
    """Where an epoch's ``micro_batches`` give each process fewer than ``train.gradient_accumulation_steps``
    (a small ``data.max_samples``), accumulate over all of them: one optimizer step an epoch, said in
    one line, instead of no step at all. A run with at least one full step is left as it is."""
    per_process = micro_batches // acc.num_processes
    if 0 < per_process < t.gradient_accumulation_steps:
        if acc.is_main_process:
            print(f"[{who}] {micro_batches} micro-batches an epoch make no step of gradient_accumulation_steps="
                  f"{t.gradient_accumulation_steps} on {acc.num_processes} process(es): accumulating over "
                  f"{per_process}, one optimizer step an epoch")
        t.gradient_accumulation_steps = acc.gradient_accumulation_steps = per_process


def warmup_steps(t: EngineTrainSettings, total_steps: int) -> int:
    """``train.warmup_steps`` when set, else ``ceil(train.warmup_ratio × total_steps)``."""
    return int(t.warmup_steps) if t.warmup_steps else int(math.ceil(t.warmup_ratio * total_steps))


def build_optimizer(model, t: EngineTrainSettings, total_steps: int):
    """(optimizer, scheduler) for the trainable parameters of ``model``, from the ``train`` section."""
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = OPTIMIZERS[t.optimizer](params, lr=t.lr, betas=tuple(t.betas), eps=t.eps, weight_decay=t.weight_decay)
    scheduler = get_scheduler(t.lr_scheduler, optimizer, num_warmup_steps=warmup_steps(t, total_steps),
                              num_training_steps=total_steps)
    return optimizer, scheduler


def accumulate_step(acc, model, optimizer, scheduler, compute_loss: Callable[[], torch.Tensor],
                    max_grad_norm: float | None) -> tuple[torch.Tensor, float | None]:
    """One micro-batch: its loss, backward through accelerate (which divides by the accumulation
    steps), and at an accumulation boundary the clip, the optimizer step and the schedule.

    Returns (loss, gradient norm before clipping, or None between boundaries, without clipping,
    or under DeepSpeed, which clips inside its engine).
    """
    threads.give_way()  # the threads for the cores other work leaves free now (train.threads=auto)
    grad_norm = None
    with acc.accumulate(model):  # the prepared model runs under mixed precision itself
        loss = compute_loss()
        acc.backward(loss)
        if acc.sync_gradients and max_grad_norm:
            norm = acc.clip_grad_norm_(model.parameters(), max_grad_norm)
            grad_norm = None if norm is None else float(norm)
        optimizer.step()  # a no-op between accumulation boundaries (accelerate)
        if acc.sync_gradients:
            scheduler.step()
        optimizer.zero_grad()
    return loss, grad_norm


@dataclass
class TrainState:
    """Where a trainer is: what a checkpoint records and a resume starts from."""
    step: int = 0  # optimizer steps done
    epoch: int = 0
    micro: int = 0  # micro-batches of this epoch already consumed (per process)


def run_epochs(acc, state: TrainState, epochs: int, epoch_batches: Callable[[int], list[list[int]]],
               micro_step: Callable[[list[int]], None], after_step: Callable[[], None], bar) -> None:
    """The loop of the trainers on fixed data: every epoch from ``state``'s on, its micro-batches
    from the one ``state`` stopped at. ``micro_step(indices)`` runs one micro-batch (through
    :func:`accumulate_step`); at each optimizer-step boundary the state advances and
    ``after_step()`` logs, checkpoints and calls back (an exception there, such as a test's
    interruption, ends the loop with the state as checkpointed). ``bar`` (tqdm) is closed at the end."""
    try:
        while state.epoch < epochs:
            batches = epoch_batches(state.epoch)
            while state.micro < len(batches):
                micro_step(batches[state.micro])
                state.micro += 1
                if acc.sync_gradients:
                    state.step += 1
                    bar.update(1)
                    after_step()
            state.epoch += 1
            state.micro = 0
    finally:
        bar.close()


#: Beside a trainer's final model: the settings and data digest of the run that made it
#: (:func:`aria.trainers.checkpoint.run_record`; a later run into the folder is checked against it).
RUN_RECORD = "aria_run.json"


def save_final_model(acc, model, tokenizer, out: Path, encoding, info: dict, state_dict: dict | None = None,
                     run: dict | None = None) -> Path:
    """``out/``: the unwrapped model (adapter or full) and tokenizer in Hugging Face format, the
    :class:`aria.llm.policy.Encoding` its samples were encoded with, ``aria_training.json`` (``info``)
    and the run's record (``run``, :func:`aria.trainers.checkpoint.run_record`: a later run into
    the same folder under other settings is refused), whole or not at all
    (:func:`aria.io.atomic_folder`); every process calls it."""
    acc.wait_for_everyone()
    if acc.is_main_process:
        with atomic_folder(out) as tmp:
            acc.unwrap_model(model).save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            encoding.save(tmp)
            atomic_write_json(tmp / "aria_training.json", info)
            if run is not None:
                atomic_write_json(tmp / RUN_RECORD, run)
        for why in stale_merges_of(out):  # a merge of the adapter this run has just replaced
            print(f"[train] note: {why}")
    acc.wait_for_everyone()
    return out
