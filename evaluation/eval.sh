#!/usr/bin/env bash
# Evaluate a model served by an OpenAI-compatible server (vLLM) on the single-agent games, and on
# the two-player games as Alice and as Bob against an opponent.
#
#   BASE_URL=http://127.0.0.1:8000/v1 MODEL_NAME=my-model bash evaluation/eval.sh
#   ENVS="bargaining negotiation" N_PER_CONFIG=25 bash evaluation/eval.sh
#   bash evaluation/eval.sh compare results/eval/base results/eval/aria
#
# Settings (environment variables, defaults in brackets):
#   BASE_URL      the server's API root [http://127.0.0.1:8000/v1]
#   MODEL_NAME    the served model name [default]
#   ENVS          environments [twenty_questions guess_my_city]; two-player: bargaining negotiation
#   N             single-agent games per environment [200]; targets are a seeded order through the
#                 list, the same for every model compared
#   N_PER_CONFIG  two-player games per configuration and seat [25]
#   CONFIG_SET    two-player configurations, a config set of config/game/<game>.yaml [eval48]
#   OPPONENT      two-player opponent: scripted, self, or the base URL of an OpenAI-compatible server [scripted]
#   OPPONENT_STRENGTH  the scripted opponent's strength, 0 (weak) to 1 (strong) [1.0]
#   OPPONENT_MODEL     the opponent server's model name, when OPPONENT is a URL [default]
#   SEED          fixes the targets [0]
#   CONCURRENCY   requests in flight [16]
#   TEMPERATURE   sampling temperature of the policy [1.0]; MAX_TOKENS per reply [64] (single-agent),
#   MAX_TOKENS_TWO_PLAYER [160]
#   ORACLE        knowledge_base (offline) or the base URL of an OpenAI-compatible server [knowledge_base]
#   ORACLE_MODEL  the oracle server's model name, when ORACLE is a URL [default]
#   OUT           result folder [results/eval/$MODEL_NAME]
#   FORCE_NEW     1: OUT holds games of another model or other settings; move them aside and start over [0]
# Re-running with the same settings continues where it stopped; with other settings (another
# MODEL_NAME, sampling or oracle) into the same OUT it stops with one line naming the difference.
# Any further arguments are passed to evaluation/evaluate.py as Hydra overrides (config/eval.yaml), e.g.
# max_turns=5 for short single-agent games.
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
MAX_TOKENS_TWO_PLAYER=${MAX_TOKENS_TWO_PLAYER:-160}
N_PER_CONFIG=${N_PER_CONFIG:-25}
CONFIG_SET=${CONFIG_SET:-eval48}
OPPONENT=${OPPONENT:-scripted}
ORACLE=${ORACLE:-knowledge_base}
OUT=${OUT:-results/eval/$MODEL_NAME}
FORCE_NEW=${FORCE_NEW:-0}

envs_list=$(echo "$ENVS" | xargs | tr ' ' ',')
oracle_args=(oracle=knowledge_base)
if [ "$ORACLE" != "knowledge_base" ]; then
  oracle_args=(oracle=llm "oracle.base_url=$ORACLE" "oracle.model=${ORACLE_MODEL:-default}")
fi

case "$OPPONENT" in
  scripted) opponent_args=(opponent=scripted "opponent.strength=${OPPONENT_STRENGTH:-1.0}") ;;
  self) opponent_args=(opponent=self) ;;
  *) opponent_args=(opponent=endpoint "opponent.base_url=$OPPONENT" "opponent.model=${OPPONENT_MODEL:-default}") ;;
esac

exec "$PYTHON" evaluation/evaluate.py "policy.base_url=$BASE_URL" "policy.model=$MODEL_NAME" "envs=[$envs_list]" \
  "num_games=$N" "seed=$SEED" "policy.concurrency=$CONCURRENCY" "policy.temperature=$TEMPERATURE" \
  "policy.max_tokens=$MAX_TOKENS" "out=$OUT" "${oracle_args[@]}" "${opponent_args[@]}" \
  "two_player.games_per_config=$N_PER_CONFIG" "two_player.config_set=$CONFIG_SET" "two_player.max_tokens=$MAX_TOKENS_TWO_PLAYER" \
  "force_new=$([ "$FORCE_NEW" = 1 ] && echo true || echo false)" "$@"
