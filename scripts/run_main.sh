#!/usr/bin/env bash
# The main job on the embedded defaults, in one command: install, then the small experiment
# (config/experiment/small.yaml): a warm start by behaviour cloning on the scripted expert's
# games, then one iteration of ARIA and of its ablation (no aggregation) from it on ArCHer's
# Twenty Questions subset, each evaluated on the same 100 seeded targets, and the table with
# Wilson intervals and the paired test (results/experiments/small/table.md). In float32 on 2 CPU
# cores 26 minutes with AVX512-BF16, 38 with AVX2 only (README, "What the main job shows"); a second run reuses finished stages. Hydra overrides are passed on, e.g.
#   bash scripts/run_main.sh eval.games=200 collect.games=128
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/serve_vllm.sh install
PYTHON=${PYTHON:-python3}
exec "$PYTHON" scripts/run_experiment.py --config-name experiment "$@"
