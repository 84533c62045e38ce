"""dkmeans alone: float64 vs float32, 1 vs 2 workers, worker memory, fixed cost, scaling in n and k.

Parts (``--parts``, default all), each on dkmeans' embedded-cluster configuration
(``start_local_cluster``: worker processes x 1 thread, one BLAS/OpenMP thread each), data
persisted, ``KMeans(init=C0, tol=0)`` so that a fit runs exactly ``max_iter`` updates:

* ``dtype``: seconds per iteration in float64 and float32 on ``tall`` and ``wide``
  (the data of ``lloyd.py``, 16 chunks); the ratio float64 / float32 (issue 4: <= 2.2).
* ``workers``: seconds per iteration on 1 worker and on 2 workers, ``tall`` and ``wide``
  float32; the speedup (issue 4: >= 1.7).
* ``spmd``: the SPMD loop's exchange between 2 workers: ``RankComm.allreduce`` alone (a
  32 x 17 float64 array, 400 times), then 300 passes of the tall shape split into the
  kernel time of each rank, the gap between the ranks finishing, and the exchange after
  the later one (medians and 90th percentiles; ``CLOCK_MONOTONIC`` is shared by the
  worker processes).
* ``kernels``: ``assign_partials`` alone (no Dask, one thread) on one worker's share of
  ``tall``, ``wide`` and ``manyk`` (half the rows), with the kernel chosen per shape and with
  BLAS plus the compiled argmin (Dask config ``dkmeans.kernels.backend = "blas"``).
* ``memory``: resident memory of each worker, sampled every 2 ms by a thread in the
  worker, on ``tall``, ``wide``, ``manyk`` and ``manyk`` with k=8192 (data generated on
  the workers, 16 chunks; a fresh cluster per case, warmed up on a tiny array): the peak
  during ``dkmeans.train`` (Lloyd and the final labels pass) and during ``KMeans.fit``
  (which adds a first pass for the column variances) minus the resident memory just
  before, against the worker's share of the data and the scratch bound (see
  ``scratch_bound``).
* ``fixed``: the fixed cost per iteration: 1 chunk of 1,000 rows (d=8, k=10) and the
  ``small`` shape (100,000 x 8, k=10, 16 chunks), each with the default loop (these small
  loops run inside one task), SPMD (``small`` only; Dask config ``dkmeans.single-task-work``
  = 0) and with one graph per iteration (also ``dkmeans.spmd`` = False: the cluster round
  trip).
* ``n``: seconds per iteration for n = 1e5, 1e6, 1e7 rows at d=16, k=32 (generated on the
  workers in 16 chunks; 1e7 rows are 640 MB in float32).
* ``k``: seconds per iteration for k = 8, 64, 512, 4096, 8192 at 200,000 x 64.

Seconds per iteration are ``(T(max_iter=1+iters) - T(max_iter=1)) / iters``, median of
``--repeats`` after a warm-up fit; the median of ``history_[i]["seconds"]`` (the loop's own
timer) is shown too. For ``n`` and ``k`` the script reports the marginal cost per row (per
centroid) between consecutive points: the growth is "linear" when every marginal cost is
within 25% of the first, "sub-linear" when some are lower (fixed costs amortised) and
none higher, "super-linear" when some are higher.

Run from the repository root::

    .venv/bin/python benchmarks/lloyd_scaling.py                      # everything (about 10 min)
    .venv/bin/python benchmarks/lloyd_scaling.py --parts dtype workers
    .venv/bin/python benchmarks/lloyd_scaling.py --parts workers spmd --repeats 7 --iters 20

Results: stdout and ``benchmarks/results/lloyd_scaling.json`` (``--output``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import dask
import dask.array as da
import distributed
import numpy as np

import dkmeans
from dkmeans.engine.client import start_local_cluster
from dkmeans.kernels import DEFAULT_SCRATCH_BYTES
from dkmeans.testing import make_blobs_dask

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lloyd import (  # noqa: E402
    SHAPES,
    dkmeans_source,
    fmt_load,
    library_versions,
    make_data,
    persist_chunks,
    wait_for_load,
)

RESULTS = Path(__file__).resolve().parent / "results" / "lloyd_scaling.json"
PARTS = ("dtype", "workers", "spmd", "contention", "kernels", "memory", "fixed", "n", "k")
N_CHUNKS = 16


# -- helpers -------------------------------------------------------------------------------
def cluster(n_workers: int) -> distributed.Client:
    return start_local_cluster(
        n_workers=n_workers, threads_per_worker=1, dashboard_address=None, set_as_default=True
    )


def close(client) -> None:
    c = client.cluster
    client.close()
    c.close()


def fit(X, C0, max_iter):
    return dkmeans.KMeans(n_clusters=len(C0), init=C0, max_iter=max_iter, tol=0.0).fit(X)


def per_iteration(X, C0, iters: int, repeats: int) -> dict:
    """Median ``(T(1 + iters) - T(1)) / iters`` and the median of history_ seconds."""
    fit(X, C0, 2)
    diffs, hist = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fit(X, C0, 1)
        t1 = time.perf_counter()
        km = fit(X, C0, 1 + iters)
        t2 = time.perf_counter()
        if km.n_iter_ != 1 + iters:
            raise RuntimeError(f"converged after {km.n_iter_} iterations; use fewer --iters")
        diffs.append(((t2 - t1) - (t1 - t0)) / iters)
        hist += [h["seconds"] for h in km.history_]
    return {
        "seconds_per_iter": statistics.median(diffs),
        "history_median_s": statistics.median(hist),
        "per_iter_s": diffs,
        "fit1_s": t1 - t0,
    }


def persist_generated(client, n, d, k, seed=0, dtype=np.float32):
    """Blobs generated on the workers (16 chunks), persisted; ``k`` rows of them as ``C0``."""
    X, _ = make_blobs_dask(
        n, d, k, chunk_rows=-(-n // N_CHUNKS), spread=6.0, box=10.0, seed=seed, dtype=dtype
    )
    X = client.persist(X)
    distributed.wait(X)
    C0 = X[:k].compute()
    return X, C0


def local_data_bytes(client, X) -> dict:
    """Bytes of ``X``'s chunks held by each worker."""
    who = client.who_has(X)
    sizes = client.nbytes(summary=False)
    out = {}
    for key, workers in who.items():
        for w in workers:
            out[w] = out.get(w, 0) + sizes.get(key, 0)
    return out


