#!/usr/bin/env bash
# Train the pointwise reward model (docs/method.md §5), like the original's reward-model script.
#
#   TRAIN_FILE=outputs/intention/twenty_questions/train.json bash scripts/train_rm.sh
#   NUM_PROCESSES=8 ACCELERATE_CONFIG=config/accelerate/gpu_8.yaml MODEL_PATH=/models/Llama-3.1-8B-Instruct bash scripts/train_rm.sh
#
# Settings (environment variables, defaults in brackets):
#   TRAIN_FILE         the aggregated-reward training set, pipeline step 4's train.json
#                      [outputs/intention/twenty_questions/train.json]
#   MODEL_PATH         a Hugging Face model folder; "embedded" = SmolLM2-135M-Instruct [embedded]
#   OUTPUT_DIR         checkpoints/, final/, metrics.jsonl, eval.json [the config's: outputs/reward_model/cpu/<data>,
#                      <data> the training file's folder, e.g. twenty_questions]
#   LORA               true = LoRA adapter (head trained in full), false = full fine-tuning [false]
#   LR                 learning rate [2e-5]; EPOCHS [3]
#   MICRO_BATCH        samples per forward pass per process [8]
#   GRAD_ACCUM         micro-batches per optimizer step [8]; batch = MICRO_BATCH x GRAD_ACCUM x processes
#   MAX_PROMPT_TOKENS  observations are truncated on the left to this many tokens [512]
#   EVAL_FRACTION      share of games held out for eval loss and correlations [0.1]
#   SEED               [0]
#   ACCELERATE_CONFIG  an accelerate config (config/accelerate/*.yaml); when set, runs `accelerate launch` []
#   NUM_PROCESSES      processes for accelerate launch [1]
# Any further arguments are passed on as Hydra overrides (e.g. loss.weighted_mse.extreme_weight=3.0).
# Re-running the same command resumes from the newest checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

args=(
  "data.train_file=${TRAIN_FILE:-outputs/intention/twenty_questions/train.json}"
  "model.path=${MODEL_PATH:-embedded}"
  "model.lora.enabled=${LORA:-false}"
  "train.lr=${LR:-2e-5}"
  "train.epochs=${EPOCHS:-3}"
  "train.micro_batch_size=${MICRO_BATCH:-8}"
  "train.gradient_accumulation_steps=${GRAD_ACCUM:-8}"
  "data.max_prompt_tokens=${MAX_PROMPT_TOKENS:-512}"
  "data.eval_fraction=${EVAL_FRACTION:-0.1}"
  "seed=${SEED:-0}"
)
if [ -n "${OUTPUT_DIR:-}" ]; then args+=("output_dir=$OUTPUT_DIR"); fi
if [ -n "${ACCELERATE_CONFIG:-}" ]; then
  exec accelerate launch --config_file "$ACCELERATE_CONFIG" --num_processes "${NUM_PROCESSES:-1}" \
    scripts/train_rm.py "${args[@]}" "$@"
fi
exec "$PYTHON" scripts/train_rm.py "${args[@]}" "$@"
