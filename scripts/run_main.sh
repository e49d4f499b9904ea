#!/usr/bin/env bash
# The main job on the embedded defaults, in one command: install, then the whole ARIA loop for
# Twenty Questions and Guess My City (collect -> pipeline steps 1-4 -> offline REINFORCE with
# LoRA -> merge -> serve the base and trained models with vLLM -> evaluate both -> report).
# Sized for about 15 minutes on 2 CPU cores (config/main.yaml); a second run reuses finished
# steps. Hydra overrides after the script name are passed on, e.g.
#   bash scripts/run_main.sh eval.num_games=200 collect.num_games=200
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/serve_vllm.sh install
PYTHON=${PYTHON:-python3}
exec "$PYTHON" scripts/main_job.py "$@"