def _rss_start(dask_worker, interval=0.002):
    import threading

    page = os.sysconf("SC_PAGE_SIZE")

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    state = {"before": rss(), "peak": 0, "stop": False}

    def loop():
        while not state["stop"]:
            state["peak"] = max(state["peak"], rss())
            time.sleep(interval)

    state["thread"] = threading.Thread(target=loop, daemon=True)
    state["thread"].start()
    dask_worker._dkmeans_rss = state
    return state["before"]


def _rss_stop(dask_worker):
    state = dask_worker._dkmeans_rss
    state["stop"] = True
    state["thread"].join()
    return {"before": state["before"], "peak": state["peak"]}


def scratch_bound(k: int, d: int, itemsize: int, chunks_per_worker: int) -> dict:
    """The stated bound on a worker's memory beyond its data during a Lloyd pass.

    One kernel call at a time per worker thread uses at most ``DEFAULT_SCRATCH_BYTES``
    of tiles (the compiled paths about ``BLAS_BLOCK_BYTES``) plus centroid-sized arrays:
    the centroids and their copies in the data dtype and float64 (about 4 x k x d x 8
    bytes) and one float64 ``k x d`` partial per chunk the worker holds (the per-worker
    task keeps its chunks' partials until it combines them).
    """
    tiles = DEFAULT_SCRATCH_BYTES
    centroid_sized = (4 + chunks_per_worker) * k * d * 8
    return {"tiles": tiles, "centroid_sized": centroid_sized, "total": tiles + centroid_sized}


# -- parts ---------------------------------------------------------------------------------
def part_dtype(args) -> dict:
    out = {}
    client = cluster(2)
    try:
        for name in ("tall", "wide"):
            n, d, k = SHAPES[name]
            row = {}
            for dtype in ("float32", "float64"):
                X, C0 = make_data(n, d, k, dtype=dtype)
                Xd = persist_chunks(client, X)
                print(f"[dtype] {name} {dtype} ...", file=sys.stderr, flush=True)
                row[dtype] = per_iteration(Xd, C0, args.iters, args.repeats)
                del Xd, X
            row["ratio"] = row["float64"]["seconds_per_iter"] / row["float32"]["seconds_per_iter"]
            row["ratio_history"] = (
                row["float64"]["history_median_s"] / row["float32"]["history_median_s"]
            )
            out[name] = row
    finally:
        close(client)
    return out


