"""``dkmeans bisect``: the objective at every k from one fit, on Parquet; its user errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dkmeans import BisectingKMeans
from dkmeans.cli import main


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    from dkmeans.testing import make_blobs

    root = tmp_path_factory.mktemp("bisect")
    X, truth, _ = make_blobs(2000, 2, 4, spread=0.8, seed=5)
    df = pd.DataFrame(X, columns=["a", "b"])
    df["truth"] = truth
    (root / "data").mkdir()
    df.iloc[:1100].to_parquet(root / "data" / "part0.parquet")
    df.iloc[1100:].to_parquet(root / "data" / "part1.parquet")
    return root, df


def test_bisect_prints_every_k_and_writes_them(client, parquet_dir, capsys):
    root, df = parquet_dir
    output = root / "objectives.csv"
    code = main(
        [
            "bisect",
            str(root / "data"),
            "-k",
            "6",
            "--exclude",
            "truth",
            "--init",
            "k-means++",
            "--random-state",
            "3",
            "--output",
            str(output),
            "--scheduler",
            client.scheduler.address,
            "--quiet",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4, 5, 6]
    written = pd.read_csv(output)
    reference = BisectingKMeans(6, init="k-means++", random_state=3).fit(df[["a", "b"]].to_numpy())
    np.testing.assert_allclose(written["objective"], reference.inertia_per_k_, rtol=1e-9)


def test_bisect_bad_option_is_a_clear_error(parquet_dir, capsys):
    root, _ = parquet_dir
    assert main(["bisect", str(root / "data"), "-k", "0"]) == 2
    assert "must be an integer >= 1" in capsys.readouterr().err


def test_bisect_reads_parquet_out_of_core(client, parquet_dir, capsys):
    root, df = parquet_dir
    output = root / "streamed.csv"
    code = main(
        [
            "bisect",
            str(root / "data"),
            "-k",
            "5",
            "--columns",
            "a",
            "b",
            "--random-state",
            "1",
            "--out-of-core",
            "true",
            "--output",
            str(output),
            "--scheduler",
            client.scheduler.address,
            "--quiet",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "(out-of-core)" in out
    reference = BisectingKMeans(5, random_state=1).fit(df[["a", "b"]].to_numpy())
    np.testing.assert_allclose(
        pd.read_csv(output)["objective"], reference.inertia_per_k_, rtol=1e-9
    )
