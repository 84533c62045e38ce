#!/usr/bin/env bash
# Start a loopback-only Dask cluster from the command line (one `dask scheduler`, N worker
# processes), run `dkmeans fit` (and optionally `dkmeans predict`) on it, and stop it again.
#
# Usage:
#   deploy/local/run_local.sh [--workers N] [--gpu] [--predict INPUT OUTPUT] [--keep-logs] \
#                             [--] FIT_ARGS...
#
#   FIT_ARGS are passed to `dkmeans fit` unchanged (INPUT -k K --model OUT ...); the script
#   adds `--scheduler ADDRESS`. --predict labels INPUT with the model written by the fit
#   (the path given with --model) into the Parquet directory OUTPUT.
#
# Options:
#   --workers N     worker processes, one thread each (default: 2)
#   --gpu           start `dask cuda worker` (dask-cuda, one worker per visible GPU) instead;
#                   --workers is then ignored: choose GPUs with CUDA_VISIBLE_DEVICES
#   --predict IN OUT  after the fit, run `dkmeans predict MODEL IN --output OUT`
#   --keep-logs     keep the scheduler/worker logs (their folder is printed)
#
# Environment:
#   PYTHON          the interpreter whose dask/dkmeans to use (default: python3 on PATH)
#   STARTUP_TIMEOUT seconds to wait for the scheduler and workers (default: 60)
#
# Everything binds to 127.0.0.1 and the script always stops the processes it started
# (trap on EXIT, also on Ctrl-C / SIGTERM). Exit status: that of dkmeans, or 1 when the
# cluster did not come up.
set -euo pipefail

PYTHON=${PYTHON:-python3}
STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-60}
WORKERS=2
GPU=0
KEEP_LOGS=0
PREDICT_IN=""
PREDICT_OUT=""
FIT_ARGS=()

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --workers) WORKERS=${2:?--workers needs a number}; shift 2 ;;
        --workers=*) WORKERS=${1#*=}; shift ;;
        --gpu) GPU=1; shift ;;
        --predict) PREDICT_IN=${2:?--predict needs INPUT OUTPUT}; PREDICT_OUT=${3:?--predict needs INPUT OUTPUT}; shift 3 ;;
        --keep-logs) KEEP_LOGS=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; FIT_ARGS+=("$@"); break ;;
        *) FIT_ARGS+=("$1"); shift ;;
    esac
done

if [[ ${#FIT_ARGS[@]} -eq 0 ]]; then
    echo "run_local.sh: error: no arguments for dkmeans fit (INPUT -k K --model OUT ...)" >&2
    exit 2
fi
if ! [[ $WORKERS =~ ^[1-9][0-9]*$ ]]; then
    echo "run_local.sh: error: --workers must be a positive integer, got '$WORKERS'" >&2
    exit 2
fi

MODEL=""
if [[ -n $PREDICT_IN ]]; then
    for ((i = 0; i < ${#FIT_ARGS[@]}; i++)); do
        case "${FIT_ARGS[i]}" in
            --model) MODEL=${FIT_ARGS[i + 1]:-} ;;
            --model=*) MODEL=${FIT_ARGS[i]#--model=} ;;
        esac
    done
    if [[ -z $MODEL ]]; then
        echo "run_local.sh: error: --predict needs the fit's --model path" >&2
        exit 2
    fi
fi

WORKDIR=$(mktemp -d "${TMPDIR:-/tmp}/dkmeans-local.XXXXXX")
SCHEDULER_FILE="$WORKDIR/scheduler.json"
PIDS=()

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    # Each process was started in its own session (setsid): signal the whole group so
    # nannies and their worker processes go too; workers first, the scheduler last.
    local pid
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        pid=${PIDS[i]}
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do      # up to 5 s for a clean shutdown
            kill -0 -- "-$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [[ $status -ne 0 || $KEEP_LOGS -eq 1 ]]; then
        echo "run_local.sh: logs in $WORKDIR" >&2
        if [[ $status -ne 0 && $KEEP_LOGS -eq 0 ]]; then
            tail -n 20 "$WORKDIR"/*.log >&2 2>/dev/null || true
        fi
    fi
    [[ $KEEP_LOGS -eq 1 ]] || rm -rf "$WORKDIR"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start() {  # start "$@" in a new session (its pid is its process-group id); log to $LOG
    if command -v setsid >/dev/null 2>&1; then
        setsid "$@" >"$LOG" 2>&1 </dev/null &
    else
        "$@" >"$LOG" 2>&1 </dev/null &
    fi
    PIDS+=("$!")
}

# One BLAS/OpenMP thread per worker thread (no oversubscription).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

LOG="$WORKDIR/scheduler.log" start "$PYTHON" -m dask scheduler \
    --host 127.0.0.1 --port 0 --dashboard-address 127.0.0.1:0 \
    --scheduler-file "$SCHEDULER_FILE"

for _ in $(seq $((STARTUP_TIMEOUT * 10))); do
    [[ -s $SCHEDULER_FILE ]] && break
    kill -0 "${PIDS[0]}" 2>/dev/null || { echo "run_local.sh: error: the scheduler exited" >&2; exit 1; }
    sleep 0.1
done
[[ -s $SCHEDULER_FILE ]] || { echo "run_local.sh: error: no scheduler after ${STARTUP_TIMEOUT} s" >&2; exit 1; }

if [[ $GPU -eq 1 ]]; then
    # dask-cuda: one worker process per visible GPU, each with its own CUDA context.
    EXPECTED=$("$PYTHON" -c 'import os, sys
v = os.environ.get("CUDA_VISIBLE_DEVICES")
if v is not None:
    print(len([d for d in v.split(",") if d.strip()]))
else:
    import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())') || {
        echo "run_local.sh: error: --gpu needs dask-cuda and an NVIDIA GPU (pip install 'dkmeans[gpu]')" >&2; exit 1; }
    LOG="$WORKDIR/workers.log" start "$PYTHON" -m dask cuda worker \
        --scheduler-file "$SCHEDULER_FILE" --host 127.0.0.1 --no-dashboard \
        --local-directory "$WORKDIR"
else
    EXPECTED=$WORKERS
    LOG="$WORKDIR/workers.log" start "$PYTHON" -m dask worker \
        --scheduler-file "$SCHEDULER_FILE" --host 127.0.0.1 --no-dashboard \
        --nworkers "$WORKERS" --nthreads 1 --local-directory "$WORKDIR"
fi

"$PYTHON" - "$SCHEDULER_FILE" "$EXPECTED" "$STARTUP_TIMEOUT" <<'EOF' || { echo "run_local.sh: error: the workers did not start" >&2; exit 1; }
import sys
from distributed import Client

scheduler_file, n, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with Client(scheduler_file=scheduler_file, timeout=timeout) as client:
    client.wait_for_workers(n, timeout=timeout)
EOF

ADDRESS=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["address"])' "$SCHEDULER_FILE")
echo "run_local.sh: scheduler $ADDRESS with $EXPECTED worker(s)"

"$PYTHON" -m dkmeans fit "${FIT_ARGS[@]}" --scheduler "$ADDRESS"
if [[ -n $PREDICT_IN ]]; then
    "$PYTHON" -m dkmeans predict "$MODEL" "$PREDICT_IN" --output "$PREDICT_OUT" --scheduler "$ADDRESS"
fi
