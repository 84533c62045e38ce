"""ETL: Parquet in, labelled Parquet out, on a local Dask cluster, without a shuffle.

Run: .venv/bin/python examples/etl_parquet.py [WORKDIR]
Writes a small partitioned Parquet data set, clusters two of its columns, and writes the
same partitions back with a ``cluster`` column (index and other columns untouched).
"""

import sys
import tempfile
from pathlib import Path

import dask.dataframe as dd
import numpy as np
import pandas as pd

import dkmeans
from dkmeans.io.files import read_table, write_parquet
from dkmeans.testing import make_blobs


def make_input(folder: Path) -> Path:
    X, _, _ = make_blobs(120_000, 2, 5, spread=1.2, seed=7)
    df = pd.DataFrame({"customer": np.arange(len(X)), "spend": X[:, 0], "visits": X[:, 1],
                       "region": np.random.default_rng(0).choice(["north", "south"], len(X))})
    path = folder / "customers.parquet"
    dd.from_pandas(df, npartitions=6).to_parquet(path, write_index=False)
    return path


def main(workdir: str | None = None) -> None:
    folder = Path(workdir or tempfile.mkdtemp(prefix="dkmeans-etl-"))
    source = make_input(folder)

    df = read_table(source)                              # a lazy Dask DataFrame, 6 partitions
    df = df[df.spend > -50]                              # a filter: partition lengths now unknown
    km = dkmeans.KMeans(n_clusters=5, random_state=0).fit(df[["spend", "visits"]])
    labelled = df.assign(cluster=km.predict(df[["spend", "visits"]]))   # aligned, no shuffle
    out = write_parquet(labelled, folder / "customers_labelled.parquet")
    km.save(folder / "segments.npz")

    back = pd.read_parquet(out)
    print(f"{len(back):,} rows in {df.npartitions} partitions -> {out}")
    print(back.groupby("cluster")[["spend", "visits"]].mean().round(2))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
