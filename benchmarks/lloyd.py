"""Seconds per Lloyd iteration: dkmeans against scikit-learn and dask-ml.

Method
------
For each shape (rows x features, k) the script generates float32 Gaussian blobs with a
fixed seed and picks ``k`` rows (fixed seed) as the initial centroids ``C0``. Every
library starts from the same ``C0`` on the same data, with ``tol=0`` so that a fit runs
exactly ``max_iter`` centroid updates:

* dkmeans ``KMeans(init=C0, tol=0)`` and dask-ml ``KMeans(init=C0, tol=0)`` both get the
  same Dask array (16 row chunks) persisted on one ``LocalCluster`` of 2 worker processes
  x 1 thread, created like dkmeans' embedded cluster (one BLAS/OpenMP thread per worker,
  no ``MALLOC_TRIM_THRESHOLD_``), so that shipping the data is not timed;
* scikit-learn ``KMeans(init=C0, n_init=1, algorithm="lloyd", tol=0)`` runs in this
  process on the NumPy array, limited to 2 threads with threadpoolctl (the same 2 cores).

A fit has a fixed cost besides its iterations (validation, a first pass, the final
assignment), so the seconds per iteration are ``(T(max_iter=6) - T(max_iter=1)) / 5``,
repeated ``--repeats`` times (median reported), after one warm-up fit. For dkmeans the
median of ``history_[i]["seconds"]`` (the loop's own per-iteration timer) is shown too.

The objectives are recomputed for every library from its returned centroids with one
float64 NumPy pass over the data (sum of squared distances to the nearest centroid;
dask-ml's ``inertia_`` is a sum of unsquared distances), and compared with dkmeans'
after the same number of iterations.

Run
---
From the repository root::

    .venv/bin/python benchmarks/lloyd_core.py                 # small, tall, wide (about 2 min on 2 cores)
    .venv/bin/python benchmarks/lloyd_core.py --quick         # smaller n, a smoke run
    .venv/bin/python benchmarks/lloyd_core.py --shapes small tall --repeats 5

The table goes to stdout and the figures to ``benchmarks/results/lloyd_core.json``.
Libraries that are not installed (dask-ml) are skipped with a message.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import dask
import dask.array as da
import distributed
import numpy as np
import sklearn
import sklearn.cluster
from sklearn.datasets import make_blobs
from threadpoolctl import threadpool_limits

import dkmeans

#: name -> (n_samples, n_features, n_clusters)
SHAPES = {
    "small": (100_000, 8, 10),
    "tall": (2_000_000, 16, 32),
    "wide": (500_000, 128, 256),
}
#: ``--quick``: the same shapes with fewer rows.
QUICK_SHAPES = {
    "small": (20_000, 8, 10),
    "tall": (200_000, 16, 32),
    "wide": (50_000, 128, 256),
}
N_WORKERS = 2
N_CHUNKS = 16
SHORT, LONG = 1, 6  # max_iter of the two timed fits
SEED = 0
RESULTS = Path(__file__).resolve().parent / "results" / "lloyd_core.json"


# -- data and cluster --------------------------------------------------------------------
def make_data(n: int, d: int, k: int, seed: int = SEED):
    """Float32 Gaussian blobs and ``k`` of their rows (fixed seed) as initial centroids.

    The ``k`` blobs overlap (standard deviation 6, centres in [-10, 10]^d), so that
    Lloyd neither reaches a fixed point nor empties a cluster within the timed iterations
    on the default shapes: the libraries' empty-cluster rules differ.
    """
    X, _ = make_blobs(n_samples=n, n_features=d, centers=k, cluster_std=6.0,
                      center_box=(-10.0, 10.0), random_state=seed)
    X = X.astype(np.float32)
    rows = np.random.default_rng(seed + 1).choice(n, size=k, replace=False)
    return X, X[np.sort(rows)].copy()


def start_cluster(n_workers: int = N_WORKERS) -> distributed.Client:
    """A loopback LocalCluster configured like dkmeans' embedded one, and a default Client.

    Same settings as :func:`dkmeans.cluster.start_local_cluster`, but the client is set as
    the default one so that dask-ml's ``compute()`` calls run on this cluster too (the
    client ``start_local_cluster`` returns is not the default one).
    """
    environ = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        cluster = distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None)
    return distributed.Client(cluster)


def persist_chunks(client: distributed.Client, X: np.ndarray, n_chunks: int = N_CHUNKS) -> da.Array:
    """``X`` as a Dask array of ``n_chunks`` row chunks, persisted on the cluster."""
    rows = -(-X.shape[0] // n_chunks)
    with warnings.catch_warnings():  # the chunks travel once, inside the graph
        warnings.filterwarnings("ignore", message="Sending large graph")
        Xd = client.persist(da.from_array(X, chunks=(rows, X.shape[1])))
    distributed.wait(Xd)
    return Xd


# -- the libraries -------------------------------------------------------------------------
def fit_dkmeans(X, C0, max_iter):
    """dkmeans on the persisted Dask array ``X``."""
    return dkmeans.KMeans(n_clusters=len(C0), init=C0, max_iter=max_iter, tol=0.0).fit(X)


def fit_sklearn(X, C0, max_iter):
    """scikit-learn's Lloyd on the NumPy array ``X``, on 2 threads."""
    with threadpool_limits(limits=N_WORKERS):
        return sklearn.cluster.KMeans(n_clusters=len(C0), init=C0, n_init=1, algorithm="lloyd",
                                      max_iter=max_iter, tol=0.0).fit(X)


