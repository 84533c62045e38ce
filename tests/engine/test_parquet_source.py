"""Parquet behind ``dd.read_parquet``, read by the engine in row batches (:mod:`dkmeans.engine.sources`).

The same centroids as a float64 Lloyd computed file by file, in memory and out of core; frames
that are not a plain read of some columns are left to Dask.
"""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest

import dkmeans

pq = pytest.importorskip("pyarrow.parquet")
pa = pytest.importorskip("pyarrow")
dd = pytest.importorskip("dask.dataframe")

D, K = 5, 4
COLUMNS = [f"f{j}" for j in range(D)]


def _write(path, sizes, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-10, 10, size=(K, D))
    for i, n in enumerate(sizes):
        X = (centers[rng.integers(0, K, n)] + rng.normal(size=(n, D))).astype(np.float32)
        table = pa.table({**{c: X[:, j] for j, c in enumerate(COLUMNS)}, "label": np.arange(n) % 3})
        pq.write_table(
            table, os.path.join(path, f"part.{i}.parquet"), row_group_size=max(1, n // 3)
        )
    return centers


def _reference(path, n_files, C, steps):
    """``steps`` float64 Lloyd updates of ``C``, reading the files one at a time."""
    for _ in range(steps):
        sums, counts = np.zeros_like(C), np.zeros(len(C))
        for i in range(n_files):
            X = (
                pq.read_table(os.path.join(path, f"part.{i}.parquet"), columns=COLUMNS)
                .to_pandas()
                .to_numpy(np.float64)
            )
            labels = ((C**2).sum(axis=1)[None, :] - 2 * X @ C.T).argmin(axis=1)
            np.add.at(sums, labels, X)
            counts += np.bincount(labels, minlength=len(C))
        C = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], C)
    return C


@pytest.mark.parametrize(
    "out_of_core, limit",
    [(False, None), (False, 0), (True, None)],
    ids=["in-the-caller", "persisted", "out-of-core"],
)
def test_parquet_fit_equals_a_float64_lloyd_file_by_file(client, tmp_path, out_of_core, limit):
    """Files read in the caller (their footers say they fit dkmeans.in-process-bytes), persisted
    on the workers (the limit 0), or read in every pass."""
    sizes = [7000, 3000, 9000, 5000]
    centers = _write(str(tmp_path), sizes)
    C0 = centers + np.random.default_rng(1).normal(scale=2.0, size=centers.shape)
    df = dd.read_parquet(str(tmp_path))[COLUMNS]
    with dask.config.set({} if limit is None else {"dkmeans.in-process-bytes": limit}):
        km = dkmeans.KMeans(K, init=C0, n_init=1, max_iter=4, tol=0.0, out_of_core=out_of_core)
        km.fit(df)
    assert km.data_mode_ == ("out-of-core" if out_of_core else "in-memory")
    np.testing.assert_allclose(
        km.cluster_centers_, _reference(str(tmp_path), len(sizes), C0, 4), rtol=1e-5, atol=1e-4
    )
    labels = km.predict(df).compute()
    assert len(labels) == sum(sizes)


@pytest.mark.parametrize("algorithm", ["lloyd", "hartigan", "minibatch"])
def test_every_kind_of_pass_over_the_files_gives_the_in_memory_fit(client, tmp_path, algorithm):
    """Stateful passes (k-means||'s replayed state), the labels read out of a replayed state
    (Hartigan) and sequential passes (out-of-core mini-batch) over pieces the engine reads."""
    _write(str(tmp_path), [4000, 2500, 3500])
    df = dd.read_parquet(str(tmp_path))[COLUMNS]
    options = dict(random_state=0, n_init=1, max_iter=3)
    if algorithm == "minibatch":
        fit = [
            dkmeans.MiniBatchKMeans(K, batch_size=1024, out_of_core=o, **options).fit(df)
            for o in (True, False)
        ]
    else:
        fit = [
            dkmeans.KMeans(K, algorithm=algorithm, tol=0.0, out_of_core=o, **options).fit(df)
            for o in (True, False)
        ]
    with dask.config.set({"dkmeans.in-process-bytes": 0}):  # persisted on the workers
        estimator = dkmeans.MiniBatchKMeans if algorithm == "minibatch" else dkmeans.KMeans
        persisted_fit = estimator(**fit[1].get_params() | {"out_of_core": False}).fit(df)
    in_caller = fit[1]
    assert in_caller.data_mode_ == persisted_fit.data_mode_ == "in-memory"
    np.testing.assert_allclose(
        in_caller.cluster_centers_, persisted_fit.cluster_centers_, rtol=1e-10, atol=1e-10
    )
    streamed, persisted = fit[0], persisted_fit
    assert (streamed.data_mode_, persisted.data_mode_) == ("out-of-core", "in-memory")
    if algorithm == "minibatch":  # one pass in row order per epoch, against batches drawn at random
        assert np.isfinite(streamed.inertia_) and streamed.cluster_centers_.shape == (K, D)
        labels, predicted = streamed.labels_.compute(), streamed.predict(df).compute()
        np.testing.assert_array_equal(np.asarray(labels), np.asarray(predicted))
        return
    np.testing.assert_allclose(
        streamed.cluster_centers_, persisted.cluster_centers_, rtol=1e-5, atol=1e-4
    )
    assert streamed.inertia_ == pytest.approx(persisted.inertia_, rel=1e-5)


