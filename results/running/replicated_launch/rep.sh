#!/usr/bin/env bash
# The replicated run, pinned to the worktree's commit; each start and end logged with its machine.
cd /work/wt_rep
m="$(lscpu | sed -n 's/^Model name: *//p') $(nproc) cores $(lscpu | grep -o -E 'avx512_bf16|amx_tile|avx2' | sort -u | tr '\n' ' ')"
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) $m" >> /work/runs/replicated_machines.log
(sleep 30; bash /work/runs/alive.sh) &  # a line a minute while the command lives (replicated_alive.log)
PYTHONPATH=/work/wt_rep python scripts/run_experiment.py --config-name experiment experiment=replicated run_dir=/work/runs/replicated
rc=$?
echo "end $(date -u +%FT%TZ) rc $rc" >> /work/runs/replicated_machines.log
exit $rc
