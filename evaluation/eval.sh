#!/usr/bin/env bash
# Evaluate a model served by an OpenAI-compatible server (vLLM) on the single-agent games.
#
#   BASE_URL=http://127.0.0.1:8000/v1 MODEL_NAME=my-model bash evaluation/eval.sh
#   bash evaluation/eval.sh compare results/single_agent/base results/single_agent/aria
#
# Settings (environment variables, defaults in brackets):
#   BASE_URL      the server's API root [http://127.0.0.1:8000/v1]
#   MODEL_NAME    the served model name [default]
#   ENVS          environments [twenty_questions guess_my_city]
#   N             games per environment [200]; targets are a seeded order through the list, the
#                 same for every model compared
#   SEED          fixes the targets [0]
#   CONCURRENCY   requests in flight [16]
#   TEMPERATURE   sampling temperature of the policy [1.0]; MAX_TOKENS per reply [64]
#   ORACLE        knowledge_base (offline) or the base URL of an OpenAI-compatible server [knowledge_base]
#   ORACLE_MODEL  the oracle server's model name, when ORACLE is a URL [default]
#   OUT           result folder [results/single_agent/$MODEL_NAME]
# Re-running with the same settings continues where it stopped. Any further arguments are
# passed to evaluation/evaluate.py as Hydra overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [ "${1:-}" = "compare" ]; then
  shift
  exec "$PYTHON" evaluation/compare.py "$@"
fi

BASE_URL=${BASE_URL:-http://127.0.0.1:8000/v1}
MODEL_NAME=${MODEL_NAME:-default}
ENVS=${ENVS:-"twenty_questions guess_my_city"}
N=${N:-200}
SEED=${SEED:-0}
CONCURRENCY=${CONCURRENCY:-16}
TEMPERATURE=${TEMPERATURE:-1.0}
MAX_TOKENS=${MAX_TOKENS:-64}
ORACLE=${ORACLE:-knowledge_base}
OUT=${OUT:-results/single_agent/$MODEL_NAME}

envs_list=$(echo "$ENVS" | xargs | tr ' ' ',')
oracle_args=(oracle=knowledge_base)
if [ "$ORACLE" != "knowledge_base" ]; then
  oracle_args=(oracle=llm "oracle.base_url=$ORACLE" "oracle.model=${ORACLE_MODEL:-default}")
fi

exec "$PYTHON" evaluation/evaluate.py "policy.base_url=$BASE_URL" "policy.model=$MODEL_NAME" "envs=[$envs_list]" \
  "num_games=$N" "seed=$SEED" "policy.concurrency=$CONCURRENCY" "policy.temperature=$TEMPERATURE" \
  "policy.max_tokens=$MAX_TOKENS" "out=$OUT" "${oracle_args[@]}" "$@"