def fit_dask_ml(X, C0, max_iter):
    """dask-ml on the persisted Dask array ``X`` (``init`` must be an ndarray)."""
    import dask_ml.cluster

    return dask_ml.cluster.KMeans(n_clusters=len(C0), init=np.asarray(C0), max_iter=max_iter,
                                  tol=0.0).fit(X)


#: name -> (importable module it needs, fit function, takes the Dask array)
LIBRARIES = {
    "dkmeans": ("dkmeans", fit_dkmeans, True),
    "scikit-learn": ("sklearn.cluster", fit_sklearn, False),
    "dask-ml": ("dask_ml.cluster", fit_dask_ml, True),
}


def available_libraries() -> dict:
    """The libraries that import; a message for each one that does not."""
    found = {}
    for name, (module, fit, dask_input) in LIBRARIES.items():
        try:
            importlib.import_module(module)
        except ImportError as exc:
            print(f"skipping {name}: cannot import {module} ({exc})", file=sys.stderr)
            continue
        found[name] = (fit, dask_input)
    return found


def library_versions() -> dict:
    """Versions of the packages involved (None when not installed)."""
    versions = {}
    for name in ("dkmeans", "sklearn", "dask", "distributed", "dask_ml", "numpy"):
        try:
            versions[name] = importlib.import_module(name).__version__
        except ImportError:
            versions[name] = None
    return versions


def dkmeans_source() -> dict:
    """Where dkmeans was imported from, with its git commit when that is a checkout."""
    package = Path(dkmeans.__file__).resolve().parent
    info = {"path": str(package), "commit": None, "modified": None}
    try:
        git = ["git", "-C", str(package)]
        info["commit"] = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True,
                                        check=True).stdout.strip()
        status = subprocess.run(git + ["status", "--porcelain", "--", "."], capture_output=True,
                                text=True, check=True).stdout
        info["modified"] = bool(status.strip())
    except (OSError, subprocess.CalledProcessError):
        pass
    return info


# -- measurement ---------------------------------------------------------------------------
def timed(fit, X, C0, max_iter):
    """``(seconds, model)`` for one fit."""
    t0 = time.perf_counter()
    model = fit(X, C0, max_iter)
    return time.perf_counter() - t0, model


