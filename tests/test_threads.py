"""The training threads that give way to other work (aria/threads.py), on hand-made CPU readings.

The governor reads the kernel's CPU counters; here a fake clock and fake counters stand in for
them (a real shared CPU cannot be arranged in a test: benchmarks/shared_cpu.py measures that)."""
from __future__ import annotations

import pytest

import subprocess
import sys
from pathlib import Path

from aria.threads import ThreadGovernor, busy_seconds, threads_for, wait_policy

THREADS_SCRIPT = Path(__file__).resolve().parents[1] / "aria" / "threads.py"


def test_threads_for_by_hand():
    # the cores others left, rounded to the nearest, at least one, at most the cores
    assert threads_for(2, 0.0) == 2
    assert threads_for(2, 0.49) == 2  # a short-lived process now and then keeps both threads
    assert threads_for(2, 0.51) == 1
    assert threads_for(2, 0.67) == 1  # one busy thread beside a team of two gets 2/3 of a core
    assert threads_for(2, 1.9) == 1  # never zero
    assert threads_for(8, 2.4) == 6
    assert threads_for(4, -0.3) == 4  # never more than the cores
    # back up only where a whole core is nearly free: another training's pause is not one
    assert threads_for(2, 0.4, current=1) == 1
    assert threads_for(2, 0.25, current=1) == 2
    assert threads_for(2, 0.6, current=2) == 1  # down as before
    assert threads_for(8, 1.3, current=4) == 6  # 8 - 1.3 + 0.25 = 6.95


class FakeCpu:
    """A clock and two CPU-time counters that a test advances by hand."""

    def __init__(self):
        self.now, self.busy, self.own = 100.0, 5000.0, 40.0
        self.set_calls: list[int] = []

    def advance(self, seconds: float, ours: float, others: float) -> None:
        """``seconds`` pass; this process used ``ours`` cores, other processes ``others``."""
        self.now += seconds
        self.own += ours * seconds
        self.busy += (ours + others) * seconds

    def governor(self, max_threads: int = 2, cpus: set[int] = frozenset({0, 1})) -> ThreadGovernor:
        return ThreadGovernor(max_threads, set(cpus), self.set_calls.append, clock=lambda: self.now,
                              busy=lambda _: self.busy, own=lambda: self.own)


def test_the_governor_gives_a_core_away_while_another_process_uses_it_and_takes_it_back():
    cpu = FakeCpu()
    g = cpu.governor()
    cpu.advance(2.0, ours=2.0, others=0.02)
    assert g.step() == 2 and cpu.set_calls == []  # alone: nothing set
    cpu.advance(2.0, ours=1.33, others=0.67)  # a busy loop beside the team of two
    assert g.step() == 1 and cpu.set_calls == [1]
    cpu.advance(0.5, ours=1.0, others=1.0)
    assert g.step() == 1 and cpu.set_calls == [1]  # within the interval: no look
    cpu.advance(1.0, ours=1.0, others=1.0)
    assert g.step() == 1 and cpu.set_calls == [1]  # still there: unchanged, nothing set again
    cpu.advance(1.5, ours=1.0, others=0.1)  # it ended
    assert g.step() == 2 and cpu.set_calls == [1, 2] and g.changes == 2


def test_the_first_look_comes_before_the_first_step():
    cpu = FakeCpu()
    g = cpu.governor()
    cpu.advance(0.3, ours=1.0, others=1.0)  # the model loaded beside another training
    assert g.step() == 1 and cpu.set_calls == [1]
    cpu.advance(0.3, ours=1.0, others=0.0)
    assert g.step() == 1  # later looks wait the whole interval


def test_two_governed_trainings_settle_on_a_core_each():
    a, b = FakeCpu(), FakeCpu()
    ga, gb = a.governor(), b.governor()
    a.advance(1.0, ours=1.0, others=1.0)  # two teams of two on two cores: each gets one
    b.advance(1.0, ours=1.0, others=1.0)
    assert (ga.step(), gb.step()) == (1, 1)
    a.advance(1.0, ours=1.0, others=1.0)
    b.advance(1.0, ours=1.0, others=1.0)
    assert (ga.step(), gb.step()) == (1, 1) and a.set_calls == b.set_calls == [1]


