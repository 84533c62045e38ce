"""The faces on data larger than memory: the CLI and the ETL example on a Parquet folder bigger than the cluster.

Uses the folder of ``benchmarks/out_of_core.py`` (written once, ``--times`` the cluster's memory),
starts a LocalCluster of ``--workers`` processes x 1 thread with ``memory_limit=--memory``, and on it,
unchanged:

* ``dkmeans fit FOLDER -k K --exclude id --max-iter N --model M --scheduler ADDRESS`` and
  ``dkmeans predict M FOLDER --output OUT --scheduler ADDRESS`` (subprocesses, as a shell user runs
  them); the labelled folder must hold every input row, in the input's order, with a ``cluster`` column;
* ``examples/etl_parquet.py``'s ``segment`` pipeline (filter, fit, predict, write Parquet) on the same
  folder.

While each runs, every worker's memory is polled from the scheduler (peak against its limit), and the
workers' logs are read afterwards for pauses; a worker restarted or lost is reported. JSON goes to
``benchmarks/results/out_of_core_faces.json``.

Run:  .venv/bin/python benchmarks/out_of_core_faces.py [--memory 1GiB --times 1.5 --k 16 --max-iter 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))
from _common import machine, write_json  # noqa: E402
from out_of_core import PeakMemory, write_folder  # noqa: E402


def pauses(client) -> int:
    """How many times a worker paused for memory (its log says so)."""
    logs = client.get_worker_logs()
    return sum("Pausing worker" in message for lines in logs.values() for _, message in lines)


def check_labelled(folder: Path, n_rows: int, k: int) -> tuple[int, bool]:
    """Rows in a labelled Parquet folder, and whether its ids are 0..n_rows-1 in order with labels in [0, k).

    Read file by file in this process (a few MiB each), not on the cluster under test.
    """
    import pyarrow.parquet as pq

    expected, ok = 0, True
    number = lambda path: int("".join(ch for ch in path.stem if ch.isdigit()) or 0)  # noqa: E731  part.10 after part.9
    for path in sorted(Path(folder).glob("*.parquet"), key=number):
        table = pq.read_table(path, columns=["id", "cluster"])
        ids, labels = table["id"].to_numpy(), table["cluster"].to_numpy()
        ok &= bool(np.array_equal(ids, np.arange(expected, expected + len(ids))))
        ok &= bool(len(labels) == 0 or (labels.min() >= 0 and labels.max() < k))
        expected += len(ids)
    return expected, ok and expected == n_rows


def run_cli(args: list[str]) -> float:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "dkmeans", *args], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(
            f"dkmeans {' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
        )
    print(out.stdout.strip().splitlines()[-1])
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--folder", default=str(Path(tempfile.gettempdir()) / "dkmeans-out-of-core")
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memory", default="1GiB", help="memory_limit of each worker")
    parser.add_argument(
        "--times", type=float, default=1.5, help="data size, in multiples of the cluster's memory"
    )
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--file-rows", type=int, default=524_288)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--max-iter", type=int, default=3)
    args = parser.parse_args()

    from dask.utils import parse_bytes
    from etl_parquet import segment

    from dkmeans.engine.client import start_local_cluster

    limit = parse_bytes(args.memory)
    file_bytes = args.file_rows * args.features * 4
    n_files = int(np.ceil(args.times * args.workers * limit / file_bytes))
    folder = Path(args.folder) / f"{args.features}x{n_files}x{args.file_rows}"
    write_folder(folder, n_files, args.features, args.k, args.file_rows)
    n_rows = n_files * args.file_rows
    print(
        f"data: {n_files} Parquet files, {n_rows:,} rows, {n_files * file_bytes / 2**30:.2f} GiB of float32 "
        f"features ({args.times:g}x the cluster's {args.workers} x {args.memory}) in {folder}"
    )
    work = Path(tempfile.mkdtemp(prefix="dkmeans-faces-"))
    cols = [f"x{j}" for j in range(args.features)]

    client = start_local_cluster(args.workers, memory_limit=limit, dashboard_address=None)
    address = client.scheduler.address
    workers_before = set(client.scheduler_info(n_workers=-1)["workers"])
    results = {
        "machine": machine(),
        "args": vars(args),
        "data_gib": n_files * file_bytes / 2**30,
        "limit_mib": limit / 2**20,
    }
    try:
        with PeakMemory(client) as memory:
            model = work / "model.dkm"
            results["cli_fit_s"] = run_cli(
                [
                    "fit",
                    str(folder),
                    "-k",
                    str(args.k),
                    "--exclude",
                    "id",
                    "--max-iter",
                    str(args.max_iter),
                    "--model",
                    str(model),
                    "--scheduler",
                    address,
                ]
            )
            assert model.is_file(), "the CLI did not write the model file it was given"
            labelled = work / "labelled.parquet"
            results["cli_predict_s"] = run_cli(
                [
                    "predict",
                    str(model),
                    str(folder),
                    "--output",
                    str(labelled),
                    "--scheduler",
                    address,
                ]
            )
            results["cli_rows_out"], results["cli_rows_in_order"] = check_labelled(
                labelled, n_rows, args.k
            )
            assert results["cli_rows_in_order"], "predict lost, added or reordered rows"
            shutil.rmtree(labelled)
        results["cli_peak_mib"] = {a: m / 2**20 for a, m in memory.peak.items()}
        cli_seen = set(memory.seen)

        with PeakMemory(client) as memory:
            t = time.perf_counter()
            km, out = segment(folder, cols, args.k, work, max_iter=args.max_iter)
            results["etl_s"] = time.perf_counter() - t
            results["etl_data_mode"], results["etl_passes"] = km.data_mode_, km.n_passes_
            results["etl_rows_out"], in_order = check_labelled(out, n_rows, args.k)
            assert in_order, "the ETL pipeline lost, added or reordered rows"
        results["etl_peak_mib"] = {a: m / 2**20 for a, m in memory.peak.items()}
        lost = workers_before ^ (cli_seen | memory.seen)
        results["workers_restarted_or_lost"] = sorted(lost)
        results["pauses"] = pauses(client)
    finally:
        client.close()
        shutil.rmtree(work, ignore_errors=True)

    peak = max(max(results["cli_peak_mib"].values()), max(results["etl_peak_mib"].values()))
    print()
    print("| step | seconds | peak worker memory (MiB) |")
    print("|---|---:|---:|")
    print(
        f"| `dkmeans fit` (k={args.k}, max_iter={args.max_iter}) + `dkmeans predict` | "
        f"{results['cli_fit_s']:.1f} + {results['cli_predict_s']:.1f} | "
        f"{max(results['cli_peak_mib'].values()):.0f} |"
    )
    print(
        f"| `examples/etl_parquet.py` `segment` ({results['etl_data_mode']}, {results['etl_passes']} passes) | "
        f"{results['etl_s']:.1f} | {max(results['etl_peak_mib'].values()):.0f} |"
    )
    print(
        f"\nlimit {limit / 2**20:.0f} MiB per worker; workers restarted or lost: {len(lost)}; "
        f"pauses: {results['pauses']}; rows out = rows in ({n_rows:,}), in order: {results['cli_rows_in_order']}"
    )
    ok = not lost and peak <= limit / 2**20
    print(
        f"goal (both run unchanged, no worker over its limit, none lost): {'met' if ok else 'NOT met'}"
    )
    print("results:", write_json("out_of_core_faces.json", results))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
