"""Benchmark: one training job alone and on a shared CPU, with the old and the new thread settings.

The job: one epoch of offline REINFORCE (``scripts/run_offline.py --config-name reinforce_llm``,
the CPU preset's defaults, the embedded SmolLM2-135M-Instruct) on a fixed set of whole games: the
first ``--games`` games of at least ``--min-turns`` turns in ``--train-file`` (default: the
warm-started model's collection of the grouping run, committed in results/; most of its games run
the full 20 turns, as a policy that is still learning plays them).

Each setting runs the job three ways, in one process of its own each time:

* ``alone``: nothing else on the cores (``--repeats`` runs, the settings interleaved);
* ``busy_thread``: beside a single-threaded busy loop (another process, started a second before);
* ``second_job``: beside a second copy of the same job with the same settings (both timed).

Settings (``--settings``, default ``old new``): ``old`` = ``train.threads=N`` (N = the cores,
torch's own default before: GNU OpenMP's threads on every core, spinning at each operation's
barrier), ``new`` = ``train.threads=auto`` (aria/threads.py: as many threads as other work leaves
cores free), ``passive`` = the old count with sleeping threads (``OMP_WAIT_POLICY=PASSIVE``). Figures: the command's wall
time and the training's own (the sum of metrics.jsonl's ``seconds``), and each shared way's ratio
to the median alone. Targets (the issue on speed): new beside a busy thread at most 2.5x alone,
beside a second job at most 3x for each, alone no slower than old.

    python benchmarks/shared_cpu.py --out benchmarks/results/shared_cpu.json

The vLLM server (``--ways serve_alone serve_busy_thread``): the embedded model served by
``scripts/serve_vllm.sh`` (the CPU build, its pinned threads), 32 chat requests of 48 tokens, 16
in flight, timed ``--repeats`` times after one warm-up, with nothing else running or beside a busy
thread that was running before the server started. Settings: ``old`` = ``OMP_WAIT_POLICY=ACTIVE``
(spinning, OpenMP's default), ``passive`` = ``OMP_WAIT_POLICY=PASSIVE`` (always sleeping), ``new`` =
the script's own choice at start (aria/threads.py).

    python benchmarks/shared_cpu.py --ways serve_alone serve_busy_thread --out benchmarks/results/shared_cpu_serving.json

Keep the machine otherwise idle: the benchmark is its own competitor.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from aria.io import atomic_write_json, atomic_write_json_rows, read_json
from aria.llm.hardware import describe, label
from aria.resources import REPO_ROOT

DEFAULT_TRAIN = REPO_ROOT / "results/experiments/grouping/run/s0/it1-shared/intention/train.json"
BUSY_LOOP = [sys.executable, "-c", "while True: pass"]


def whole_games(train_file: Path, games: int, min_turns: int) -> list[dict]:
    """Every step of the first ``games`` games (in file order) with at least ``min_turns`` steps."""
    rows = read_json(train_file)
    turns = Counter(r["game_id"] for r in rows)
    chosen: list = []
    for r in rows:
        if turns[r["game_id"]] >= min_turns and r["game_id"] not in chosen and len(chosen) < games:
            chosen.append(r["game_id"])
    if len(chosen) < games:
        sys.exit(f"{train_file}: only {len(chosen)} games of at least {min_turns} turns, asked for {games}")
    keep = set(chosen)
    return [r for r in rows if r["game_id"] in keep]


def start_job(train_file: Path, out: Path, threads: str, model: str, passive: bool = False) -> subprocess.Popen:
    command = [sys.executable, str(REPO_ROOT / "scripts/run_offline.py"), "--config-name", "reinforce_llm",
               f"data.train_file={train_file}", f"output_dir={out}", f"model.path={model}", "train.epochs=1",
               "train.save_freq=1000000", f"train.threads={threads}", "logging.report_to=null", f"hydra.run.dir={out}/hydra"]
    log = open(out.with_suffix(".log"), "w")  # noqa: SIM115 - closed with the process (finish)
    env = {**os.environ, **({"OMP_WAIT_POLICY": "PASSIVE"} if passive else {})}
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env)
    process.log, process.started = log, time.perf_counter()  # type: ignore[attr-defined]
    return process


def finish(process: subprocess.Popen, out: Path) -> dict:
    code = process.wait()
    wall = time.perf_counter() - process.started  # type: ignore[attr-defined]
    process.log.close()  # type: ignore[attr-defined]
    if code != 0:
        sys.exit(f"the training job failed (exit {code}); its output: {out.with_suffix('.log')}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": round(wall, 2), "train_s": round(sum(r["seconds"] for r in rows), 2), "steps": rows[-1]["step"],
            "threads_seen": sorted({r["threads"] for r in rows})}


def run(way: str, setting: str, threads: str, train_file: Path, tmp: Path, model: str, n: int,
        passive: bool = False) -> list[dict]:
    """One measurement of ``way``: the timed job's figures (two for a second job)."""
    outs = [tmp / f"{setting}-{way}-{n}-{i}" for i in range(2 if way == "second_job" else 1)]
    competitor = subprocess.Popen(BUSY_LOOP) if way == "busy_thread" else None
    try:
        if competitor:
            time.sleep(1.0)
        jobs = [start_job(train_file, out, threads, model, passive) for out in outs]
        results = [finish(job, out) for job, out in zip(jobs, outs)]
    finally:
        if competitor:
            competitor.kill()
            competitor.wait()
    for result in results:
        print(json.dumps({"setting": setting, "way": way, **result}), flush=True)
    return results


