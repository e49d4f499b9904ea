#!/usr/bin/env bash
# The main job on the embedded defaults, in one command: install, then the small experiment
# (config/experiment/small.yaml): a warm start by behaviour cloning on the scripted expert's
# games, then one iteration of ARIA and of its ablation (no aggregation) from it on ArCHer's
# Twenty Questions subset, each evaluated on the same seeded targets and measured for how far it
# moved, and the table (results/experiments/small/table.md). About 13 minutes on 2 AVX512-BF16 cores after
# the install (README, "What the main job shows"); a second run reuses finished stages. Hydra
# overrides are passed on, e.g.
#   bash scripts/run_main.sh eval.games=100 collect.games=48
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/serve_vllm.sh install
PYTHON=${PYTHON:-python3}
exec "$PYTHON" scripts/run_experiment.py --config-name experiment "$@"