def seconds_per_iteration(fit, X, C0, repeats: int) -> dict:
    """Median of ``(T(LONG) - T(SHORT)) / (LONG - SHORT)`` over ``repeats``, after a warm-up.

    Raises if a fit stopped before ``max_iter`` (a fixed point), which would void the
    difference; returns the per-repeat figures and the last ``LONG`` model.
    """
    fit(X, C0, 2)  # warm-up: imports, JIT compilation, worker caches
    out = {"short_s": [], "long_s": [], "per_iter_s": [], "history_s": []}
    for _ in range(repeats):
        t_short, short = timed(fit, X, C0, SHORT)
        t_long, model = timed(fit, X, C0, LONG)
        for m, expected in ((short, SHORT), (model, LONG)):
            if int(m.n_iter_) != expected:
                raise RuntimeError(f"a fit ran {m.n_iter_} iterations instead of {expected} "
                                   "(converged early): use another --seed or shape")
        out["short_s"].append(t_short)
        out["long_s"].append(t_long)
        out["per_iter_s"].append((t_long - t_short) / (LONG - SHORT))
        out["history_s"] += [h["seconds"] for h in getattr(model, "history_", [])]
        if hasattr(model, "history_"):
            out["empty_clusters_fixed"] = sum(h["empty_clusters_fixed"] for h in model.history_)
    out["seconds_per_iter"] = statistics.median(out["per_iter_s"])
    out["history_median_s"] = statistics.median(out["history_s"]) if out["history_s"] else None
    out["model"] = model
    return out


def objective(X: np.ndarray, C: np.ndarray, tile: int = 8192) -> float:
    """Sum over rows of the squared distance to the nearest centroid, in float64."""
    C = np.asarray(C, dtype=np.float64)
    c_sq = np.einsum("ij,ij->i", C, C)
    total = 0.0
    for i0 in range(0, X.shape[0], tile):
        Xt = X[i0:i0 + tile].astype(np.float64)
        nearest = np.argmin(c_sq - 2.0 * (Xt @ C.T), axis=1)
        diff = Xt - C[nearest]
        total += float(np.einsum("ij,ij->", diff, diff))
    return total


def bench_shape(name, n, d, k, client, libraries, repeats, dask_ml_repeats, seed) -> dict:
    """Time every library on one shape; seconds per iteration, ratios and objectives."""
    X, C0 = make_data(n, d, k, seed)
    Xd = persist_chunks(client, X)
    result = {"n_samples": n, "n_features": d, "n_clusters": k, "libraries": {}}
    centers = {}
    for lib, (fit, dask_input) in libraries.items():
        print(f"[{name}] {lib} ...", file=sys.stderr, flush=True)
        reps = dask_ml_repeats if lib == "dask-ml" else repeats
        timing = seconds_per_iteration(fit, Xd if dask_input else X, C0, reps)
        model = timing.pop("model")
        centers[lib] = np.asarray(model.cluster_centers_, dtype=np.float64)
        timing["objective"] = objective(X, centers[lib])
        timing["reported_inertia"] = float(model.inertia_)
        result["libraries"][lib] = timing
    del Xd
    ref = result["libraries"].get("dkmeans")
    for lib, r in result["libraries"].items():
        if ref is not None and lib != "dkmeans":
            r["ratio_vs_dkmeans"] = r["seconds_per_iter"] / ref["seconds_per_iter"]
            r["objective_rel_diff"] = abs(r["objective"] - ref["objective"]) / ref["objective"]
            r["centers_max_abs_diff"] = float(np.max(np.abs(centers[lib] - centers["dkmeans"])))
    return result


