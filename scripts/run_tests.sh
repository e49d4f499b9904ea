#!/usr/bin/env bash
# Install, then run the whole test suite on the CPU. Tests build tiny random models themselves;
# the vLLM integration test (tests/test_vllm_integration.py, marked slow) serves the embedded
# model with a real vLLM server, so the CPU build of vLLM is installed first into its own
# virtual environment (scripts/serve_vllm.sh install; about 3 minutes the first time).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/serve_vllm.sh install
PYTHON=${PYTHON:-python3}
exec "$PYTHON" -m pytest -q tests "$@"
