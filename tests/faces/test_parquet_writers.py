"""Parquet as others write it (Spark, pandas, polars, pyarrow.dataset) and CSV with a header and missing
values: each fits with the columns a user names, in memory and out of core, with the centroids of the
float64 fit of the same numbers.

Spark is not installed: its layout is built with pyarrow as Spark writes it (``part-*.snappy.parquet``
files beside ``_SUCCESS`` and ``.crc`` files, hive-partitioned ``key=value/`` folders, decimal,
timestamp and nested columns that are not selected). The command line on the same files, in
processes of its own, is in ``tests/system/test_cli_writers.py``.
"""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from dkmeans import KMeans
from dkmeans.engine.files import read_table
from dkmeans.errors import DataSourceError, InvalidDataError

polars = pytest.importorskip("polars")

_rng = np.random.default_rng(11)
N = 240
CENTRES = np.array([[0.0, 0.0, 100.0], [20.0, 5.0, 300.0], [5.0, 25.0, 600.0]])
# x, y: float64 and int32 in the files; amount: decimal128(12, 2) (cents, exact in float64)
NUMBERS = np.concatenate(
    [
        c
        + np.column_stack(
            [_rng.normal(0, 2, 80), _rng.integers(-3, 4, 80), _rng.integers(-4000, 4000, 80) / 100]
        )
        for c in CENTRES
    ]
)
NUMBERS[:, 1] = np.round(NUMBERS[:, 1])
NUMBERS[:, 2] = np.round(NUMBERS[:, 2], 2)
INIT = CENTRES + 1.0
FEATURES = ["x", "y", "amount"]


def spark_table() -> pa.Table:
    """A table with Spark's column types: long id, double, int, decimal(12,2), timestamp, a struct and a list."""
    return pa.table(
        {
            "id": pa.array(np.arange(N), pa.int64()),
            "x": pa.array(NUMBERS[:, 0], pa.float64()),
            "y": pa.array(NUMBERS[:, 1].astype(np.int32), pa.int32()),
            "amount": pa.array([Decimal(f"{v:.2f}") for v in NUMBERS[:, 2]], pa.decimal128(12, 2)),
            "ts": pa.array(
                pd.date_range("2025-01-01", periods=N, freq="min").to_numpy(), pa.timestamp("us")
            ),
            "meta": pa.array([{"source": "s", "tags": ["a", "b"]}] * N),
            "region": pa.array(np.where(np.arange(N) % 3 == 0, "eu", "us")),
        }
    )


def write_spark(root) -> None:
    """``root/region=eu/part-00000-<uuid>-c000.snappy.parquet``, ..., ``root/_SUCCESS``, ``.crc`` files."""
    table = spark_table()
    for region in ("eu", "us"):
        part = table.filter(pa.compute.equal(table["region"], region)).drop_columns(["region"])
        folder = root / f"region={region}"
        folder.mkdir(parents=True)
        for i, start in enumerate(range(0, part.num_rows, 50)):
            name = f"part-{i:05d}-6f1c2d3e-0000-4000-8000-000000000000.c000.snappy.parquet"
            pq.write_table(
                part.slice(start, 50), folder / name, compression="snappy", row_group_size=20
            )
            (folder / f".{name}.crc").write_bytes(b"crc")
    (root / "_SUCCESS").write_bytes(b"")


def error_lines(res) -> list:
    """stderr's lines but distributed's own warnings of a slow cluster shutdown (a busy machine's)."""
    return [line for line in res.stderr.strip().splitlines() if " - distributed." not in line]


def reference(numbers=NUMBERS) -> KMeans:
    return KMeans(3, init=INIT, n_init=1).fit(numbers.astype(np.float64))