# -- output --------------------------------------------------------------------------------
def format_table(results: dict) -> str:
    """A Markdown table: s/iteration, ratio to dkmeans, fixed cost, objective agreement."""
    lines = [
        "| shape | n x d, k | library | s / iteration | peer / dkmeans | fit(max_iter=1) s | objective (float64) | rel. diff vs dkmeans |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, res in results.items():
        dims = f"{res['n_samples']:,} x {res['n_features']}, k={res['n_clusters']}"
        for lib, r in res["libraries"].items():
            per_iter = f"{r['seconds_per_iter']:.4f}"
            if lib == "dkmeans" and r["history_median_s"] is not None:
                per_iter += f" (history_ {r['history_median_s']:.4f})"
            ratio = f"{r['ratio_vs_dkmeans']:.2f}" if "ratio_vs_dkmeans" in r else "1 (ref.)"
            rel = f"{r['objective_rel_diff']:.1e}" if "objective_rel_diff" in r else "-"
            lines.append(f"| {name} | {dims} | {lib} | {per_iter} | {ratio} | "
                         f"{statistics.median(r['short_s']):.3f} | {r['objective']:.6e} | {rel} |")
    for name, res in results.items():
        empties = res["libraries"].get("dkmeans", {}).get("empty_clusters_fixed", 0)
        if empties:
            lines.append(f"\nnote: {name}: dkmeans refilled {empties} empty cluster(s); the libraries' "
                         "empty-cluster rules differ, so their objectives may too")
    return "\n".join(lines)


def fmt_load(load) -> str:
    """A load-average triple as text (other processes on the cores skew the timings)."""
    return " ".join(f"{x:.2f}" for x in load)


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=list(SHAPES),
                        help="shapes to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer rows: a fast smoke run")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per library (default 3)")
    parser.add_argument("--dask-ml-repeats", type=int, default=None,
                        help="timed repeats for dask-ml (default: --repeats)")
    parser.add_argument("--seed", type=int, default=SEED, help="seed of the data and of C0")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON file (default {RESULTS})")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    """Run the shapes, print the table, write the JSON report."""
    args = parse_args(argv)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    libraries = available_libraries()
    source = dkmeans_source()  # before the run: the code being timed is already imported
    load_before = os.getloadavg()
    client = start_cluster()
    try:
        worker_env = client.run(lambda: {v: os.environ.get(v) for v in
                                         ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_")})
        results = {}
        for name in args.shapes:
            n, d, k = shapes[name]
            results[name] = bench_shape(name, n, d, k, client, libraries, args.repeats,
                                        args.dask_ml_repeats or args.repeats, args.seed)
    finally:
        client.close()
        client.cluster.close()
    table = format_table(results)
    load_after = os.getloadavg()
    print(f"Lloyd seconds per iteration: (T(max_iter={LONG}) - T(max_iter={SHORT})) / {LONG - SHORT}, "
          f"median of {args.repeats} repeats; {N_WORKERS} workers x 1 thread, {os.cpu_count()} CPUs; "
          "peer / dkmeans > 1 means dkmeans is faster")
    print(table)
    print(f"dkmeans from {source['path']} (commit {source['commit'] or 'unknown'}"
          f"{', with uncommitted changes' if source['modified'] else ''})")
    print(f"load average (1, 5, 15 min) before: {fmt_load(load_before)}, after: {fmt_load(load_after)}")
    report = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable)] + sys.argv),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "processor": platform.processor(), "python": platform.python_version(),
                    "load_average_before": load_before, "load_average_after": load_after},
        "cluster": {"workers": N_WORKERS, "threads_per_worker": 1, "chunks": N_CHUNKS,
                    "worker_env": next(iter(worker_env.values()))},
        "method": {"short_max_iter": SHORT, "long_max_iter": LONG, "repeats": args.repeats,
                   "dask_ml_repeats": args.dask_ml_repeats or args.repeats, "seed": args.seed,
                   "quick": args.quick},
        "versions": library_versions(),
        "dkmeans_source": source,
        "skipped": sorted(set(LIBRARIES) - set(libraries)),
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
