"""Balanced k-means against the uncapped fit: seconds, passes, objective and sizes.

Two cases, each fit in a fresh process (``--fit NAME`` runs one and prints its JSON line), after a
warm-up fit on a small sample in that process (so that none pays the kernels' loading):

* ``--case tall`` (default): ``--rows`` x ``--features`` float32 Gaussian blobs (default
  2,000,000 x 16, k = 32, seed 0) of Zipf-like sizes (``--blobs zipf``, the default: the largest
  natural cluster 4.8 times a 1.1 n/k cap, so the caps split and merge blobs), or of equal
  shares (``--blobs equal``: the tall shape's own generator, ``dkmeans.testing.make_blobs(...,
  spread=1.0, box=10.0)`` as ``init_scale.py`` and PERFORMANCE.md use it, where the caps move
  the few hundred rows by which each blob misses n/k); ``dkmeans.KMeans(k, random_state=0,
  n_init=1)`` without caps, with ``balanced=True`` and with ``max_cluster_size=--cap / k``.
* ``--case ivf``: an IVF-style build, ``--rows`` x ``--features`` unit vectors (default
  1,000,000 x 128, k = 1,024) of the same generator, normalised; cosine ``KMeans`` without caps
  and with ``max_cluster_size=--cap / k``, beside faiss's unbalanced spherical k-means
  (``faiss.Kmeans(d, k, niter=25, spherical=True, seed=0)``) and a greedy post-hoc rebalancing of
  its result (each row, by its distance to the centroid, to the nearest of its 32 nearest
  centroids with room, then to the nearest with room; the centroids kept).

Reported per fit: wall and CPU seconds of the fit (CPU: the process's, all threads: the steadier
figure on a shared machine), iterations, passes over the data (``n_passes_``), the capped
assignments' passes (``capacity_passes_``: their sum, largest and list), the objective (cosine:
``sum (1 - cos)``), the largest and smallest cluster, and the ratios to the uncapped fit.

Run:  .venv/bin/python benchmarks/balanced.py [--case tall|ivf] [--blobs zipf|equal] [--rows N]
      [--features D] [--k K] [--cap 1.1] [--fits uncapped,balanced,cap]
      [--auction-passes N --repair-alternatives M]   (the size caps' constants: an experiment)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import numpy as np


def make_data(rows: int, features: int, k: int, seed: int = 0) -> np.ndarray:
    """Blobs of unequal sizes (so that the caps bind): ``k`` centres, Zipf-like shares."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(k, features))
    shares = 1.0 / np.arange(1, k + 1) ** 0.7
    labels = rng.choice(k, size=rows, p=shares / shares.sum())
    return (centres[labels] + rng.normal(size=(rows, features))).astype(np.float32)


def equal_data(rows: int, features: int, k: int, seed: int = 0) -> np.ndarray:
    """The tall shape's own blobs (equal shares), as ``init_scale.py`` and PERFORMANCE.md make them."""
    from dkmeans.testing import make_blobs

    return make_blobs(rows, features, k, spread=1.0, box=10.0, seed=seed, dtype=np.float32)[0]


def unit_data(rows: int, features: int, k: int, seed: int = 0) -> np.ndarray:
    X = make_data(rows, features, k, seed)
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def _sizes(labels, k: int) -> dict:
    sizes = np.bincount(np.asarray(labels), minlength=k)
    return {"largest": int(sizes.max()), "smallest": int(sizes.min())}


def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, round(time.perf_counter() - t0, 2), round(time.process_time() - c0, 2)


def fit_dkmeans(X, k: int, caps: dict, metric: str) -> dict:
    from dkmeans import KMeans

    def fit(rows):
        return KMeans(k, random_state=0, n_init=1, metric=metric, **caps).fit(rows)

    fit(X[: max(20 * k, 20_000)])  # warm-up: kernels loaded, thread pools found
    try:
        km, seconds, cpu = _timed(lambda: fit(X))
    except Exception as error:  # a capped fit whose prices did not settle: reported
        return {"error": f"{type(error).__name__}: {str(error)[:160]}"}
    passes = getattr(km, "capacity_passes_", None)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "n_iter": int(km.n_iter_),
        "n_passes": int(km.n_passes_),
        "capacity_passes_sum": int(sum(passes)) if passes else None,
        "capacity_passes_max": int(max(passes)) if passes else None,
        "capacity_passes": list(map(int, passes)) if passes else None,
        "objective": float(km.inertia_),
        **_sizes(km.labels_, k),
    }


def _cosine_objective(X, C, labels) -> float:
    return float(np.sum(1.0 - np.einsum("ij,ij->i", X, C[labels], dtype=np.float64)))


def fit_faiss(X, k: int, cap: int | None) -> dict:
    import faiss

    def train(rows):
        km = faiss.Kmeans(X.shape[1], k, niter=25, spherical=True, seed=0, verbose=False)
        km.train(np.ascontiguousarray(rows))
        return km

    train(X[: max(40 * k, 20_000)])
    km, seconds, cpu = _timed(lambda: train(X))
    C = km.centroids
    out = {"seconds": seconds, "cpu_seconds": cpu}
    if cap is None:
        labels = km.index.search(X, 1)[1][:, 0]
        out.update(objective=_cosine_objective(X, C, labels), **_sizes(labels, k))
        return out
    labels, s2, c2 = _timed(lambda: greedy_rebalance(X, C, km.index, cap))
    out.update(
        rebalance_seconds=s2,
        rebalance_cpu_seconds=c2,
        seconds=round(seconds + s2, 2),
        cpu_seconds=round(cpu + c2, 2),
        objective=_cosine_objective(X, C, labels),
        **_sizes(labels, k),
    )
    return out