def part_workers(args) -> dict:
    out = {}
    for name in ("tall", "wide"):
        out[name] = {}
    for workers in (1, 2):
        client = cluster(workers)
        try:
            for name in ("tall", "wide"):
                n, d, k = SHAPES[name]
                X, C0 = make_data(n, d, k)
                Xd = persist_chunks(client, X)
                print(f"[workers] {name} {workers} worker(s) ...", file=sys.stderr, flush=True)
                out[name][workers] = per_iteration(Xd, C0, args.iters, args.repeats)
                del Xd, X
        finally:
            close(client)
    for row in out.values():
        row["speedup"] = row[1]["seconds_per_iter"] / row[2]["seconds_per_iter"]
        row["speedup_history"] = row[1]["history_median_s"] / row[2]["history_median_s"]
    return out


def _allreduce_times(chunks, value, passes):
    """Seconds of each of ``passes`` allreduces of ``value`` (an SPMD program; every rank's)."""
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        chunks.comm.allreduce(value, lambda parts: sum(parts))
        times.append(time.perf_counter() - t0)
    return chunks.comm.allreduce([times], lambda parts: [t for part in parts for t in part])


def _pass_stamps(chunks, C, passes):
    """(start, local kernels done, exchange done) of each Lloyd pass (an SPMD program; every rank's)."""
    from dkmeans.drivers.lloyd import _partials_chunk
    from dkmeans.kernels.reduce import combine_partials

    stamps = []
    for _ in range(passes):
        t0 = time.monotonic()
        chunks.map_reduce(_partials_chunk, combine_partials, (C,))
        stamps.append((t0, t0 + chunks.comm.last_pass_s, time.monotonic()))
    return chunks.comm.allreduce([stamps], lambda parts: [s for part in parts for s in part])


def _med_p90_ms(values) -> dict:
    return {
        "median_ms": float(np.median(values)) * 1e3,
        "p90_ms": float(np.percentile(values, 90)) * 1e3,
    }


def part_spmd(args, exchanges: int = 400, passes: int = 300, skip: int = 50) -> dict:
    """The exchange alone, then the tall pass split into kernel, gap and exchange (2 workers)."""
    from dkmeans.engine.persisted import PersistedData
    from dkmeans.engine.spmd import run_spmd

    client = cluster(2)
    try:
        n, d, k = SHAPES["tall"]
        X, C0 = make_data(n, d, k)
        data = PersistedData(client, persist_chunks(client, X))
        if len(data.placement()) != 2:
            raise RuntimeError("the chunks are not spread over both workers")
        print("[spmd] the exchange alone ...", file=sys.stderr, flush=True)
        value = np.random.default_rng(0).standard_normal((k, d + 1))
        times, _ = run_spmd(data, _allreduce_times, (value, exchanges))
        out = {"exchange": {f"rank {r}": _med_p90_ms(t[skip:]) for r, t in enumerate(times)}}
        print("[spmd] tall passes ...", file=sys.stderr, flush=True)
        (a, b), _ = run_spmd(data, _pass_stamps, (C0, passes))
        rows = np.array(
            [
                (
                    (a1 - a0),
                    (b1 - b0),
                    abs(a1 - b1),
                    max(a2, b2) - max(a1, b1),
                    max(a2, b2) - min(a0, b0),
                )
                for (a0, a1, a2), (b0, b1, b2) in list(zip(a, b))[skip:]
            ]
        )
        names = (
            "kernel rank 0",
            "kernel rank 1",
            "gap between ranks",
            "exchange after the later rank",
            "pass",
        )
        out["tall pass"] = {name: _med_p90_ms(rows[:, i]) for i, name in enumerate(names)}
    finally:
        close(client)
    return out


def _warm_worker(d, dtype):
    """Load the kernels of ``d`` features and ``dtype`` in this process (runs on a worker)."""
    import dkmeans.drivers.lloyd  # noqa: F401
    import dkmeans.estimator  # noqa: F401 - the modules a fit imports
    from dkmeans.kernels import assign, assign_partials, column_moments

    X = np.random.default_rng(0).standard_normal((600, d)).astype(dtype)
    assign_partials(X, X[:8])
    assign(X, X[:8])
    column_moments(X)