WAYS = {"alone": "alone", "busy_thread": "beside a busy thread", "second_job": "beside a second job (each)"}


def render(report: dict) -> str:
    """The Markdown table of docs/benchmarks.md "Training on a shared CPU", from a report of this benchmark."""
    if "serve_alone" in report["summary"]["old"]:
        return render_serving(report)
    lines = [f"{label(report['machine'])}; {report['job']['samples']} samples of {report['job']['games']} games, one epoch; "
             "seconds of training (the command's wall time)"]
    names = list(report["settings"])
    lines += ["", "| way | " + " | ".join(f"{name}: `{report['settings'][name]}`" for name in names) + " |",
              "|---" * (len(names) + 1) + "|"]
    for way, name_of_way in WAYS.items():
        cells = []
        for name in names:
            row = report["summary"][name].get(way)
            if row is None:
                cells.append("–")
                continue
            ratio = f", {row['x_alone_train']:.1f}x alone" if "x_alone_train" in row else ""
            cells.append(f"{row['median_train_s']:.0f} s ({row['median_wall_s']:.0f} s){ratio}")
        lines.append(f"| {name_of_way} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def serve_load(base_url: str, name: str, requests: int = 32, in_flight: int = 16, tokens: int = 48) -> float:
    """Seconds for ``requests`` chat requests of exactly ``tokens`` generated tokens, ``in_flight`` at once."""
    from concurrent.futures import ThreadPoolExecutor

    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="EMPTY")

    def one(i: int) -> int:
        reply = client.chat.completions.create(model=name, max_tokens=tokens, temperature=0, extra_body={"ignore_eos": True},
                                               messages=[{"role": "user", "content": f"Ask yes/no question {i} about an object."}])
        return reply.usage.completion_tokens

    start = time.perf_counter()
    with ThreadPoolExecutor(in_flight) as pool:
        generated = sum(pool.map(one, range(requests)))
    if generated != requests * tokens:
        sys.exit(f"the server generated {generated} tokens, expected {requests * tokens}")
    return time.perf_counter() - start


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by a process and every process below it (Linux /proc)."""
    from aria.llm.served import process_tree

    total = 0
    for member in process_tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def idle_cores(pid: int, pause_s: float = 3.0, window_s: float = 10.0) -> float:
    """Cores a server keeps busy with no request in flight: its CPU time over ``window_s`` seconds,
    from ``pause_s`` after its last reply."""
    time.sleep(pause_s)
    before = tree_cpu_seconds(pid)
    time.sleep(window_s)
    return round((tree_cpu_seconds(pid) - before) / window_s, 2)


#: The server's OpenMP wait settings compared (``--serve-settings``): environment variables, None = the script's choice.
SERVE_SETTINGS = {"old": ("OMP_WAIT_POLICY=ACTIVE", {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "30000000000"}),  # libgomp's own count for ACTIVE
                  "passive": ("OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}),
                  "spin": ("GOMP_SPINCOUNT=3000000, the wait chosen by scripts/serve_vllm.sh at start", {"GOMP_SPINCOUNT": "3000000"}),
                  "new": ("the wait chosen by scripts/serve_vllm.sh at start", None)}
SERVE_HEADERS = {"old": "old: spinning (`OMP_WAIT_POLICY=ACTIVE`)", "passive": "always sleeping (`PASSIVE`)",
                 "spin": "chosen at start, spinning 3M turns at most (`GOMP_SPINCOUNT=3000000`)", "new": "new: chosen at start"}


def run_serving(way: str, setting: str, policy: dict | None, model: str, repeats: int) -> list[dict]:
    """One server under the environment ``policy`` (None: the script's choice), timed ``repeats``
    times (after a warm-up); then the cores it keeps busy while idle."""
    from aria.llm.embedded import resolve_model_path
    from aria.llm.served import free_port, start_server, stop_server

    competitor = subprocess.Popen(BUSY_LOOP) if way == "serve_busy_thread" else None
    saved = {key: os.environ.pop(key, None) for key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    os.environ.update(policy or {})
    info = None
    try:
        if competitor:
            time.sleep(1.0)
        info = start_server(resolve_model_path(model), "policy", free_port(), dtype="native")  # as measured: the CPU's fastest
        environ = dict(item.split(b"=", 1) for item in Path(f"/proc/{info['PID']}/environ").read_bytes().split(b"\0") if b"=" in item)
        chosen = environ.get(b"OMP_WAIT_POLICY", b"(unset)").decode()  # what the server runs under
        if b"GOMP_SPINCOUNT" in environ:
            chosen += f", GOMP_SPINCOUNT={environ[b'GOMP_SPINCOUNT'].decode()}"
        serve_load(info["BASE_URL"], info["MODEL_NAME"])  # warm-up
        results = [{"seconds": round(serve_load(info["BASE_URL"], info["MODEL_NAME"]), 2), "omp_wait_policy": chosen}
                   for _ in range(repeats)]
        idle = idle_cores(int(info["PID"])) if way == "serve_alone" else None
        for result in results:
            result["idle_cores"] = idle
    finally:
        if info:
            stop_server(info["PID"])
        if competitor:
            competitor.kill()
            competitor.wait()
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value
    for result in results:
        print(json.dumps({"setting": setting, "way": way, **result}), flush=True)
    return results


def render_serving(report: dict) -> str:
    names = list(report["summary"])
    lines = [f"{label(report['machine'])}; {report['job']['load']}; median seconds", "",
             "| way | " + " | ".join(SERVE_HEADERS[name] for name in names) + " |", "|---" * (len(names) + 1) + "|"]
    for way, name_of_way in (("serve_alone", "alone"), ("serve_busy_thread", "beside a busy thread")):
        cells = []
        for name in names:
            row = report["summary"][name].get(way)
            ratio = f", {row['x_alone']:.1f}x alone" if row and "x_alone" in row else ""
            cells.append(f"{row['median_s']:.1f} s ({row['omp_wait_policy']}){ratio}" if row else "–")
        lines.append(f"| {name_of_way} | " + " | ".join(cells) + " |")
    if any("idle_cores" in report["summary"][name].get("serve_alone", {}) for name in names):
        lines.append("| idle, 3-13 s after its last reply: cores busy | " + " | ".join(
            f"{report['summary'][name]['serve_alone']['idle_cores']:.2f}" if "serve_alone" in report["summary"][name] else "–"
            for name in names) + " |")
    return "\n".join(lines) + "\n"


def headline(report: dict) -> list[dict]:
    """docs/benchmarks.md's summary row of a report: the setting tried against ``old``, for training
    (``new`` or ``passive``) or for the server (``new``: the choice at start; ``spin``: the capped spin)."""
    old, summary, settings = report["summary"]["old"], report["summary"], report["settings"]
    if "serve_alone" in old:
        if "spin" in summary:
            spin = summary["spin"]["serve_alone"]
            return [{"compares": f"an idle vLLM server's spin capped (`{settings['spin']}`) against `{settings['old']}`",
                     "result": f"idle server: cores kept busy {spin['idle_cores']:.2f} against {old['serve_alone']['idle_cores']:.2f}; "
                               f"alone {spin['median_s']:.1f} s against {old['serve_alone']['median_s']:.1f} s"}]
        new = summary["new"]
        return [{"compares": "a vLLM server's OpenMP wait chosen at start against always spinning (`ACTIVE`)",
                 "result": f"server: beside a busy thread it chose {new['serve_busy_thread']['omp_wait_policy']}, "
                           f"{new['serve_busy_thread']['median_s']:.1f} s against {old['serve_busy_thread']['median_s']:.1f} s "
                           f"spinning; alone it chose {new['serve_alone']['omp_wait_policy']}"}]
    if "passive" in summary:
        passive = summary["passive"]
        return [{"compares": f"the same, sleeping threads (`{settings['passive']}`) against spinning",
                 "result": f"sleeping: {passive['busy_thread']['x_alone_train']:.1f}x its time alone beside a busy thread "
                           f"(spinning {old['busy_thread']['x_alone_train']:.1f}x), alone "
                           f"{passive['alone']['median_train_s'] / old['alone']['median_train_s']:.2f}x the spinning time"}]
    new = summary["new"]
    return [{"compares": f"one epoch of training beside other work: `{settings['new']}` against `{settings['old']}` (old)",
             "result": f"{settings['new']}: {new['busy_thread']['x_alone_train']:.1f}x its time alone beside a busy thread "
                       f"(old {old['busy_thread']['x_alone_train']:.1f}x), {new['second_job']['x_alone_train']:.1f}x "
                       f"beside a second job (old {old['second_job']['x_alone_train']:.1f}x), alone "
                       f"{new['alone']['median_train_s'] / old['alone']['median_train_s']:.2f}x the old time"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train-file", type=Path, default=DEFAULT_TRAIN)
    parser.add_argument("--games", type=int, default=12)
    parser.add_argument("--min-turns", type=int, default=15)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--repeats", type=int, default=3, help="runs alone per setting (the noisiest comparison)")
    parser.add_argument("--ways", nargs="+", default=["alone", "busy_thread", "second_job"])
    parser.add_argument("--settings", nargs="+", default=["old", "new"], choices=["old", "new", "passive"],
                        help="training: passive = the old count with sleeping threads (OMP_WAIT_POLICY=PASSIVE)")
    parser.add_argument("--serve-settings", nargs="+", default=["old", "passive", "new"], choices=list(SERVE_SETTINGS),
                        help="serving: the server's OpenMP wait settings to compare")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/shared_cpu.json")
    parser.add_argument("--render", type=Path, help="print the docs' table of this report and exit")
    args = parser.parse_args()
    if args.render:
        print(render(read_json(args.render)), end="")
        return
    cores = len(os.sched_getaffinity(0))
    serving = [way for way in args.ways if way.startswith("serve_")]
    if serving and len(serving) != len(args.ways):
        sys.exit("--ways: the training ways and the serving ways run in separate calls (separate reports)")
    if serving:
        settings = {name: SERVE_SETTINGS[name][0] for name in args.serve_settings}
        results = {name: {way: run_serving(way, name, SERVE_SETTINGS[name][1], args.model, args.repeats)
                          for way in args.ways} for name in settings}
        summary = {name: {way: {"median_s": statistics.median(r["seconds"] for r in runs),
                                "omp_wait_policy": runs[0]["omp_wait_policy"],
                                **({"idle_cores": runs[0]["idle_cores"]} if runs[0].get("idle_cores") is not None else {}),
                                **({"x_alone": round(statistics.median(r["seconds"] for r in runs)
                                                     / statistics.median(r["seconds"] for r in ways["serve_alone"]), 2)}
                                   if way != "serve_alone" and "serve_alone" in ways else {})}
                          for way, runs in ways.items()} for name, ways in results.items()}
        job = {"model": args.model, "load": "32 chat requests of 48 tokens, 16 in flight, temperature 0, after one warm-up",
               "server": "scripts/serve_vllm.sh (CPU build, eager, threads pinned one a core)"}
    else:
        known = {"old": f"train.threads={cores}", "new": "train.threads=auto",
                 "passive": f"OMP_WAIT_POLICY=PASSIVE train.threads={cores}"}
        settings = {name: known[name] for name in args.settings}
        with tempfile.TemporaryDirectory() as folder:
            tmp = Path(folder)
            train_file = tmp / "train.json"
            rows = whole_games(args.train_file, args.games, args.min_turns)
            atomic_write_json_rows(train_file, rows)
            results = {name: {way: [] for way in args.ways} for name in settings}
            for way in args.ways:
                for n in range(args.repeats if way == "alone" else 1):
                    for name, value in settings.items():  # interleaved: a drift of the machine's speed hits both
                        results[name][way] += run(way, name, value.rsplit("=")[-1], train_file, tmp, args.model, n,
                                                  passive=name == "passive")
        summary = {}
        for name, ways in results.items():
            alone = {key: statistics.median(r[key] for r in ways["alone"]) for key in ("wall_s", "train_s")} if ways.get("alone") else None
            summary[name] = {way: {"median_wall_s": statistics.median(r["wall_s"] for r in runs),
                                   "median_train_s": statistics.median(r["train_s"] for r in runs),
                                   **({"x_alone_wall": round(max(r["wall_s"] for r in runs) / alone["wall_s"], 2),
                                       "x_alone_train": round(max(r["train_s"] for r in runs) / alone["train_s"], 2)}
                                      if alone and way != "alone" else {})}
                             for way, runs in ways.items()}
        job = {"train_file": str(args.train_file.relative_to(REPO_ROOT) if args.train_file.is_relative_to(REPO_ROOT)
                                 else args.train_file),
               "games": args.games, "min_turns": args.min_turns, "samples": len(rows), "model": args.model,
               "trainer": "scripts/run_offline.py --config-name reinforce_llm train.epochs=1"}
    report = {"command": "python benchmarks/shared_cpu.py " + " ".join(sys.argv[1:]),
              "machine": {**describe(), "python": sys.version.split()[0]}, "job": job, "settings": settings,
              "note": "x_alone*: the slowest timed job of the way (training) or the median (serving) over the setting's median alone",
              "summary": summary, "runs": results}
    atomic_write_json(args.out, report)
    print(render(report), end="")


if __name__ == "__main__":
    main()
