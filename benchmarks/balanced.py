"""Balanced k-means against the uncapped fit: seconds, passes, objective and sizes.

The tall shape of the issue (``--rows`` x ``--features`` float32 Gaussian blobs, default
2,000,000 x 16, k = 32, seed 0): ``dkmeans.KMeans(k, random_state=0, n_init=1)`` without caps,
with ``balanced=True`` and with ``max_cluster_size=1.1 / k`` (``--cap``), each in this process
after a warm-up fit on a small sample (so that neither pays the kernels' start-up). Reported per
fit: wall and CPU seconds of ``fit`` (CPU: this process's, the
steadier figure on a shared machine), iterations, passes over the data (``n_passes_``), the capped
assignments' passes (``capacity_passes_``: their sum and largest), the objective, the largest and
smallest cluster, and the ratio of seconds to the uncapped fit. A fit whose prices do not settle
reports the error instead.

Run:  .venv/bin/python benchmarks/balanced.py [--rows 2000000] [--features 16] [--k 32] [--cap 1.1]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from dkmeans import KMeans


def make_data(rows: int, features: int, k: int, seed: int = 0) -> np.ndarray:
    """Blobs of unequal sizes (so that the caps bind): ``k`` centres, Zipf-like shares."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(k, features))
    shares = 1.0 / np.arange(1, k + 1) ** 0.7
    labels = rng.choice(k, size=rows, p=shares / shares.sum())
    return (centres[labels] + rng.normal(size=(rows, features))).astype(np.float32)


def run(X, k: int, **caps) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        km = KMeans(k, random_state=0, n_init=1, **caps).fit(X)
    except Exception as error:  # a capped fit whose prices did not settle: reported
        return {
            "caps": caps,
            "error": f"{type(error).__name__}: {str(error)[:160]}",
            "seconds": round(time.perf_counter() - t0, 2),
        }
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    sizes = np.bincount(np.asarray(km.labels_), minlength=k)
    passes = getattr(km, "capacity_passes_", None)
    return {
        "caps": caps,
        "seconds": round(seconds, 2),
        "cpu_seconds": round(cpu, 2),
        "n_iter": int(km.n_iter_),
        "n_passes": int(km.n_passes_),
        "capacity_passes_sum": int(sum(passes)) if passes else None,
        "capacity_passes_max": int(max(passes)) if passes else None,
        "objective": float(km.inertia_),
        "largest": int(sizes.max()),
        "smallest": int(sizes.min()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument(
        "--cap", type=float, default=1.1, help="max_cluster_size as a multiple of n/k"
    )
    args = parser.parse_args()
    X = make_data(args.rows, args.features, args.k)
    run(X[:20_000], args.k)  # warm-up: kernels loaded, thread pools found
    run(X[:20_000], args.k, balanced=True)
    base = run(X, args.k)
    print(json.dumps(base))
    for caps in ({"balanced": True}, {"max_cluster_size": args.cap / args.k}):
        out = run(X, args.k, **caps)
        if "error" not in out:
            out["seconds_ratio"] = round(out["seconds"] / base["seconds"], 2)
            out["cpu_ratio"] = round(out["cpu_seconds"] / base["cpu_seconds"], 2)
            out["objective_ratio"] = round(out["objective"] / base["objective"], 4)
        print(json.dumps(out))


if __name__ == "__main__":
    main()
