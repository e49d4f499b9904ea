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
# Three workers (pytest-xdist) on two cores, each test file whole on one of them (its module
# fixtures, such as the vLLM server, start once), the files with slow tests handed out first
# (tests/conftest.py, which also keeps each worker on one thread). Two workers left a third of the
# cores idle while tests waited on their servers and child processes; a third fills that time
# (docs/testing.md). TEST_WORKERS=0 runs everything in this process.
# --durations: the 25 slowest tests, so a run that grows past its budget says where the time went.
exec "$PYTHON" -m pytest -q -n "${TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder --durations=25 tests "$@"
