"""Cluster-quality scores: dkmeans.metrics beside scikit-learn's, in memory, on a cluster, out of core.

Blobs of ``--rows`` x 16 float64 (8 centres) and a dkmeans KMeans(8) fitted on them; the
partition scored is the model's (each row's nearest centre). For each score: its value
relative to scikit-learn's on ``(X, km.predict(X))`` (the sampled silhouette: against
scikit-learn on the same sampled rows) and seconds. dkmeans runs the scores in this
process (NumPy in), on a 2-worker LocalCluster (a Dask array persisted there), and out
of core (a Parquet folder streamed in every pass, Dask config ``dkmeans.out-of-core=True``),
and reports the passes over the data.

Run:  .venv/bin/python benchmarks/quality_metrics.py [--rows 200000]
JSON goes to ``benchmarks/results/quality_metrics.json``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_json  # noqa: E402


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--sample-size", type=int, default=10_000)
    args = parser.parse_args()

    import dask
    import dask.array as da
    import dask.dataframe as dd
    import pandas as pd
    from sklearn import metrics as sk

    import dkmeans
    from dkmeans import metrics
    from dkmeans.drivers.streams import stream
    from dkmeans.kernels.sampling import uniform_by_index
    from dkmeans.testing import local_cluster, make_blobs

    X, _, _ = make_blobs(args.rows, 16, 8, spread=2.0, box=10.0, seed=0)
    km = dkmeans.KMeans(8, random_state=0).fit(X)
    labels = km.predict(X)
    m = args.sample_size
    u = uniform_by_index(np.arange(len(X), dtype=np.int64), 0, stream("silhouette.sample"))
    index = np.sort(
        np.argsort(-u, kind="stable")[:m]
    )  # the rows dkmeans' sample draws (random_state=0)

    rows = []
    ref = {}
    for name, fn, call in (
        ("calinski_harabasz", sk.calinski_harabasz_score, lambda: (X, labels)),
        ("davies_bouldin", sk.davies_bouldin_score, lambda: (X, labels)),
        ("silhouette (sample)", sk.silhouette_score, lambda: (X[index], labels[index])),
    ):
        ref[name], seconds = timed(fn, *call())
        rows.append(dict(where="scikit-learn", score=name, value=ref[name], seconds=seconds))

    def ours(where, data, passes_of=None):
        for name, fn, kw in (
            ("calinski_harabasz", metrics.calinski_harabasz_score, {}),
            ("davies_bouldin", metrics.davies_bouldin_score, {}),
            ("silhouette (sample)", metrics.silhouette_score, dict(sample_size=m, random_state=0)),
        ):
            value, seconds = timed(fn, data, km, **kw)
            rows.append(
                dict(
                    where=where,
                    score=name,
                    value=value,
                    seconds=seconds,
                    rel_diff=abs(value - ref[name]) / abs(ref[name]),
                )
            )
        scores, seconds = timed(metrics.cluster_scores, data, km)
        rows.append(
            dict(
                where=where,
                score="cluster_scores (all)",
                seconds=seconds,
                passes=scores.n_passes,
                data_mode=scores.data_mode,
            )
        )

    ours("dkmeans, in this process", X)
    with local_cluster(2, set_as_default=True) as client, client.as_current():
        ours("dkmeans, 2 workers", da.from_array(X, chunks=(50_000, 16)))
        with tempfile.TemporaryDirectory() as tmp:
            frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(16)])
            for i, start in enumerate(range(0, len(X), 50_000)):
                frame.iloc[start : start + 50_000].to_parquet(Path(tmp) / f"part{i:03d}.parquet")
            with dask.config.set({"dkmeans.out-of-core": True}):
                ours("dkmeans, 2 workers, Parquet out of core", dd.read_parquet(tmp))

    print(f"{args.rows} x 16 float64, k=8, sample_size={m}")
    print("| where | score | seconds | value / relative difference to scikit-learn | passes |")
    print("|---|---|---|---|---|")
    for r in rows:
        detail = (
            f"{r['value']:.6g}"
            if "rel_diff" not in r and "value" in r
            else f"{r['rel_diff']:.1e}"
            if "rel_diff" in r
            else r.get("data_mode", "")
        )
        print(
            f"| {r['where']} | {r['score']} | {r['seconds']:.2f} | {detail} | {r.get('passes', '')} |"
        )
    write_json(
        "quality_metrics.json", dict(machine=machine(), rows=args.rows, sample_size=m, results=rows)
    )


if __name__ == "__main__":
    main()
