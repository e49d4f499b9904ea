#!/usr/bin/env bash
# Serve a model folder with a real vLLM server: the package's aria/llm/serve_vllm.sh (its header
# lists the commands and settings: MODEL_DIR [PORT] | stop PID | install).
exec bash "$(dirname "$0")/../aria/llm/serve_vllm.sh" "$@"
