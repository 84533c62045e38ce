"""Mini-batch k-means: time to Lloyd's objective, and the final objective, against full Lloyd and scikit-learn.

Two cases, in one run:

* **tall**: ``--rows`` x 16 float32 Gaussian blobs (2M by default, ``--quick``: 200k), k=32, as
  a persisted Dask array on a LocalCluster of ``--workers`` x 1 thread. First ``dkmeans.KMeans``
  (Lloyd, its defaults: k-means|| and local search; and plain Lloyd, ``local_search=False``):
  its fit seconds and objective are the reference. Then, for each mini-batch setting (``SETTINGS``),
  ``dkmeans.MiniBatchKMeans`` on the Dask array and scikit-learn's ``MiniBatchKMeans`` on the same
  rows as NumPy (where it has the setting), all ``random_state=0``, ``compute_labels=False``.

  *Time to objective*: the objective (of all rows) of each fit's centers after every step, and the
  time since the fit began at which it first comes within ``--target`` (1%) of Lloyd's objective.
  scikit-learn's steps are timed in its process (``_mini_batch_step`` wrapped: the time and a copy
  of the centers after each step). dkmeans' steps run on a worker (inside one task or SPMD):
  the centers after each step are those of the same fit replayed in this process (the batches
  are drawn by global row index, so the replay takes the same steps; the script checks that the
  replay's last centers are the Dask fit's), and the time at step ``s`` is the fit's wall time
  minus the seconds of the steps after ``s`` (``history_``'s seconds time whole steps), which
  counts the fit's own overheads before ``s``. The objectives along the way are computed on a
  uniform sample of ``--sample`` rows (relative to Lloyd's centers on the same sample); the first
  step found is confirmed on all rows.
* **out-of-core**: blobs generated on the workers block by block (a recomputable source, rows in
  random order) ``--times`` times the memory of a second cluster of ``--workers`` x ``--memory``;
  ``MiniBatchKMeans(max_iter=1, out_of_core="auto")`` must take the out-of-core mode and read the
  data in one pass (``n_passes_``; with ``--ooc-labels``, ``compute_labels=True``, one more for the
  exact objective), with
  the workers' peak process memory polled (``out_of_core.PeakMemory``) and no worker lost; and
  ``KMeans`` (plain Lloyd, ``max_iter=--ooc-lloyd-iters``) for comparison (0: not run).

``--seed-sweep N`` instead: the final objective (relative to plain Lloyd's) of a few settings for
``random_state`` 0..N-1, dkmeans and scikit-learn in this process, untimed.

``--defaults N`` instead: default ``MiniBatchKMeans()`` against default ``KMeans()`` for
``random_state`` 0..N-1 on ``--rows`` (1.2M) x 16 float32 blobs, k = 32, each fit in a fresh
process (a new LocalCluster of ``--workers``, the data persisted and the kernels warmed up
before the clock starts), the objective re-scored in float64; prints the ratios of objectives
and times. ``--mb-params`` adds parameters to the mini-batch fit (a JSON list: several settings).

Run:  .venv/bin/python benchmarks/minibatch.py [--quick] [--skip-out-of-core] [--skip-tall]
      .venv/bin/python benchmarks/minibatch.py --defaults 8 --output minibatch_defaults.json
JSON goes to ``benchmarks/results/minibatch.json`` (``--output``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_json  # noqa: E402

#: mini-batch settings a user would pick: (label, parameters; scikit-learn runs them too unless it lacks one)
SETTINGS = [
    ("scikit-learn defaults (batch_size=1024)", {}),
    ("batch_size=4096", {"batch_size": 4096}),
    (
        "batch_size=2**14, max_no_improvement=None, max_iter=1",
        {"batch_size": 2**14, "max_no_improvement": None, "max_iter": 1},
    ),
    ("batch_size=4096, n_init=3", {"batch_size": 4096, "n_init": 3}),
    (
        "init='k-means||' (n_init 'auto': 3), batch_size=4096",
        {"init": "k-means||", "batch_size": 4096},
    ),
    ("init='k-means||', batch_size=2**14", {"init": "k-means||", "batch_size": 2**14}),
    (
        "init='k-means||', batch_size=2**16, max_no_improvement=None, max_iter=1",
        {"init": "k-means||", "batch_size": 2**16, "max_no_improvement": None, "max_iter": 1},
    ),
]


def objective(X, C) -> float:
    from dkmeans.kernels import assign_partials

    total = 0.0
    for i in range(0, len(X), 200_000):
        total += float(assign_partials(X[i : i + 200_000], np.asarray(C).astype(X.dtype)).objective)
    return total


class StepRecorder:
    """Time and a copy of the centers after each mini-batch step taken in this process (dkmeans' and scikit-learn's)."""

    def __init__(self):
        import sklearn.cluster._kmeans as sk_kmeans

        import dkmeans.drivers.minibatch as dk_minibatch

        self.steps: list[tuple[float, np.ndarray]] = []
        self._dk, self._sk = dk_minibatch, sk_kmeans
        self._dk_advance, self._sk_step = dk_minibatch.advance, sk_kmeans._mini_batch_step

    def __enter__(self):
        def dk_advance(*args, **kwargs):
            out = self._dk_advance(*args, **kwargs)
            self.steps.append((time.perf_counter(), out[0].centroids.copy()))
            return out

        def sk_step(*args, **kwargs):
            out = self._sk_step(*args, **kwargs)
            self.steps.append((time.perf_counter(), np.array(kwargs["centers_new"], copy=True)))
            return out

        self._dk.advance, self._sk._mini_batch_step = dk_advance, sk_step
        return self

    def __exit__(self, *exc):
        self._dk.advance, self._sk._mini_batch_step = self._dk_advance, self._sk_step


def first_within(X, sample, centers_by_step, reference_full, reference_sample, target):
    """``(step, objective ratio on all rows)`` of the first step within ``target`` of the reference, or None.

    Scans the steps on the sample (every step up to 100 steps, else 200 evenly spaced and
    then every step before the first hit found), then confirms on all rows.
    """
    n = len(centers_by_step)
    if n == 0:
        return None
    grid = list(range(n)) if n <= 100 else sorted(set(np.linspace(0, n - 1, 200).astype(int)))
    ratio = {}

    def r(i):
        if i not in ratio:
            ratio[i] = objective(sample, centers_by_step[i]) / reference_sample
        return ratio[i]

    hit = next((i for i in grid if r(i) <= 1 + target), None)
    if hit is None:
        return None
    lo = max([i for i in grid if i < hit], default=-1)
    hit = next(
        i for i in range(lo + 1, hit + 1) if r(i) <= 1 + target
    )  # the first step on the sample
    for i in range(hit, n):  # confirmed on all rows (the sample's estimate may be a little off)
        full = objective(X, centers_by_step[i]) / reference_full
        if full <= 1 + target:
            return i + 1, full
    return None


def tall(args, client) -> list[dict]:
    import dask
    import dask.array as da
    from sklearn.cluster import MiniBatchKMeans as SkMiniBatchKMeans

    import dkmeans
    from dkmeans.kernels import assign_partials
    from dkmeans.testing import make_blobs

    X, _, _ = make_blobs(args.rows, 16, args.k, spread=1.5, box=10.0, seed=0)
    X = X.astype(np.float32)
    sample = X[np.random.default_rng(1).choice(len(X), min(len(X), args.sample), replace=False)]
    dX = client.persist(da.from_array(X, chunks=(len(X) // (4 * args.workers), 16)))
    rows, lloyd_centers = [], None
    for name, params in [
        ("dkmeans KMeans (Lloyd, defaults)", {}),
        ("dkmeans KMeans (plain Lloyd, local_search=False)", {"local_search": False}),
    ]:
        t0 = time.perf_counter()
        model = dkmeans.KMeans(args.k, random_state=0, **params).fit(dX)
        seconds = time.perf_counter() - t0
        lloyd_centers = model.cluster_centers_ if lloyd_centers is None else lloyd_centers
        rows.append(
            {
                "case": "tall",
                "fit": name,
                "setting": "",
                "seconds": seconds,
                "objective": objective(X, model.cluster_centers_),
                "steps_or_iterations": int(model.n_iter_),
            }
        )
    lloyd = rows[0]  # the reference: Lloyd with its defaults
    ref_full, ref_sample = lloyd["objective"], objective(sample, lloyd_centers)
    settings = SETTINGS if args.settings is None else [SETTINGS[i] for i in args.settings]
    for label, params in settings:
        params = {
            "init": "k-means++",
            "batch_size": 1024,
            **params,
        }  # scikit-learn's defaults unless set
        # dkmeans on the Dask array (timed), then replayed here for its centers after each step
        t0 = time.perf_counter()
        model = dkmeans.MiniBatchKMeans(args.k, random_state=0, compute_labels=False, **params).fit(
            dX
        )
        seconds = time.perf_counter() - t0
        step_seconds = np.array([h["seconds"] for h in model.history_])
        with StepRecorder() as rec, dask.config.set({"dkmeans.in-process-bytes": "100 GiB"}):
            replay = dkmeans.MiniBatchKMeans(
                args.k, random_state=0, compute_labels=False, **params
            ).fit(X)
        centers = [c for _, c in rec.steps]
        replay_diff = float(np.max(np.abs(replay.cluster_centers_ - model.cluster_centers_)))
        hit = first_within(X, sample, centers, ref_full, ref_sample, args.target)
        floor = _batch_floor(X, model.cluster_centers_, params["batch_size"], assign_partials)
        row = {
            "case": "tall",
            "fit": "dkmeans MiniBatchKMeans",
            "setting": label,
            "seconds": seconds,
            "objective": objective(X, model.cluster_centers_),
            "steps_or_iterations": int(model.n_steps_),
            "stop_reason": model.stop_reason_,
            "loop_modes": list(getattr(model, "_loop_modes", [])),
            "replay_max_abs_diff": replay_diff,
            "median_step_seconds": float(np.median(step_seconds)),
            "batch_partials_floor_seconds": floor,
        }
        if hit is not None:
            row["steps_to_target"], row["objective_at_target_vs_lloyd"] = hit
            row["seconds_to_target"] = seconds - float(step_seconds[hit[0] :].sum())
        rows.append(row)
        if "init" in params and params["init"] == "k-means||":
            continue  # scikit-learn has no k-means||
        with StepRecorder() as rec:
            t0 = time.perf_counter()
            sk = SkMiniBatchKMeans(args.k, random_state=0, compute_labels=False, **params).fit(X)
            seconds = time.perf_counter() - t0
        centers = [c for _, c in rec.steps]
        hit = first_within(X, sample, centers, ref_full, ref_sample, args.target)
        row = {
            "case": "tall",
            "fit": "scikit-learn MiniBatchKMeans",
            "setting": label,
            "seconds": seconds,
            "objective": objective(X, sk.cluster_centers_),
            "steps_or_iterations": int(sk.n_steps_),
        }
        if hit is not None:
            row["steps_to_target"], row["objective_at_target_vs_lloyd"] = hit
            row["seconds_to_target"] = rec.steps[hit[0] - 1][0] - t0
        rows.append(row)
    plain = rows[1]  # the goal's "full Lloyd": Lloyd iterations only, no local search
    for r in rows:
        r["objective_vs_lloyd"] = r["objective"] / ref_full
        r["time_vs_lloyd"] = r["seconds"] / lloyd["seconds"]
        if "seconds_to_target" in r:
            r["time_to_target_vs_lloyd"] = r["seconds_to_target"] / lloyd["seconds"]
            r["time_to_target_vs_plain_lloyd"] = r["seconds_to_target"] / plain["seconds"]
    return rows


def seed_sweep(args) -> list[dict]:
    """Final objective / plain Lloyd's for random_state 0..N-1, in this process (NumPy; fits only, untimed)."""
    import dask
    from sklearn.cluster import MiniBatchKMeans as SkMiniBatchKMeans

    import dkmeans
    from dkmeans.testing import make_blobs

    X, _, _ = make_blobs(args.rows, 16, args.k, spread=1.5, box=10.0, seed=0)
    X = X.astype(np.float32)
    rows = []
    with dask.config.set({"dkmeans.in-process-bytes": "100 GiB"}):
        ref = objective(
            X, dkmeans.KMeans(args.k, random_state=0, local_search=False).fit(X).cluster_centers_
        )
        fits = [
            (
                "dkmeans",
                "batch_size=4096",
                lambda s: dkmeans.MiniBatchKMeans(
                    args.k, random_state=s, batch_size=4096, init="k-means++"
                ),
            ),
            (
                "scikit-learn",
                "batch_size=4096",
                lambda s: SkMiniBatchKMeans(args.k, random_state=s, batch_size=4096),
            ),
            (
                "dkmeans",
                "batch_size=4096, n_init=3",
                lambda s: dkmeans.MiniBatchKMeans(
                    args.k, random_state=s, batch_size=4096, n_init=3, init="k-means++"
                ),
            ),
            (
                "scikit-learn",
                "batch_size=4096, n_init=3",
                lambda s: SkMiniBatchKMeans(args.k, random_state=s, batch_size=4096, n_init=3),
            ),
            (
                "dkmeans",
                "init='k-means||', batch_size=4096, n_init=1",
                lambda s: dkmeans.MiniBatchKMeans(
                    args.k, random_state=s, batch_size=4096, init="k-means||", n_init=1
                ),
            ),
            (
                "dkmeans",
                "init='k-means||', batch_size=4096 (n_init 'auto': 3)",
                lambda s: dkmeans.MiniBatchKMeans(
                    args.k, random_state=s, batch_size=4096, init="k-means||", n_init=3
                ),
            ),
            (
                "dkmeans",
                "init='k-means||', batch_size=2**14, n_init=1",
                lambda s: dkmeans.MiniBatchKMeans(
                    args.k, random_state=s, batch_size=2**14, init="k-means||", n_init=1
                ),
            ),
        ]
        for lib, label, make in fits:
            ratios = [
                objective(X, make(seed).set_params(compute_labels=False).fit(X).cluster_centers_)
                / ref
                for seed in range(args.seed_sweep)
            ]
            rows.append(
                {
                    "case": f"seed sweep {args.rows} x 16",
                    "fit": f"{lib} MiniBatchKMeans",
                    "setting": label,
                    "objective_vs_plain_lloyd": ratios,
                }
            )
            print(f"{lib:14s} {label:40s} " + " ".join(f"{r:.3f}" for r in ratios), flush=True)
    return rows