WRITERS = ["spark", "pandas", "polars", "pyarrow_dataset", "csv"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """Every writer's output of the same rows: ``{writer: path}``."""
    root = tmp_path_factory.mktemp("writers")
    write_spark(root / "spark")
    frame = spark_table().drop_columns(["meta"]).to_pandas()
    frame.to_parquet(root / "pandas.parquet")  # one file, with pandas' metadata and its index
    polars.from_pandas(frame.drop(columns=["ts"])).write_parquet(
        root / "polars.parquet", row_group_size=64
    )
    pads.write_dataset(
        spark_table(),
        root / "pyarrow_dataset",
        format="parquet",
        partitioning=["region"],
        partitioning_flavor="hive",
        max_rows_per_file=100,
        max_rows_per_group=50,
    )
    csv = frame[["id", "x", "y"]].assign(amount=NUMBERS[:, 2], ts=frame["ts"])
    (root / "csv").mkdir()
    csv.iloc[:100].to_csv(root / "csv" / "part-0.csv", index=False)
    csv.iloc[100:].to_csv(root / "csv" / "part-1.csv", index=False)
    return {
        "spark": root / "spark",
        "pandas": root / "pandas.parquet",
        "polars": root / "polars.parquet",
        "pyarrow_dataset": root / "pyarrow_dataset",
        "csv": root / "csv",
    }


@pytest.mark.parametrize("out_of_core", [False, True])
@pytest.mark.parametrize("writer", WRITERS)
def test_each_writer_fits_the_named_columns(client, written, writer, out_of_core):
    df = read_table(written[writer], columns=FEATURES)
    ref = reference()
    km = KMeans(3, init=INIT, n_init=1, out_of_core=out_of_core).fit(df)
    assert km.data_mode_ == ("out-of-core" if out_of_core else "in-memory")
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=1e-9)
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-9)
    assert list(km.feature_names_in_) == FEATURES


def test_spark_folder_keeps_its_partition_and_other_columns_out_of_the_fit(client, written):
    df = read_table(written["spark"])
    assert {"id", "x", "y", "amount", "ts", "meta", "region"} <= set(df.columns)
    km = KMeans(3, init=INIT, n_init=1).fit(df[FEATURES])
    labels = km.predict(df[FEATURES]).compute()
    assert len(labels) == N and labels.between(0, 2).all()


# -- CSV with a header and missing values --------------------------------------------------------------
@pytest.fixture
def csv_with_missing(tmp_path):
    frame = pd.DataFrame(
        {"id": np.arange(N), "x": NUMBERS[:, 0], "y": NUMBERS[:, 1], "amount": NUMBERS[:, 2]}
    )
    frame.loc[[4, 100], "y"] = np.nan
    frame.loc[200, "amount"] = np.nan
    path = tmp_path / "with_missing.csv"
    frame.to_csv(path, index=False, na_rep="")
    complete = frame[FEATURES].notna().all(axis=1).to_numpy()
    return path, complete


@pytest.mark.parametrize("out_of_core", [False, True])
def test_csv_with_missing_values_errors_or_skips(client, csv_with_missing, out_of_core):
    path, complete = csv_with_missing
    df = read_table(path, columns=FEATURES)
    with pytest.raises(
        InvalidDataError, match=r"missing values \(NaN or null\) in column\(s\) '(y|amount)'"
    ):
        KMeans(3, init=INIT, n_init=1, out_of_core=out_of_core).fit(df)
    ref = reference(NUMBERS[complete])
    km = KMeans(3, init=INIT, n_init=1, out_of_core=out_of_core, missing="skip").fit(df)
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=1e-9)
    labels = km.predict(df).compute().to_numpy()
    assert (labels[~complete] == -1).all() and (labels[complete] == ref.labels_).all()


def test_paths_that_do_not_exist_or_match_nothing_say_so(tmp_path):
    with pytest.raises(DataSourceError, match="no file matches"):
        read_table(str(tmp_path / "*.parquet"))
    with pytest.raises(DataSourceError, match="does not exist"):
        read_table(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "_SUCCESS").write_bytes(b"")
    with pytest.raises(DataSourceError, match="holds no data file"):
        read_table(tmp_path / "empty")
