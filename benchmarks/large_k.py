"""Large k: k = 65,536 on 500,000 x 64 and k = 262,144 on 1,000,000 x 16 (float32), seeding and Lloyd.

For each shape, on a LocalCluster of 2 worker processes x 1 thread (data persisted in 16 chunks):

* **seeding**: ``"k-means||"`` as a fit runs it (two-level from k = 4096 on: one sample pass,
  then coarse and fine clustering of the sample on the client), timed alone;
* **Lloyd**: ``KMeans(init=<those centres>, max_iter=--iters, tol=0)``; seconds per iteration
  from the loop's own timer (``history_``), and the whole fit (moments pass, loop, final
  assignment);
* **the default fit** (``--default-fit``): ``KMeans(n_clusters=k, random_state=0, max_iter=--iters)``
  as a user writes it (the default seeding, local search ``"auto"`` and pruning ``"auto"``), whole,
  on the same persisted data, against the larger of the two bounds below;
* **worker memory**: every worker's process memory polled from the scheduler every 0.1 s during
  each, against the stated bound on its growth over its memory before (data and imports):
  seeding, the kernel scratch (32 MiB) plus three times the sample (``min(n, 8 k) x d x itemsize``:
  the parts, their concatenation and its serialised copy, on one worker in the worst case); the fit, the scratch
  plus the centroid-sized arrays a pass holds (:func:`dkmeans.kernels.common.centroid_bytes`).

``--fewer-rows`` runs the full k on 100,000 and 300,000 rows (the same centroid memory).

Run:  .venv/bin/python benchmarks/large_k.py [--quick] [--iters 2] [--default-fit]
Writes benchmarks/results/large_k.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, write_json  # noqa: E402
from lloyd import persist_chunks, start_cluster  # noqa: E402
from out_of_core import PeakMemory  # noqa: E402

import dkmeans  # noqa: E402
from dkmeans.drivers.init import InitOptions  # noqa: E402
from dkmeans.drivers.init.kmeans_parallel import kmeans_parallel  # noqa: E402
from dkmeans.drivers.init.two_level import SAMPLE_PER_CENTROID  # noqa: E402
from dkmeans.engine import MemoryBudget, PersistedData  # noqa: E402
from dkmeans.kernels.common import DEFAULT_SCRATCH_BYTES, centroid_bytes  # noqa: E402

SHAPES = {"k65536": (500_000, 64, 65_536), "k262144": (1_000_000, 16, 262_144)}
QUICK = {"k65536": (50_000, 64, 6_000), "k262144": (100_000, 16, 24_000)}
#: The same k with fewer rows: the centroid-sized memory of the full shapes, a fraction of their time.
FEWER_ROWS = {"k65536": (100_000, 64, 65_536), "k262144": (300_000, 16, 262_144)}


def worker_memory(client) -> dict:
    return {
        a: int(w["metrics"]["memory"])
        for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
    }


def make_data(n: int, d: int, seed: int = 0) -> np.ndarray:
    """A mixture of n / 16 Gaussian clusters (more clusters than k: the large-k regime), float32."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-10, 10, size=(max(1, n // 16), d)).astype(np.float32)
    X = centres[rng.integers(0, len(centres), size=n)]
    X += rng.standard_normal((n, d), dtype=np.float32)
    return X


