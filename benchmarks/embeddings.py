"""Embeddings: cosine (spherical) k-means on float32 unit vectors, against faiss and scikit-learn.

Shapes (``--quick``: 100,000 x 256, k = 1,024 and 20,000 x 256, k = 8,192):

* ``4k``: 1,000,000 x 256, k = 4,096;
* ``64k``: 200,000 x 256, k = 65,536.

Data: unit vectors around ``n / 8`` random unit directions (clustered, synthetic), float32.
In one run, on the same 2 cores (dkmeans: LocalCluster 2 workers x 1 thread, data persisted
in 16 chunks; the in-process peers: 2 threads):

* **per iteration**, every library from the same initial centroids (the first k rows of a keyed
  random order), ``tol=0``: dkmeans ``KMeans(metric="cosine")`` by the loop's own timer
  (median of the iterations after the first); faiss ``Kmeans(d, k, spherical=True)`` on all
  points (``max_points_per_centroid`` above ``n / k``), from its ``iteration_stats`` times;
  scikit-learn ``KMeans`` (lloyd) on the normalised rows, ``(T(iters) - T(1)) / (iters - 1)``;
* **the floor**: one float32 matrix product ``n x d`` by ``d x k`` on 2 BLAS threads (in row
  tiles of 16 MiB of output; best of 2);
* **seeding**: dkmeans' default ``"k-means||"`` (two-level from k = 4,096), as a fit runs it;
  faiss's seeding is a random sample (no k-means++), so it is not timed; scikit-learn's
  greedy k-means++ (``kmeans_plusplus``) where ``k <= --sklearn-seed-max-k`` (default 0: not
  run; at 100,000 x 256, k = 1,024 it had not finished after 7 minutes on the loaded machine).

Goals: per iteration no slower than faiss and within 1.5x of the floor; seeding at k = 65,536
under 10 of dkmeans' Lloyd iterations.

Run:  .venv/bin/python benchmarks/embeddings.py [--quick] [--iters 3]
Writes benchmarks/results/embeddings[_quick]_<shapes>.json after each shape.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, write_json  # noqa: E402
from lloyd import N_THREADS, persist_chunks, start_cluster  # noqa: E402

import dkmeans  # noqa: E402
from dkmeans.drivers.init import InitOptions  # noqa: E402
from dkmeans.drivers.init.kmeans_parallel import kmeans_parallel  # noqa: E402
from dkmeans.engine import MemoryBudget, PersistedData  # noqa: E402
from dkmeans.kernels.common import DEFAULT_SCRATCH_BYTES  # noqa: E402

SHAPES = {"4k": (1_000_000, 256, 4_096), "64k": (200_000, 256, 65_536)}
QUICK = {"4k": (100_000, 256, 1_024), "64k": (20_000, 256, 8_192)}


def make_embeddings(n: int, d: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dirs = rng.standard_normal((max(1, n // 8), d), dtype=np.float32)
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    X = dirs[rng.integers(0, len(dirs), size=n)]
    X += (0.6 / np.sqrt(d)) * rng.standard_normal((n, d), dtype=np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X


def gemm_floor(X, k: int, tile_bytes: int = 16 * 2**20, repeats: int = 2) -> float:
    Ct = np.ascontiguousarray(X[:k].T)
    rows = max(1, min(len(X), tile_bytes // (k * 4)))
    out = np.empty((rows, k), dtype=np.float32)
    best = np.inf
    with threadpool_limits(limits=N_THREADS, user_api="blas"):
        for _ in range(repeats):
            t0 = time.perf_counter()
            for i0 in range(0, len(X), rows):
                i1 = min(len(X), i0 + rows)
                np.matmul(X[i0:i1], Ct, out=out[: i1 - i0])
            best = min(best, time.perf_counter() - t0)
    return best


def objective(X, C, tile: int = 8192) -> float:
    """sum(1 - max cos) in float64 (C normalised here)."""
    C = C.astype(np.float64)
    C /= np.linalg.norm(C, axis=1, keepdims=True)
    total = 0.0
    for i0 in range(0, len(X), tile):
        total += float(np.sum(1.0 - (X[i0 : i0 + tile].astype(np.float64) @ C.T).max(1)))
    return total


def run_dkmeans(Xd, C0, iters):
    km = dkmeans.KMeans(n_clusters=len(C0), init=C0, metric="cosine", max_iter=iters, tol=0.0).fit(
        Xd
    )
    seconds = [h["seconds"] for h in km.history_]
    return statistics.median(seconds[1:] or seconds), km.cluster_centers_, seconds, km.history_


def run_faiss(X, C0, iters):
    import faiss

    n, d = X.shape
    k = len(C0)
    faiss.omp_set_num_threads(N_THREADS)
    km = faiss.Kmeans(
        d,
        k,
        niter=iters,
        verbose=False,
        seed=1,
        spherical=True,
        max_points_per_centroid=-(-n // k) + 1,
        min_points_per_centroid=1,
    )
    km.train(X, init_centroids=np.ascontiguousarray(C0))
    times = [s["time"] for s in km.iteration_stats]
    per = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else times[0]
    return per, km.centroids, times


def run_sklearn(X, C0, iters):
    import sklearn.cluster

    def fit(m):
        t0 = time.perf_counter()
        with threadpool_limits(limits=N_THREADS):
            km = sklearn.cluster.KMeans(
                n_clusters=len(C0), init=C0, n_init=1, algorithm="lloyd", max_iter=m, tol=0.0
            ).fit(X)
        return time.perf_counter() - t0, km

    t1, _ = fit(1)
    tn, km = fit(iters)
    return (tn - t1) / (iters - 1), km.cluster_centers_, [t1, tn]


def bench(client, name, n, d, k, args) -> dict:
    print(f"{name}: {n:,} x {d}, k = {k:,}, cosine, float32", flush=True)
    load_before = os.getloadavg()[0]  # the machine is shared: the load goes with the figures
    X = make_embeddings(n, d)
    order = np.argsort(np.random.default_rng(1).random(n))
    C0 = X[np.sort(order[:k])].copy()
    res = {"n": n, "d": d, "k": k}
    res["floor_seconds"] = gemm_floor(X, k)
    print(f"  floor (GEMM {n:,} x {d} x {k:,}) {res['floor_seconds']:.3f} s", flush=True)
    Xd = persist_chunks(client, X)
    dkmeans.KMeans(n_clusters=64, metric="cosine", random_state=0, max_iter=2).fit(
        Xd[:20_000]
    )  # compile
    data = PersistedData(client, Xd, None, MemoryBudget.of(client, DEFAULT_SCRATCH_BYTES))
    t0 = time.perf_counter()
    seeded = kmeans_parallel(data, k, seed=0, options=InitOptions(metric="cosine"))
    res["dkmeans_seeding_seconds"] = time.perf_counter() - t0
    del data
    print(f"  dkmeans seeding {res['dkmeans_seeding_seconds']:.2f} s", flush=True)
    per, C, seconds, history = run_dkmeans(Xd, C0, args.iters)
    # an update that left clusters empty adds oneDAL's farthest-point pass (a second product)
    empties = [h["empty_clusters_fixed"] for h in history]
    res.update(
        dkmeans_per_iteration=per,
        dkmeans_iterations=seconds,
        dkmeans_empty_clusters_fixed=empties,
        dkmeans_objective=objective(X, C),
    )
    print(
        f"  dkmeans {per:.3f} s per iteration ({', '.join(f'{s:.2f}' for s in seconds)}; "
        f"empty clusters refilled: {empties})",
        flush=True,
    )
    if (
        args.seeded_fit
    ):  # the objective after Lloyd from dkmeans' own seeding, beside the fixed start's
        res["seeded_objective_after_lloyd"] = objective(X, run_dkmeans(Xd, seeded, args.iters)[1])
    del Xd
    if "faiss" in args.peers:
        per, C, times = run_faiss(X, C0, args.iters)
        res.update(faiss_per_iteration=per, faiss_times=times, faiss_objective=objective(X, C))
        print(f"  faiss {per:.3f} s per iteration", flush=True)
    if "sklearn" in args.peers:
        per, C, times = run_sklearn(X, C0, args.iters)
        res.update(
            sklearn_per_iteration=per, sklearn_times=times, sklearn_objective=objective(X, C)
        )
        print(f"  scikit-learn {per:.3f} s per iteration", flush=True)
        if k <= args.sklearn_seed_max_k:
            from sklearn.cluster import kmeans_plusplus

            t0 = time.perf_counter()
            with threadpool_limits(limits=N_THREADS):
                kmeans_plusplus(X, k, random_state=0)
            res["sklearn_seeding_seconds"] = time.perf_counter() - t0
            print(
                f"  scikit-learn k-means++ seeding {res['sklearn_seeding_seconds']:.1f} s",
                flush=True,
            )
    res["load_average"] = [load_before, os.getloadavg()[0]]
    res["ratio_floor"] = res["dkmeans_per_iteration"] / res["floor_seconds"]
    if "faiss_per_iteration" in res:
        res["ratio_faiss"] = res["dkmeans_per_iteration"] / res["faiss_per_iteration"]
    res["seeding_in_iterations"] = res["dkmeans_seeding_seconds"] / res["dkmeans_per_iteration"]
    print(
        f"  dkmeans / floor {res['ratio_floor']:.2f}, / faiss {res.get('ratio_faiss', float('nan')):.2f}, "
        f"seeding = {res['seeding_in_iterations']:.1f} iterations",
        flush=True,
    )
    return res


def table(results: dict) -> str:
    lines = [
        "| shape | floor (GEMM) | dkmeans | faiss | scikit-learn | dkmeans / floor | dkmeans / faiss | "
        "dkmeans seeding (in its iterations) | scikit-learn k-means++ |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for _name, r in results.items():
        sk_seed = r.get("sklearn_seeding_seconds")
        lines.append(
            f"| {r['n']:,} x {r['d']}, k={r['k']:,} | {r['floor_seconds']:.3f} | {r['dkmeans_per_iteration']:.3f} | "
            f"{r.get('faiss_per_iteration', float('nan')):.3f} | {r.get('sklearn_per_iteration', float('nan')):.3f} | "
            f"{r['ratio_floor']:.2f} | {r.get('ratio_faiss', float('nan')):.2f} | "
            f"{r['dkmeans_seeding_seconds']:.2f} s ({r['seeding_in_iterations']:.1f}) | "
            f"{'not run' if sk_seed is None else f'{sk_seed:.1f} s'} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes")
    parser.add_argument("--iters", type=int, default=3, help="Lloyd iterations per timed fit")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    parser.add_argument("--peers", nargs="*", default=["faiss", "sklearn"])
    parser.add_argument(
        "--sklearn-seed-max-k",
        type=int,
        default=0,
        help="time scikit-learn's k-means++ only up to this k (it grows as n k log k)",
    )
    parser.add_argument(
        "--seeded-fit",
        action="store_true",
        help="also run dkmeans from its own seeding and report the objective",
    )
    args = parser.parse_args(argv)
    shapes = QUICK if args.quick else SHAPES
    client = start_cluster()
    results = {}
    for name in args.shapes:  # written after each shape: a long run keeps what it measured
        results[name] = bench(client, name, *shapes[name], args)
        out = write_json(
            f"embeddings{'_quick' if args.quick else ''}_{'_'.join(args.shapes)}.json",
            {"machine": machine(), "args": vars(args), "results": results},
        )
    print("\n" + table(results))
    print(f"wrote {out}")
    client.close()


if __name__ == "__main__":
    main()
