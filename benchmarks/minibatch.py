"""Mini-batch k-means: time and objective against full Lloyd (ours) and scikit-learn's MiniBatchKMeans.

Two cases, in one run:

* **tall**: ``--rows`` x 16 float32 Gaussian blobs (2M by default, ``--quick``: 200k), k=32, as
  a Dask array on a LocalCluster of ``--workers`` x 1 thread. ``dkmeans.KMeans`` (Lloyd, its
  defaults), ``dkmeans.MiniBatchKMeans`` and scikit-learn's ``MiniBatchKMeans`` (on the same
  rows as NumPy), all ``random_state=0``, ``batch_size=--batch-size``. Reported: fit seconds
  and the final objective (computed the same way for all three: the full data against the
  fitted centers). Goal: mini-batch objective within 1% of Lloyd's in at most a third of its time.
* **out-of-core**: blobs generated on the workers block by block (a recomputable source)
  ``--times`` times the memory of a second cluster with ``memory_limit=--memory`` per worker;
  ``MiniBatchKMeans(max_iter=1, out_of_core="auto")`` must take the out-of-core mode and
  read the data in one pass (plus the final objective's), and ``KMeans`` (Lloyd,
  ``max_iter=--ooc-lloyd-iters``) for comparison.

Run:  .venv/bin/python benchmarks/minibatch.py [--quick]
JSON goes to ``benchmarks/results/minibatch.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_json  # noqa: E402


def objective(X, C) -> float:
    from dkmeans.kernels import assign_partials

    total = 0.0
    for i in range(0, len(X), 200_000):
        total += float(assign_partials(X[i:i + 200_000], C.astype(X.dtype)).objective)
    return total


def tall(args, client) -> list[dict]:
    import dask.array as da
    from sklearn.cluster import MiniBatchKMeans as SkMiniBatchKMeans

    import dkmeans
    from dkmeans.testing import make_blobs

    X, _, _ = make_blobs(args.rows, 16, args.k, spread=1.5, box=10.0, seed=0)
    X = X.astype(np.float32)
    dX = client.persist(da.from_array(X, chunks=(len(X) // (4 * args.workers), 16)))
    rows = []
    fits = {
        "dkmeans KMeans (Lloyd)": lambda: dkmeans.KMeans(args.k, random_state=0).fit(dX),
        "dkmeans MiniBatchKMeans": lambda: dkmeans.MiniBatchKMeans(args.k, random_state=0, batch_size=args.batch_size,
                                                                    compute_labels=False).fit(dX),
        "scikit-learn MiniBatchKMeans": lambda: SkMiniBatchKMeans(args.k, random_state=0, batch_size=args.batch_size,
                                                                   compute_labels=False).fit(X),
    }
    for name, fit in fits.items():
        t0 = time.perf_counter()
        model = fit()
        seconds = time.perf_counter() - t0
        rows.append({"case": "tall", "fit": name, "seconds": seconds, "objective": objective(X, model.cluster_centers_),
                     "steps_or_iterations": int(getattr(model, "n_steps_", model.n_iter_)),
                     "mode": getattr(model, "data_mode_", "numpy")})
    lloyd = rows[0]
    for r in rows:
        r["objective_vs_lloyd"] = r["objective"] / lloyd["objective"]
        r["time_vs_lloyd"] = r["seconds"] / lloyd["seconds"]
    return rows


def out_of_core(args) -> list[dict]:
    import dask

    import dkmeans
    from dask.utils import parse_bytes
    from dkmeans.cluster import start_local_cluster
    from dkmeans.testing import make_blobs_dask

    memory = parse_bytes(args.memory)
    n = int(args.times * memory * args.workers / (16 * 4))
    client = start_local_cluster(n_workers=args.workers, dashboard_address=None, memory_limit=args.memory)
    rows = []
    try:
        with client.as_current(), dask.config.set({"dkmeans.in-process-bytes": 0}):
            X, _ = make_blobs_dask(n, 16, args.k, chunk_rows=50_000, spread=1.5, seed=1)
            fits = {
                "dkmeans MiniBatchKMeans (max_iter=1)": lambda: dkmeans.MiniBatchKMeans(
                    args.k, random_state=0, batch_size=args.batch_size, max_iter=1).fit(X),
                f"dkmeans KMeans (Lloyd, max_iter={args.ooc_lloyd_iters})": lambda: dkmeans.KMeans(
                    args.k, random_state=0, max_iter=args.ooc_lloyd_iters, local_search=False).fit(X),
            }
            if args.ooc_lloyd_iters == 0:
                fits = dict(list(fits.items())[:1])
            for name, fit in fits.items():
                t0 = time.perf_counter()
                model = fit()
                rows.append({"case": f"out-of-core {n} x 16 float32 ({n * 64 / 2**20:.0f} MiB, "
                                     f"{args.times:g}x the cluster's {args.workers} x {args.memory})",
                             "fit": name, "seconds": time.perf_counter() - t0, "objective": float(model.inertia_),
                             "passes": int(model.n_passes_), "mode": model.data_mode_,
                             "steps_or_iterations": int(getattr(model, "n_steps_", model.n_iter_))})
    finally:
        cluster = client.cluster
        client.close()
        cluster.close()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (200k rows; 10x of 2 x 150MiB, without Lloyd)")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory", default=None, help="memory_limit per worker of the out-of-core cluster")
    parser.add_argument("--times", type=float, default=10.0)
    parser.add_argument("--ooc-lloyd-iters", type=int, default=None,
                        help="Lloyd iterations out of core (default 5; --quick: 0, Lloyd not run)")
    parser.add_argument("--skip-out-of-core", action="store_true")
    args = parser.parse_args(argv)
    args.rows = args.rows or (200_000 if args.quick else 2_000_000)
    args.memory = args.memory or ("150MiB" if args.quick else "1GiB")
    if args.ooc_lloyd_iters is None:
        args.ooc_lloyd_iters = 0 if args.quick else 5

    from dkmeans.testing import local_cluster

    with local_cluster(args.workers) as client, client.as_current():
        rows = tall(args, client)
    if not args.skip_out_of_core:
        rows += out_of_core(args)
    print(f"{'case':60s} {'fit':42s} {'seconds':>8s} {'objective':>12s} {'vs Lloyd':>9s} {'time vs':>8s} "
          f"{'steps/it':>8s} {'passes':>6s} mode")
    for r in rows:
        print(f"{r['case'][:60]:60s} {r['fit']:42s} {r['seconds']:8.2f} {r['objective']:12.5e} "
              f"{r.get('objective_vs_lloyd', float('nan')):9.4f} {r.get('time_vs_lloyd', float('nan')):8.3f} "
              f"{r['steps_or_iterations']:8d} {r.get('passes', ''):>6} {r['mode']}")
    write_json("minibatch.json", {"machine": machine(), "args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