def objective64(X, C) -> float:
    """The objective of ``C`` on ``X``, both in float64, from the differences (no expanded formula)."""
    C = np.asarray(C, dtype=np.float64)
    total = 0.0
    for i in range(0, len(X), 50_000):
        block = X[i : i + 50_000].astype(np.float64)
        d2 = np.full(len(block), np.inf)
        for c in C:
            d2 = np.minimum(d2, np.einsum("ij,ij->i", block - c, block - c))
        total += float(d2.sum())
    return total


def defaults_one(args) -> dict:
    """One fit of ``--one-fit`` (kmeans or minibatch, defaults plus ``--mb-params``), in this fresh process.

    The data (``--rows`` x 16 float32 blobs, k = ``--k``, the tall case's generator) is a Dask
    array of ``4 * --workers`` chunks persisted on a new LocalCluster of ``--workers`` x 1
    thread before the clock starts; the fit is timed alone; its centers are scored in float64.
    """
    import json

    import dask.array as da
    import sklearn.base
    from distributed import wait

    import dkmeans
    from dkmeans.testing import local_cluster, make_blobs

    X, _, _ = make_blobs(args.rows, 16, args.k, spread=1.5, box=10.0, seed=0)
    X = X.astype(np.float32)
    with local_cluster(args.workers) as client, client.as_current():
        dX = client.persist(da.from_array(X, chunks=(-(-len(X) // (4 * args.workers)), 16)))
        wait(dX)
        if args.one_fit == "kmeans":
            model = dkmeans.KMeans(args.k, random_state=args.seed)
        else:
            model = dkmeans.MiniBatchKMeans(
                args.k, random_state=args.seed, **json.loads(args.mb_params)
            )
        # warm-up (untimed): the workers load the compiled kernels (DASK_DKMEANS__COMPILE=eager, set by the sweep)
        small = client.persist(da.from_array(X[:20_000], chunks=(5_000, 16)))
        sklearn.base.clone(model).fit(small)
        t0 = time.perf_counter()
        model.fit(dX)
        seconds = time.perf_counter() - t0
    return {
        "fit": args.one_fit,
        "seed": args.seed,
        "seconds": seconds,
        "objective64": objective64(X, model.cluster_centers_),
        "inertia": float(model.inertia_),
        "params": {k: v for k, v in model.get_params().items() if not callable(v)},
        "steps_or_iterations": int(getattr(model, "n_steps_", model.n_iter_)),
        "stop_reason": model.stop_reason_,
    }


def defaults_sweep(args) -> list[dict]:
    """Default ``MiniBatchKMeans`` against default ``KMeans`` for random_state 0..N-1, each fit in a fresh process.

    ``--mb-params`` is a JSON object (parameters added to the default ``MiniBatchKMeans``), or a
    list of them: each seed then runs ``KMeans`` and every setting, one after the other.
    """
    import json
    import os
    import subprocess

    settings = json.loads(args.mb_params)
    settings = settings if isinstance(settings, list) else [settings]
    env = {**os.environ, "DASK_DKMEANS__COMPILE": "eager"}

    def run(fit, seed, params="{}"):
        cmd = [
            sys.executable,
            __file__,
            "--one-fit",
            fit,
            "--seed",
            str(seed),
            "--rows",
            str(args.rows),
            "--k",
            str(args.k),
            "--workers",
            str(args.workers),
            "--mb-params",
            params,
        ]
        for attempt in range(3):  # a fresh process can fail to start its cluster on a busy machine
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode == 0:
                return json.loads(proc.stdout.strip().splitlines()[-1])
            tail = [line for line in proc.stderr.splitlines() if "Error" in line][-1:]
            print(f"(seed {seed} {fit} failed, attempt {attempt + 1}: {tail})", flush=True)
            time.sleep(10)
        raise RuntimeError(f"{cmd} failed three times")

    rows = []
    print(
        f"{'seed':>4s} {'KMeans s':>9s}  "
        + "  ".join(
            f"[{json.dumps(p)}] {'MBKMeans s':>10s} {'t MB/KM':>8s} {'obj MB/KM':>10s} steps"
            for p in settings
        ),
        flush=True,
    )
    for seed in range(args.defaults):
        km = run("kmeans", seed)
        line = f"{seed:4d} {km['seconds']:9.2f}  "
        for params in settings:
            mb = run("minibatch", seed, json.dumps(params))
            row = {
                "case": f"defaults {args.rows} x 16 float32, k={args.k}",
                "seed": seed,
                "mb_params": params,
                "kmeans": km,
                "minibatch": mb,
                "objective_ratio": mb["objective64"] / km["objective64"],
                "time_ratio": mb["seconds"] / km["seconds"],
            }
            rows.append(row)
            line += (
                f"{mb['seconds']:10.2f} {row['time_ratio']:8.3f} {row['objective_ratio']:10.4f} "
                f"{mb['steps_or_iterations']:5d}  "
            )
        print(line, flush=True)
    for params in settings:
        ratios = np.array([r["objective_ratio"] for r in rows if r["mb_params"] == params])
        times = np.array([r["time_ratio"] for r in rows if r["mb_params"] == params])
        print(
            f"{json.dumps(params)}: objective ratio max {ratios.max():.4f}, median {np.median(ratios):.4f}; "
            f"time ratio max {times.max():.3f}, median {np.median(times):.3f}",
            flush=True,
        )
    return rows


def _batch_floor(X, C, batch_size, assign_partials) -> float:
    """Seconds to gather one batch of random rows (sorted index) and take its assignment partials, here.

    The least a step can cost (median of 5); dkmeans' steps add the draw of the batch,
    the per-center update, the reassignment check and the loop's bookkeeping.
    """
    b = min(batch_size, len(X))
    rng = np.random.default_rng(2)
    times = []
    for _ in range(5):
        index = np.sort(rng.integers(0, len(X), b))
        t0 = time.perf_counter()
        assign_partials(X[index], C.astype(X.dtype))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def out_of_core(args) -> list[dict]:
    import dask
    from dask.utils import parse_bytes
    from out_of_core import PeakMemory

    import dkmeans
    from dkmeans.engine.client import start_local_cluster
    from dkmeans.testing import make_blobs_dask

    memory = parse_bytes(args.memory)
    n = int(args.times * memory * args.workers / (16 * 4))
    client = start_local_cluster(
        n_workers=args.workers, dashboard_address=None, memory_limit=args.memory
    )
    case = (
        f"out-of-core {n} x 16 float32 ({n * 64 / 2**30:.2f} GiB, {args.times:g}x the cluster's "
        f"{args.workers} x {args.memory})"
    )
    rows = []
    try:
        with client.as_current(), dask.config.set({"dkmeans.in-process-bytes": 0}):
            X, true_centers = make_blobs_dask(
                n, 16, args.k, chunk_rows=args.chunk_rows, spread=1.5, seed=1
            )
            head = X[
                :200_000
            ].compute()  # the objective against the generating centers' on these rows
            mni = None if args.ooc_max_no_improvement < 0 else args.ooc_max_no_improvement
            fits = {
                f"dkmeans MiniBatchKMeans (init='k-means||', max_iter=1, batch_size={args.ooc_batch_size}, "
                f"max_no_improvement={mni}, compute_labels={args.ooc_labels})": lambda: (
                    dkmeans.MiniBatchKMeans(
                        args.k,
                        random_state=0,
                        batch_size=args.ooc_batch_size,
                        max_iter=1,
                        init="k-means||",
                        max_no_improvement=mni,
                        compute_labels=args.ooc_labels,
                    ).fit(X)
                ),
            }
            if args.ooc_lloyd_iters:
                fits[f"dkmeans KMeans (plain Lloyd, max_iter={args.ooc_lloyd_iters})"] = lambda: (
                    dkmeans.KMeans(
                        args.k, random_state=0, max_iter=args.ooc_lloyd_iters, local_search=False
                    ).fit(X)
                )
            for name, fit in fits.items():
                workers_before = set(client.scheduler_info(n_workers=-1)["workers"])
                with PeakMemory(client) as peak:
                    t0 = time.perf_counter()
                    model = fit()
                    seconds = time.perf_counter() - t0
                workers_after = set(client.scheduler_info(n_workers=-1)["workers"])
                rows.append(
                    {
                        "case": case,
                        "fit": name,
                        "seconds": seconds,
                        "objective": float(model.inertia_),
                        "passes": int(model.n_passes_),
                        "mode": model.data_mode_,
                        "steps_or_iterations": int(getattr(model, "n_steps_", model.n_iter_)),
                        "stop_reason": model.stop_reason_,
                        "rows_read_by_steps": min(
                            n, int(getattr(model, "n_steps_", 0)) * args.ooc_batch_size
                        ),
                        "head_objective_vs_true_centers": objective(head, model.cluster_centers_)
                        / objective(head, true_centers),
                        "peak_worker_mib": sorted(round(v / 2**20) for v in peak.peak.values()),
                        "memory_limit_mib": memory / 2**20,
                        "workers_lost": len(peak.seen - workers_after)
                        + len(workers_before - workers_after),
                    }
                )
    finally:
        cluster = client.cluster
        client.close()
        cluster.close()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="small sizes (200k rows; 3x of 2 x 400MiB, no Lloyd)"
    )
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument(
        "--target", type=float, default=0.01, help="within this fraction of Lloyd's objective"
    )
    parser.add_argument(
        "--sample",
        type=int,
        default=200_000,
        help="rows the objective along the way is computed on",
    )
    parser.add_argument(
        "--settings", type=int, nargs="*", default=None, help="indices into SETTINGS (default all)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--memory", default="512MiB", help="memory_limit per worker of the out-of-core cluster"
    )
    parser.add_argument(
        "--times",
        type=float,
        default=None,
        help="data / the cluster's memory (default 10; quick 3)",
    )
    parser.add_argument("--chunk-rows", type=int, default=500_000)
    parser.add_argument("--ooc-batch-size", type=int, default=2**14)
    parser.add_argument(
        "--ooc-lloyd-iters",
        type=int,
        default=None,
        help="plain Lloyd iterations out of core (default 2; --quick: 0, Lloyd not run)",
    )
    parser.add_argument(
        "--ooc-max-no-improvement",
        type=int,
        default=10,
        help="out of core: max_no_improvement (-1: None, the whole pass)",
    )
    parser.add_argument(
        "--ooc-labels",
        action="store_true",
        help="out of core: compute_labels=True (a second pass, for the exact objective); else "
        "the objective reported is scikit-learn's estimate (the smoothed batch objective)",
    )
    parser.add_argument("--skip-out-of-core", action="store_true")
    parser.add_argument("--skip-tall", action="store_true")
    parser.add_argument(
        "--seed-sweep",
        type=int,
        default=0,
        help="only: the final objective of some settings for random_state 0..N-1, in this process",
    )
    parser.add_argument(
        "--defaults",
        type=int,
        default=0,
        help="only: default MiniBatchKMeans against default KMeans for random_state 0..N-1, "
        "each fit in a fresh process (--rows default 1.2M)",
    )
    parser.add_argument(
        "--mb-params",
        default="{}",
        help="--defaults: JSON parameters added to MiniBatchKMeans' (a list: several settings)",
    )
    parser.add_argument("--one-fit", choices=("kmeans", "minibatch"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--output", default="minibatch.json", help="file name under benchmarks/results/"
    )
    args = parser.parse_args(argv)
    if args.one_fit:
        import json

        print(json.dumps(defaults_one(args)), flush=True)
        return 0
    if args.defaults:
        args.rows = args.rows or 1_200_000
        write_json(
            args.output, {"machine": machine(), "args": vars(args), "rows": defaults_sweep(args)}
        )
        return 0
    args.rows = args.rows or (200_000 if args.quick else 2_000_000)
    args.times = args.times or (3.0 if args.quick else 10.0)
    if args.ooc_lloyd_iters is None:
        args.ooc_lloyd_iters = 0 if args.quick else 2

    from dkmeans.testing import local_cluster

    rows = []
    if args.seed_sweep:
        write_json(
            args.output, {"machine": machine(), "args": vars(args), "rows": seed_sweep(args)}
        )
        return 0
    if not args.skip_tall:
        with local_cluster(args.workers) as client, client.as_current():
            rows += tall(args, client)
    if not args.skip_out_of_core:
        rows += out_of_core(args)
    print(
        f"{'fit':30s} {'setting':58s} {'seconds':>8s} {'obj/Lloyd':>9s} {'t/Lloyd':>8s} {'steps':>6s} "
        f"{'to 1%: s':>8s} {'t/Lloyd':>8s} {'t/plain':>8s} {'step':>6s} extra"
    )
    for r in rows:
        extra = {
            key: r[key]
            for key in (
                "stop_reason",
                "passes",
                "rows_read_by_steps",
                "head_objective_vs_true_centers",
                "mode",
                "peak_worker_mib",
                "workers_lost",
                "loop_modes",
                "replay_max_abs_diff",
                "median_step_seconds",
                "batch_partials_floor_seconds",
            )
            if key in r
        }
        print(
            f"{r['fit'][:30]:30s} {r.get('setting', r['case'])[:58]:58s} {r['seconds']:8.2f} "
            f"{r.get('objective_vs_lloyd', float('nan')):9.4f} {r.get('time_vs_lloyd', float('nan')):8.3f} "
            f"{r['steps_or_iterations']:6d} {r.get('seconds_to_target', float('nan')):8.2f} "
            f"{r.get('time_to_target_vs_lloyd', float('nan')):8.3f} "
            f"{r.get('time_to_target_vs_plain_lloyd', float('nan')):8.3f} {r.get('steps_to_target', '-')!s:>6s} {extra}"
        )
    write_json(args.output, {"machine": machine(), "args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
