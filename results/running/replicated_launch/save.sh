#!/usr/bin/env bash
# At a session's end: the replicated run's resumable copy and its launch files and logs, committed.
set -euo pipefail
cd /work/main
python scripts/copy_run.py /work/runs/replicated results/running/replicated
# ArCHer's final critic (184 MB): a later iteration's critic would start from it, but this preset runs
# one iteration, and the finished critic's advantages (critic/train.json) are what a resumed actor reads
find results/running/replicated -path '*/critic/final/*.safetensors' -delete
mkdir -p results/running/replicated_launch
cp /work/runs/rep.sh /work/runs/alive.sh /work/runs/save.sh /work/runs/replicated_machines.log results/running/replicated_launch/
[ -f /work/runs/replicated_alive.log ] && cp /work/runs/replicated_alive.log results/running/replicated_launch/
git add -f results/running/replicated results/running/replicated_launch
git commit -qm "replicated: its resumable copy, launch files and logs at this session's end ($(tr '\r' '\n' < /work/runs/rep.log | grep -a -o '^\[experiment\] ([0-9]*/64)' | tail -1 | grep -o '[0-9]*/64') stages done)"
git log --oneline -1