def greedy_rebalance(X, C, index, cap: int, candidates: int = 32) -> np.ndarray:
    """Post-hoc rebalancing: rows in order of their distance to their nearest centroid, each to
    the nearest of its ``candidates`` nearest centroids with room, the rest to the nearest
    centroid with room (one exact scan per such row's block)."""
    n, k = X.shape[0], C.shape[0]
    sims, cand = index.search(X, candidates)
    order = np.argsort(-sims[:, 0], kind="stable")
    load = np.zeros(k, np.int64)
    labels = np.full(n, -1, np.int64)
    for i in order:
        for j in cand[i]:
            if load[j] < cap:
                labels[i], load[j] = j, load[j] + 1
                break
    left = np.flatnonzero(labels < 0)
    for i in left:
        sims_i = C @ X[i]
        for j in np.argsort(-sims_i):
            if load[j] < cap:
                labels[i], load[j] = j, load[j] + 1
                break
    return labels


def one_fit(args) -> dict:
    from dkmeans.drivers import capacitated

    # an experiment's knobs: the size caps' constants for this run (read where they are used)
    if args.auction_passes is not None:
        capacitated.AUCTION_PASSES_ABOVE_EXACT = args.auction_passes
    if args.repair_alternatives is not None:
        capacitated.REPAIR_ALTERNATIVES = args.repair_alternatives
    k = args.k
    if args.case == "ivf":
        X = unit_data(args.rows, args.features, k)
        cap = int(np.ceil(args.cap * args.rows / k))
        if args.fit == "uncapped":
            return fit_dkmeans(X, k, {}, "cosine")
        if args.fit == "cap":
            return fit_dkmeans(X, k, {"max_cluster_size": cap}, "cosine")
        if args.fit == "faiss":
            return fit_faiss(X, k, None)
        if args.fit == "faiss-rebalanced":
            return fit_faiss(X, k, cap)
        raise SystemExit(f"unknown fit {args.fit!r}")
    if args.blobs == "equal":
        X = equal_data(args.rows, args.features, k)
    else:
        X = make_data(args.rows, args.features, k)
    caps = {
        "uncapped": {},
        "balanced": {"balanced": True},
        "cap": {"max_cluster_size": args.cap / k},
    }[args.fit]
    return fit_dkmeans(X, k, caps, "euclidean")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("tall", "ivf"), default="tall")
    parser.add_argument("--blobs", choices=("zipf", "equal"), default="zipf")
    parser.add_argument("--rows", type=int)
    parser.add_argument("--features", type=int)
    parser.add_argument("--k", type=int)
    parser.add_argument(
        "--cap", type=float, default=1.1, help="max_cluster_size as a multiple of n/k"
    )
    parser.add_argument("--fits", help="comma-separated fits to run (default: all of the case)")
    parser.add_argument(
        "--auction-passes", type=int, help="AUCTION_PASSES_ABOVE_EXACT (an experiment)"
    )
    parser.add_argument(
        "--repair-alternatives", type=int, help="REPAIR_ALTERNATIVES (an experiment)"
    )
    parser.add_argument("--fit", help=argparse.SUPPRESS)  # one fit, in this process
    args = parser.parse_args()
    tall = args.case == "tall"
    args.rows = args.rows or (2_000_000 if tall else 1_000_000)
    args.features = args.features or (16 if tall else 128)
    args.k = args.k or (32 if tall else 1024)
    if args.fit:
        print(json.dumps({"fit": args.fit, **one_fit(args)}))
        return
    fits = (
        args.fits.split(",")
        if args.fits
        else (
            ["uncapped", "balanced", "cap"]
            if tall
            else ["uncapped", "cap", "faiss", "faiss-rebalanced"]
        )
    )
    base = None
    for name in fits:
        command = [sys.executable, __file__, "--fit", name, "--case", args.case]
        command += ["--blobs", args.blobs]
        command += ["--rows", str(args.rows), "--features", str(args.features)]
        command += ["--k", str(args.k), "--cap", str(args.cap)]
        for flag, value in (
            ("--auction-passes", args.auction_passes),
            ("--repair-alternatives", args.repair_alternatives),
        ):
            command += [] if value is None else [flag, str(value)]
        line = subprocess.run(command, capture_output=True, text=True, check=False)
        if line.returncode:
            print(json.dumps({"fit": name, "error": line.stderr.strip()[-300:]}))
            continue
        out = json.loads(line.stdout.strip().splitlines()[-1])
        if name == "uncapped":
            base = out
        elif base is not None and "error" not in out:
            out["seconds_ratio"] = round(out["seconds"] / base["seconds"], 2)
            out["cpu_ratio"] = round(out["cpu_seconds"] / base["cpu_seconds"], 2)
            out["objective_ratio"] = round(out["objective"] / base["objective"], 4)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
