"""Solution quality of k-means++ local search after our default fit, against scikit-learn's restarts.

For every set in ``../shared/data/sipu`` (A1-A3, S1-S4, Unbalance; skipped with a message
when absent) and every seed:

* scikit-learn ``KMeans(n_init=1)`` and ``KMeans(n_init=10)`` (greedy k-means++, Lloyd, tol=1e-4);
* our default fit: k-means|| (:func:`dkmeans.drivers.init.kmeans_parallel`) then Lloyd with the
  estimator's stop rule (``tol=1e-4`` times the mean feature variance, ``max_iter=300``);
* the default fit followed by :func:`dkmeans.drivers.local_search.local_search`, for a few settings:
  rounds R (at most), candidates per round m, trials t, swaps per trial s, Lloyd updates per
  round L, patience p ("-": every round runs).

Our methods run on in-process data (:class:`InMemoryData`, the data protocol over NumPy
chunks) that counts its passes; the final assignment pass of a fit is counted too.
scikit-learn's passes are estimated as ``k`` for greedy k-means++ (one pass per centre)
plus its Lloyd iterations, times the number of restarts (mean over the n_init=1 runs).
Reported per set and method: mean Centroid Index against the ground-truth centroids (CI),
success rate (share of runs with CI = 0), mean objective / ground-truth objective, mean
passes and seconds per run. The goal: a setting that reaches scikit-learn n_init=10's
mean CI (no higher) and mean objective (within 0.1%) on every set, with at most twice the
passes of our default fit.

The estimator's own default fit (``dkmeans.KMeans(k, random_state=seed)``: k-means||, Lloyd,
local search, Lloyd; passes as it reports them in ``n_passes_``) is compared the same way
against scikit-learn n_init=10 and against ``local_search=False`` (the previous default).

Run:  .venv/bin/python benchmarks/quality.py [--seeds 10] [--sets a1 s1 ...] [--estimator-only]
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time

import numpy as np
from sklearn.cluster import KMeans as SKKMeans

import dkmeans
from dkmeans import metrics
from dkmeans.drivers.init import kmeans_parallel
from dkmeans.drivers.lloyd import CentroidShift, lloyd
from dkmeans.drivers.local_search import RECOMMENDED as LS_RECOMMENDED
from dkmeans.drivers.local_search import local_search
from dkmeans.engine.local import ChunkList

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _common import load_sipu, machine, sipu_dir, write_json  # noqa: E402

#: Local-search settings compared; the first is the recommended one (dkmeans.drivers.local_search.RECOMMENDED
#: and the driver's defaults). m is a multiple of k.
_DEFAULTS = inspect.signature(local_search).parameters
RECOMMENDED = {
    "rounds": LS_RECOMMENDED["rounds"],
    "m": float(LS_RECOMMENDED["candidates_per_cluster"]),
    "trials": _DEFAULTS["trials"].default,
    "max_swaps": _DEFAULTS["max_swaps"].default,
    "lloyd_iters": LS_RECOMMENDED["lloyd_iters"],
    "patience": _DEFAULTS["patience"].default,
}
SETTINGS = [
    RECOMMENDED,
    {**RECOMMENDED, "rounds": 1},
    {**RECOMMENDED, "rounds": 2},
    {**RECOMMENDED, "rounds": 4},
    {**RECOMMENDED, "rounds": 4, "patience": None},
    {**RECOMMENDED, "m": 1.0},
    {**RECOMMENDED, "trials": 1},
    {**RECOMMENDED, "max_swaps": 1},
    {
        **RECOMMENDED,
        "lloyd_iters": 0,
    },  # the plain swap search (Lattanzi-Sohler), no Lloyd in between
]
#: A setting "reaches" scikit-learn n_init=10's objective when within this factor of it.
OBJECTIVE_SLACK = 1.001


def InMemoryData(X: np.ndarray, weights: np.ndarray | None = None, n_chunks: int = 1) -> ChunkList:
    """The data protocol over NumPy row chunks in this process (counts its passes)."""
    return ChunkList.from_array(X, weights, n_chunks)


def default_fit(X: np.ndarray, k: int, seed: int):
    """Our default: k-means|| then Lloyd (estimator stop rule); centroids, passes (with the final one), seconds."""
    t = time.perf_counter()
    data = InMemoryData(X)
    C0 = kmeans_parallel(data, k, seed)
    stop = CentroidShift(1e-4 * float(X.var(axis=0).mean()), inclusive=True)
    result = lloyd(data, C0, max_iter=300, stop_rule=stop)
    return result.centroids, data.passes + 1, time.perf_counter() - t, stop


def summarise(runs):
    ci = np.array([r["ci"] for r in runs])
    return {
        "mean_ci": float(ci.mean()),
        "success": float((ci == 0).mean()),
        "objective_ratio": float(np.mean([r["objective_ratio"] for r in runs])),
        "passes": float(np.mean([r["passes"] for r in runs])),
        "seconds": float(np.mean([r["seconds"] for r in runs])),
    }


def setting_name(setting: dict) -> str:
    p = "-" if setting["patience"] is None else setting["patience"]
    return (
        f"+LS R={setting['rounds']} m={setting['m']:g}k t={setting['trials']} s={setting['max_swaps']} "
        f"L={setting['lloyd_iters']} p={p}"
    )


def run_set(X, truth, k, seeds, sweep: bool = True):
    gt_centroids = metrics.class_means(X, truth)
    gt_objective = metrics.objective(X, gt_centroids)

    def score(C, passes, seconds):
        return {
            "ci": metrics.centroid_index(C, gt_centroids),
            "objective_ratio": metrics.objective(X, C) / gt_objective,
            "passes": passes,
            "seconds": seconds,
        }

    runs: dict[str, list] = {}
    for seed in seeds:
        t = time.perf_counter()
        sk = SKKMeans(k, n_init=1, random_state=seed).fit(X)
        runs.setdefault("scikit-learn n_init=1", []).append(
            score(sk.cluster_centers_, k + sk.n_iter_, time.perf_counter() - t)
        )
    sk1_passes = float(np.mean([r["passes"] for r in runs["scikit-learn n_init=1"]]))
    for seed in seeds:
        t = time.perf_counter()
        sk = SKKMeans(k, n_init=10, random_state=seed).fit(X)
        runs.setdefault("scikit-learn n_init=10", []).append(
            score(sk.cluster_centers_, 10 * sk1_passes, time.perf_counter() - t)
        )
    for seed in (
        seeds
    ):  # the estimator itself: its default fit (local search included) and without the search
        for name, options in (
            ("dkmeans.KMeans() default", {}),
            ("dkmeans.KMeans(local_search=False)", {"local_search": False}),
        ):
            t = time.perf_counter()
            km = dkmeans.KMeans(k, random_state=seed, **options).fit(X)
            runs.setdefault(name, []).append(
                score(km.cluster_centers_, km.n_passes_, time.perf_counter() - t)
            )
    for seed in seeds if sweep else ():
        C, passes, seconds, stop = default_fit(X, k, seed)
        runs.setdefault("default (k-means|| + Lloyd)", []).append(score(C, passes, seconds))
        for setting in SETTINGS:
            options = dict(setting)
            mult = options.pop("m")
            data = InMemoryData(X)
            t = time.perf_counter()
            res = local_search(
                data,
                C,
                candidates_per_round=max(1, round(mult * k)),
                seed=seed,
                stop_rule=stop,
                **options,
            )
            # `passes` already counts the final assignment pass; the search's own passes are added
            runs.setdefault(setting_name(setting), []).append(
                score(res.centroids, passes + data.passes, seconds + time.perf_counter() - t)
            )
    return {method: summarise(r) for method, r in runs.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--sets", nargs="*", default=None)
    parser.add_argument(
        "--estimator-only",
        action="store_true",
        help="only the estimator's default against scikit-learn and local_search=False (no sweep)",
    )
    args = parser.parse_args(argv)
    data_dir = sipu_dir()
    if data_dir is None:
        print("skipped: benchmark data not found (../shared/data/sipu or $DKMEANS_BENCH_DATA)")
        return 0
    seeds = list(range(args.seeds))
    files = sorted(data_dir.glob("*.npz"))
    if args.sets:
        files = [f for f in files if f.stem in args.sets]
    print(
        f"{len(seeds)} seeds per method; objective / ground-truth objective; in-process data, one process"
    )
    print(
        f"{'set':10s} {'method':40s} {'mean CI':>8s} {'CI=0':>6s} {'obj/gt':>8s} {'passes':>7s} {'s/run':>7s}"
    )
    results = {}
    for f in files:
        X, truth, k = load_sipu(f)
        rows = run_set(X, truth, k, seeds, sweep=not args.estimator_only)
        results[f.stem] = rows
        for method, r in rows.items():
            print(
                f"{f.stem:10s} {method:40s} {r['mean_ci']:8.2f} {r['success']:6.0%} {r['objective_ratio']:8.4f} "
                f"{r['passes']:7.1f} {r['seconds']:7.3f}",
                flush=True,
            )
    print(
        "\ngoal per setting: mean CI <= scikit-learn n_init=10's, objective within "
        f"{(OBJECTIVE_SLACK - 1):.1%} of it, passes <= 2 x default's, on every set"
    )
    verdicts = {}
    for name in ["dkmeans.KMeans() default"] + (
        [] if args.estimator_only else [setting_name(s) for s in SETTINGS]
    ):
        misses, ratios = [], []
        for set_name, rows in results.items():
            base_name = (
                "dkmeans.KMeans(local_search=False)"
                if name.startswith("dkmeans.")
                else "default (k-means|| + Lloyd)"
            )
            ours, ref, base = rows[name], rows["scikit-learn n_init=10"], rows[base_name]
            ratios.append(ours["passes"] / base["passes"])
            if ours["mean_ci"] > ref["mean_ci"]:
                misses.append(f"{set_name} CI")
            if ours["objective_ratio"] > ref["objective_ratio"] * OBJECTIVE_SLACK:
                misses.append(f"{set_name} objective")
            if ours["passes"] > 2 * base["passes"]:
                misses.append(f"{set_name} passes")
        verdicts[name] = misses
        print(
            f"{name:40s} passes x{min(ratios):.2f}-{max(ratios):.2f} of default: "
            f"{'met' if not misses else 'NOT met: ' + ', '.join(misses)}"
        )
    out = write_json(
        "quality.json",
        {
            "machine": machine(),
            "seeds": seeds,
            "settings": SETTINGS,
            "results": results,
            "verdicts": verdicts,
        },
    )
    print(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
