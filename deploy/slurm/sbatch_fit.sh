#!/usr/bin/env bash
# Batch k-means fit inside ONE SLURM allocation: task 0 runs the Dask scheduler, the other
# tasks run one Dask worker each, and the batch script itself runs `dkmeans fit` against the
# scheduler (the scheduler-file pattern: the address travels through a file on a shared
# filesystem, nothing is hard-coded).
#
# Submit (edit the #SBATCH lines or override them on the command line):
#   sbatch deploy/slurm/sbatch_fit.sh /shared/data/*.parquet -k 16 --model /shared/model.npz \
#          --random-state 0
# All arguments are passed to `dkmeans fit` (INPUT -k K --model OUT [...]); the script adds
# --scheduler. Environment knobs: DKMEANS_VENV (a venv to activate on every node),
# SCHEDULER_DIR (shared folder for the scheduler file and the Dask logs, dkmeans-fit-<job>-scheduler.log
# and -workers.log; default: the submit directory).
#
# Stopping: `scancel`, and the time limit (SIGTERM 60 s before it, --signal below), stop the
# fit cleanly: with --checkpoint PATH it writes its last iteration there and exits 143, and the
# same command with --resume continues to the result an uninterrupted job gives.
#
#SBATCH --job-name=dkmeans-fit
#SBATCH --ntasks=5                 # 1 scheduler + 4 workers
#SBATCH --cpus-per-task=8          # threads of each worker (and the scheduler's task)
#SBATCH --mem-per-cpu=4G
#SBATCH --time=01:00:00
#SBATCH --signal=B:TERM@60         # SIGTERM to this script 60 s before the time limit
##SBATCH --partition=compute       # remove one '#' to use
##SBATCH --account=myproject
#SBATCH --output=dkmeans-fit-%j.out

set -euo pipefail

if [[ -n ${DKMEANS_VENV:-} ]]; then
    # shellcheck disable=SC1091
    source "$DKMEANS_VENV/bin/activate"
fi

SCHEDULER_DIR=${SCHEDULER_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}
SCHEDULER_FILE="$SCHEDULER_DIR/dask-scheduler-${SLURM_JOB_ID:-local}.json"
THREADS=${SLURM_CPUS_PER_TASK:-1}
N_WORKERS=$(( ${SLURM_NTASKS:-2} - 1 ))
# The Dask processes' logs, apart from the fit's output (the job's --output)
LOG_PREFIX="$SCHEDULER_DIR/dkmeans-fit-${SLURM_JOB_ID:-local}"
# one BLAS/OpenMP thread per worker thread
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
rm -f "$SCHEDULER_FILE"

PIDS=()
cleanup() {
    local status=$?
    # Stop the workers and the scheduler through Dask, so the srun steps end by themselves
    # (a SIGTERM to srun kills its tasks); then stop what is left.
    if [[ -s $SCHEDULER_FILE ]]; then
        timeout 20 python - "$SCHEDULER_FILE" >/dev/null 2>&1 <<'EOF' || true
import sys
from distributed import Client

with Client(scheduler_file=sys.argv[1], timeout="10s") as client:
    # the workers first (each closes gracefully), then the scheduler
    client.retire_workers(list(client.scheduler_info()["workers"]), close_workers=True)
    client.shutdown()
EOF
    fi
    local deadline=$((SECONDS + 15))
    for pid in "${PIDS[@]}"; do
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
        kill -TERM "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -f "$SCHEDULER_FILE"
    exit "$status"
}
trap cleanup EXIT

# The scheduler: one task on the first node. It listens on the cluster network, so the
# port is open to every node of the allocation: on a shared cluster add TLS (see README).
srun --ntasks=1 --nodes=1 --cpus-per-task=1 --exclusive --output "$LOG_PREFIX-scheduler.log" \
    dask scheduler --scheduler-file "$SCHEDULER_FILE" --port 0 --dashboard-address :0 &
PIDS+=("$!")

for _ in $(seq 120); do [[ -s $SCHEDULER_FILE ]] && break; sleep 1; done
[[ -s $SCHEDULER_FILE ]] || { echo "sbatch_fit.sh: no scheduler file after 120 s" >&2; exit 1; }

# The workers: the remaining tasks, one worker process with $THREADS threads each.
srun --ntasks="$N_WORKERS" --cpus-per-task="$THREADS" --exclusive --output "$LOG_PREFIX-workers.log" \
    dask worker --scheduler-file "$SCHEDULER_FILE" --nthreads "$THREADS" \
    --memory-limit "$(( ${SLURM_MEM_PER_CPU:-4096} * THREADS ))MiB" \
    --local-directory "${TMPDIR:-/tmp}" --no-dashboard &
PIDS+=("$!")

python - "$SCHEDULER_FILE" "$N_WORKERS" <<'EOF'
import sys
from distributed import Client

with Client(scheduler_file=sys.argv[1], timeout="120s") as client:
    client.wait_for_workers(int(sys.argv[2]), timeout=600)
EOF

ADDRESS=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["address"])' "$SCHEDULER_FILE")
# The fit runs in the background so that a SIGTERM to this script alone (--signal=B:...) reaches
# it too; it ends with 0 (done), 2 (a user error), 1 (an internal error) or 143 (stopped).
dkmeans fit "$@" --scheduler "$ADDRESS" &
FIT=$!
trap 'kill -TERM "$FIT" 2>/dev/null || true' TERM INT
set +e
wait "$FIT"
status=$?
while kill -0 "$FIT" 2>/dev/null; do  # a signal interrupted the wait: wait for the fit to stop
    wait "$FIT"
    status=$?
done
set -e
exit "$status"
