"""ETL: Parquet in, labelled Parquet out, on a Dask cluster, without a shuffle
===========================================================================

Run: .venv/bin/python examples/etl_parquet.py [WORKDIR]
Writes a small partitioned Parquet data set, clusters two of its columns, and writes the
same partitions back with a ``cluster`` column (index and other columns untouched).

``segment`` is the whole pipeline; it runs unchanged on a Parquet folder larger than the
cluster's memory (dkmeans then reads the partitions in every pass instead of keeping them):
``benchmarks/out_of_core_faces.py`` runs it that way.
"""

import sys
import tempfile
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pandas as pd

import dkmeans
from dkmeans.engine.files import read_table, write_parquet
from dkmeans.testing import make_blobs


def make_input(folder: Path) -> Path:
    X, _, _ = make_blobs(120_000, 2, 5, spread=1.2, seed=7)
    df = pd.DataFrame(
        {
            "customer": np.arange(len(X)),
            "spend": X[:, 0],
            "visits": X[:, 1],
            "region": np.random.default_rng(0).choice(["north", "south"], len(X)),
        }
    )
    path = folder / "customers.parquet"
    dd.from_pandas(df, npartitions=6).to_parquet(path, write_index=False)
    return path


def segment(source, columns, n_clusters: int, out_folder: Path, **fit_params):
    """Cluster ``columns`` of the Parquet data at ``source``; write it back with a ``cluster`` column.

    Returns the fitted estimator and the path of the labelled Parquet folder.
    """
    df = read_table(source)  # a lazy Dask DataFrame
    df = df[df[columns[0]] > -50]  # a filter: partition lengths now unknown
    km = dkmeans.KMeans(n_clusters=n_clusters, random_state=0, **fit_params).fit(df[columns])
    labelled = df.assign(cluster=km.predict(df[columns]))  # aligned, no shuffle
    out = write_parquet(labelled, out_folder / "labelled.parquet")
    km.save(out_folder / "segments.npz")
    return km, out


def main(workdir: str | None = None) -> None:
    folder = Path(workdir or tempfile.mkdtemp(prefix="dkmeans-etl-"))
    km, out = segment(make_input(folder), ["spend", "visits"], 5, folder)

    back = pd.read_parquet(out)
    print(f"{len(back):,} rows in {back.shape[1]} columns, fitted {km.data_mode_} -> {out}")
    print(back.groupby("cluster")[["spend", "visits"]].mean().round(2))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
