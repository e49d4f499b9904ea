"""One writer for every resumable output (aria.io.hold_output): a collection's or evaluation's games
file, a trainer's output_dir, a pipeline run_dir. A second command on an output another process
holds stops in one line (exit 2) naming that process, and writes nothing; before, two collections
into one file both exited 0 with every game written twice, and two trainings into one output_dir
wrote every metrics row twice. The holder here is a real second process."""
from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from in_process import run_script

REPO = Path(__file__).resolve().parents[1]
HOLD = ("import sys, time; from aria.io import hold_output; "
        "kind = sys.argv[2]; hold_output(sys.argv[1], **({'beside': True} if kind == 'beside' else {'is_file': kind == 'file'})); "
        "print('held', flush=True); time.sleep(300)")


@contextmanager
def held(path: Path, kind: str):
    """``path`` held by another process until the block ends; yields its PID."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), kind], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def one_line(done) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return lines[-1]


def test_a_second_collection_into_one_games_file_is_refused(tmp_path):
    from aria.trajectories import read_trajectories

    out = tmp_path / "games.jsonl"
    common = [REPO / "scripts/collect_games.py", "game=twenty_questions_subset", "num_games=2", "progress=false",
              "policy=scripted", f"out={out}"]
    with held(out, "file") as pid:
        line = one_line(run_script(*common))
        assert f"out: {out} is in use by process {pid} " in line, line
        assert not out.exists() or not out.read_text().strip()
    assert run_script(*common).returncode == 0  # the holder gone: it plays
    assert run_script(*common).returncode == 0  # and again: it resumes, nothing doubled
    assert sorted(r["game_id"] for r in read_trajectories(out)) == sorted({r["game_id"] for r in read_trajectories(out)})
    assert len(list(read_trajectories(out))) == 2


def test_a_second_training_into_one_output_dir_is_refused_before_the_model_loads(tmp_path):
    train = tmp_path / "train.json"
    train.write_text(json.dumps([{"observation": "o", "action": "a", "reward": 1.0}]))
    out = tmp_path / "off"
    with held(out, "folder") as pid:
        # model.path names no model: the refusal comes before any model is read
        line = one_line(run_script(REPO / "scripts/run_offline.py", "--config-name", "reinforce_llm",
                                   f"data.train_file={train}", f"output_dir={out}", "model.path=/no/model"))
    assert f"output_dir: {out} is in use by process {pid} " in line, line
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_a_second_pipeline_step_on_one_run_dir_is_refused(tmp_path):
    games = tmp_path / "games.jsonl"
    run_dir = tmp_path / "intention"
    assert run_script(REPO / "scripts/collect_games.py", "game=twenty_questions_subset", "num_games=1",
                      "progress=false", "policy=scripted", f"out={games}").returncode == 0
    with held(run_dir, "folder") as pid:
        line = one_line(run_script(REPO / "reward_aggregation/1_embed_and_cluster.py", f"input={games}",
                                   f"run_dir={run_dir}"))
    assert f"run_dir: {run_dir} is in use by process {pid} " in line, line
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]


def test_a_process_may_hold_its_own_output_again_and_lets_it_go_when_done(tmp_path):
    """In one process (the experiment runner trains and plays many times) a hold is counted, and a
    released output can be taken by another process."""
    from aria.io import hold_output, release_output

    first = hold_output(tmp_path / "out")
    second = hold_output(tmp_path / "out")
    assert first == second == tmp_path / "out" / ".lock"
    release_output(first)
    probe = [sys.executable, "-c", HOLD.replace("time.sleep(300)", "pass"), str(tmp_path / "out"), "folder"]
    assert subprocess.run(probe, capture_output=True).returncode != 0  # still held once
    release_output(second)
    assert subprocess.run(probe, capture_output=True, text=True).stdout == "held\n"


def test_a_symbolic_link_to_a_held_games_file_is_the_same_output(tmp_path):
    """Before: the lock was keyed on the path's name, and two collections through a link and its
    file both exited 0 with thousands of games written twice (the adversarial pass)."""
    out = tmp_path / "games.jsonl"
    out.write_text("")
    link = tmp_path / "link.jsonl"
    link.symlink_to(out)
    with held(out, "file") as pid:
        line = one_line(run_script(REPO / "scripts/collect_games.py", "game=twenty_questions_subset", "num_games=2",
                                   "progress=false", "policy=scripted", f"out={link}"))
    assert f"is in use by process {pid} " in line, line
    assert out.read_text() == ""


def test_a_refused_command_leaves_no_lock_file_and_no_folder_it_made(tmp_path):
    """Before: a command refused after taking its hold left ``output_dir/.lock`` (a folder made for
    nothing) or ``games.jsonl.lock`` beside a file it never wrote (the adversarial pass)."""
    train = tmp_path / "train.json"
    train.write_text(json.dumps([{"observation": "o", "action": "a", "reward": 1.0}]))
    out = tmp_path / "off"
    done = run_script(REPO / "scripts/run_offline.py", "--config-name", "reinforce_llm", f"data.train_file={train}",
                      f"output_dir={out}", "model.path=/no/model")
    assert "model.path" in one_line(done)
    assert not out.exists()
    games = tmp_path / "games.jsonl"
    common = [REPO / "scripts/collect_games.py", "game=twenty_questions_subset", "num_games=1", "progress=false",
              "policy=scripted", f"out={games}"]
    assert run_script(*common).returncode == 0
    refused = run_script(*common, "seed=7")  # other settings over the finished file: refused, nothing written
    assert "other settings" in one_line(refused)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["games.jsonl", "games.jsonl.producer.json", "train.json"]


def test_a_lock_file_removed_by_its_last_holder_is_not_held_by_name(tmp_path, monkeypatch):
    """Letting go removes the lock file, so a process that opened the old file just before may lock
    a file no one else sees while a third process holds the new one: hold_output must check that the
    file it locked is still the one under the name. The race is staged by hand: right after this
    process opens the lock file, its holder lets go (the file removed) and another process takes the
    output (a new file)."""
    import os

    from aria import io as aria_io

    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").write_text("")
    real_open, raced, stack = os.open, [], []

    def open_then_race(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        if str(path).endswith(".lock") and not raced:
            raced.append(fd)
            os.unlink(path)
            stack.append(held(out, "folder"))
            stack[-1].__enter__()
        return fd

    monkeypatch.setattr(aria_io.os, "open", open_then_race)
    try:
        try:
            aria_io.hold_output(out, "out")
        except aria_io.InUse as refused:
            assert "is in use by process" in str(refused)
        else:
            raise AssertionError("held a lock file that was no longer the output's")
    finally:
        for context in stack:
            context.__exit__(None, None, None)
    assert raced


def test_a_games_file_that_is_a_pipe_or_a_loop_of_links_is_one_line(tmp_path):
    """Before (the adversarial pass at c3cbd65): ``out=`` a named pipe blocked the collection until
    its timeout, and a loop of symbolic links was pathlib's RuntimeError traceback."""
    import os

    os.mkfifo(tmp_path / "pipe.jsonl")
    (tmp_path / "a.jsonl").symlink_to(tmp_path / "b.jsonl")
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "a.jsonl")
    common = [REPO / "scripts/collect_games.py", "game=twenty_questions_subset", "num_games=1", "progress=false",
              "policy=scripted"]
    line = one_line(run_script(*common, f"out={tmp_path / 'pipe.jsonl'}"))
    assert line == f"error: out: {tmp_path / 'pipe.jsonl'} is not a regular file (a folder, a pipe or a device): give the path of a file"
    line = one_line(run_script(*common, f"out={tmp_path / 'a.jsonl'}"))
    assert line.startswith(f"error: out: {tmp_path / 'a.jsonl'}: its symbolic links lead nowhere"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl", "pipe.jsonl"]


def test_step_1_refuses_a_games_file_another_process_is_writing(tmp_path):
    """Step 1 read a games file a collection was still playing (882 of its 4000 games), labelled
    them and exited 0. The writer's hold is seen by the reader: one line naming the process."""
    games = tmp_path / "games.jsonl"
    assert run_script(REPO / "scripts/collect_games.py", "game=twenty_questions_subset", "num_games=2", "progress=false",
                      "policy=scripted", f"out={games}").returncode == 0
    step1 = [REPO / "reward_aggregation/1_embed_and_cluster.py", "game=twenty_questions_subset", f"input={games}",
             f"run_dir={tmp_path / 'int'}", "clustering.k_max=3"]
    with held(games, "file") as pid:
        line = one_line(run_script(*step1))
        assert f"{games}: is being written by process {pid} " in line and "wait for it to end" in line, line
        assert not (tmp_path / "int" / "utterances.json").exists()
    assert run_script(*step1).returncode == 0  # the writer gone: it reads


def test_two_copies_or_merges_into_one_folder_are_refused(tmp_path, tiny_model_dir):
    """Two copy_run (or merge_lora) into one new folder both exited 0, each writing it whole. The
    folder made whole is held beside it (``<folder>.lock``) from before the first check."""
    from aria.experiment.layout import copy_without_weights
    from aria.io import InUse

    run = tmp_path / "run"
    run.mkdir()
    (run / "experiment.json").write_text("{}")
    dest = tmp_path / "copy"
    with held(dest, "beside") as pid:
        try:
            copy_without_weights(run, dest)
        except InUse as err:
            assert f"is in use by process {pid} " in str(err), err
        else:
            raise AssertionError("a copy into a folder another process makes went ahead")
        assert not dest.exists()
    copy_without_weights(run, dest)  # the other writer gone: it copies
    assert (dest / "experiment.json").read_text() == "{}"

    from aria.llm.policy import load_policy, merge_lora

    _, model = load_policy(str(tiny_model_dir), lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj"]})
    model.save_pretrained(tmp_path / "adapter")
    merged = tmp_path / "merged"
    with held(merged, "beside") as pid:
        try:
            merge_lora(tmp_path / "adapter", merged, base=str(tiny_model_dir))
        except InUse as err:
            assert f"OUT_DIR: {merged.resolve()} is in use by process {pid} " in str(err), err
        else:
            raise AssertionError("a merge into a folder another process makes went ahead")
        assert not merged.exists()
