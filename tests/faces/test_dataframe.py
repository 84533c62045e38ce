"""DataFrames in and out: columns, unknown lengths, empty partitions, index alignment, files."""

from __future__ import annotations

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pytest

import dkmeans
from dkmeans import Descriptor, KMeans, infer, train
from dkmeans.engine.files import read_table, write_parquet
from dkmeans.errors import DataTypeError, InvalidDataError, InvalidParameterError
from dkmeans.io import ModelFileError
from dkmeans.testing import make_blobs, pick_rows


@pytest.fixture(scope="module")
def frame():
    X, truth, _ = make_blobs(3000, 3, 4, spread=1.0, seed=12)
    pdf = pd.DataFrame(X, columns=["x", "y", "z"], index=np.arange(10_000, 13_000))
    pdf["name"] = [f"row{i}" for i in range(len(pdf))]
    pdf["truth"] = truth
    return pdf


def test_dask_dataframe_unknown_lengths_and_empty_partitions(client, frame):
    ddf = dd.from_pandas(frame, npartitions=6)
    ddf = ddf[
        (ddf.x > -100) & ((ddf.index < 10_500) | (ddf.index >= 11_000))
    ]  # partition 2 becomes empty
    assert np.isnan(ddf[["x"]].to_dask_array().shape[0])
    local = frame[(frame.index < 10_500) | (frame.index >= 11_000)]
    C0 = pick_rows(local[["x", "y", "z"]].to_numpy(), 4, seed=3)
    km = KMeans(4, init=C0).fit(ddf[["x", "y", "z"]])
    ref = KMeans(4, init=C0).fit(local[["x", "y", "z"]])
    np.testing.assert_allclose(km.cluster_centers_, ref.cluster_centers_, rtol=1e-10)
    assert list(km.feature_names_in_) == ["x", "y", "z"]
    # labels_ is a Dask Series on the input's index and partitions
    labels = km.labels_.compute()
    assert isinstance(labels, pd.Series) and labels.index.equals(local.index)
    np.testing.assert_array_equal(labels.to_numpy(), ref.labels_)


def test_predict_returns_aligned_series_without_shuffle(client, frame):
    ddf = dd.from_pandas(frame, npartitions=5)
    km = KMeans(4, random_state=0).fit(frame[["x", "y", "z"]])
    pred = km.predict(ddf[["x", "y", "z"]])
    assert pred.npartitions == ddf.npartitions and pred.divisions == ddf.divisions
    out = ddf.assign(cluster=pred).compute()
    np.testing.assert_array_equal(out["cluster"].to_numpy(), km.predict(frame[["x", "y", "z"]]))
    assert out.index.equals(frame.index)
    dist = km.transform(ddf[["x", "y", "z"]])
    assert list(dist.columns) == ["kmeans0", "kmeans1", "kmeans2", "kmeans3"]
    np.testing.assert_allclose(
        dist.compute().to_numpy(), km.transform(frame[["x", "y", "z"]]), rtol=1e-9
    )


def test_feature_names_are_checked(client, frame):
    ddf = dd.from_pandas(frame[["x", "y", "z"]], npartitions=3)
    km = KMeans(4, random_state=0).fit(ddf)
    with pytest.raises(InvalidDataError, match="reordered"):
        km.predict(ddf[["y", "x", "z"]])
    with pytest.raises(InvalidDataError, match="renamed"):
        km.predict(ddf.rename(columns={"x": "xx"}))
    with pytest.raises(InvalidDataError, match="feature names"):
        km.predict(frame[["y", "x", "z"]])


def test_non_numeric_columns_are_named(client, frame):
    with pytest.raises(DataTypeError, match=r"\['name'\] are not numeric"):
        KMeans(4).fit(frame)
    with pytest.raises(DataTypeError, match=r"\['name'\] are not numeric"):
        KMeans(4).fit(dd.from_pandas(frame, npartitions=2))


