#!/usr/bin/env bash
# Beside the pinned run (whose commit predates the runner's heartbeat): one line a minute while its
# command lives, so a command killed at a session's end is timed to the minute from this log.
pid=$(pgrep -f "scripts/run_experiment.py --config-name experiment experiment=replicated" | head -1)
[ -n "$pid" ] || exit 0
started=$(ps -o lstart= -p "$pid" | xargs -I{} date -u -d "{}" +%FT%TZ)
while kill -0 "$pid" 2>/dev/null; do
  echo "alive $(date -u +%FT%TZ) pid $pid started $started" >> /work/runs/replicated_alive.log
  sleep 60
done
