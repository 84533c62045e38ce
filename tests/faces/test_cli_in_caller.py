"""``dkmeans fit | sweep | bisect`` on Parquet files whose footers say they are small: read and fitted
in the command's process, no cluster started, with the outputs of the same command on a cluster."""

from __future__ import annotations

import json

import dask
import numpy as np
import pandas as pd
import pytest

from dkmeans import KMeans
from dkmeans import cli as cli_module
from dkmeans.cli import main
from dkmeans.engine import client as engine_client


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Four blobs in 3 Parquet files (float32 and int columns, a string id left out by default)."""
    root = tmp_path_factory.mktemp("small")
    rng = np.random.default_rng(5)
    centres = rng.normal(scale=8.0, size=(4, 3))
    X = np.concatenate([c + rng.normal(size=(900, 3)) for c in centres])[rng.permutation(3600)]
    df = pd.DataFrame(X.astype(np.float32), columns=["a", "b", "c"])
    df["n"] = rng.integers(0, 5, len(df))  # an int column: the rows become float64
    df["id"] = [f"r{i}" for i in range(len(df))]
    (root / "data").mkdir()
    for i, rows in enumerate(np.array_split(np.arange(len(df)), 3)):
        df.iloc[rows].to_parquet(root / "data" / f"part-{i}.parquet")
    return root / "data", df


def _refuse(*args, **kwargs):
    raise AssertionError("the command connected to a cluster")


def _no_cluster(patch):
    """The command may start and join no cluster (nor may the fit: the embedded one refused)."""
    patch.setattr(cli_module, "connect", _refuse)
    patch.setattr(engine_client, "start_local_cluster", _refuse)


def _run(capsys, argv) -> dict:
    assert main([*map(str, argv), "--json"]) == 0, capsys.readouterr().err
    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    outcome.pop("seconds")
    return outcome


def _on_cluster(capsys, argv) -> dict:
    """The same command on the cluster (the session's client is current: the command joins it)."""
    with dask.config.set({"dkmeans.in-process-bytes": 0}):
        return _run(capsys, argv)


def test_fit_of_small_files_runs_in_the_caller_with_the_clusters_outputs(
    client, folder, tmp_path, capsys, monkeypatch
):
    path, df = folder
    argv = ["fit", path, "-k", "4", "--random-state", "1", "--quiet"]
    reference = _on_cluster(capsys, [*argv, "--model", tmp_path / "cluster.npz"])
    with monkeypatch.context() as patch:
        _no_cluster(patch)
        here = _run(capsys, [*argv, "--model", tmp_path / "here.npz"])
    assert engine_client.embedded_client() is None  # dkmeans' record: none started
    assert here.pop("model") != reference.pop("model")
    assert here == reference and here["columns"] == ["a", "b", "c", "n"]
    ours, theirs = KMeans.load(tmp_path / "here.npz"), KMeans.load(tmp_path / "cluster.npz")
    np.testing.assert_allclose(ours.cluster_centers_, theirs.cluster_centers_, rtol=1e-12)
    assert list(ours.feature_names_in_) == list(theirs.feature_names_in_) == ["a", "b", "c", "n"]
    objectives = [[h["objective"] for h in m.history_] for m in (ours, theirs)]
    assert objectives[0] == pytest.approx(objectives[1], rel=1e-12)
    # and scikit-learn's Lloyd from the same centres labels the rows as the model does
    from sklearn.cluster import KMeans as SK

    rows = df[["a", "b", "c", "n"]].astype(np.float64)
    sk = SK(4, init=ours.cluster_centers_, n_init=1, max_iter=1).fit(rows.to_numpy())
    np.testing.assert_array_equal(sk.labels_, ours.predict(rows))


def test_sweep_and_bisect_of_small_files_run_in_the_caller(
    client, folder, tmp_path, capsys, monkeypatch
):
    path, _ = folder
    sweep = ["sweep", path, "-k", "2:6", "--random-state", "0", "--quiet"]
    bisect = ["bisect", path, "-k", "4", "--random-state", "0", "--output"]
    reference = _on_cluster(capsys, sweep)
    with dask.config.set({"dkmeans.in-process-bytes": 0}):
        assert main(list(map(str, [*bisect, tmp_path / "cluster.csv"]))) == 0
    assert "(in-memory)" in capsys.readouterr().out
    with monkeypatch.context() as patch:
        _no_cluster(patch)
        here = _run(capsys, sweep)
        assert main(list(map(str, [*bisect, tmp_path / "here.csv"]))) == 0
    assert engine_client.embedded_client() is None
    assert here["suggested_k"] == reference["suggested_k"] == 4
    for ours, theirs in zip(here.pop("rows"), reference.pop("rows")):
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            if isinstance(value, float):
                assert ours[name] == pytest.approx(value, rel=1e-9, nan_ok=True), name
            else:
                assert ours[name] == value, name
    assert here == reference
    a = pd.read_csv(tmp_path / "here.csv")
    b = pd.read_csv(tmp_path / "cluster.csv")
    np.testing.assert_allclose(a["objective"], b["objective"], rtol=1e-12)


def test_files_larger_than_the_limit_or_out_of_core_join_the_cluster(
    client, folder, tmp_path, capsys, monkeypatch
):
    path, _ = folder
    joined = []
    connect = cli_module.connect
    monkeypatch.setattr(cli_module, "connect", lambda args: joined.append(1) or connect(args))
    argv = ["fit", path, "-k", "4", "--quiet", "--model", tmp_path / "m.npz"]
    with dask.config.set({"dkmeans.in-process-bytes": 3600 * 4 * 8 - 1}):  # one byte short
        assert _run(capsys, argv)["data_mode"] == "in-memory"
    assert joined == [1]
    assert _run(capsys, [*argv, "--out-of-core", "true"])["data_mode"] == "out-of-core"
    assert joined == [1, 1]
    with dask.config.set({"dkmeans.in-process-bytes": 3600 * 4 * 8}):  # exactly the rows' bytes
        _run(capsys, argv)
    assert joined == [1, 1]


def test_missing_values_in_small_files_give_the_clusters_error(client, tmp_path, capsys):
    folder = tmp_path / "gaps"
    folder.mkdir()
    df = pd.DataFrame({"a": [0.0, 1.0, np.nan, 3.0] * 50, "b": np.arange(200.0)})
    df.to_parquet(folder / "part-0.parquet")
    argv = ["fit", folder, "-k", "2", "--quiet", "--model", tmp_path / "m.npz"]
    errors = []
    for limit in (0, 2**20):
        with dask.config.set({"dkmeans.in-process-bytes": limit}):
            assert main(list(map(str, argv))) == 2
        errors.append(capsys.readouterr().err.strip())
    assert errors[0] == errors[1] and "missing" in errors[0], errors
