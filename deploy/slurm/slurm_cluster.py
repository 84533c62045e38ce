#!/usr/bin/env python
"""Fit dkmeans on a Dask cluster whose workers are SLURM jobs (dask-jobqueue).

Run it on a login node (or in a small allocation) that the compute nodes can reach::

    python deploy/slurm/slurm_cluster.py data/*.parquet -k 16 --model model.npz \\
        --cores 8 --processes 8 --memory 32GB --walltime 01:00:00 \\
        --queue compute --account myproject --jobs 4 --interface ib0

This starts the scheduler in this process, submits ``--jobs`` worker jobs with ``sbatch``
(each ``--cores`` cores split into ``--processes`` worker processes), waits for the workers,
fits :class:`dkmeans.KMeans` on the Parquet columns, writes the model and cancels the jobs.
``--print-job-script`` shows the generated batch script and submits nothing.

Needs ``pip install dask-jobqueue`` next to dkmeans, and the same Python environment (same
dkmeans version) on the compute nodes: ``--python`` names its interpreter if it differs.
"""

from __future__ import annotations

import argparse
import sys
import time


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="dkmeans fit on a dask-jobqueue SLURMCluster")
    p.add_argument("input", nargs="?", help="Parquet file, directory or glob")
    p.add_argument("-k", type=int, help="number of clusters")
    p.add_argument("--model", help="model file to write (.npz)")
    p.add_argument("--columns", nargs="+", help="columns to cluster on (default: all numeric)")
    p.add_argument("--exclude", nargs="+", default=[], help="columns to leave out")
    p.add_argument("--random-state", type=int, default=None)
    p.add_argument("--max-iter", type=int, default=300)

    r = p.add_argument_group("SLURM resources (per job)")
    r.add_argument("--cores", type=int, default=8, help="cores per job (--cpus-per-task)")
    r.add_argument("--memory", default="32GB", help="memory per job (--mem)")
    r.add_argument(
        "--processes",
        type=int,
        default=None,
        help="worker processes per job (default: one per core, one thread each)",
    )
    r.add_argument("--walltime", default="01:00:00", help="time limit per job (-t)")
    r.add_argument("--queue", help="partition (-p)")
    r.add_argument("--account", help="account to charge (-A)")
    r.add_argument("--jobs", type=int, default=2, help="number of worker jobs to submit")
    r.add_argument(
        "--job-extra",
        action="append",
        default=[],
        metavar="DIRECTIVE",
        help="extra #SBATCH directive, e.g. --job-extra=--exclusive (repeatable)",
    )
    r.add_argument(
        "--interface", help="network interface of scheduler and workers, e.g. ib0 or eth0"
    )
    r.add_argument(
        "--scheduler-host", help="address the scheduler binds to (instead of --interface)"
    )
    r.add_argument("--python", help="Python interpreter on the compute nodes (default: this one)")
    r.add_argument("--local-directory", default="$TMPDIR", help="worker scratch space on the nodes")
    r.add_argument("--log-directory", default=None, help="folder for the jobs' stdout/stderr")
    r.add_argument(
        "--tls",
        action="store_true",
        help="encrypt and authenticate all traffic with a temporary certificate (needs the "
        "'cryptography' package; written to --shared-temp-directory, which the nodes must see)",
    )
    r.add_argument(
        "--shared-temp-directory",
        default=None,
        help="shared folder for the TLS files (default: current directory)",
    )
    r.add_argument(
        "--min-workers",
        type=int,
        default=None,
        help="worker processes to wait for before fitting (default: all, jobs x processes)",
    )
    r.add_argument(
        "--wait-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for those workers (queued jobs may take a while)",
    )
    p.add_argument(
        "--print-job-script", action="store_true", help="print the batch script and exit"
    )
    return p


def make_cluster(args):
    """The :class:`dask_jobqueue.SLURMCluster` for ``args`` (nothing is submitted yet).

    Creating it starts the Dask scheduler in this process; close it (or use it as a context
    manager) when done. ``cluster.job_script()`` is the batch script each job runs.
    """
    from dask_jobqueue import SLURMCluster

    processes = args.processes or args.cores
    threads = max(1, args.cores // processes)
    scheduler_options = {"dashboard_address": ":0"}
    if args.scheduler_host:
        scheduler_options["host"] = args.scheduler_host
    security = None
    if args.tls:
        from distributed.security import Security

        try:
            security = Security.temporary()  # a fresh self-signed certificate for this run
        except ImportError as exc:
            raise SystemExit(
                f"slurm_cluster.py: error: --tls needs the 'cryptography' package ({exc})"
            ) from None
    env = [
        f"export {name}={threads}"
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    ]
    return SLURMCluster(
        cores=args.cores,
        processes=processes,
        memory=args.memory,
        walltime=args.walltime,
        queue=args.queue,
        account=args.account,
        interface=args.interface,
        scheduler_options=scheduler_options,
        job_extra_directives=list(args.job_extra),
        job_script_prologue=env,
        local_directory=args.local_directory,
        log_directory=args.log_directory,
        python=args.python or sys.executable,
        security=security,
        shared_temp_directory=args.shared_temp_directory,  # with security: the TLS files for the jobs
    )


def fit(client, args):
    """Read the Parquet input, fit KMeans on ``client``'s cluster and save the model."""
    from dkmeans import KMeans
    from dkmeans.engine.files import read_table

    df = read_table(args.input, columns=args.columns)
    columns = [
        c for c in (args.columns or df.select_dtypes("number").columns) if c not in args.exclude
    ]
    t0 = time.perf_counter()
    with client.as_current():
        km = KMeans(n_clusters=args.k, max_iter=args.max_iter, random_state=args.random_state).fit(
            df[columns]
        )
    path = km.save(args.model)
    print(
        f"fitted k={args.k} on {len(columns)} columns in {time.perf_counter() - t0:.2f} s: "
        f"{km.n_iter_} iterations, objective {km.inertia_:.6e}; model written to {path}"
    )
    return km


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.print_job_script and (args.input is None or args.k is None or args.model is None):
        parser.error("INPUT, -k and --model are required (or use --print-job-script)")
    from distributed import Client

    with make_cluster(args) as cluster:
        if args.print_job_script:
            print(cluster.job_script())
            return 0
        print(
            f"scheduler {cluster.scheduler_address}; submitting {args.jobs} job(s)", file=sys.stderr
        )
        cluster.scale(jobs=args.jobs)
        with Client(cluster) as client:
            # The data is spread over the workers present when it is read: wait for them.
            n_workers = args.min_workers or args.jobs * (args.processes or args.cores)
            client.wait_for_workers(n_workers, timeout=args.wait_timeout)
            fit(client, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