def test_the_governor_keeps_a_fixed_count_and_unknown_readings_alone():
    cpu = FakeCpu()
    one = cpu.governor(max_threads=1)
    cpu.advance(2.0, ours=1.0, others=1.0)
    assert one.step() == 1 and cpu.set_calls == []
    unreadable = ThreadGovernor(2, {0, 1}, cpu.set_calls.append, clock=lambda: cpu.now, busy=lambda _: None,
                                own=lambda: cpu.own)
    cpu.advance(2.0, ours=1.0, others=1.0)
    assert unreadable.step() == 2 and cpu.set_calls == []
    # more threads than cores (OMP_NUM_THREADS=4 on 2 cores) are held to the cores
    many = cpu.governor(max_threads=4)
    cpu.advance(2.0, ours=2.0, others=0.0)
    assert many.step() == 2 and cpu.set_calls == [2]


def test_busy_seconds_reads_the_process_cores_lines_by_hand(tmp_path):
    stat = tmp_path / "stat"
    #                user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  900 0 300 5000 50 10 10 30 0 0\n"
                    "cpu0 400 0 100 2500 20 5 5 10 0 0\n"
                    "cpu1 500 0 200 2500 30 5 5 20 0 0\n"
                    "cpu2 7000 0 0 0 0 0 0 0 0 0\n"
                    "intr 12345 0 0\n")
    tick = __import__("os").sysconf("SC_CLK_TCK")
    # cpu0: 400 + 100 + 5 + 5 + 10 = 520 ticks; cpu1: 500 + 200 + 5 + 5 + 20 = 730; idle and iowait left out
    assert busy_seconds({0}, stat) == pytest.approx(520 / tick)
    assert busy_seconds({0, 1}, stat) == pytest.approx(1250 / tick)
    assert busy_seconds({1}, tmp_path / "none") is None


def test_configure_auto_and_fixed():
    import torch

    from aria import threads

    before = torch.get_num_threads()
    try:
        threads.configure("1")
        assert torch.get_num_threads() == 1 and threads.give_way() is None  # fixed: no governor
        threads.configure("auto")
        assert threads.give_way() == 1  # at most the threads torch had when it was configured
    finally:
        threads._governor = None
        torch.set_num_threads(before)


def test_the_servers_wait_policy_by_hand_and_from_the_script():
    assert (wait_policy(0.0), wait_policy(0.49), wait_policy(0.5), wait_policy(1.7)) == ("ACTIVE", "ACTIVE", "PASSIVE", "PASSIVE")
    # scripts/serve_vllm.sh runs the file as a script with the system's python: nothing of the
    # package or of site-packages may be needed (-S: no site-packages)
    for command, check in (("vllm-wait-policy", lambda out: out in ("ACTIVE", "PASSIVE")), ("others", lambda out: float(out) >= 0)):
        done = subprocess.run([sys.executable, "-S", str(THREADS_SCRIPT), command], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and check(done.stdout.strip()), done.stderr
    done = subprocess.run([sys.executable, "-S", str(THREADS_SCRIPT), "what"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "usage:" in done.stderr


def _shared_cpu_benchmark():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "shared_cpu.py"
    spec = importlib.util.spec_from_file_location("shared_cpu_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmarks_job_is_whole_games_in_file_order(tmp_path):
    import json

    lengths = {"a": 3, "b": 1, "c": 4, "d": 3, "e": 5}
    rows = [{"game_id": g, "turn": t} for g, n in lengths.items() for t in range(n)]
    rows = rows[1:] + rows[:1]  # a game's steps need not be together: a's first step comes last
    (tmp_path / "train.json").write_text(json.dumps(rows))
    chosen = _shared_cpu_benchmark().whole_games(tmp_path / "train.json", games=2, min_turns=3)
    assert sorted((r["game_id"], r["turn"]) for r in chosen) == [("a", 0), ("a", 1), ("a", 2), ("c", 0), ("c", 1), ("c", 2), ("c", 3)]

