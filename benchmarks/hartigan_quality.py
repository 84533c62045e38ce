"""Solution quality of Hartigan's method against Lloyd's, from the same random initial centroids.

For every set in ``../shared/data/sipu`` (skipped with a message when absent) and every
seed, k distinct random rows are the initial centroids of:

* Lloyd to a fixed point (the float64 driver on persisted data),
* Lloyd, then batch Hartigan (unsafe) from Lloyd's centroids ("refine"),
* Lloyd, then standard Hartigan from Lloyd's centroids,
* standard Hartigan (in memory, row by row),
* batch Hartigan, unsafe mode (and safe mode with ``--safe``: k/2 moves per round at most).

Reported per set and method: mean objective / ground-truth objective, mean Centroid
Index (CI) against the ground-truth centroids, share of runs with CI = 0, passes over the
data (Lloyd iterations + Hartigan passes; sweeps for the standard method) and seconds.

Run:  .venv/bin/python benchmarks/hartigan_quality.py [--seeds 5] [--sets a1 s1 ...] [--safe]
"""

from __future__ import annotations

import argparse
import sys
import time

import dask.array as da
import numpy as np

from dkmeans import metrics
from dkmeans.drivers.hartigan import hartigan, standard_hartigan
from dkmeans.drivers.lloyd import CentroidShift, lloyd
from dkmeans.engine.client import start_local_cluster
from dkmeans.engine.persisted import PersistedData
from dkmeans.testing import pick_rows

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _common import load_sipu, machine, sipu_dir, write_json  # noqa: E402


def run_methods(data, X, C0, safe: bool):
    out = {}
    t = time.perf_counter()
    lr = lloyd(data, C0, max_iter=1000, stop_rule=CentroidShift(0.0))
    t_lloyd = time.perf_counter() - t
    out["lloyd"] = (lr.centroids, lr.n_iter + 1, t_lloyd)
    t = time.perf_counter()
    hr = hartigan(data, lr.centroids, mode="unsafe", max_iter=10_000)
    out["lloyd + batch hartigan"] = (
        hr.centroids,
        lr.n_iter + 1 + hr.n_passes,
        t_lloyd + time.perf_counter() - t,
    )
    t = time.perf_counter()
    sr = standard_hartigan(X, lr.centroids, max_iter=10_000)
    out["lloyd + standard hartigan"] = (
        sr.centroids,
        lr.n_iter + 1 + sr.n_iter,
        t_lloyd + time.perf_counter() - t,
    )
    t = time.perf_counter()
    sr = standard_hartigan(X, C0, max_iter=10_000)
    out["standard hartigan"] = (sr.centroids, sr.n_iter, time.perf_counter() - t)
    modes = ("unsafe", "safe") if safe else ("unsafe",)
    for mode in modes:
        t = time.perf_counter()
        hr = hartigan(data, C0, mode=mode, max_iter=100_000)
        out[f"batch hartigan {mode}"] = (hr.centroids, hr.n_passes, time.perf_counter() - t)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--sets", nargs="*", default=None)
    parser.add_argument(
        "--safe", action="store_true", help="also run batch Hartigan in safe mode (slow)"
    )
    args = parser.parse_args(argv)
    data_dir = sipu_dir()
    if data_dir is None:
        print("skipped: benchmark data not found (../shared/data/sipu or $DKMEANS_BENCH_DATA)")
        return 0
    client = start_local_cluster(n_workers=2, dashboard_address=None)
    seeds = list(range(args.seeds))
    files = sorted(data_dir.glob("*.npz"))
    if args.sets:
        files = [f for f in files if f.stem in args.sets]
    print(
        f"{len(seeds)} seeds, random-row initial centroids shared by all methods; 2 worker processes"
    )
    print(
        f"{'set':10s} {'method':28s} {'obj/gt':>8s} {'mean CI':>8s} {'CI=0':>6s} {'passes':>7s} {'s/run':>7s}"
    )
    results = {}
    for f in files:
        X, truth, k = load_sipu(f)
        gt = metrics.class_means(X, truth)
        gt_obj = metrics.objective(X, gt)
        data = PersistedData(client, da.from_array(X, chunks=(-(-len(X) // 4), X.shape[1])))
        runs: dict[str, list] = {}
        for seed in seeds:
            C0 = pick_rows(X, k, seed=seed)
            for name, (C, passes, seconds) in run_methods(data, X, C0, args.safe).items():
                runs.setdefault(name, []).append(
                    (
                        metrics.objective(X, C) / gt_obj,
                        metrics.centroid_index(C, gt),
                        passes,
                        seconds,
                    )
                )
        data.release()
        rows = {}
        for name, rs in runs.items():
            a = np.asarray(rs, dtype=float)
            rows[name] = {
                "objective_ratio": a[:, 0].mean(),
                "mean_ci": a[:, 1].mean(),
                "success": (a[:, 1] == 0).mean(),
                "passes": a[:, 2].mean(),
                "seconds": a[:, 3].mean(),
            }
            r = rows[name]
            print(
                f"{f.stem:10s} {name:28s} {r['objective_ratio']:8.4f} {r['mean_ci']:8.2f} {r['success']:6.0%} "
                f"{r['passes']:7.1f} {r['seconds']:7.2f}"
            )
        results[f.stem] = rows
    out = write_json(
        "hartigan_quality.json", {"machine": machine(), "seeds": seeds, "results": results}
    )
    print(f"results in {out}")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
