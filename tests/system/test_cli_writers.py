"""The command line on files as others write them, in processes of its own: a Spark folder fitted
out of core and labelled, a CSV file with missing values (a one-line error, or the rows left out
and labelled null). The data and the in-process cases are in ``tests/faces/test_parquet_writers.py``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dkmeans import KMeans
from tests.faces.test_parquet_writers import (  # noqa: F401 (csv_with_missing: a fixture)
    FEATURES,
    N,
    csv_with_missing,
    error_lines,
    reference,
    write_spark,
)
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def spark_folder(tmp_path_factory):
    """The rows as Spark writes them (``write_spark``)."""
    root = tmp_path_factory.mktemp("writers") / "spark"
    write_spark(root)
    return root


def test_cli_fits_and_labels_a_spark_folder(spark_folder, tmp_path):
    ref = reference()
    model = tmp_path / "model.npz"
    res = run_cli(
        "fit",
        spark_folder,
        "-k",
        "3",
        "--columns",
        *FEATURES,
        "--model",
        model,
        "--workers",
        1,
        "--out-of-core",
        "true",
        "--quiet",
    )
    assert res.returncode == 0, res.stderr
    fitted = KMeans.load(
        model
    ).cluster_centers_  # seeded by k-means||: the same clusters, in its order
    np.testing.assert_allclose(
        fitted[np.argsort(fitted[:, 2])],
        ref.cluster_centers_[np.argsort(ref.cluster_centers_[:, 2])],
        rtol=1e-6,
    )
    res = run_cli("predict", model, spark_folder, "--output", tmp_path / "labelled", "--workers", 1)
    assert res.returncode == 0, res.stderr
    out = pd.read_parquet(tmp_path / "labelled")
    assert len(out) == N and out["cluster"].between(0, 2).all()
    assert f"written to {tmp_path / 'labelled'} " in res.stdout


def test_cli_predict_with_missing_skip_keeps_every_row_with_a_null_label(
    csv_with_missing,  # noqa: F811 - the fixture imported above
    tmp_path,
):
    path, complete = csv_with_missing
    model = tmp_path / "m.npz"
    res = run_cli(
        "fit", path, "-k", "3", "--columns", *FEATURES, "--model", model, "--workers", 1, "--quiet"
    )
    assert res.returncode == 2, res.stderr
    assert error_lines(res) == [
        "dkmeans: error: X: missing values (NaN or null) in column(s) 'y' (2), 'amount' (1): "
        "remove or impute them, or pass missing='skip' to leave such rows out of the fit "
        "(predict labels them -1)"
    ]
    res = run_cli(
        "fit",
        path,
        "-k",
        "3",
        "--columns",
        *FEATURES,
        "--model",
        model,
        "--workers",
        1,
        "--quiet",
        "--missing",
        "skip",
    )
    assert res.returncode == 0, res.stderr
    res = run_cli(
        "predict", model, path, "--output", tmp_path / "out", "--workers", 1, "--missing", "skip"
    )
    assert res.returncode == 0, res.stderr
    out = pd.read_parquet(tmp_path / "out")
    assert len(out) == N and out["cluster"].isna().to_numpy().tolist() == (~complete).tolist()
