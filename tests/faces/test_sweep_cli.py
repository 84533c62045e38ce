"""``dkmeans sweep``: the table per k, the suggested k, model files and the plot; its user errors."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dkmeans import KMeans
from dkmeans.cli import main, parse_k_values
from dkmeans.errors import InvalidParameterError


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    from dkmeans.testing import make_blobs

    root = tmp_path_factory.mktemp("sweep")
    X, truth, _ = make_blobs(3000, 2, 4, spread=0.8, seed=3)
    df = pd.DataFrame(X, columns=["a", "b"])
    df["truth"] = truth
    (root / "data").mkdir()
    df.iloc[:1700].to_parquet(root / "data" / "part0.parquet")
    df.iloc[1700:].to_parquet(root / "data" / "part1.parquet")
    return root


def test_sweep_prints_the_table_and_writes_models_and_plot(client, parquet_dir, capsys):
    pytest.importorskip("matplotlib")
    models, plot = parquet_dir / "models", parquet_dir / "sweep.png"
    code = main(
        [
            "sweep",
            str(parquet_dir / "data"),
            "-k",
            "2:6:2,3",
            "--exclude",
            "truth",
            "--random-state",
            "0",
            "--save-models",
            str(models),
            "--plot",
            str(plot),
            "--scheduler",
            client.scheduler.address,
            "--quiet",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    rows = [line.split() for line in lines if line.split() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [2, 3, 4, 6]
    assert any(line.startswith("suggested k: 4 (") for line in lines), out  # 4 blobs
    rules = next(line for line in lines if line.startswith("each rule's k: "))
    assert all(
        f"{name} " in rules
        for name in ("elbow", "calinski_harabasz", "davies_bouldin", "silhouette", "gap", "bic")
    )
    header = next(line for line in lines if line.split() and line.split()[0] == "k")
    assert all(
        name in header.split()
        for name in ("calinski_harabasz", "silhouette", "gap", "gap_sd", "bic")
    )
    assert any(line.startswith("passes over the data: ") for line in lines)
    assert sorted(p.name for p in models.iterdir()) == [
        "kmeans-k2.npz",
        "kmeans-k3.npz",
        "kmeans-k4.npz",
        "kmeans-k6.npz",
    ]
    assert plot.stat().st_size > 5_000
    # a model file is the single fit's model (the sweep's seed, the same columns)
    from dkmeans.engine.files import read_table

    single = KMeans(4, random_state=0).fit(read_table(str(parquet_dir / "data"))[["a", "b"]])
    saved = KMeans.load(models / "kmeans-k4.npz")
    np.testing.assert_allclose(saved.cluster_centers_, single.cluster_centers_, rtol=1e-8)
    assert list(saved.feature_names_in_) == ["a", "b"]
    row = next(r for r in rows if r[0] == "4")
    assert (
        float(row[1]) == pytest.approx(single.inertia_, rel=1e-6) and int(row[2]) == single.n_iter_
    )


@pytest.mark.parametrize(
    "k, fragment",
    [
        ("0:3", "-k: k_values must hold integers >= 1"),
        ("2:x", "-k takes lo:hi[:step]"),
        ("5:2", "needs lo <= hi"),
        ("2,4,4", "distinct"),
    ],
)
def test_bad_k_is_one_line_and_exit_2(parquet_dir, capsys, k, fragment):
    code = main(["sweep", str(parquet_dir / "data"), "-k", k, "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().count("\n") == 0 and fragment in err, err


def test_minibatch_is_not_a_choice(parquet_dir, capsys):
    with pytest.raises(SystemExit) as info:  # argparse: usage, then the error
        main(
            ["sweep", str(parquet_dir / "data"), "-k", "2:3", "--algorithm", "minibatch", "--quiet"]
        )
    assert info.value.code == 2 and "invalid choice: 'minibatch'" in capsys.readouterr().err


def test_k_values_syntax():
    assert parse_k_values("2:8:3") == [2, 5, 8]
    assert parse_k_values("2:9:3") == [2, 5, 8]
    assert parse_k_values("16,2:4") == [2, 3, 4, 16]
    assert parse_k_values("7") == [7]
    with pytest.raises(InvalidParameterError, match="step >= 1"):
        parse_k_values("2:8:0")


def test_sweep_by_a_bisecting_tree_saves_the_suggested_k_s_refit(parquet_dir, tmp_path, capsys):
    """In process, Parquet: every k from one bisecting fit; the model file is KMeans(4) alone."""
    models = tmp_path / "models"
    code = main(
        [
            "sweep",
            str(parquet_dir / "data"),
            "-k",
            "2:6",
            "--exclude",
            "truth",
            "--random-state",
            "0",
            "--method",
            "bisecting",
            "--save-models",
            str(models),
            "--quiet",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert any(line.startswith("suggested k: 4 (") for line in out.splitlines()), out
    assert "one bisecting fit of" in out and "the refit of k = 4" in out
    assert [p.name for p in models.iterdir()] == ["kmeans-k4.npz"]
    from dkmeans.engine.files import read_table

    single = KMeans(4, random_state=0).fit(read_table(str(parquet_dir / "data"))[["a", "b"]])
    saved = KMeans.load(models / "kmeans-k4.npz")
    np.testing.assert_allclose(saved.cluster_centers_, single.cluster_centers_, rtol=1e-8)