def test_functional_columns_option(client, frame):
    ddf = dd.from_pandas(frame, npartitions=4)
    desc = Descriptor(cluster_count=4, dtype=np.float64)
    res = train(desc, ddf, columns=["x", "y", "z"], random_state=1)
    assert isinstance(res.labels, dd.Series)
    assert res.labels.compute().index.equals(frame.index)
    inf = infer(desc, res.model, ddf, columns=["x", "y", "z"])
    np.testing.assert_array_equal(inf.labels.compute().to_numpy(), res.labels.compute().to_numpy())
    assert inf.objective_function_value == pytest.approx(res.objective_function_value, rel=1e-12)
    with pytest.raises(InvalidParameterError, match="not found"):
        train(desc, ddf, columns=["x", "nope"])
    with pytest.raises(DataTypeError, match="not numeric"):
        train(desc, frame, columns=["x", "name"])
    with pytest.raises(InvalidParameterError, match="columns="):
        train(desc, frame[["x", "y"]].to_numpy(), columns=["x"])


def test_parquet_and_csv_round_trip(client, frame, tmp_path):
    ddf = dd.from_pandas(frame, npartitions=3)
    ddf.to_parquet(tmp_path / "in.parquet", write_index=True)
    frame.to_csv(tmp_path / "in.csv", index=False)
    pq = read_table(tmp_path / "in.parquet", columns=["x", "y", "z"])
    csv = read_table(tmp_path / "in.csv", columns=["x", "y", "z"])
    km = KMeans(4, random_state=2).fit(pq)
    km_csv = KMeans(4, random_state=2).fit(csv)
    np.testing.assert_allclose(km.cluster_centers_, km_csv.cluster_centers_, rtol=1e-12)
    full = read_table(tmp_path / "in.parquet")
    out = write_parquet(
        full.assign(cluster=km.predict(full[["x", "y", "z"]])), tmp_path / "out.parquet"
    )
    back = pd.read_parquet(out)
    assert len(list(out.glob("*.parquet"))) == full.npartitions  # partitioned like the input
    assert back.index.equals(frame.index) and (back["name"] == frame["name"]).all()
    np.testing.assert_array_equal(back["cluster"].to_numpy(), km.predict(frame[["x", "y", "z"]]))
    with pytest.raises(InvalidDataError, match="does not exist"):
        read_table(tmp_path / "missing.parquet")


def test_estimator_save_load_round_trip(client, frame, tmp_path):
    km = KMeans(4, random_state=0).fit(frame[["x", "y", "z"]])
    path = km.save(tmp_path / "km")
    loaded = KMeans.load(path)
    np.testing.assert_array_equal(loaded.cluster_centers_, km.cluster_centers_)
    assert loaded.get_params() == km.get_params()
    assert list(loaded.feature_names_in_) == ["x", "y", "z"]
    assert (loaded.inertia_, loaded.n_iter_, loaded.history_) == (
        km.inertia_,
        km.n_iter_,
        km.history_,
    )
    np.testing.assert_array_equal(loaded.cluster_sizes_, km.cluster_sizes_)
    np.testing.assert_array_equal(loaded.cluster_inertia_, km.cluster_inertia_)
    assert loaded.imbalance_ == km.imbalance_ and km.cluster_sizes_.sum() == len(frame)
    np.testing.assert_array_equal(
        loaded.predict(frame[["x", "y", "z"]]), km.predict(frame[["x", "y", "z"]])
    )
    bare = dkmeans.io.save_model(tmp_path / "bare", dkmeans.Model(km.cluster_centers_))
    assert bare == tmp_path / "bare"  # the file named, no suffix added
    with pytest.raises(ModelFileError, match="not a saved dkmeans.KMeans"):
        KMeans.load(bare)


def test_model_file_rejects_tampering_and_versions(tmp_path):
    import json

    C = np.arange(6, dtype=np.float64).reshape(3, 2)
    path = dkmeans.io.save_model(tmp_path / "m", dkmeans.Model(C))
    with np.load(path) as f:
        arrays = {k: f[k] for k in f.files}
    tampered = dict(arrays, centroids=arrays["centroids"] + 1)
    np.savez(tmp_path / "tampered.npz", **tampered)
    with pytest.raises(ModelFileError, match="altered"):
        dkmeans.io.load_model(tmp_path / "tampered.npz")
    meta = json.loads(arrays["metadata"].tobytes())
    meta["format_version"] = 99
    blob = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(tmp_path / "v99.npz", centroids=arrays["centroids"], metadata=blob)
    with pytest.raises(ModelFileError, match="version 99 is not supported"):
        dkmeans.io.load_model(tmp_path / "v99.npz")
