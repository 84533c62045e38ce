"""Pruned Lloyd: seconds per iteration, per iteration index, beside the floor and scikit-learn.

Method
------
For each shape the script generates float32 data with a fixed seed (the Gaussian blobs of
``benchmarks/lloyd.py`` for tall, wide and manyk; for ``cosine``, unit vectors around ``n / 4``
random directions with noise of norm about 0.8, whose clusters keep moving for more iterations
than ``benchmarks/embeddings.py``'s) and measures, in one run on the same 2 cores:

* **the floor**: the best time of one float32 matrix product ``X @ C.T`` on 2 BLAS threads
  (whole or in row tiles, :func:`lloyd.gemm_floor`), and the bytes of ``X`` over the read
  bandwidth; the larger of the two (as ``benchmarks/lloyd.py``);
* **dkmeans, a default-started fit** (``KMeans(n_clusters=k, random_state=0)``: k-means||,
  ``tol=1e-4``, the default local search) twice on the same persisted Dask array (16 chunks, a
  2-worker x 1-thread LocalCluster), ``prune="auto"`` and ``prune=False``: each Lloyd
  iteration's seconds by the loop's own timer (``history_[i]["seconds"]``) and the share of
  distances computed; the two runs must give the same centroids;
* **dkmeans from fixed centroids** ``C0`` (``k`` rows, fixed seed), ``tol=0``, ``--iters``
  iterations, ``prune="auto"`` (``--prune true``: True) and ``prune=False``: the same per-index
  seconds;
* **scikit-learn** ``KMeans(init=C0, n_init=1, algorithm="lloyd", tol=0)`` on 2 threads:
  ``(T(1 + iters) - T(1)) / iters`` (a mean: it reports no per-iteration times); skipped where
  ``k * n`` is above ``--sklearn-max-pairs``.

* **iterations that prune little**: the fixed-start fits begin far from convergence (``C0`` is
  ``k`` rows of overlapping blobs), so their first pruned passes leave most rows unsettled; the
  table's ``little`` line gives, over the fixed-start iterations after the first that computed at
  least half the distances, the mean of pruned over unpruned seconds at the same index (issue 34:
  at most 1.05x). ``--little`` adds a fixed-start fit of ``--little-iters`` iterations with
  ``prune=True`` (no switching off: every pass pruned, whatever it costs) beside it.

Reported per shape: per iteration index the seconds pruned and unpruned, each over the floor,
and the distances computed; the mean over the whole default-started fit and from the goal's
iteration on (issue 34: wide and manyk at most 0.5x the floor over the fit and 0.25x from the
6th iteration, tall 0.75x from the 10th, cosine 0.5x from the 3rd; an iteration where little is
pruned at most 1.05x the unpruned one).

Run
---
From the repository root, on a quiet machine (``--wait-load`` waits for it)::

    .venv/bin/python benchmarks/pruned.py                         # all shapes
    .venv/bin/python benchmarks/pruned.py --shapes wide manyk --iters 12
    .venv/bin/python benchmarks/pruned.py --quick                 # smaller n, a smoke run
    .venv/bin/python benchmarks/pruned.py --shapes wide --little   # and prune=True from a far start

The tables go to stdout and everything to ``benchmarks/results/pruned[_quick].json``.

``--passes`` measures instead, in this process on one thread, the passes of one chunk
(``--chunk-rows`` rows of the shape's data, its ``k`` first centroids ``C0``): unpruned Lloyd from
``C0`` gives the centroids ``C_i``; for each ``i`` the bounds are built at ``C_(i-1)``, then the
pass at ``C_i`` is timed (CPU time of the thread, best of ``--repeats``) unpruned, building the
bounds, pruned with ``prune=True`` (every pass pruned) and as ``prune="auto"`` runs it (a chunk that
settles little takes the unpruned kernel); the table gives each over the unpruned pass and the share
of distances computed::

    .venv/bin/python benchmarks/pruned.py --passes --shapes wide manyk
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine, write_json  # noqa: E402
from lloyd import (  # noqa: E402
    fit_sklearn,
    make_data,
    measure_floor,
    peak_gflops,
    persist_chunks,
    read_bandwidth,
    start_cluster,
    wait_for_load,
)

import dkmeans  # noqa: E402

#: name -> (n, d, k, goal iteration (1-based) from which the "late" goal holds, late goal, whole-fit goal)
SHAPES = {
    "wide": (500_000, 128, 256, 6, 0.25, 0.5),
    "manyk": (200_000, 64, 2048, 6, 0.25, 0.5),
    "tall": (2_000_000, 16, 32, 10, 0.75, None),
    "cosine": (200_000, 256, 65_536, 3, 0.5, None),
}
QUICK = {
    "wide": (50_000, 128, 256, 6, 0.25, 0.5),
    "manyk": (40_000, 64, 512, 6, 0.25, 0.5),
    "tall": (200_000, 16, 32, 10, 0.75, None),
    "cosine": (20_000, 256, 4_096, 3, 0.5, None),
}


def hard_embeddings(n: int, d: int, seed: int = 0) -> np.ndarray:
    """Unit vectors around ``n / 4`` random directions, noise of norm about 0.8 (embeddings.py: ``n / 8``
    and 0.6): overlapping clusters. At 20,000 x 256, k = 6,553 (its 3 rows per centroid) Lloyd from
    k of its rows ran 10 iterations to its fixed point; today's data, 5."""
    rng = np.random.default_rng(seed)
    dirs = rng.standard_normal((max(1, n // 4), d), dtype=np.float32)
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    X = dirs[rng.integers(0, len(dirs), size=n)]
    X += (0.8 / np.sqrt(d)) * rng.standard_normal((n, d), dtype=np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X


def shape_data(name: str, n: int, d: int, k: int):
    if name == "cosine":
        X = hard_embeddings(n, d)
        rows = np.random.default_rng(1).choice(n, size=k, replace=False)
        return X, X[np.sort(rows)].copy()
    return make_data(n, d, k)


def lloyd_records(km) -> list:
    return [h for h in km.history_ if h["algorithm"] == "lloyd"]


def fit_default(Xd, k: int, prune, metric: str) -> dict:
    t0 = time.perf_counter()
    km = dkmeans.KMeans(n_clusters=k, random_state=0, prune=prune, metric=metric).fit(Xd)
    wall = time.perf_counter() - t0
    recs = lloyd_records(km)
    return {
        "wall": wall,
        "seconds": [h["seconds"] for h in recs],
        "computed": [h["distances_computed"] for h in recs],
        "n_iter": km.n_iter_,
        "centers": km.cluster_centers_,
        "inertia": km.inertia_,
    }


def fit_fixed(Xd, C0, iters: int, prune, metric: str) -> dict:
    km = dkmeans.KMeans(
        n_clusters=len(C0),
        init=C0,
        tol=0.0,
        max_iter=iters,
        prune=prune,
        metric=metric,
        local_search=False,
    ).fit(Xd)
    recs = lloyd_records(km)
    return {
        "seconds": [h["seconds"] for h in recs],
        "computed": [h["distances_computed"] for h in recs],
        "centers": km.cluster_centers_,
    }


def sklearn_per_iter(X, C0, iters: int) -> float:
    def run(m):
        t0 = time.perf_counter()
        fit_sklearn(X, C0, m)
        return time.perf_counter() - t0

    run(1)  # warm-up
    return (run(1 + iters) - run(1)) / iters


def summary(seconds, floor: float, start: int) -> dict:
    late = seconds[start - 1 :]
    return {
        "mean_over_floor": statistics.fmean(seconds) / floor if seconds else None,
        "late_mean_over_floor": statistics.fmean(late) / floor if late else None,
        "iterations": len(seconds),
    }


def little_summary(runs) -> dict:
    """Pruned over unpruned seconds at the same index, over the fixed-start iterations after the first
    that computed at least half the distances (``prune="auto"``), and per iteration of the
    ``prune=True`` run (``--little``)."""
    p, u = runs["fixed-pruned"], runs["fixed-unpruned"]
    idx = [
        i for i in range(1, min(len(p["seconds"]), len(u["seconds"]))) if p["computed"][i] >= 0.5
    ]
    ratios = [p["seconds"][i] / u["seconds"][i] for i in idx]
    out = {
        "auto": {
            "iterations": [i + 1 for i in idx],
            "ratios": ratios,
            "mean": statistics.fmean(ratios) if ratios else None,
        }
    }
    if "little-true" in runs:
        t = runs["little-true"]
        n = min(len(t["seconds"]), len(u["seconds"]))
        out["true"] = {
            "ratios": [t["seconds"][i] / u["seconds"][i] for i in range(n)],
            "computed": t["computed"][:n],
        }
    return out


def bench(name, spec, client, args) -> dict:
    n, d, k, start, late_goal, whole_goal = spec
    metric = "cosine" if name == "cosine" else "euclidean"
    X, C0 = shape_data(name, n, d, k)
    if args.wait_load:
        wait_for_load(args.wait_load, args.max_wait)
    floor = measure_floor(X, C0, read_bandwidth(), peak_gflops(np.float32))
    fl = floor["seconds"]
    out = {"shape": [n, d, k], "metric": metric, "floor": floor, "load_before": os.getloadavg()[0]}
    Xd = persist_chunks(client, X)
    fit_fixed(Xd, C0, 2, True, metric)  # warm-up: kernels loaded on the workers
    runs = {}
    for label, prune in (("pruned", args.prune), ("unpruned", False)):
        if args.wait_load:
            wait_for_load(args.wait_load, args.max_wait)
        print(f"[{name}] fixed start, {label} ...", file=sys.stderr, flush=True)
        runs[f"fixed-{label}"] = fit_fixed(Xd, C0, args.iters, prune, metric)
        if not args.skip_default:
            print(f"[{name}] default start, {label} ...", file=sys.stderr, flush=True)
            runs[f"default-{label}"] = fit_default(Xd, k, prune, metric)
    if args.little:
        if args.wait_load:
            wait_for_load(args.wait_load, args.max_wait)
        print(
            f"[{name}] fixed start, prune=True, {args.little_iters} iterations ...",
            file=sys.stderr,
            flush=True,
        )
        runs["little-true"] = fit_fixed(Xd, C0, args.little_iters, True, metric)
    same = bool(np.array_equal(runs["fixed-pruned"]["centers"], runs["fixed-unpruned"]["centers"]))
    if not args.skip_default:
        same = same and bool(
            np.array_equal(runs["default-pruned"]["centers"], runs["default-unpruned"]["centers"])
        )
    out["same_centroids"] = same
    if n * k <= args.sklearn_max_pairs and metric == "euclidean":
        print(f"[{name}] scikit-learn ...", file=sys.stderr, flush=True)
        out["sklearn_seconds_per_iter"] = sklearn_per_iter(X, C0, args.iters)
    for _key, run in runs.items():
        run.pop("centers")
        run["summary"] = summary(run["seconds"], fl, start)
    out["runs"] = runs
    out["little"] = little_summary(runs)
    out["goals"] = {
        "late": {
            "from_iteration": start,
            "goal": late_goal,
            "fixed": runs["fixed-pruned"]["summary"]["late_mean_over_floor"],
        }
    }
    if not args.skip_default:
        out["goals"]["late"]["default"] = runs["default-pruned"]["summary"]["late_mean_over_floor"]
        out["goals"]["whole_fit"] = {
            "goal": whole_goal,
            "default": runs["default-pruned"]["summary"]["mean_over_floor"],
        }
    out["load_after"] = os.getloadavg()[0]
    del Xd
    return out


def _f(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(name: str, res: dict) -> str:
    fl = res["floor"]["seconds"]
    n, d, k = res["shape"]
    lines = [
        f"### {name}: {n:,} x {d}, k = {k:,} ({res['metric']}); floor {fl:.4f} s "
        f"(GEMM {res['floor']['gemm']['seconds']:.4f} s, {res['floor']['gemm']['how']}); "
        f"same centroids pruned/unpruned: {res['same_centroids']}; load {res['load_before']:.2f} -> "
        f"{res['load_after']:.2f}"
    ]
    if "sklearn_seconds_per_iter" in res:
        sk = res["sklearn_seconds_per_iter"]
        lines.append(
            f"scikit-learn (fixed start, mean): {sk:.4f} s/iteration = {sk / fl:.2f}x floor"
        )
    little = res["little"]["auto"]
    lines.append(
        f"little pruned (fixed start, iterations {little['iterations'] or '-'} computing >= half the "
        f"distances): pruned / unpruned {_f(little['mean'])} (mean; "
        f"{', '.join(f'{r:.3f}' for r in little['ratios']) or '-'})"
    )
    if "true" in res["little"]:
        t = res["little"]["true"]
        lines.append(
            "prune=True, fixed start, per iteration: pruned / unpruned "
            + ", ".join(f"{r:.2f} ({c:.3f})" for r, c in zip(t["ratios"], t["computed"]))
            + " (distances computed)"
        )
    for start in ("fixed", "default"):
        if f"{start}-pruned" not in res["runs"]:
            continue
        p, u = res["runs"][f"{start}-pruned"], res["runs"][f"{start}-unpruned"]
        lines.append(
            f"\n{start} start | iteration | pruned s | / floor | distances computed | unpruned s | / floor"
        )
        lines.append("|---|---|---|---|---|---|---|")
        for i in range(max(len(p["seconds"]), len(u["seconds"]))):
            ps = (
                f"{p['seconds'][i]:.4f} | {p['seconds'][i] / fl:.2f} | {p['computed'][i]:.3f}"
                if i < len(p["seconds"])
                else "- | - | -"
            )
            us = (
                f"{u['seconds'][i]:.4f} | {u['seconds'][i] / fl:.2f}"
                if i < len(u["seconds"])
                else "- | -"
            )
            lines.append(f"| {start} | {i + 1} | {ps} | {us} |")
        ps, us = p["summary"], u["summary"]
        lines.append(
            f"mean / floor: pruned {_f(ps['mean_over_floor'])} (from it. "
            f"{res['goals']['late']['from_iteration']}: {_f(ps['late_mean_over_floor'])}), unpruned "
            f"{_f(us['mean_over_floor'])} ({_f(us['late_mean_over_floor'])})"
        )
    return "\n".join(lines)


def chunk_passes(name: str, spec, args) -> dict:
    """One chunk's pass costs in this process (``--passes``; see the module docstring)."""
    from threadpoolctl import threadpool_limits

    from dkmeans.drivers.pruned_lloyd import centroid_drift, plain_share
    from dkmeans.kernels import assign_partials, update_centroids
    from dkmeans.kernels.pruned import centroid_groups, group_count, pruned_partials, warm_up

    n, d, k = args.chunk_rows, spec[1], spec[2]
    X, C = shape_data(name, n, d, min(k, n // 2))
    k = len(C)
    warm_up(X.dtype, d)
    groups = centroid_groups(C, group_count(k, d, X.dtype.itemsize), token=1)

    def best(fn):
        times = []
        for _ in range(args.repeats):
            t0 = time.thread_time()
            out = fn()
            times.append(time.thread_time() - t0)
        return min(times), out

    def copy(state):
        return {key: (v.copy() if isinstance(v, np.ndarray) else v) for key, v in state.items()}

    rows = []
    with threadpool_limits(1):
        while (
            pruned_partials(X, C, None, None, groups)[0] is None
        ):  # the compiled loops still loading
            time.sleep(0.2)
        seq = [C]
        for _ in range(args.passes_iters):
            seq.append(update_centroids(assign_partials(X, seq[-1]), seq[-1])[0].astype(X.dtype))
        for i in range(1, len(seq)):
            prev, cur = seq[i - 1], seq[i]
            state, _ = pruned_partials(X, prev, None, None, groups)
            drift = centroid_drift(cur, prev)
            plain, _ = best(lambda: assign_partials(X, cur))
            build, _ = best(lambda: pruned_partials(X, cur, None, None, groups))
            forced, (_, fo) = best(
                lambda: pruned_partials(X, cur, copy(state), None, groups, drift)
            )
            auto, (_, ao) = best(
                lambda: pruned_partials(
                    X,
                    cur,
                    copy(state),
                    None,
                    groups,
                    drift,
                    plain_above=plain_share(k, groups.n_groups),
                )
            )
            rows.append(
                {
                    "pass": i + 1,
                    "unpruned_s": plain,
                    "build": build / plain,
                    "true": forced / plain,
                    "true_computed": fo.distances / fo.pairs,
                    "auto": auto / plain,
                    "auto_computed": ao.distances / ao.pairs,
                }
            )
    return {"shape": [n, d, k], "groups": groups.n_groups, "rows": rows, "load": os.getloadavg()[0]}


def passes_table(name: str, res: dict) -> str:
    n, d, k = res["shape"]
    lines = [
        f"### {name}, one chunk: {n:,} x {d}, k = {k:,}, {res['groups']} groups, one thread "
        f"(load {res['load']:.2f})",
        "| pass | unpruned s | build / unpruned | prune=True / unpruned | computed | auto / unpruned | computed |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['pass']} | {r['unpruned_s']:.4f} | {r['build']:.2f} | {r['true']:.2f} | "
            f"{r['true_computed']:.3f} | {r['auto']:.2f} | {r['auto_computed']:.3f} |"
        )
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--quick", action="store_true", help="smaller n (a smoke run)")
    p.add_argument("--iters", type=int, default=12, help="iterations of the fixed-start fits")
    p.add_argument(
        "--prune", default="auto", choices=["auto", "true"], help="the pruned runs' prune parameter"
    )
    p.add_argument("--skip-default", action="store_true", help="only the fixed-start fits")
    p.add_argument("--little", action="store_true", help="also a fixed-start fit with prune=True")
    p.add_argument("--little-iters", type=int, default=4, help="iterations of the --little fit")
    p.add_argument(
        "--passes", action="store_true", help="one chunk's pass costs in this process, no cluster"
    )
    p.add_argument("--chunk-rows", type=int, default=62_500, help="rows of the --passes chunk")
    p.add_argument(
        "--passes-iters", type=int, default=10, help="Lloyd iterations the --passes table covers"
    )
    p.add_argument("--repeats", type=int, default=3, help="--passes: best of this many timings")
    p.add_argument(
        "--sklearn-max-pairs",
        type=float,
        default=2e9,
        help="rows x k above which scikit-learn is skipped",
    )
    p.add_argument(
        "--wait-load", type=float, default=0.0, help="wait until the 1-minute load is below this"
    )
    p.add_argument("--max-wait", type=float, default=600.0)
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    args.prune = True if args.prune == "true" else args.prune
    return args


def main(argv=None):
    args = parse_args(argv)
    shapes = QUICK if args.quick else SHAPES
    if args.passes:
        results = {"machine": machine(), "argv": sys.argv[1:], "shapes": {}}
        for name in args.shapes:
            results["shapes"][name] = chunk_passes(name, shapes[name], args)
            write_json(args.output or "pruned_passes.json", results)
            print(passes_table(name, results["shapes"][name]), flush=True)
        return
    client = start_cluster()
    results = {"machine": machine(), "argv": sys.argv[1:], "shapes": {}}
    try:
        for name in args.shapes:
            results["shapes"][name] = bench(name, shapes[name], client, args)
            write_json(args.output or f"pruned{'_quick' if args.quick else ''}.json", results)
            print(table(name, results["shapes"][name]), flush=True)
    finally:
        client.close()


if __name__ == "__main__":
    main()
