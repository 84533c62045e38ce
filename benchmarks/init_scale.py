"""Initialisation at scale: k-means|| against scikit-learn's k-means++ and dask-ml's k-means||.

For each shape (float32 Gaussian blobs, fixed seed) and seed, measure the seconds of the
initialisation alone and the objective after Lloyd (tol=1e-4) from that start:

* dkmeans: ``"k-means||"`` (init_rounds=5, oversampling_factor=2) on data persisted on a
  2-worker LocalCluster (the embedded cluster's settings), then ``KMeans(init=C0)``;
* scikit-learn: ``sklearn.cluster.kmeans_plusplus`` (greedy, 2 threads) on the NumPy
  array, then ``KMeans(init=C0, n_init=1)``;
* dask-ml (if installed): its ``k_init(..., init="k-means||")`` on the same persisted Dask
  array, then Lloyd from that start with scikit-learn.

Objectives are recomputed from each library's final centroids with one float64 pass.
Goals: dkmeans initialises in at most a third of scikit-learn's time and a tenth of
dask-ml's, with an objective within 1% of scikit-learn's or better. dkmeans and
scikit-learn get one untimed warm-up run each (seed 1000) before the timed seeds.

Run:  .venv/bin/python benchmarks/init_scale.py [--shapes tall wide] [--seeds 2] [--no-dask-ml]
"""

from __future__ import annotations

import argparse
import sys
import time

import dask.array as da
import numpy as np
from sklearn.cluster import KMeans as SKKMeans
from sklearn.cluster import kmeans_plusplus
from threadpoolctl import threadpool_limits

import dkmeans
from dkmeans.drivers.init import kmeans_parallel
from dkmeans.engine.client import start_local_cluster
from dkmeans.engine.persisted import PersistedData
from dkmeans.metrics import objective
from dkmeans.testing import make_blobs

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _common import machine, write_json  # noqa: E402

SHAPES = {"tall": (2_000_000, 16, 32), "wide": (500_000, 128, 256), "small": (200_000, 8, 16)}


def exact_objective(X, C) -> float:
    """Float64 objective, in row blocks (bounded memory)."""
    C = np.asarray(C, dtype=np.float64)
    return sum(
        objective(X[i : i + 200_000].astype(np.float64), C) for i in range(0, len(X), 200_000)
    )


def run_dkmeans(client, Xd, k, seed):
    data = PersistedData(client, Xd)
    t = time.perf_counter()
    C0 = kmeans_parallel(data, k, seed)
    init_s = time.perf_counter() - t
    data.release()
    km = dkmeans.KMeans(k, init=C0, tol=1e-4).fit(Xd)
    return init_s, km.cluster_centers_, km.n_iter_


def run_sklearn(X, k, seed):
    with threadpool_limits(2):
        t = time.perf_counter()
        C0, _ = kmeans_plusplus(X, k, random_state=seed)
        init_s = time.perf_counter() - t
        km = SKKMeans(k, init=C0, n_init=1, tol=1e-4).fit(X)
    return init_s, km.cluster_centers_, km.n_iter_


def run_dask_ml(Xd, k, seed):
    from dask_ml.cluster.k_means import k_init

    t = time.perf_counter()
    C0 = k_init(Xd, k, init="k-means||", random_state=seed, max_iter=None, oversampling_factor=2)
    init_s = time.perf_counter() - t
    with threadpool_limits(2):
        km = SKKMeans(k, init=np.asarray(C0), n_init=1, tol=1e-4).fit(Xd.compute())
    return init_s, km.cluster_centers_, km.n_iter_


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="*", default=["tall", "wide"], choices=sorted(SHAPES))
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--no-dask-ml", action="store_true")
    args = parser.parse_args(argv)
    try:
        import dask_ml  # noqa: F401

        have_dask_ml = not args.no_dask_ml
    except ImportError:
        print("dask-ml is not installed: skipped (pip install -e '.[bench]')")
        have_dask_ml = False
    client = start_local_cluster(n_workers=2)
    results = {}
    print(f"{'shape':6s} {'method':26s} {'init s':>8s} {'objective':>12s} {'iters':>6s}")
    for shape in args.shapes:
        n, d, k = SHAPES[shape]
        X, _, _ = make_blobs(n, d, k, spread=1.0, box=10.0, seed=0, dtype=np.float32)
        Xd = client.persist(da.from_array(X, chunks=(-(-n // 16), d)))
        rows = {}
        methods = [
            ("dkmeans k-means||", lambda s: run_dkmeans(client, Xd, k, s)),
            ("scikit-learn k-means++", lambda s: run_sklearn(X, k, s)),
        ]
        if have_dask_ml:
            methods.append(("dask-ml k-means||", lambda s: run_dask_ml(Xd, k, s)))
        for name, fn in methods:
            if not name.startswith("dask-ml"):
                fn(
                    1000
                )  # untimed warm-up: first-call costs (compiled kernels, imports) on every side
            seeds = range(1 if name.startswith("dask-ml") else args.seeds)
            runs = []
            for seed in seeds:
                init_s, C, iters = fn(seed)
                runs.append(
                    {"init_s": init_s, "objective": exact_objective(X, C), "iterations": iters}
                )
            r = {key: float(np.mean([x[key] for x in runs])) for key in runs[0]}
            rows[name] = r
            print(
                f"{shape:6s} {name:26s} {r['init_s']:8.2f} {r['objective']:12.5e} {r['iterations']:6.1f}",
                flush=True,
            )
        ours, sk = rows["dkmeans k-means||"], rows["scikit-learn k-means++"]
        line = (
            f"{shape:6s} dkmeans init time / scikit-learn's: {ours['init_s'] / sk['init_s']:.2f} (goal <= 0.33); "
            f"objective / scikit-learn's: {ours['objective'] / sk['objective']:.4f} (goal <= 1.01)"
        )
        if "dask-ml k-means||" in rows:
            line += f"; init time / dask-ml's: {ours['init_s'] / rows['dask-ml k-means||']['init_s']:.3f} (goal <= 0.1)"
        print(line)
        results[shape] = rows
    out = write_json(
        "init_scale.json", {"machine": machine(), "seeds": args.seeds, "results": results}
    )
    print(f"results in {out}")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
