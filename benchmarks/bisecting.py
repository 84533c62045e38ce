"""Bisecting k-means to large k, and every k from one fit: passes and seconds, in one run.

Parts (``--parts``):

* **large-k**: bisecting to k = ``--k`` (default 1,024) on the manyk shape (200,000 x 64 float32,
  ``benchmarks/lloyd.py``'s ``make_data``: ``--k`` overlapping Gaussian blobs, seed 0):
  ``dkmeans.BisectingKMeans(k, random_state=0)``, scikit-learn's ``BisectingKMeans(k,
  random_state=0)`` and ``dkmeans.KMeans(n_clusters=k, random_state=0)`` (default parameters
  otherwise), each in a fresh process on the same data (written once to a ``.npy`` file);
* **every-k**: the objective at every k from 2 to ``--every-k`` (default 64) on the same data:
  one ``dkmeans.BisectingKMeans(64)`` fit (its ``inertia_per_k_``) against
  ``dkmeans.KMeans(n_clusters=k)`` fitted alone for each k (one fresh process for the loop), and
  with ``--with-sweep`` ``dkmeans.sweep(X, range(2, 65))`` (a k-means fit of every k sharing their
  passes) and ``dkmeans.sweep(X, range(2, 65), method="bisecting")`` (one bisecting fit, every k
  scored at its nearest centres, the suggested k refitted), with the k each suggests.

Reported per fit: seconds of ``fit`` alone (the process's imports and the data's load are not
counted; wall clock, and CPU seconds of the process, which a busy machine disturbs less), passes
over the data (``n_passes_``; scikit-learn's are not counted), and two
objectives recomputed in float64 NumPy from the centres: the fit's own labels' (the tree's for
bisecting) and every row at its nearest centre.

``--quick``: 20,000 rows, k = 128, every k to 16: a smoke run of the script, not a measurement.

Run:  .venv/bin/python benchmarks/bisecting.py [--parts large-k every-k] [--k 1024] [--every-k 64]
                                                [--quick] [--with-sweep]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import machine, write_json  # noqa: E402


def _objectives(X, C, labels) -> dict:
    """Float64 objectives of centres ``C``: with ``labels``, and every row at its nearest centre."""
    X64, C64 = X.astype(np.float64), np.asarray(C, np.float64)
    own = float(((X64 - C64[np.asarray(labels)]) ** 2).sum())
    nearest = 0.0
    cc = (C64**2).sum(1)
    for start in range(0, len(X64), 20_000):
        block = X64[start : start + 20_000]
        d2 = (block**2).sum(1)[:, None] - 2 * block @ C64.T + cc
        nearest += float(np.maximum(d2.min(1), 0).sum())
    return {"objective": own, "objective_nearest": nearest}


def child(kind: str, data: str, k: int, every: int) -> dict:
    """One contender in this (fresh) process: its figures, with the CPU seconds of the process (every
    thread; dkmeans fits in-memory data in the calling process when no Dask client exists)."""
    cpu = time.process_time()
    result = _contender(kind, data, k, every)
    result["cpu_seconds"] = time.process_time() - cpu
    return result


def _contender(kind: str, data: str, k: int, every: int) -> dict:
    X = np.load(data)
    if kind == "sklearn-bisecting":
        from sklearn.cluster import BisectingKMeans

        t = time.perf_counter()
        model = BisectingKMeans(k, random_state=0).fit(X)
        seconds = time.perf_counter() - t
        return {
            "seconds": seconds,
            "passes": None,
            **_objectives(X, model.cluster_centers_, model.labels_),
        }
    import dkmeans

    if kind == "dkmeans-bisecting":
        t = time.perf_counter()
        model = dkmeans.BisectingKMeans(k, random_state=0).fit(X)
        seconds = time.perf_counter() - t
        return {
            "seconds": seconds,
            "passes": int(model.n_passes_),
            "rounds": int(model.n_rounds_),
            "data_mode": model.data_mode_,
            "inertia_per_k": model.inertia_per_k_.tolist(),
            **_objectives(X, model.cluster_centers_, model.labels_),
        }
    if kind == "dkmeans-kmeans":
        t = time.perf_counter()
        model = dkmeans.KMeans(n_clusters=k, random_state=0).fit(X)
        seconds = time.perf_counter() - t
        return {
            "seconds": seconds,
            "passes": int(model.n_passes_),
            "n_iter": int(model.n_iter_),
            "data_mode": model.data_mode_,
            **_objectives(X, model.cluster_centers_, model.labels_),
        }
    if kind == "dkmeans-each-k":
        per_k = {}
        for kk in range(2, every + 1):
            t = time.perf_counter()
            model = dkmeans.KMeans(n_clusters=kk, random_state=0).fit(X)
            per_k[kk] = {
                "seconds": time.perf_counter() - t,
                "passes": int(model.n_passes_),
                "objective": float(model.inertia_),
            }
        return {
            "seconds": sum(v["seconds"] for v in per_k.values()),
            "passes": sum(v["passes"] for v in per_k.values()),
            "per_k": per_k,
        }
    if kind in ("dkmeans-sweep", "dkmeans-sweep-bisecting"):
        method = "bisecting" if kind.endswith("bisecting") else "refit"
        t = time.perf_counter()
        result = dkmeans.sweep(X, list(range(2, every + 1)), random_state=0, method=method)
        seconds = time.perf_counter() - t
        return {
            "seconds": seconds,
            "passes": int(result.n_passes),
            "suggested_k": result.suggested_k,
            "answers": result.answers,
            "per_k": {kk: {"objective": float(result.objective[kk])} for kk in range(2, every + 1)},
        }
    raise SystemExit(f"unknown contender {kind}")


def run_child(kind: str, data: Path, k: int, every: int) -> dict:
    """``child`` in a fresh interpreter (imports, threads and caches of its own)."""
    print(f"  {kind} ...", flush=True)
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            kind,
            "--data",
            str(data),
            "--k",
            str(k),
            "--every-k",
            str(every),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{out.stderr[-4000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"  {kind}: {result['seconds']:.1f} s ({result['cpu_seconds']:.1f} CPU s), "
        f"passes {result['passes']}",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts", nargs="+", default=["large-k", "every-k"], choices=["large-k", "every-k"]
    )
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--every-k", type=int, default=64)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--with-sweep", action="store_true", help="every-k: also dkmeans.sweep over the same ks"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.data, args.k, args.every_k), default=float))
        return
    if args.quick:
        args.rows, args.k, args.every_k = 20_000, 128, 16
    from lloyd import make_data

    X, _ = make_data(args.rows, 64, args.k)
    load = os.getloadavg()
    report = {
        "machine": machine(),
        "rows": args.rows,
        "features": 64,
        "k": args.k,
        "every_k": args.every_k,
        "load_before": load,
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(f"{args.rows} x 64 float32, k = {args.k}; load average {load[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "X.npy"
        np.save(data, X)
        if "large-k" in args.parts:
            report["large_k"] = {
                kind: run_child(kind, data, args.k, args.every_k)
                for kind in ("dkmeans-bisecting", "sklearn-bisecting", "dkmeans-kmeans")
            }
        if "every-k" in args.parts:
            kinds = ("dkmeans-bisecting", "dkmeans-each-k") + (
                ("dkmeans-sweep", "dkmeans-sweep-bisecting") if args.with_sweep else ()
            )
            report["every_k_fits"] = {
                kind: run_child(kind, data, args.every_k, args.every_k) for kind in kinds
            }
    report["load_after"] = os.getloadavg()
    print()
    if "large_k" in report:
        print(
            f"| {args.rows:,} x 64, k = {args.k:,} | seconds | CPU seconds | passes "
            "| objective (own labels) | objective (nearest centre) |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for kind, r in report["large_k"].items():
            print(
                f"| {kind} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} "
                f"| {'-' if r['passes'] is None else r['passes']} "
                f"| {r['objective']:.4e} | {r['objective_nearest']:.4e} |"
            )
    if "every_k_fits" in report:
        fits = report["every_k_fits"]
        per_k = fits["dkmeans-bisecting"]["inertia_per_k"]
        each = {
            int(kk): v for kk, v in fits["dkmeans-each-k"]["per_k"].items()
        }  # JSON keys are strings
        sweep = {int(kk): v for kk, v in fits.get("dkmeans-sweep", {"per_k": {}})["per_k"].items()}
        print(f"\n| every k in 2..{args.every_k} | seconds | CPU seconds | passes | suggested k |")
        print("|---|---:|---:|---:|---:|")
        for kind in fits:
            r = fits[kind]
            print(
                f"| {kind} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} | {r['passes']} "
                f"| {r.get('suggested_k', '-')} |"
            )
        ratio = [per_k[kk - 1] / each[kk]["objective"] for kk in range(2, args.every_k + 1)]
        ratio_sweep = [sweep[kk]["objective"] / each[kk]["objective"] for kk in sorted(sweep)]
        print(
            f"\nobjective / fitted alone, over k: bisecting {min(ratio):.3f}-{max(ratio):.3f} "
            f"(median {np.median(ratio):.3f})"
            + (f"; sweep {min(ratio_sweep):.3f}-{max(ratio_sweep):.3f}" if ratio_sweep else "")
        )
        report["objective_ratio_bisecting"] = ratio
        report["objective_ratio_sweep"] = ratio_sweep
    print(f"\nload average before {load[0]:.2f}, after {report['load_after'][0]:.2f}")
    print(f"written {write_json('bisecting-' + '-'.join(args.parts) + '.json', report)}")


if __name__ == "__main__":
    main()