def kernel_peak_bytes(rows: int, d: int, k: int, dtype=np.float32) -> int:
    """Peak NumPy allocations (tracemalloc) of one ``assign_partials`` call on a chunk, in this process.

    Counts the arrays the call allocates (buffers, sums, counts, copies), not its input;
    numba's own small buffers (the direct loop's transposed tile) are not traced.
    """
    import tracemalloc

    from dkmeans.kernels import assign_partials

    rng = np.random.default_rng(0)
    X = rng.standard_normal((rows, d)).astype(dtype)
    C = X[rng.choice(rows, size=min(k, rows), replace=False)]
    if k > rows:
        C = np.concatenate([C, rng.standard_normal((k - rows, d)).astype(dtype)])
    assign_partials(X, C)  # compile / load outside the traced call
    tracemalloc.start()
    try:
        assign_partials(X, C)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _sampled(client, run):
    """Run ``run()`` while each worker samples its resident memory; {worker: before, peak}."""
    client.run(_rss_start)
    try:
        run()
    finally:
        rss = client.run(_rss_stop)
    return rss


def _median_call_s(fn, fn_args, repeats: int) -> float:
    """Median seconds of ``fn(*fn_args)`` over ``repeats`` calls, after one warm-up call (compiles)."""
    fn(*fn_args)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*fn_args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def part_contention(args, repeats: int = 15) -> dict:
    """The tall kernel on one worker's share (1,000,000 x 16, k=32, float32), alone and two at once.

    No Dask: one thread, then two threads of this process, each on its own copy of the rows
    (the kernel releases the GIL). A slowdown with two threads caps what two workers can gain
    on this machine, whatever the driver does.
    """
    import threading

    from threadpoolctl import threadpool_limits

    from dkmeans.kernels import assign_partials

    rng = np.random.default_rng(0)
    rows = [rng.standard_normal((1_000_000, 16)).astype(np.float32) for _ in range(2)]
    C = rows[0][:32].copy()

    def run(X, out):
        out.append(_median_call_s(assign_partials, (X, C), repeats))

    print("[contention] one thread, then two ...", file=sys.stderr, flush=True)
    with threadpool_limits(1):
        alone = []
        run(rows[0], alone)
        both = []
        threads = [threading.Thread(target=run, args=(X, both)) for X in rows]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return {
        "alone_s": alone[0],
        "two_at_once_s": sorted(both),
        "slowdown": max(both) / alone[0],
        "speedup_cap": 2 * alone[0] / max(both),
    }