def bench(client, name, n, d, k, iters, default_fit=False) -> dict:
    print(f"{name}: {n:,} x {d}, k = {k:,}, float32", flush=True)
    load_before = os.getloadavg()[0]  # the machine is shared: the load goes with the figures
    X = make_data(n, d)
    warm = persist_chunks(
        client, X[:20_000]
    )  # the workers compile their kernels for d (not counted)
    dkmeans.KMeans(n_clusters=64, random_state=0, max_iter=2).fit(warm)
    dkmeans.KMeans(n_clusters=64, random_state=0, max_iter=2, init="k-means||").fit(X[:20_000])
    del warm
    Xd = persist_chunks(client, X)
    time.sleep(1.0)  # a fresh memory reading
    before = worker_memory(client)
    with PeakMemory(client) as seeding_memory:
        data = PersistedData(client, Xd, None, MemoryBudget.of(client, DEFAULT_SCRATCH_BYTES))
        t0 = time.perf_counter()
        C0 = kmeans_parallel(data, k, seed=0, options=InitOptions())
        seeding = time.perf_counter() - t0
        del data
    print(f"  seeding {seeding:.1f} s", flush=True)
    time.sleep(1.0)
    before_fit = worker_memory(client)
    with PeakMemory(client) as fit_memory:
        t0 = time.perf_counter()
        km = dkmeans.KMeans(n_clusters=k, init=C0, max_iter=iters, tol=0.0).fit(Xd)
        fit = time.perf_counter() - t0
    per_iter = [h["seconds"] for h in km.history_]
    # the stated bounds on a worker's growth: seeding, the kernel scratch and three times the sample (the
    # parts, their concatenation and its serialised copy, the worst case of one worker combining
    # it); the fit, the scratch and the centroid-sized arrays
    sample = min(n, SAMPLE_PER_CENTROID * k) * d * 4
    bounds = {
        "seeding": DEFAULT_SCRATCH_BYTES + 3 * sample,
        "fit": DEFAULT_SCRATCH_BYTES + centroid_bytes(k, d, 4),
    }
    growth = {
        "seeding": {a: seeding_memory.peak.get(a, 0) - before[a] for a in before},
        "fit": {a: fit_memory.peak.get(a, 0) - before_fit[a] for a in before_fit},
    }
    within = all(max(growth[p].values()) <= bounds[p] for p in bounds)
    result = {
        "n": n,
        "d": d,
        "k": k,
        "seeding_seconds": seeding,
        "fit_seconds": fit,
        "iterations": km.n_iter_,
        "seconds_per_iteration": per_iter,
        "empty_clusters_fixed": [h["empty_clusters_fixed"] for h in km.history_],
        "inertia": float(km.inertia_),
        "worker_memory_before_mib": {a: v / 2**20 for a, v in before.items()},
        "worker_growth_mib": {p: {a: v / 2**20 for a, v in g.items()} for p, g in growth.items()},
        "bound_growth_mib": {p: b / 2**20 for p, b in bounds.items()},
        "within_bound": within,
        "load_average": [load_before, os.getloadavg()[0]],
    }
    print(
        f"  fit {fit:.1f} s ({km.n_iter_} iterations, {', '.join(f'{s:.1f}' for s in per_iter)} s each; "
        f"empty clusters fixed {result['empty_clusters_fixed']}); worker memory growth (MiB): "
        + "; ".join(
            f"{p} {', '.join(f'{g / 2**20:.0f}' for g in growth[p].values())} against {bounds[p] / 2**20:.0f}"
            for p in bounds
        )
        + f": {'within' if within else 'NOT within'}; load {result['load_average']}",
        flush=True,
    )
    if default_fit:
        time.sleep(1.0)
        before_default = worker_memory(client)
        with PeakMemory(client) as default_memory:
            t0 = time.perf_counter()
            km = dkmeans.KMeans(n_clusters=k, random_state=0, max_iter=iters).fit(Xd)
            whole = time.perf_counter() - t0
        bound = max(bounds.values())
        grown = {a: default_memory.peak.get(a, 0) - before_default[a] for a in before_default}
        result["default_fit"] = {
            "seconds": whole,
            "iterations": km.n_iter_,
            "passes": km.n_passes_,
            "inertia": float(km.inertia_),
            "algorithms": sorted({h.get("algorithm", "lloyd") for h in km.history_}),
            "worker_growth_mib": {a: v / 2**20 for a, v in grown.items()},
            "bound_growth_mib": bound / 2**20,
            "within_bound": max(grown.values()) <= bound,
        }
        print(
            f"  default fit {whole:.1f} s ({km.n_iter_} iterations, {km.n_passes_} passes, "
            f"{', '.join(result['default_fit']['algorithms'])}); worker memory growth (MiB): "
            f"{', '.join(f'{g / 2**20:.0f}' for g in grown.values())} against {bound / 2**20:.0f}: "
            f"{'within' if result['default_fit']['within_bound'] else 'NOT within'}",
            flush=True,
        )
    del Xd, km  # the data is released when its last reference goes
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (same code paths)")
    parser.add_argument(
        "--fewer-rows", action="store_true", help="the full k on fewer rows (memory at full k)"
    )
    parser.add_argument("--iters", type=int, default=2, help="Lloyd iterations")
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    parser.add_argument(
        "--default-fit",
        action="store_true",
        help="also the whole default fit, KMeans(n_clusters=k, random_state=0, max_iter=--iters)",
    )
    args = parser.parse_args(argv)
    shapes = QUICK if args.quick else FEWER_ROWS if args.fewer_rows else SHAPES
    client = start_cluster()
    results = {}
    for name in args.shapes:  # written after each shape: a long run keeps what it measured
        results[name] = bench(client, name, *shapes[name], args.iters, args.default_fit)
        out = write_json(
            "large_k_quick.json"
            if args.quick
            else "large_k_fewer_rows.json"
            if args.fewer_rows
            else "large_k.json",
            {"machine": machine(), "args": vars(args), "results": results},
        )
    print(f"wrote {out}")
    client.close()


if __name__ == "__main__":
    main()
