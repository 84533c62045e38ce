"""Command line: ``dkmeans demo`` (and ``python -m dkmeans demo``).

Every user error ends with exit status 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

from dkmeans._validation import check_int, check_n_clusters_vs_rows
from dkmeans.cluster import close_embedded_cluster
from dkmeans.errors import DKMeansError


def _demo(args) -> int:
    import dask.dataframe as dd
    from sklearn.metrics import adjusted_rand_score

    from dkmeans import KMeans, Model, get_client
    from dkmeans.io import save_model
    from dkmeans.lloyd import assign_dataset
    from dkmeans.testing import make_blobs_dask

    check_int("n_clusters", args.k, 1)
    check_int("n_features", args.n_features, 1)
    check_n_clusters_vs_rows(args.k, check_int("n_samples", args.n_samples, 1))
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    client = get_client()
    workers = client.scheduler_info(n_workers=-1)["workers"]
    print(f"dkmeans demo: Dask cluster with {len(workers)} worker(s), "
          f"{sum(w['nthreads'] for w in workers.values())} thread(s); dashboard {client.dashboard_link}")
    X, true_centers = make_blobs_dask(args.n_samples, args.n_features, args.k, spread=args.spread,
                                      seed=args.seed, chunk_rows=args.chunk_rows)
    X = client.persist(X)
    print(f"data: {args.n_samples:,} x {args.n_features} float32 Gaussian blobs ({X.nbytes / 2**20:.0f} MiB) "
          f"generated on the workers in {X.numblocks[0]} chunks; k = {args.k}")

    t_fit = time.perf_counter()
    km = KMeans(n_clusters=args.k, init="random", max_iter=args.max_iter, tol=args.tol,
                random_state=args.seed, verbose=1).fit(X)
    fit_seconds = time.perf_counter() - t_fit
    per_iter = [h["seconds"] for h in km.history_]

    # Quality against the generating centres (known here because the data is synthetic).
    truth_labels, truth_objective = assign_dataset(client, X, true_centers.astype(np.float32))
    ari = adjusted_rand_score(truth_labels.compute(), km.labels_.compute())

    model_path = save_model(out_dir / "model.npz", Model(km.cluster_centers_), {
        "params": {k: v for k, v in km.get_params().items() if k != "init"} | {"init": "random"},
        "objective": km.inertia_, "iteration_count": km.n_iter_, "history": km.history_,
        "stop_reason": km.stop_reason_,
    })
    labels_path = out_dir / "labels.parquet"
    dd.from_dask_array(km.labels_, columns="cluster").to_frame().to_parquet(labels_path, write_index=False)

    print()
    print("summary")
    print(f"  iterations          {km.n_iter_} (stopped by: {km.stop_reason_})")
    print(f"  objective           {km.inertia_:.6e}  ({km.inertia_ / truth_objective:.4f} x the objective "
          f"at the generating centres)")
    print(f"  agreement with the generating clusters (adjusted Rand index): {ari:.4f}")
    print(f"  seconds/iteration   median {np.median(per_iter):.4f}, total fit {fit_seconds:.2f} s "
          f"(run {time.perf_counter() - t_start:.2f} s)")
    print(f"  model               {model_path}")
    print(f"  labels              {labels_path}  (Parquet, column 'cluster', {args.n_samples:,} rows)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dkmeans", description="Distributed k-means clustering on Dask.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="cluster a few million generated points on a local Dask cluster")
    demo.add_argument("--n-samples", type=int, default=3_000_000)
    demo.add_argument("--n-features", type=int, default=8)
    demo.add_argument("-k", type=int, default=12, help="number of clusters (and of generating blobs)")
    demo.add_argument("--spread", type=float, default=2.0, help="standard deviation of each blob")
    demo.add_argument("--chunk-rows", type=int, default=250_000)
    demo.add_argument("--max-iter", type=int, default=100)
    demo.add_argument("--tol", type=float, default=1e-4)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--output", default="dkmeans-demo-output", help="folder for the model and labels")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv=None) -> int:
    """Entry point of the ``dkmeans`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except (DKMeansError, OSError) as exc:
        print(f"dkmeans: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dkmeans: interrupted", file=sys.stderr)
        return 130
    finally:
        close_embedded_cluster()  # before interpreter shutdown, so it closes quietly


if __name__ == "__main__":
    sys.exit(main())
