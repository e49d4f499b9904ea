"""Threads that give way: torch computes on as many threads as other work leaves cores free.

Why (docs/benchmarks.md "Training on a shared CPU", benchmarks/shared_cpu.py): torch runs each
operation on a team of OpenMP threads that meet at a barrier when it ends, and GNU OpenMP's
threads spin at that barrier instead of sleeping. A training step is tens of thousands of such
operations. Alone, spinning is the fastest way to wait. Beside one other busy thread on two
cores, the kernel keeps one of the team's two threads off its core for a time slice at a time,
every operation waits for it, and the thread that arrived first spins on the core the other
needs: an epoch took 3x its time alone, and two trainings side by side 5.5x each. Sleeping
threads (``OMP_WAIT_POLICY=PASSIVE``) remove the collapse but cost 15-20% alone, every barrier
then a wake-up. One thread fewer does neither: with as many threads as free cores, no thread of
the team waits for another that the kernel put aside.

So between micro-batches (every trainer's step, :func:`aria.trainers.engine.accumulate_step`)
:func:`give_way` looks at how much of the process's cores other processes used since it last
looked (``/proc/stat`` less this process's own CPU time) and sets torch's thread count to the
cores they left: all of them alone, one fewer beside a busy process, one each for two trainings
(each sees the other). The look costs about 0.03 ms (2-core AVX512-BF16 EPYC) and happens
at most once a second.

``train.threads`` chooses: ``auto`` (this), or a number of threads kept fixed. The most threads
``auto`` uses are torch's own at start (the process's cores, or ``OMP_NUM_THREADS``).

A vLLM server's threads cannot be governed from outside (its engine sets them once, pinned one a
core), so ``scripts/serve_vllm.sh`` chooses their wait policy when it starts the server, from
the same look (``python aria/threads.py vllm-wait-policy``, which imports nothing of the
package): spinning (ACTIVE, the fastest alone) on a free CPU, sleeping (PASSIVE) where other work
already uses half a core or more (docs/benchmarks.md, benchmarks/results/shared_cpu_serving.json).
"""
from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Callable
# Imported in the functions that use them (slow to import: benchmarks/import_time.py): torch

#: Seconds between two looks at the CPU: a step of the CPU presets takes 1-10 s, and one look over
#: a shorter span reads the kernel's 10 ms ticks too coarsely. The first look comes sooner, before
#: the first micro-batch where it can: a first step on too many threads took 10 s instead of 4.5.
INTERVAL_S = 1.0
FIRST_LOOK_S = 0.25

PROC_STAT = Path("/proc/stat")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def threads_for(cores: int, others: float, current: int | None = None) -> int:
    """Threads for ``cores`` cores of which other processes used ``others`` (in cores, averaged
    over the last look): the cores they left, rounded to the nearest, at least one. Above the
    ``current`` count only where a whole core more is nearly free (``others`` at most a quarter
    of a core over the rest): two trainings side by side each see the other pause now and then
    (a log line, a checkpoint), and a thread taken back for that pause collides with the other's.

    >>> threads_for(2, 0.05), threads_for(2, 0.67), threads_for(2, 1.0), threads_for(8, 2.4)
    (2, 1, 1, 6)
    >>> threads_for(2, 0.4, current=1), threads_for(2, 0.2, current=1)
    (1, 2)
    """
    target = max(1, min(cores, math.floor(cores - others + 0.5)))
    if current is not None and target > current:
        target = max(current, min(target, math.floor(cores - others + 0.25)))
    return target


