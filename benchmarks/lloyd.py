"""Seconds per Lloyd iteration: dkmeans against scikit-learn, scikit-learn-intelex, faiss and dask-ml.

Method
------
For each shape (rows x features, k) the script generates Gaussian blobs with a fixed seed
(float32 by default, ``--dtype float64``) and picks ``k`` rows (fixed seed) as the
initial centroids ``C0``. Every library starts from the same ``C0`` on the same data, with
``tol=0`` so that a fit runs exactly ``max_iter`` centroid updates:

* dkmeans ``KMeans(init=C0, tol=0)`` and dask-ml ``KMeans(init=C0, tol=0)`` get the same
  Dask array (16 row chunks) persisted on one cluster made by dkmeans' own
  ``start_local_cluster`` (2 worker processes x 1 thread, one BLAS/OpenMP thread each,
  loopback only), so shipping the data is not timed; its client is the default one, so
  dask-ml's ``compute()`` calls run there too;
* ``dkmeans-graph``: dkmeans again with one graph per iteration (Dask config
  ``dkmeans.spmd`` False and ``dkmeans.single-task-work`` 0), which shows what the default
  loop modes (one task for small loops, SPMD for large ones) gain, side by side;
* scikit-learn ``KMeans(init=C0, n_init=1, algorithm="lloyd", tol=0)`` and
  scikit-learn-intelex (``sklearnex.cluster.KMeans``, same parameters; the script
  records whether oneDAL ran it) run in this process on the NumPy array, limited to 2
  threads (threadpoolctl; oneDAL uses the 2 cores of the machine);
* faiss ``Kmeans(d, k, niter=max_iter, max_points_per_centroid=ceil(n/k)+1)`` trains on
  all rows (no subsampling) with ``train(X, init_centroids=C0)``, on 2 OpenMP threads;
  float32 only (skipped for ``--dtype float64``).

A fit has a fixed cost besides its iterations (validation, a first pass, the final
assignment), so the seconds per iteration are ``(T(max_iter=1+iters) - T(max_iter=1)) /
iters`` (``--iters``, default 10), median of ``--repeats`` (default 3), after one warm-up
fit. For dkmeans the median of ``history_[i]["seconds"]`` (the loop's own timer per
iteration) is shown too. The script stops with an error if a fit ran fewer iterations
than asked (a fixed point), which would void the difference.

**Floor.** Measured in the same run, on the same data: the best time of the float matrix
product ``X @ C0.T`` (data dtype) with 2 BLAS threads (whole, or in row tiles, whichever is
faster), and the bytes of ``X`` over the memory read bandwidth measured with 2 threads;
the floor is the larger of the two. For reference the script also reports the shape's
flops at the machine's peak rate (a 2048 x 2048 x 2048 product with 2 threads), which is
lower where BLAS is inefficient for the shape (small ``d``).

**Objectives.** Every library's returned centroids are re-scored with one float64 NumPy
pass over the data (sum of squared distances to the nearest centroid); the script
reports the largest relative difference to dkmeans' and whether it is within
``--objective-rtol`` (libraries report their objectives differently: dask-ml's
``inertia_`` is a sum of unsquared distances, faiss reports the previous centroids').

Run
---
From the repository root (``pip install -e '.[bench]'`` installs the peers; a peer that
does not import is skipped with a message)::

    .venv/bin/python benchmarks/lloyd.py                          # all shapes, float32
    .venv/bin/python benchmarks/lloyd.py --shapes tall wide --repeats 5
    .venv/bin/python benchmarks/lloyd.py --dtype float64
    .venv/bin/python benchmarks/lloyd.py --quick                   # smaller n, a smoke run

The table goes to stdout and everything to ``benchmarks/results/lloyd_<dtype>.json``
(``--output``). ``--wait-load 0.5`` waits (up to ``--max-wait`` seconds, default 600)
until the 1-minute load average is below 0.5 before the floors and before each library;
the load before and after each library is recorded and printed (other processes on the
2 cores skew the timings).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dask
import dask.array as da
import distributed
import numpy as np
from sklearn.datasets import make_blobs
from threadpoolctl import threadpool_limits

import dkmeans
from dkmeans.engine.client import start_local_cluster

#: name -> (n_samples, n_features, n_clusters)
SHAPES = {
    "small": (100_000, 8, 10),
    "tall": (2_000_000, 16, 32),
    "wide": (500_000, 128, 256),
    "manyk": (200_000, 64, 2048),
}
#: ``--quick``: the same shapes with fewer rows.
QUICK_SHAPES = {
    "small": (20_000, 8, 10),
    "tall": (200_000, 16, 32),
    "wide": (50_000, 128, 256),
    "manyk": (40_000, 64, 512),
}
N_WORKERS = 2
N_THREADS = 2  # threads of the in-process peers: the same 2 cores
N_CHUNKS = 16
SHORT = 1  # max_iter of the short fit
SEED = 0
RESULTS = Path(__file__).resolve().parent / "results"
#: the peers dkmeans should be no slower than
FAST_PEERS = ("scikit-learn", "scikit-learn-intelex", "faiss")
#: shape -> minimum dask-ml / dkmeans (issue 4)
DASK_ML_GOAL = {"tall": 8.0, "wide": 3.0, "manyk": 3.0}
FLOOR_GOAL = 2.0
FLOOR_SHAPES = ("tall", "wide", "manyk")


# -- data and cluster --------------------------------------------------------------------
def make_data(n: int, d: int, k: int, seed: int = SEED, dtype=np.float32):
    """Gaussian blobs and ``k`` of their rows (fixed seed) as initial centroids.

    The ``k`` blobs overlap (standard deviation 6, centres in [-10, 10]^d), so that
    Lloyd neither reaches a fixed point nor empties a cluster within the timed iterations
    on the default shapes: the libraries' empty-cluster rules differ.
    """
    X, _ = make_blobs(
        n_samples=n,
        n_features=d,
        centers=k,
        cluster_std=6.0,
        center_box=(-10.0, 10.0),
        random_state=seed,
    )
    X = np.ascontiguousarray(X, dtype=dtype)
    rows = np.random.default_rng(seed + 1).choice(n, size=k, replace=False)
    return X, X[np.sort(rows)].copy()


def start_cluster(n_workers: int = N_WORKERS) -> distributed.Client:
    """dkmeans' embedded cluster configuration, with its client as the default one."""
    return start_local_cluster(
        n_workers=n_workers, threads_per_worker=1, dashboard_address=None, set_as_default=True
    )


