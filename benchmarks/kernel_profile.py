"""Time the assignment kernels on one chunk in one process (one thread), against a GEMM floor.

Run with one BLAS thread, e.g.::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/kernel_profile.py

For each shape (chunk rows x d, k) it prints the best-of-N seconds of ``assign_partials``,
``assign`` and a bare float32 ``X @ C.T`` into a preallocated buffer (the floor).
"""

from __future__ import annotations

import argparse
import time

import dask
import numpy as np

from dkmeans.kernels import assign, assign_partials

#: name -> (chunk rows, d, k): one of 16 chunks of the benchmark shapes
SHAPES = {
    "small": (100_000 // 16, 8, 10),
    "tall": (2_000_000 // 16, 16, 32),
    "wide": (500_000 // 16, 128, 256),
    "manyk": (200_000 // 16, 64, 2048),
    "manyk8192": (200_000 // 16, 64, 8192),
    "d32k64": (125_000, 32, 64),
    "d64k16": (125_000, 64, 16),
}


def best(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--shapes", nargs="+", default=["small", "tall", "wide", "manyk"], choices=sorted(SHAPES)
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "blas", "numpy"],
        help="Dask config dkmeans.kernels.backend for the whole run",
    )
    args = parser.parse_args(argv)
    dask.config.set({"dkmeans.kernels.backend": args.engine})
    rng = np.random.default_rng(0)
    print(
        f"{'shape':>10} {'m x d, k':>20} {'partials ms':>12} {'assign ms':>10} {'gemm ms':>9} "
        f"{'gemm GF/s':>9} {'partials/gemm':>13}"
    )
    for name in args.shapes:
        m, d, k = SHAPES[name]
        X = rng.normal(size=(m, d)).astype(args.dtype)
        C = X[rng.choice(m, k, replace=False)].copy()
        out = np.empty((m, k), dtype=args.dtype)
        t_gemm = best(lambda: np.matmul(X, C.T, out=out), args.repeats)
        t_part = best(lambda: assign_partials(X, C), args.repeats)
        t_assign = best(lambda: assign(X, C), args.repeats)
        gf = 2 * m * k * d / t_gemm / 1e9
        print(
            f"{name:>10} {f'{m} x {d}, {k}':>20} {t_part * 1e3:12.2f} {t_assign * 1e3:10.2f} "
            f"{t_gemm * 1e3:9.2f} {gf:9.1f} {t_part / t_gemm:13.2f}"
        )


if __name__ == "__main__":
    main()
