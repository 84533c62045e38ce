#!/usr/bin/env bash
# The GPU checks of dkmeans in one run, each step under its own time limit, logs under $OUT:
#   1. environment: the GPU, the versions, dkmeans and the fused kernels on a tiny input;
#   2. the GPU tests (pytest -m gpu: the fused kernels, the namespace kernels on CuPy, fits
#      on CuPy, device="gpu", CuPy-backed Dask arrays, LocalCUDACluster);
#   3. benchmarks/gpu_lloyd.py at n = 10M, d = 128, k = 1,000 (float32) beside the cuBLAS
#      floor, then the CPU benchmark's shapes, then the TF32 product (CUPY_TF32=1);
#   4. every benchmark JSON merged into $OUT/results.json.
#
# Run from the repository root on a machine with an NVIDIA GPU, CuPy and dkmeans' dependencies
# (dask-cuda for the LocalCUDACluster parts). Optional: WHEELS=<folder of wheels> installs them
# first into a scratch folder put on PYTHONPATH (for a machine without a package index);
# QUICK=1 runs the benchmark at n = 1M; SCRATCH="64 256 1024" the scratch sizes (MiB) it times;
# NO_CPU=1 leaves out its CPU part, SHAPES=0 the CPU benchmark's shapes, TF32=0 the TF32 run.
# Steps go on past a failure; the exit code is that of the tests.
set -u
OUT=${OUT:-benchmarks/results/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
ROOT=$(pwd)
export PYTHONUNBUFFERED=1
step() { echo; echo "== $(date -u +%H:%M:%S) $*"; }

if [ -n "${WHEELS:-}" ]; then
    step "install wheels from $WHEELS"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/dkmeans-site "$WHEELS"/*.whl 2>&1 | tail -3
    export PYTHONPATH=/tmp/dkmeans-site:$ROOT
else
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi

{
    step "environment"
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm \
        --format=csv 2>&1
    nproc; free -g | head -2
    timeout 120 $PY - <<'EOF'
import importlib, sys, time
print("python", sys.version.split()[0])
for name in ("numpy", "cupy", "numba", "scipy", "sklearn", "pandas", "pyarrow", "dask",
             "distributed", "dask_cuda", "tornado", "pynvml", "cuda.core", "dkmeans"):
    try:
        mod = importlib.import_module(name)
        print(f"{name:12s} {getattr(mod, '__version__', '?'):12s} {getattr(mod, '__file__', '')}")
    except Exception as exc:
        print(f"{name:12s} FAILED {type(exc).__name__}: {exc}")
import cupy as cp
dev = cp.cuda.Device()
props = cp.cuda.runtime.getDeviceProperties(dev.id)
print("device", props["name"], "cc", dev.compute_capability, "SMs", props["multiProcessorCount"],
      "runtime", cp.cuda.runtime.runtimeGetVersion(), "driver", cp.cuda.runtime.driverGetVersion())
from dkmeans.kernels.backends import cuda as kc
import numpy as np
t0 = time.perf_counter()
X = cp.asarray(np.random.default_rng(0).standard_normal((1000, 16), dtype=np.float32))
labels, d2 = kc.assign_cuda(X, X[:7])
cp.cuda.Device().synchronize()
print("fused kernels compiled and ran in", round(time.perf_counter() - t0, 2), "s; labels of the "
      "first 7 rows:", cp.asnumpy(labels[:7]), "distances", cp.asnumpy(d2[:7]))
EOF
} 2>&1 | tee "$OUT/env.log"

step "GPU tests" | tee "$OUT/tests.log"
timeout ${TEST_TIMEOUT:-240} $PY -m pytest -m gpu -q -rfEs --timeout 150 -p no:cacheprovider \
    -n ${TEST_PROCS:-4} --dist loadfile \
    tests/kernels tests/drivers/test_local_search.py tests/fit/test_gpu_fit.py tests/fit/test_gpu_faces.py \
    tests/system/test_deploy.py::test_gpu_fit_on_local_cuda_cluster 2>&1 | tee -a "$OUT/tests.log"
tests_rc=${PIPESTATUS[0]}
echo "pytest exit code $tests_rc" | tee -a "$OUT/tests.log"

mkdir -p /tmp/dkmeans-bench
N=10000000
[ "${QUICK:-0}" = 1 ] && N=1000000
{
    step "gpu_lloyd: n=$N d=128 k=1000 float32"
    timeout ${BENCH_TIMEOUT:-200} $PY benchmarks/gpu_lloyd.py --n $N --d 128 --k 1000 --iters 5 \
        --repeats 3 --scratch-mib ${SCRATCH:-64 256 1024} \
        $([ "${NO_CPU:-0}" = 1 ] && echo --no-cpu) \
        --output /tmp/dkmeans-bench/main.json
    shapes="tall 2000000 16 32,wide 500000 128 256,manyk 200000 64 2048"
    [ "${SHAPES:-1}" = 1 ] || shapes=""
    IFS=, read -ra shape_list <<< "$shapes"
    for shape in "${shape_list[@]}"; do
        set -- $shape
        step "gpu_lloyd: the CPU benchmark's shape $1 (n=$2 d=$3 k=$4)"
        timeout 60 $PY benchmarks/gpu_lloyd.py --n $2 --d $3 --k $4 --iters 5 --repeats 3 \
            --scratch-mib 256 --no-dask --no-cpu --output /tmp/dkmeans-bench/shape_$1.json
    done
    if [ "${TF32:-1}" = 1 ]; then
        step "gpu_lloyd with CUPY_TF32=1 (the product in TF32: labels not exact)"
        CUPY_TF32=1 timeout 90 $PY benchmarks/gpu_lloyd.py --n $N --d 128 --k 1000 --iters 3 \
            --repeats 3 --scratch-mib 256 --no-dask --no-cpu --no-whole \
            --output /tmp/dkmeans-bench/tf32.json
    fi
    nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv 2>&1
} 2>&1 | tee "$OUT/bench.log"

$PY - "$OUT/results.json" /tmp/dkmeans-bench/*.json <<'EOF'
import json, pathlib, sys
merged = {pathlib.Path(p).stem: json.loads(pathlib.Path(p).read_text()) for p in sys.argv[2:]}
pathlib.Path(sys.argv[1]).write_text(json.dumps(merged, indent=1))
print("merged", list(merged))
EOF
exit "$tests_rc"
