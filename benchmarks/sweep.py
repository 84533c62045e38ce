"""A k sweep against fitting the same values of k one by one: passes over the data and seconds, in one run.

Parts (``--parts``):

* **tall**: 2,000,000 x 16 float32 Gaussian blobs (``benchmarks/lloyd.py``'s ``make_data``: 32
  overlapping blobs, seed 0), persisted as 16 row chunks on lloyd.py's cluster (dkmeans'
  embedded configuration, 2 workers x 1 thread);
* **out-of-core**: a Parquet folder of float32 uniform blobs (``benchmarks/out_of_core.py``'s
  ``write_folder``: 16 feature columns and an id column that is not read, files of
  ``--file-rows`` rows), ``--times`` the memory of out_of_core.py's cluster (a plain
  ``distributed.LocalCluster`` of ``--workers`` processes x 1 thread, ``memory_limit=--memory``),
  read as ``dd.read_parquet(folder)[feature columns]``.

For each part, in one run: ``dkmeans.KMeans(n_clusters=k, random_state=0).fit(X)`` for every k of
``--k-values`` (default parameters otherwise), one after the other, then
``dkmeans.sweep(X, k_values, random_state=0)`` (``--order sweep-first`` swaps them). Reported:
each single fit's passes over the data (``n_passes_``), seconds, iterations and objective; the
sweep's passes (``SweepResult.n_passes``, every pass over the rows) and seconds; each k's
objective and iterations in the sweep against its single fit; and the ratios: sweep passes /
the longest single fit's, sweep passes / the sum, sweep seconds / the singles' sum.

Goal (issue 33): out of core, the sweep's passes at most 1.3x those of the longest single fit.

``--quick``: the tall part with 200,000 rows, the out-of-core part on a small folder (4 files
of 100,000 rows) forced out of core (``out_of_core=True``) instead of being larger than the
cluster: a smoke run of the script, not a measurement.

Run:  .venv/bin/python benchmarks/sweep.py [--parts tall out-of-core] [--k-values 4:32:4] [--times 1.2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_json  # noqa: E402


def _fit_one_by_one(X, ks, seed, **params) -> dict:
    import dkmeans

    out = {}
    for k in ks:
        t = time.perf_counter()
        km = dkmeans.KMeans(n_clusters=k, random_state=seed, **params).fit(X)
        out[k] = {
            "seconds": time.perf_counter() - t,
            "passes": int(km.n_passes_),
            "n_iter": int(km.n_iter_),
            "objective": float(km.inertia_),
            "data_mode": km.data_mode_,
        }
        print(
            f"  single fit k={k}: {out[k]['seconds']:.2f} s, {out[k]['passes']} passes, {out[k]['n_iter']} "
            f"iterations, objective {out[k]['objective']:.6e}",
            flush=True,
        )
    return out


def _sweep(X, ks, seed, **params) -> dict:
    import dkmeans

    t = time.perf_counter()
    res = dkmeans.sweep(X, ks, random_state=seed, **params)
    seconds = time.perf_counter() - t
    print(f"  sweep: {seconds:.2f} s, {res.n_passes} passes, data {res.data_mode}", flush=True)
    return {
        "seconds": seconds,
        "passes": int(res.n_passes),
        "data_mode": res.data_mode,
        "suggested_k": res.suggested_k,
        "per_k": {
            k: {"passes": res.passes[k], "n_iter": res.n_iter[k], "objective": res.objective[k]}
            for k in ks
        },
    }


def run_part(name: str, X, ks, seed: int, order: str, **params) -> dict:
    print(f"{name}: k = {ks}", flush=True)
    if order == "sweep-first":
        sweep = _sweep(X, ks, seed, **params)
        single = _fit_one_by_one(X, ks, seed, **params)
    else:
        single = _fit_one_by_one(X, ks, seed, **params)
        sweep = _sweep(X, ks, seed, **params)
    longest = max(s["passes"] for s in single.values())
    total_passes = sum(s["passes"] for s in single.values())
    total_seconds = sum(s["seconds"] for s in single.values())
    agree = {
        k: {
            "objective_rel_diff": abs(sweep["per_k"][k]["objective"] - single[k]["objective"])
            / max(single[k]["objective"], 1e-300),
            "same_iterations": sweep["per_k"][k]["n_iter"] == single[k]["n_iter"],
            "same_passes": sweep["per_k"][k]["passes"] == single[k]["passes"],
        }
        for k in ks
    }
    return {
        "k_values": ks,
        "single": single,
        "sweep": sweep,
        "longest_single_passes": longest,
        "single_passes_sum": total_passes,
        "single_seconds_sum": total_seconds,
        "passes_vs_longest": sweep["passes"] / longest,
        "passes_vs_sum": sweep["passes"] / total_passes,
        "seconds_vs_sum": sweep["seconds"] / total_seconds,
        "agreement": agree,
    }


def _table(name: str, part: dict) -> str:
    lines = [
        f"### {name}",
        "",
        "| k | single: passes | single: s | single: iterations | sweep: iterations | "
        "objective, sweep vs single (rel. diff) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for k in part["k_values"]:
        s, a = part["single"][k], part["agreement"][k]
        lines.append(
            f"| {k} | {s['passes']} | {s['seconds']:.2f} | {s['n_iter']} | "
            f"{part['sweep']['per_k'][k]['n_iter']} | {a['objective_rel_diff']:.1e} |"
        )
    sw = part["sweep"]
    lines += [
        "",
        "| | passes over the data | seconds |",
        "|---|---:|---:|",
        f"| one by one (sum) | {part['single_passes_sum']} | {part['single_seconds_sum']:.2f} |",
        f"| the longest single fit | {part['longest_single_passes']} | |",
        f"| sweep | {sw['passes']} | {sw['seconds']:.2f} |",
        f"| sweep / longest single fit | {part['passes_vs_longest']:.2f}x | |",
        f"| sweep / one by one | {part['passes_vs_sum']:.2f}x | {part['seconds_vs_sum']:.2f}x |",
    ]
    return "\n".join(lines)


def _k_values(text: str) -> list[int]:
    from dkmeans.cli import parse_k_values

    return parse_k_values(text)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--parts", nargs="+", choices=["tall", "out-of-core"], default=["tall", "out-of-core"]
    )
    parser.add_argument(
        "--k-values", type=_k_values, default="4:32:4", help="as dkmeans sweep -k (default 4:32:4)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--order", choices=["singles-first", "sweep-first"], default="singles-first"
    )
    parser.add_argument(
        "--folder", default=str(Path(tempfile.gettempdir()) / "dkmeans-out-of-core")
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--memory", default="768MiB", help="memory_limit of each worker (out-of-core part)"
    )
    parser.add_argument(
        "--times",
        type=float,
        default=1.2,
        help="out-of-core data, in multiples of the cluster's memory (default 1.2)",
    )
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--file-rows", type=int, default=1_000_000)
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes: a smoke run of the script"
    )
    args = parser.parse_args()
    ks = args.k_values if isinstance(args.k_values, list) else _k_values(args.k_values)

    import dask
    import dask.dataframe as dd
    import distributed
    import lloyd
    from dask.utils import parse_bytes
    from out_of_core import write_folder

    results = {
        "machine": machine(),
        "args": {**vars(args), "k_values": ks},
        "load_before": os.getloadavg(),
    }
    tables = []
    if "tall" in args.parts:
        n, d, k_blobs = lloyd.QUICK_SHAPES["tall"] if args.quick else lloyd.SHAPES["tall"]
        X_np, _ = lloyd.make_data(n, d, k_blobs)
        client = lloyd.start_cluster()
        try:
            X = lloyd.persist_chunks(client, X_np)
            import dkmeans

            dkmeans.KMeans(4, random_state=0).fit(
                X
            )  # warm-up: kernels compiled and loaded on the workers
            name = f"tall {n:,} x {d} float32, persisted, {lloyd.N_WORKERS} workers x 1 thread"
            results["tall"] = run_part(name, X, ks, args.seed, args.order)
            tables.append(_table(name, results["tall"]))
        finally:
            cluster = client.cluster
            client.close()
            cluster.close()
    if "out-of-core" in args.parts:
        limit = parse_bytes(args.memory)
        file_rows = 100_000 if args.quick else args.file_rows
        file_bytes = file_rows * args.features * 4
        n_files = 4 if args.quick else int(np.ceil(args.times * args.workers * limit / file_bytes))
        folder = Path(args.folder) / f"{args.features}x{n_files}x{file_rows}"
        t0 = time.perf_counter()
        write_folder(folder, n_files, args.features, 24, file_rows)
        print(
            f"data: {n_files} Parquet files, {n_files * file_bytes / 2**30:.2f} GiB of float32 features "
            f"({n_files * file_bytes / (args.workers * limit):.2f}x the cluster's {args.workers} x {args.memory}), "
            f"in {folder} (written in {time.perf_counter() - t0:.0f} s if new)",
            flush=True,
        )
        cols = [f"x{j}" for j in range(args.features)]
        client = distributed.Client(
            distributed.LocalCluster(
                n_workers=args.workers,
                threads_per_worker=1,
                memory_limit=limit,
                processes=True,
                host="127.0.0.1",
                dashboard_address=None,
            )
        )
        try:
            params = {"out_of_core": True} if args.quick else {}
            X = dd.read_parquet(folder)[cols]
            name = (
                f"out of core: {n_files * file_bytes / 2**30:.2f} GiB of Parquet, {args.workers} workers x "
                f"{args.memory}" + (" (quick: forced out of core)" if args.quick else "")
            )
            with dask.config.set({"dkmeans.out-of-core": "auto"}):
                results["out_of_core"] = run_part(name, X, ks, args.seed, args.order, **params)
            modes = {s["data_mode"] for s in results["out_of_core"]["single"].values()}
            modes.add(results["out_of_core"]["sweep"]["data_mode"])
            assert modes == {"out-of-core"}, f"the out-of-core part ran {modes}"
            tables.append(_table(name, results["out_of_core"]))
        finally:
            client.close()
    results["load_after"] = os.getloadavg()
    print()
    print("\n\n".join(tables))
    if "out_of_core" in results:
        ratio = results["out_of_core"]["passes_vs_longest"]
        print(
            f"\ngoal (out of core: sweep passes <= 1.3x the longest single fit's): {ratio:.2f}x, "
            f"{'met' if ratio <= 1.3 else 'NOT met'}"
        )
    print(f"load average before {results['load_before']}, after {results['load_after']}")
    print("results:", write_json("sweep_quick.json" if args.quick else "sweep.json", results))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