def busy_seconds(cpus: set[int], stat: Path = PROC_STAT) -> float | None:
    """CPU seconds the kernel counts as used on ``cpus`` since boot, by anyone (every field of
    their ``/proc/stat`` lines but idle and iowait; steal too: time a hypervisor gave another
    machine is time this process did not get). None where there is no such file (not Linux)."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        if int(name[3:]) in cpus:
            user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in values[:8])
            ticks += user + nice + system + irq + softirq + steal  # guest time is inside user already
    return ticks / _TICK


def own_seconds() -> float:
    """CPU seconds this process used, all its threads (not its children)."""
    t = os.times()
    return t.user + t.system


class ThreadGovernor:
    """Sets torch's thread count to the cores other processes leave free (module doc).

    ``set_threads`` / ``clock`` / ``busy`` / ``own`` are torch's setter, a monotonic clock and the
    two CPU-time readers; tests give their own."""

    def __init__(self, max_threads: int, cpus: set[int], set_threads: Callable[[int], None],
                 clock: Callable[[], float] = time.monotonic, busy: Callable[[set[int]], float | None] = busy_seconds,
                 own: Callable[[], float] = own_seconds, interval: float = INTERVAL_S):
        self.max_threads, self.cpus, self.interval = max_threads, cpus, interval
        self._set, self._clock, self._busy, self._own = set_threads, clock, busy, own
        self.threads = max_threads
        self.changes = 0  # how often the count changed: benchmarks and tests read it
        self._looked = False
        self._last = self._sample()

    def _sample(self) -> tuple[float, float | None, float]:
        return self._clock(), self._busy(self.cpus), self._own()

    def step(self) -> int:
        """Look (at most once an ``interval``) and set the thread count; returns it."""
        now = self._clock()
        if self.max_threads <= 1 or now - self._last[0] < (self.interval if self._looked else FIRST_LOOK_S):
            return self.threads
        self._looked = True
        sample = self._sample()
        (t0, busy0, own0), (t1, busy1, own1) = self._last, sample
        self._last = sample
        if busy0 is None or busy1 is None:
            return self.threads
        # Other processes' cores: everything used on our cores less what this process used there.
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0)
        threads = threads_for(min(self.max_threads, len(self.cpus)), others, self.threads)
        if threads != self.threads:
            self._set(threads)
            self.threads, self.changes = threads, self.changes + 1
        return self.threads


_governor: ThreadGovernor | None = None


def configure(threads: int | str) -> None:
    """A process's training threads (``train.threads``): ``"auto"`` gives way to other work from the
    next :func:`give_way` on; a number fixes torch's thread count to it."""
    import torch

    global _governor
    if threads == "auto":
        if _governor is None:
            cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
            _governor = ThreadGovernor(torch.get_num_threads(), set(cpus), torch.set_num_threads)
        return
    _governor = None
    torch.set_num_threads(int(threads))


def give_way() -> int | None:
    """Between two pieces of work (a micro-batch): the thread count for the cores free now, under
    ``train.threads=auto``; None when the count is fixed."""
    return _governor.step() if _governor is not None else None


def others_now(seconds: float = 1.0, cpus: set[int] | None = None) -> float:
    """The cores other processes use, averaged over the next ``seconds`` (this process sleeps meanwhile)."""
    cpus = cpus if cpus is not None else set(os.sched_getaffinity(0))
    t0, busy0, own0 = time.monotonic(), busy_seconds(cpus), own_seconds()
    time.sleep(seconds)
    t1, busy1, own1 = time.monotonic(), busy_seconds(cpus), own_seconds()
    if busy0 is None or busy1 is None:
        return 0.0
    return max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0)


def wait_policy(others: float) -> str:
    """OpenMP's wait policy for a server's pinned threads: ``ACTIVE`` (spin) where other work leaves
    the cores free, ``PASSIVE`` (sleep) where it uses half a core or more (module doc)."""
    return "PASSIVE" if others >= 0.5 else "ACTIVE"


if __name__ == "__main__":
    if sys.argv[1:] == ["vllm-wait-policy"]:
        print(wait_policy(others_now()))
    elif sys.argv[1:] == ["others"]:
        print(f"{others_now():.2f}")
    else:
        sys.exit(f"usage: {sys.argv[0]} vllm-wait-policy | others")