def test_a_frame_that_is_not_a_plain_parquet_read_is_read_by_dask(tmp_path):
    from dkmeans.engine.sources import parquet_source

    path = str(tmp_path)
    X = np.arange(40, dtype=np.float32).reshape(10, 4)
    pq.write_table(pa.table({f"f{j}": X[:, j] for j in range(4)}), os.path.join(path, "a.parquet"))
    plain = parquet_source(dd.read_parquet(path)[["f0", "f2"]], np.float32)
    assert plain is not None and plain.n_rows == 10 and plain.columns == ["f0", "f2"]
    np.testing.assert_array_equal(plain.read(0), X[:, [0, 2]])
    assert parquet_source(dd.read_parquet(path, filters=[("f0", ">", 3)]), np.float32) is None
    df = dd.read_parquet(path)
    assert parquet_source(df[df.f0 > 3], np.float32) is None


def test_csv_files_read_through_read_table_are_streamed_in_row_batches_with_the_in_memory_fit(
    client, tmp_path, monkeypatch
):
    """CSV read with :func:`dkmeans.engine.files.read_table` (the CLI's input): the engine cuts each file at
    line ends (pieces of at most 60 kB here, several per file), counts their rows on the workers and
    reads only the feature columns in batches; the fit equals the in-memory one, where Dask parses
    the files with pandas."""
    import pandas as pd

    import dkmeans.engine.sources as sources
    from dkmeans.engine.files import read_table

    monkeypatch.setattr(sources, "PIECE_BYTES", 60_000)
    rng = np.random.default_rng(4)
    centers = rng.uniform(-10, 10, size=(K, D))
    sizes = [7000, 3000, 9000]
    for i, n in enumerate(sizes):
        X = centers[rng.integers(0, K, n)] + rng.normal(size=(n, D))
        frame = pd.DataFrame(X, columns=COLUMNS)
        frame.insert(
            2, "name", [f"row {j}, file {i}" for j in range(n)]
        )  # quoted, with a comma: not read
        frame.to_csv(tmp_path / f"part.{i}.csv", index=False)
    with open(tmp_path / "part.1.csv", "a") as f:
        f.write("\n\n")  # blank lines at the end: no rows, for pandas as for pyarrow
    df = read_table(str(tmp_path / "*.csv"), columns=COLUMNS)
    source = sources.parquet_source(df, np.float64)
    assert isinstance(source, sources.CsvSource) and len(source.pieces) > 2 * len(sizes)
    C0 = centers + rng.normal(scale=2.0, size=centers.shape)
    ours = dkmeans.KMeans(K, init=C0, n_init=1, max_iter=5, tol=0.0, out_of_core=True).fit(df)
    ref = dkmeans.KMeans(K, init=C0, n_init=1, max_iter=5, tol=0.0, out_of_core=False).fit(df)
    assert ours.data_mode_ == "out-of-core" and ref.data_mode_ == "in-memory"
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=1e-10, atol=1e-10)
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-10) and ours.n_iter_ == ref.n_iter_
    # every row, in the files' order: the source's pieces read back are pandas' parse of the files
    source = sources.parquet_source(df, np.float64)
    sources.count_rows(client, source, client.gather)
    assert source.n_rows == sum(sizes)
    read = np.concatenate([source.read(p) for p in range(len(source.pieces))])
    np.testing.assert_array_equal(read, df.compute().to_numpy())


def test_csv_frames_not_read_through_read_table_are_read_by_dask(tmp_path):
    from dkmeans.engine.sources import parquet_source

    path = tmp_path / "a.csv"
    path.write_text("a,b\n1,2\n3,4\n")
    assert parquet_source(dd.read_csv(str(path)), np.float64) is None