def part_kernels(args, repeats: int = 7) -> dict:
    """One worker's share of tall, wide and manyk, one thread, no Dask: ``assign_partials``
    with the kernel chosen per shape against BLAS plus the compiled argmin (Dask config
    ``dkmeans.kernels.backend``)."""
    from threadpoolctl import threadpool_limits

    from dkmeans.kernels import assign_partials

    rng = np.random.default_rng(0)
    out = {}
    with threadpool_limits(1):
        for name in ("tall", "wide", "manyk"):
            n, d, k = SHAPES[name]
            X = rng.standard_normal((n // 2, d)).astype(np.float32)
            C = X[rng.choice(len(X), k, replace=False)].copy()
            print(f"[kernels] {name} ...", file=sys.stderr, flush=True)
            times = {}
            for engine in ("auto", "blas"):
                with dask.config.set({"dkmeans.kernels.backend": engine}):
                    times[engine] = _median_call_s(assign_partials, (X, C), repeats)
            out[name] = {
                "rows": n // 2,
                "d": d,
                "k": k,
                "auto_s": times["auto"],
                "blas_s": times["blas"],
                "blas_over_auto": times["blas"] / times["auto"],
            }
    return out


def part_memory(args) -> dict:
    """Per case a fresh 2-worker cluster: warm-up on a tiny array, then two sampled runs.

    ``train``: ``dkmeans.train`` from ``C0`` (Lloyd iterations and the final labels pass);
    ``fit``: ``KMeans(init=C0).fit``, which also makes a first pass for the column
    variances (scikit-learn's ``tol`` scaling). Each increase is the peak during the run
    minus the resident memory just before it.
    """
    cases = {
        "tall": SHAPES["tall"],
        "wide": SHAPES["wide"],
        "manyk": SHAPES["manyk"],
        "manyk k=8192": (SHAPES["manyk"][0], SHAPES["manyk"][1], 8192),
    }
    out = {}
    for name, (n, d, k) in cases.items():
        print(f"[memory] {name} ...", file=sys.stderr, flush=True)
        client = cluster(2)
        try:
            X, C0 = persist_generated(client, n, d, k)
            # warm-up outside the sampled runs: imports and compiled kernels of this d and
            # dtype on every worker, then the driver code on a tiny array
            client.run(_warm_worker, d, "float32")
            tiny = client.persist(X[:2000])
            distributed.wait(tiny)
            dkmeans.train(
                dkmeans.Descriptor(cluster_count=8, max_iteration_count=2, accuracy_threshold=0.0),
                tiny,
                C0[:8],
            )
            fit(tiny, C0[:8], 2)
            del tiny
            data = local_data_bytes(client, X)
            desc = dkmeans.Descriptor(
                cluster_count=k,
                max_iteration_count=1 + args.memory_iters,
                accuracy_threshold=0.0,
                dtype=np.float32,
            )
            t0 = time.perf_counter()
            runs = {"train": _sampled(client, lambda X=X, C0=C0: dkmeans.train(desc, X, C0))}
            t1 = time.perf_counter()
            runs["fit"] = _sampled(client, lambda X=X, C0=C0: fit(X, C0, 1 + args.memory_iters))
            t2 = time.perf_counter()
            chunks_per_worker = -(-N_CHUNKS // len(data))
            bound = scratch_bound(k, d, X.dtype.itemsize, chunks_per_worker)
            workers = {}
            for w in sorted(runs["train"]):
                row = {"data_bytes": data.get(w, 0)}
                for run, rss in runs.items():
                    r = rss[w]
                    row[run] = {
                        "rss_before": r["before"],
                        "rss_peak": r["peak"],
                        "increase": r["peak"] - r["before"],
                        "within_bound": r["peak"] - r["before"] <= bound["total"],
                    }
                workers[w] = row
            out[name] = {
                "n": n,
                "d": d,
                "k": k,
                "iterations": 1 + args.memory_iters,
                "train_s": t1 - t0,
                "fit_s": t2 - t1,
                "bound": bound,
                "workers": workers,
                "chunk_bytes": -(-n // N_CHUNKS) * d * X.dtype.itemsize,
                "labels_bytes": n * 4,
                "kernel_peak_bytes": kernel_peak_bytes(-(-n // N_CHUNKS), d, k),
            }
            del X
        finally:
            close(client)
    return out


def part_fixed(args) -> dict:
    """The three loop modes: the default (small loops in one task), SPMD, one graph per iteration."""
    out = {}
    client = cluster(2)
    try:
        rng = np.random.default_rng(0)
        X = rng.standard_normal((1000, 8)).astype(np.float32)
        one = client.persist(da.from_array(X, chunks=(1000, 8)))
        distributed.wait(one)
        n, d, k = SHAPES["small"]
        Xs, C0 = make_data(n, d, k)
        small = persist_chunks(client, Xs)
        modes = (
            ("one task", {}),
            ("SPMD", {"dkmeans.single-task-work": 0}),
            ("graph per iteration", {"dkmeans.single-task-work": 0, "dkmeans.spmd": False}),
        )
        for mode, config in modes:
            with dask.config.set(config):
                if mode != "SPMD":  # one chunk is one rank: the same as one task
                    print(f"[fixed] 1 chunk of 1,000 rows, {mode} ...", file=sys.stderr, flush=True)
                    out[f"1 chunk x 1,000 rows, d=8, k=10, {mode}"] = per_iteration(
                        one, X[:10].copy(), args.iters, args.repeats
                    )
                print(f"[fixed] small, {mode} ...", file=sys.stderr, flush=True)
                out[f"small 100,000 x 8, k=10, 16 chunks, {mode}"] = per_iteration(
                    small, C0, args.iters, args.repeats
                )
    finally:
        close(client)
    return out


def linearity(points: list, key: str) -> dict:
    """Marginal seconds per unit between consecutive points, and how they change.

    "linear": every marginal cost within 25% of the first; "sub-linear": none above 1.25x
    the first but some below 0.75x (fixed costs amortised); "super-linear": some above.
    """
    marginal = [
        (b["seconds_per_iter"] - a["seconds_per_iter"]) / (b[key] - a[key])
        for a, b in zip(points, points[1:])
    ]
    if not marginal or marginal[0] <= 0:
        return {
            "marginal_seconds_per_unit": marginal,
            "growth": "undetermined",
            "at_most_linear": None,
        }
    rel = [m / marginal[0] for m in marginal]
    if max(rel) > 1.25:
        growth = "super-linear"
    elif min(rel) < 0.75:
        growth = "sub-linear"
    else:
        growth = "linear"
    return {
        "marginal_seconds_per_unit": marginal,
        "relative_to_first": rel,
        "growth": growth,
        "at_most_linear": growth != "super-linear",
    }


def part_n(args) -> dict:
    points = []
    client = cluster(2)
    try:
        for n in args.n_values:
            print(f"[n] {n:,} x 16, k=32 ...", file=sys.stderr, flush=True)
            X, C0 = persist_generated(client, n, 16, 32)
            r = per_iteration(X, C0, args.iters, args.repeats)
            r["n"] = n
            points.append(r)
            del X
    finally:
        close(client)
    return {"d": 16, "k": 32, "points": points, "growth": linearity(points, "n")}


def part_k(args) -> dict:
    points = []
    client = cluster(2)
    try:
        n, d = 200_000, 64
        for k in args.k_values:
            print(f"[k] 200,000 x 64, k={k} ...", file=sys.stderr, flush=True)
            X, C0 = persist_generated(client, n, d, k)
            iters = args.iters if k <= 512 else max(2, args.iters // 2)
            r = per_iteration(X, C0, iters, args.repeats)
            r["k"] = k
            points.append(r)
            del X
    finally:
        close(client)
    return {"n": 200_000, "d": 64, "points": points, "growth": linearity(points, "k")}


# -- output --------------------------------------------------------------------------------
def report_text(res: dict) -> str:
    lines = []
    if "dtype" in res:
        lines += [
            "",
            "float64 vs float32 (s / iteration; history_ median in brackets)",
            "",
            "| shape | float32 | float64 | float64 / float32 |",
            "|---|---:|---:|---:|",
        ]
        for name, r in res["dtype"].items():
            lines.append(
                f"| {name} | {r['float32']['seconds_per_iter']:.4f} ({r['float32']['history_median_s']:.4f}) | "
                f"{r['float64']['seconds_per_iter']:.4f} ({r['float64']['history_median_s']:.4f}) | "
                f"{r['ratio']:.2f} ({r['ratio_history']:.2f}) |"
            )
    if "workers" in res:
        lines += [
            "",
            "1 vs 2 workers, float32 (s / iteration; history_ median in brackets)",
            "",
            "| shape | 1 worker | 2 workers | speedup |",
            "|---|---:|---:|---:|",
        ]
        for name, r in res["workers"].items():
            lines.append(
                f"| {name} | {r[1]['seconds_per_iter']:.4f} ({r[1]['history_median_s']:.4f}) | "
                f"{r[2]['seconds_per_iter']:.4f} ({r[2]['history_median_s']:.4f}) | "
                f"{r['speedup']:.2f} ({r['speedup_history']:.2f}) |"
            )
    if "spmd" in res:
        r = res["spmd"]
        lines += [
            "",
            "SPMD exchange, 2 workers (ms: median, 90th percentile)",
            "",
            "| what | median | p90 |",
            "|---|---:|---:|",
        ]
        for name, v in r["exchange"].items():
            lines.append(
                f"| allreduce of 32 x 17 float64, {name} | {v['median_ms']:.2f} | {v['p90_ms']:.2f} |"
            )
        for name, v in r["tall pass"].items():
            lines.append(f"| tall pass: {name} | {v['median_ms']:.2f} | {v['p90_ms']:.2f} |")
    if "contention" in res:
        r = res["contention"]
        lines += [
            "",
            "The tall kernel on 1,000,000 x 16, k=32 (one thread, no Dask): alone "
            f"{r['alone_s'] * 1e3:.1f} ms; two threads at once {r['two_at_once_s'][0] * 1e3:.1f} and "
            f"{r['two_at_once_s'][1] * 1e3:.1f} ms: slowdown {r['slowdown']:.2f}, so two workers can be at "
            f"most {r['speedup_cap']:.2f}x faster than one here",
        ]
    if "kernels" in res:
        lines += [
            "",
            "One worker's share, one thread, no Dask: assign_partials (ms)",
            "",
            "| shape | rows x d, k | kernel chosen | BLAS + argmin | BLAS / chosen |",
            "|---|---|---:|---:|---:|",
        ]
        for name, r in res["kernels"].items():
            lines.append(
                f"| {name} | {r['rows']:,} x {r['d']}, k={r['k']} | {r['auto_s'] * 1e3:.1f} | "
                f"{r['blas_s'] * 1e3:.1f} | {r['blas_over_auto']:.2f} |"
            )
    if "memory" in res:
        mib = 2**20
        lines += [
            "",
            "Worker memory (MiB, 2 workers): increase = peak resident memory during the run - resident "
            "memory just before it",
            "",
            "| case | chunk | kernel call peak | worker | data held | train: before | train: increase | "
            "fit: before | fit: increase | bound | within |",
            "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for name, r in res["memory"].items():
            for i, (_w, m) in enumerate(sorted(r["workers"].items())):
                ok = m["train"]["within_bound"] and m["fit"]["within_bound"]
                lines.append(
                    f"| {name} (k={r['k']}) | {r['chunk_bytes'] / mib:.1f} | "
                    f"{r['kernel_peak_bytes'] / mib:.1f} | {i} | {m['data_bytes'] / mib:.0f} | "
                    f"{m['train']['rss_before'] / mib:.0f} | {m['train']['increase'] / mib:.1f} | "
                    f"{m['fit']['rss_before'] / mib:.0f} | {m['fit']['increase'] / mib:.1f} | "
                    f"{r['bound']['total'] / mib:.0f} | {'yes' if ok else 'NO'} |"
                )
    if "fixed" in res:
        lines += [
            "",
            "Fixed cost per iteration",
            "",
            "| case | s / iteration | history_ median |",
            "|---|---:|---:|",
        ]
        for name, r in res["fixed"].items():
            lines.append(f"| {name} | {r['seconds_per_iter']:.4f} | {r['history_median_s']:.4f} |")
    for part, key, label in (("n", "n", "rows"), ("k", "k", "centroids")):
        if part not in res:
            continue
        r = res[part]
        g = r["growth"]
        lines += [
            "",
            f"Scaling in {key} ({'d=16, k=32' if part == 'n' else '200,000 x 64'})",
            "",
            f"| {key} | s / iteration | history_ median | marginal s per 1,000 {label} |",
            "|---:|---:|---:|---:|",
        ]
        for i, p in enumerate(r["points"]):
            m = "" if i == 0 else f"{g['marginal_seconds_per_unit'][i - 1] * 1000:.3g}"
            lines.append(
                f"| {p[key]:,} | {p['seconds_per_iter']:.4f} | {p['history_median_s']:.4f} | {m} |"
            )
        rel = ", ".join(f"{x:.2f}" for x in g.get("relative_to_first", []))
        lines.append(f"\ngrowth: {g['growth']} (marginal costs relative to the first: {rel})")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument(
        "--iters", type=int, default=6, help="extra iterations of the long fit (default 6)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-iters", type=int, default=3)
    parser.add_argument("--n-values", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--k-values", type=int, nargs="+", default=[8, 64, 512, 4096, 8192])
    parser.add_argument(
        "--wait-load",
        type=float,
        default=None,
        help="before each part, wait until the 1-minute load average is below this",
    )
    parser.add_argument(
        "--max-wait", type=float, default=600.0, help="seconds per wait (default 600)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    source = dkmeans_source()
    waited = wait_for_load(args.wait_load, args.max_wait) if args.wait_load is not None else 0.0
    load_before = os.getloadavg()
    started = datetime.datetime.now().astimezone()
    res = {}
    loads = {}
    for part in args.parts:
        if args.wait_load is not None and part != args.parts[0]:
            wait_for_load(args.wait_load, args.max_wait)
        t0 = time.perf_counter()
        before = os.getloadavg()
        res[part] = globals()[f"part_{part}"](args)
        loads[part] = {"before": before, "after": os.getloadavg()}
        print(f"[{part}] done in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    print(report_text(res))
    print(
        "\n1-minute load before / after each part: "
        + ", ".join(f"{p} {v['before'][0]:.2f} / {v['after'][0]:.2f}" for p, v in loads.items())
    )
    print(
        f"\ndkmeans commit {source['commit']}{' (modified)' if source['modified'] else ''}; "
        f"load average before: {fmt_load(load_before)}, after: {fmt_load(load_after)}"
        + (f" (waited {waited:.0f} s)" if waited else "")
    )
    report = {
        "date": started.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable)] + sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
        "versions": library_versions(),
        "dkmeans_source": source,
        "results": res,
        "load_per_part": loads,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
