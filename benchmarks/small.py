"""What a newcomer feels: a default fit on small data, warm and in a fresh environment, beside scikit-learn.

* **warm**: 100,000 x 8 float32 blobs (k=10), each library's *default* fit
  (``dkmeans.KMeans(10, random_state=s)`` and ``sklearn.cluster.KMeans(10, random_state=s)``),
  alternating, median of ``--repeats`` seeds after a warm-up fit of each; objectives re-scored
  in float64. dkmeans fits such data in the calling process (no cluster round trips).
* **cold**: the first default fit of the same data in a fresh Python process whose numba cache
  directory is empty (``NUMBA_CACHE_DIR`` set to a new temporary folder), as after a fresh
  install; seconds of the ``fit`` call, and of the import before it.

Goals (the newcomer issue): warm at most 1.5x scikit-learn's default fit; cold at most 2 s.
JSON goes to ``benchmarks/results/small.json``.

Run:  .venv/bin/python benchmarks/small.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_json  # noqa: E402

COLD = """
import json, sys, time
sys.path.insert(0, {root!r})  # this checkout's dkmeans, whatever is installed
t0 = time.perf_counter()
import numpy as np, dkmeans
from sklearn.datasets import make_blobs
X = make_blobs(100_000, 8, centers=10, random_state=0)[0].astype(np.float32)
t1 = time.perf_counter()
km = dkmeans.KMeans(10, random_state=0).fit(X)
t2 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "fit_s": t2 - t1, "mode": km.data_mode_, "dkmeans": dkmeans.__file__}}))
"""


def rescored(X, C) -> float:
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    d2 = (X64**2).sum(1)[:, None] - 2 * X64 @ C64.T + (C64**2).sum(1)[None, :]
    return float(np.maximum(d2.min(axis=1), 0).sum())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cold-repeats", type=int, default=3)
    args = parser.parse_args()

    from sklearn.cluster import KMeans as SKKMeans
    from sklearn.datasets import make_blobs

    import dkmeans

    X = make_blobs(100_000, 8, centers=10, random_state=0)[0].astype(np.float32)
    dkmeans.KMeans(10, random_state=99).fit(X)
    SKKMeans(10, random_state=99).fit(X)
    ours, theirs, ratio_obj = [], [], []
    for seed in range(args.repeats):
        t = time.perf_counter()
        km = dkmeans.KMeans(10, random_state=seed).fit(X)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        sk = SKKMeans(10, random_state=seed).fit(X)
        theirs.append(time.perf_counter() - t)
        ratio_obj.append(rescored(X, km.cluster_centers_) / rescored(X, sk.cluster_centers_))
    cold = []
    for _ in range(args.cold_repeats):
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache)
            code = COLD.format(root=str(Path(__file__).resolve().parent.parent))
            out = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
            )
            cold.append(json.loads(out.stdout.strip().splitlines()[-1]))
    result = {
        "machine": machine(),
        "ours_s": ours,
        "sklearn_s": theirs,
        "objective_ratio": ratio_obj,
        "cold": cold,
        "warm_ratio": float(np.median(ours) / np.median(theirs)),
    }
    print("| what | dkmeans | scikit-learn | ratio |")
    print("|---|---:|---:|---:|")
    print(
        f"| default fit, 100k x 8, k=10, warm (median of {args.repeats}) | {np.median(ours):.3f} s | "
        f"{np.median(theirs):.3f} s | {result['warm_ratio']:.2f} |"
    )
    fits = [c["fit_s"] for c in cold]
    print(
        f"| first fit in a fresh environment (median of {len(cold)}; "
        f"import {np.median([c['import_s'] for c in cold]):.2f} s "
        f"before it) | {np.median(fits):.2f} s | - | - |"
    )
    print(
        f"objective / scikit-learn's (float64 re-scored): median {np.median(ratio_obj):.4f}, "
        f"range {min(ratio_obj):.4f}-{max(ratio_obj):.4f}"
    )
    print(
        f"goals: warm <= 1.5x: {'met' if result['warm_ratio'] <= 1.5 else 'NOT met'}; cold <= 2 s: "
        f"{'met' if np.median(fits) <= 2 else 'NOT met'}"
    )
    print("results:", write_json("small.json", result))


if __name__ == "__main__":
    main()