def persist_chunks(client: distributed.Client, X: np.ndarray, n_chunks: int = N_CHUNKS) -> da.Array:
    """``X`` as a Dask array of ``n_chunks`` row chunks, persisted on the cluster."""
    rows = -(-X.shape[0] // n_chunks)
    with warnings.catch_warnings():  # the chunks travel once, inside the graph
        warnings.filterwarnings("ignore", message="Sending large graph")
        Xd = client.persist(da.from_array(X, chunks=(rows, X.shape[1])))
    distributed.wait(Xd)
    return Xd


def wait_for_load(threshold: float, max_wait_s: float = 600.0, poll_s: float = 15.0) -> float:
    """Sleep until the 1-minute load average is below ``threshold`` (or ``max_wait_s``)."""
    t0 = time.monotonic()
    while os.getloadavg()[0] >= threshold and time.monotonic() - t0 < max_wait_s:
        time.sleep(poll_s)
    return time.monotonic() - t0


# -- the libraries -------------------------------------------------------------------------
class Fit:
    """What the timing needs from one fit: centroids, iterations run, dkmeans' history."""

    def __init__(self, centers, n_iter, history=(), info=None):
        self.centers = np.asarray(centers)
        self.n_iter = int(n_iter)
        self.history = list(history)
        self.info = info or {}


def fit_dkmeans(X, C0, max_iter):
    """dkmeans on the persisted Dask array ``X``."""
    km = dkmeans.KMeans(n_clusters=len(C0), init=C0, max_iter=max_iter, tol=0.0).fit(X)
    return Fit(
        km.cluster_centers_,
        km.n_iter_,
        km.history_,
        {"empty_clusters_fixed": sum(h["empty_clusters_fixed"] for h in km.history_)},
    )


def fit_dkmeans_graph(X, C0, max_iter):
    """dkmeans with one graph per iteration (no SPMD, no single-task loop): the loop modes' gain."""
    with dask.config.set({"dkmeans.spmd": False, "dkmeans.single-task-work": 0}):
        return fit_dkmeans(X, C0, max_iter)


def fit_sklearn(X, C0, max_iter):
    """scikit-learn's Lloyd on the NumPy array ``X``, on 2 threads."""
    import sklearn.cluster

    with threadpool_limits(limits=N_THREADS):
        km = sklearn.cluster.KMeans(
            n_clusters=len(C0), init=C0, n_init=1, algorithm="lloyd", max_iter=max_iter, tol=0.0
        ).fit(X)
    return Fit(km.cluster_centers_, km.n_iter_)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def fit_sklearnex(X, C0, max_iter):
    """scikit-learn-intelex (oneDAL) KMeans on the NumPy array ``X``; records if oneDAL ran it."""
    import sklearnex.cluster

    logger = logging.getLogger("sklearnex")
    handler = _Records()
    level, propagate, handlers = logger.level, logger.propagate, logger.handlers[:]
    logger.handlers = [handler]  # only ours: sklearnex may have its own stream handler
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        with threadpool_limits(limits=N_THREADS):
            km = sklearnex.cluster.KMeans(
                n_clusters=len(C0), init=C0, n_init=1, algorithm="lloyd", max_iter=max_iter, tol=0.0
            ).fit(X)
    finally:
        logger.handlers = handlers
        logger.setLevel(level)
        logger.propagate = propagate
    fit_logs = [m for m in handler.messages if ".fit:" in m or "fit" in m.split(":")[0]]
    accelerated = any("accelerated" in m or "onedal" in m.lower() for m in fit_logs) and not any(
        "fallback" in m.lower() or "original Scikit-learn" in m for m in fit_logs
    )
    return Fit(km.cluster_centers_, km.n_iter_, info={"onedal": accelerated, "log": fit_logs[:3]})


def fit_faiss(X, C0, max_iter):
    """faiss k-means on all rows (no subsampling), from ``C0``, on 2 OpenMP threads."""
    import faiss

    n, d = X.shape
    k = len(C0)
    faiss.omp_set_num_threads(N_THREADS)
    km = faiss.Kmeans(
        d,
        k,
        niter=max_iter,
        verbose=False,
        seed=1,
        max_points_per_centroid=-(-n // k) + 1,
        min_points_per_centroid=1,
    )
    km.train(
        np.ascontiguousarray(X, dtype=np.float32),
        init_centroids=np.ascontiguousarray(C0, dtype=np.float32),
    )
    return Fit(km.centroids, max_iter, info={"reported_obj_last": float(km.obj[-1])})


def fit_dask_ml(X, C0, max_iter):
    """dask-ml on the persisted Dask array ``X`` (``init`` must be an ndarray)."""
    import dask_ml.cluster

    km = dask_ml.cluster.KMeans(
        n_clusters=len(C0), init=np.asarray(C0), max_iter=max_iter, tol=0.0
    ).fit(X)
    return Fit(km.cluster_centers_, km.n_iter_)


#: name -> (importable module, fit function, takes the Dask array, float32 only)
LIBRARIES = {
    "dkmeans": ("dkmeans", fit_dkmeans, True, False),
    "dkmeans-graph": ("dkmeans", fit_dkmeans_graph, True, False),
    "scikit-learn": ("sklearn.cluster", fit_sklearn, False, False),
    "scikit-learn-intelex": ("sklearnex.cluster", fit_sklearnex, False, False),
    "faiss": ("faiss", fit_faiss, False, True),
    "dask-ml": ("dask_ml.cluster", fit_dask_ml, True, False),
}
VERSION_MODULES = {
    "dkmeans": "dkmeans",
    "scikit-learn": "sklearn",
    "scikit-learn-intelex": "sklearnex",
    "faiss": "faiss",
    "dask-ml": "dask_ml",
    "dask": "dask",
    "distributed": "distributed",
    "numpy": "numpy",
    "numba": "numba",
}


def available_libraries(names, dtype) -> dict:
    """The requested libraries that import (and handle ``dtype``); a message for the others."""
    found = {}
    for name in names:
        module, fit, dask_input, float32_only = LIBRARIES[name]
        if float32_only and np.dtype(dtype) != np.float32:
            print(f"skipping {name}: it works in float32 only", file=sys.stderr)
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                importlib.import_module(module)
        except ImportError as exc:
            print(
                f"skipping {name}: cannot import {module} ({exc}); pip install -e '.[bench]'",
                file=sys.stderr,
            )
            continue
        found[name] = (fit, dask_input)
    return found


def library_versions() -> dict:
    """Versions of the packages involved (None when not installed)."""
    from importlib import metadata

    versions = {}
    for dist, module in VERSION_MODULES.items():
        try:
            versions[dist] = metadata.version(dist if dist != "faiss" else "faiss-cpu")
        except metadata.PackageNotFoundError:
            try:
                versions[dist] = importlib.import_module(module).__version__
            except Exception:  # noqa: BLE001 - not installed, or no version attribute
                versions[dist] = None
    return versions


def dkmeans_source() -> dict:
    """Where dkmeans was imported from, with its git commit when that is a checkout."""
    package = Path(dkmeans.__file__).resolve().parent
    info = {"path": str(package), "commit": None, "modified": None}
    try:
        git = ["git", "-C", str(package)]
        info["commit"] = subprocess.run(
            git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            git + ["status", "--porcelain", "--", "."], capture_output=True, text=True, check=True
        ).stdout
        info["modified"] = bool(status.strip())
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


# -- measurement ---------------------------------------------------------------------------
def timed(fit, X, C0, max_iter):
    """``(seconds, Fit)`` of one fit."""
    t0 = time.perf_counter()
    result = fit(X, C0, max_iter)
    return time.perf_counter() - t0, result


def seconds_per_iteration(fit, X, C0, repeats: int, iters: int) -> dict:
    """Median of ``(T(1 + iters) - T(1)) / iters`` over ``repeats``, after a warm-up fit."""
    fit(X, C0, 2)  # warm-up: imports, JIT compilation, worker caches
    long_iter = SHORT + iters
    out = {"short_s": [], "long_s": [], "per_iter_s": [], "history_s": []}
    result = None
    for _ in range(repeats):
        t_short, short = timed(fit, X, C0, SHORT)
        t_long, result = timed(fit, X, C0, long_iter)
        for r, expected in ((short, SHORT), (result, long_iter)):
            if r.n_iter != expected:
                raise RuntimeError(
                    f"a fit ran {r.n_iter} iterations instead of {expected} "
                    "(converged early): use another --seed, shape or fewer --iters"
                )
        out["short_s"].append(t_short)
        out["long_s"].append(t_long)
        out["per_iter_s"].append((t_long - t_short) / iters)
        out["history_s"] += [h["seconds"] for h in result.history]
    out["seconds_per_iter"] = statistics.median(out["per_iter_s"])
    out["history_median_s"] = statistics.median(out["history_s"]) if out["history_s"] else None
    out["info"] = result.info
    out["centers"] = result.centers
    return out


def objective(X: np.ndarray, C: np.ndarray, tile: int = 8192) -> float:
    """Sum over rows of the squared distance to the nearest centroid, in float64."""
    C = np.asarray(C, dtype=np.float64)
    c_sq = np.einsum("ij,ij->i", C, C)
    total = 0.0
    for i0 in range(0, X.shape[0], tile):
        Xt = X[i0 : i0 + tile].astype(np.float64)
        nearest = np.argmin(c_sq - 2.0 * (Xt @ C.T), axis=1)
        diff = Xt - C[nearest]
        total += float(np.einsum("ij,ij->", diff, diff))
    return total


def best_of(fn, repeats: int = 5, long: float = 10.0) -> float:
    """Smallest wall time of ``repeats`` calls (after one untimed call); a first call of more than
    ``long`` seconds is the answer (a product of a minute, cosine's at k = 65,536, needs no warming,
    and five more would take longer than the fits it is the floor of)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    if first > long:
        return first
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def read_bandwidth(threads: int = N_THREADS, nbytes: int = 512 * 2**20) -> float:
    """Memory read bandwidth in bytes/s: ``threads`` threads each summing a slice of a large array."""
    a = np.ones(nbytes // 4, dtype=np.float32)
    parts = np.array_split(a, threads)
    with ThreadPoolExecutor(threads) as pool:
        seconds = best_of(lambda: list(pool.map(np.sum, parts)))
    return a.nbytes / seconds


def gemm_floor(X: np.ndarray, C: np.ndarray, threads: int = N_THREADS) -> dict:
    """Best time of ``X @ C.T`` with ``threads`` BLAS threads: whole, or in row tiles."""
    n, k = X.shape[0], C.shape[0]
    Ct = np.ascontiguousarray(C.T)
    times = {}
    with threadpool_limits(limits=threads, user_api="blas"):
        for label, out_bytes in (
            ("tiles 2 MiB", 2 * 2**20),
            ("tiles 16 MiB", 16 * 2**20),
            ("tiles 128 MiB", 128 * 2**20),
            ("whole", 2**31),
        ):
            rows = min(n, max(1, out_bytes // (k * X.itemsize)))
            if label != "whole" and rows >= n:
                continue
            if label == "whole" and n * k * X.itemsize > 2**31:
                continue
            out = np.empty((rows, k), dtype=X.dtype)

            def run():
                for i0 in range(0, n, rows):
                    i1 = min(n, i0 + rows)
                    np.matmul(X[i0:i1], Ct, out=out[: i1 - i0])

            times[label] = best_of(run)
    best = min(times, key=times.get)
    return {
        "seconds": times[best],
        "how": best,
        "all": times,
        "gflops": 2.0 * n * k * X.shape[1] / times[best] / 1e9,
    }


def peak_gflops(dtype, threads: int = N_THREADS, size: int = 2048) -> float:
    """GFLOP/s of a large square matrix product with ``threads`` BLAS threads (the machine's rate)."""
    a = np.random.default_rng(0).standard_normal((size, size)).astype(dtype)
    out = np.empty_like(a)
    with threadpool_limits(limits=threads, user_api="blas"):
        seconds = best_of(lambda: np.matmul(a, a, out=out), repeats=3)
    return 2.0 * size**3 / seconds / 1e9


def measure_floor(X, C0, bandwidth: float, peak: float) -> dict:
    """The matrix-product floor of one shape (see the module docstring).

    ``rate_seconds`` is the other reading of the floor: the shape's flops at the machine's
    peak rate ``peak`` (GFLOP/s of a large square product), for reference only.
    """
    gemm = gemm_floor(X, C0)
    bw_seconds = X.nbytes / bandwidth
    rate_seconds = 2.0 * X.shape[0] * X.shape[1] * C0.shape[0] / (peak * 1e9)
    return {
        "gemm": gemm,
        "bandwidth_seconds": bw_seconds,
        "seconds": max(gemm["seconds"], bw_seconds),
        "peak_gflops": peak,
        "rate_seconds": max(rate_seconds, bw_seconds),
    }


def bench_shape(name, data, floor, client, libraries, args) -> dict:
    """Time every library on one shape; seconds per iteration, ratios, floor and objectives."""
    X, C0 = data
    (n, d), k, dtype = X.shape, C0.shape[0], X.dtype
    Xd = persist_chunks(client, X)
    result = {
        "n_samples": n,
        "n_features": d,
        "n_clusters": k,
        "dtype": np.dtype(dtype).name,
        "floor": floor,
        "libraries": {},
    }
    for lib, (fit, dask_input) in libraries.items():
        print(f"[{name}] {lib} ...", file=sys.stderr, flush=True)
        reps = args.dask_ml_repeats if lib == "dask-ml" else args.repeats
        waited = wait_for_load(args.wait_load, args.max_wait) if args.wait_load is not None else 0.0
        load_before = os.getloadavg()
        try:
            timing = seconds_per_iteration(fit, Xd if dask_input else X, C0, reps, args.iters)
        except Exception as exc:  # noqa: BLE001 - report the failure, run the others
            print(f"[{name}] {lib} failed: {exc!r}", file=sys.stderr)
            result["libraries"][lib] = {"error": repr(exc)}
            continue
        timing["load_before"], timing["load_after"], timing["waited_s"] = (
            load_before,
            os.getloadavg(),
            waited,
        )
        centers = timing.pop("centers")
        timing["objective"] = objective(X, centers)
        timing["centers"] = centers
        result["libraries"][lib] = timing
    del Xd
    ref = result["libraries"].get("dkmeans", {})
    for lib, r in result["libraries"].items():
        if "error" in r:
            continue
        r["ratio_to_floor"] = r["seconds_per_iter"] / floor["seconds"]
        if "seconds_per_iter" in ref and lib != "dkmeans":
            r["peer_over_dkmeans"] = r["seconds_per_iter"] / ref["seconds_per_iter"]
            r["objective_rel_diff"] = abs(r["objective"] - ref["objective"]) / ref["objective"]
            r["centers_max_abs_diff"] = float(np.max(np.abs(r["centers"] - ref["centers"])))
    for r in result["libraries"].values():
        r.pop("centers", None)
    result["goals"] = shape_goals(name, result, args.objective_rtol)
    return result


def shape_goals(name: str, result: dict, rtol: float) -> dict:
    """Issue 4's goals for one shape: True/False (None where not measured or not asked)."""
    libs = result["libraries"]
    dk = libs.get("dkmeans", {}).get("seconds_per_iter")
    goals = {}
    if dk is None:
        return goals
    if dk <= 0:  # the difference of two fit times is below their jitter: no figure to compare
        goals["measured"] = {
            "met": False,
            "why": "dkmeans' difference of fits is not positive (noise): "
            "rerun with more --repeats and --iters",
        }
        return goals
    fast = {
        p: libs[p]["seconds_per_iter"] for p in FAST_PEERS if "seconds_per_iter" in libs.get(p, {})
    }
    if fast:
        best = min(fast, key=fast.get)
        goals["no_slower_than_fastest_peer"] = {
            "met": dk <= fast[best],
            "fastest": best,
            "ratio": dk / fast[best],
        }
    if name in FLOOR_SHAPES:
        ratio = dk / result["floor"]["seconds"]
        goals["within_2x_floor"] = {"met": ratio <= FLOOR_GOAL, "ratio": ratio}
    if name in DASK_ML_GOAL and "seconds_per_iter" in libs.get("dask-ml", {}):
        speedup = libs["dask-ml"]["seconds_per_iter"] / dk
        goals["vs_dask_ml"] = {
            "met": speedup >= DASK_ML_GOAL[name],
            "speedup": speedup,
            "goal": DASK_ML_GOAL[name],
        }
    diffs = [r["objective_rel_diff"] for r in libs.values() if "objective_rel_diff" in r]
    if diffs:
        goals["objectives_agree"] = {
            "met": max(diffs) <= rtol,
            "max_rel_diff": max(diffs),
            "rtol": rtol,
        }
    return goals


# -- output --------------------------------------------------------------------------------
def format_table(results: dict) -> str:
    """A Markdown table: s/iteration, ratios to dkmeans and to the floor, objective agreement."""
    lines = [
        "| shape | n x d, k | library | s / iteration | peer / dkmeans | / floor | fit(max_iter=1) s | "
        "objective (float64) | rel. diff vs dkmeans | load |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, res in results.items():
        dims = f"{res['n_samples']:,} x {res['n_features']}, k={res['n_clusters']}"
        fl = res["floor"]
        lines.append(
            f"| {name} | {dims} | floor: max(GEMM {fl['gemm']['seconds']:.4f} s "
            f"({fl['gemm']['gflops']:.0f} GFLOP/s), X bytes / bandwidth "
            f"{fl['bandwidth_seconds']:.4f} s) | {fl['seconds']:.4f} | | 1 | | | | |"
        )
        lines.append(
            f"| {name} | {dims} | (flops at the peak rate, {fl['peak_gflops']:.0f} GFLOP/s: "
            f"{fl['rate_seconds']:.4f} s) | | | | | | | |"
        )
        for lib, r in res["libraries"].items():
            if "error" in r:
                lines.append(f"| {name} | {dims} | {lib} | failed: {r['error'][:60]} | | | | | | |")
                continue
            per_iter = f"{r['seconds_per_iter']:.4f}"
            if r.get("history_median_s") is not None:
                per_iter += f" (history_ {r['history_median_s']:.4f})"
            ratio = f"{r['peer_over_dkmeans']:.2f}" if "peer_over_dkmeans" in r else "1 (ref.)"
            rel = f"{r['objective_rel_diff']:.1e}" if "objective_rel_diff" in r else "-"
            load = f"{r['load_before'][0]:.2f} -> {r['load_after'][0]:.2f}"
            lines.append(
                f"| {name} | {dims} | {lib} | {per_iter} | {ratio} | {r['ratio_to_floor']:.2f} | "
                f"{statistics.median(r['short_s']):.3f} | {r['objective']:.6e} | {rel} | {load} |"
            )
    return "\n".join(lines)


def format_goals(results: dict) -> str:
    """One line per shape and goal."""
    lines = []
    for name, res in results.items():
        for goal, g in res.get("goals", {}).items():
            detail = ", ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in g.items()
                if k != "met"
            )
            lines.append(f"{name}: {goal}: {'met' if g['met'] else 'NOT met'} ({detail})")
        for lib, r in res["libraries"].items():
            info = r.get("info") or {}
            if info.get("empty_clusters_fixed"):
                lines.append(
                    f"note: {name}: {lib} refilled {info['empty_clusters_fixed']} empty cluster(s); "
                    "the libraries' empty-cluster rules differ, so their objectives may too"
                )
            if lib == "scikit-learn-intelex" and info.get("onedal") is False:
                lines.append(
                    f"note: {name}: scikit-learn-intelex may have fallen back to scikit-learn: "
                    f"{info.get('log')}"
                )
    return "\n".join(lines)


def fmt_load(load) -> str:
    """A load-average triple as text (other processes on the cores skew the timings)."""
    return " ".join(f"{x:.2f}" for x in load)


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=list(SHAPES),
        default=list(SHAPES),
        help="shapes to run (default: all)",
    )
    parser.add_argument(
        "--libraries",
        nargs="+",
        choices=list(LIBRARIES),
        default=list(LIBRARIES),
        help="libraries to time (default: all that import)",
    )
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--quick", action="store_true", help="fewer rows: a fast smoke run")
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed repeats per library (default 3)"
    )
    parser.add_argument(
        "--dask-ml-repeats",
        type=int,
        default=None,
        help="timed repeats for dask-ml (default: --repeats)",
    )
    parser.add_argument(
        "--iters",
        type=int,
        default=10,
        help="extra iterations of the long fit over the short one (default 10)",
    )
    parser.add_argument("--seed", type=int, default=SEED, help="seed of the data and of C0")
    parser.add_argument(
        "--objective-rtol",
        type=float,
        default=1e-4,
        help="largest relative objective difference counted as agreement (default 1e-4)",
    )
    parser.add_argument(
        "--wait-load",
        type=float,
        default=None,
        help="before the floors and before each library, wait until the 1-minute load "
        "average is below this (at most --max-wait seconds each time)",
    )
    parser.add_argument("--max-wait", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="JSON file (default benchmarks/results/lloyd_<dtype>.json)",
    )
    args = parser.parse_args(argv)
    args.dask_ml_repeats = args.dask_ml_repeats or args.repeats
    args.output = (
        args.output or RESULTS / f"lloyd_{args.dtype}{'_quick' if args.quick else ''}.json"
    )
    return args


def main(argv=None) -> None:
    """Run the shapes, print the tables, write the JSON report."""
    args = parse_args(argv)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    libraries = available_libraries(args.libraries, args.dtype)
    source = dkmeans_source()  # before the run: the code being timed is already imported
    waited = wait_for_load(args.wait_load, args.max_wait) if args.wait_load is not None else 0.0
    load_before = os.getloadavg()
    started = datetime.datetime.now().astimezone()
    # Data and floors first, before any library has started threads that may still spin.
    bandwidth = read_bandwidth()
    peak = peak_gflops(args.dtype)
    data, floors = {}, {}
    for name in args.shapes:
        n, d, k = shapes[name]
        print(
            f"[{name}] data {n} x {d}, k={k}, {args.dtype}; floor ...", file=sys.stderr, flush=True
        )
        data[name] = make_data(n, d, k, args.seed, args.dtype)
        floors[name] = measure_floor(*data[name], bandwidth, peak)
    client = start_cluster()
    try:
        worker_env = client.run(
            lambda: {
                v: os.environ.get(v)
                for v in (
                    "OMP_NUM_THREADS",
                    "OPENBLAS_NUM_THREADS",
                    "MKL_NUM_THREADS",
                    "MALLOC_TRIM_THRESHOLD_",
                )
            }
        )
        results = {}
        for name in args.shapes:
            results[name] = bench_shape(name, data.pop(name), floors[name], client, libraries, args)
    finally:
        cluster = client.cluster
        client.close()
        cluster.close()
    load_after = os.getloadavg()
    print(
        f"Lloyd seconds per iteration, {args.dtype}: (T(max_iter={SHORT + args.iters}) - "
        f"T(max_iter={SHORT})) / {args.iters}, median of {args.repeats} repeats "
        f"(dask-ml {args.dask_ml_repeats}); dkmeans and dask-ml on {N_WORKERS} workers x 1 thread, "
        f"the others on {N_THREADS} threads; {os.cpu_count()} CPUs; peer / dkmeans > 1 means dkmeans "
        f"is faster; memory read bandwidth {bandwidth / 1e9:.1f} GB/s, peak matrix-product rate "
        f"{peak:.0f} GFLOP/s ({N_THREADS} threads)"
    )
    print(format_table(results))
    print(format_goals(results))
    print(
        f"dkmeans from {source['path']} (commit {source['commit'] or 'unknown'}"
        f"{', with uncommitted changes' if source['modified'] else ''})"
    )
    print(
        f"load average (1, 5, 15 min) before: {fmt_load(load_before)}, after: {fmt_load(load_after)}"
        + (f" (waited {waited:.0f} s for the load to drop)" if waited else "")
    )
    report = {
        "date": started.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable)] + sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "read_bandwidth_bytes_per_s": bandwidth,
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
        "cluster": {
            "workers": N_WORKERS,
            "threads_per_worker": 1,
            "chunks": N_CHUNKS,
            "worker_env": next(iter(worker_env.values())),
        },
        "method": {
            "short_max_iter": SHORT,
            "long_max_iter": SHORT + args.iters,
            "repeats": args.repeats,
            "dask_ml_repeats": args.dask_ml_repeats,
            "seed": args.seed,
            "quick": args.quick,
            "dtype": args.dtype,
            "objective_rtol": args.objective_rtol,
        },
        "versions": library_versions(),
        "dkmeans_source": source,
        "skipped": sorted(set(args.libraries) - set(libraries)),
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=float) + "\n")
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
