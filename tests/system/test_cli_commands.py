"""The command line in processes of its own, as a user runs it: the demo end to end, fit, predict
and evaluate on files, one-line user errors with exit status 2, help, quiet and ordered output
(``parquet_dir`` is in ``tests/conftest.py``; the in-process cases are in
``tests/faces/test_cli.py``)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from dkmeans import KMeans
from dkmeans.io import load_model
from tests.helpers import run_cli


def test_demo_small(tmp_path):
    out_dir = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "dkmeans",
        "demo",
        "--n-samples",
        "60000",
        "-k",
        "5",
        "--chunk-rows",
        "10000",
        "--output",
        str(out_dir),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (
        "iteration    1" in res.stdout and "summary" in res.stdout
    )  # not a terminal: logged, to stdout
    assert "iteration " not in res.stderr
    assert (out_dir / "fit.png").exists()
    model, meta = load_model(out_dir / "model.npz")
    assert model.centroids.shape == (5, 8) and meta["iteration_count"] >= 1
    labels = pd.read_parquet(out_dir / "labels.parquet")
    assert len(labels) == 60000 and labels["cluster"].between(0, 4).all()
    assert str(out_dir / "model.npz") in res.stdout


def test_cli_user_error_is_one_line(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "dkmeans",
            "demo",
            "-k",
            "0",
            "--n-samples",
            "100",
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "-k must be" in res.stderr


def test_fit_predict_evaluate(parquet_dir):
    root, df = parquet_dir
    model = root / "m.dkm"  # no .npz: the file named is the file written, and read back
    res = run_cli(
        "fit",
        root / "data",
        "-k",
        4,
        "--exclude",
        "truth",
        "--model",
        model,
        "--random-state",
        0,
        "--workers",
        1,
        "--plot",
        root / "fit.png",
    )
    assert res.returncode == 0, res.stderr
    assert f"model written to {model}\n" in res.stdout
    assert model.is_file() and not list(root.glob("m.dkm?*"))
    # progress shares stdout with the results, in order (a log captured from stdout alone reads right)
    out = res.stdout
    assert out.index("leaving out ['id']") < out.index("iteration    1") < out.index("fitted k=4")
    assert "iteration " not in res.stderr
    assert (root / "fit.png").stat().st_size > 10_000
    km = KMeans.load(model)
    assert list(km.feature_names_in_) == ["a", "b"]
    res = run_cli("predict", model, root / "data", "--output", root / "out", "--workers", 1)
    assert res.returncode == 0, res.stderr
    out = pd.read_parquet(root / "out")
    assert len(list((root / "out").glob("*.parquet"))) == 2
    np.testing.assert_array_equal(out["cluster"].to_numpy(), km.predict(df[["a", "b"]]))
    assert (out["id"].to_numpy() == df["id"].to_numpy()).all()
    res = run_cli("evaluate", model, root / "data.csv", "--truth-column", "truth", "--workers", 1)
    assert res.returncode == 0, res.stderr
    from sklearn.metrics import adjusted_rand_score

    from dkmeans import metrics

    labels = km.predict(df[["a", "b"]])
    assert (
        f"accuracy (Hungarian matching): {metrics.accuracy(df['truth'], labels):.4f}" in res.stdout
    )
    assert f"adjusted Rand index: {adjusted_rand_score(df['truth'], labels):.4f}" in res.stdout
    assert "centroid index vs the truth's class means: 0" in res.stdout
    assert f"objective (sum of squared distances): {-km.score(df[['a', 'b']]):.6e}" in res.stdout


def test_fit_with_a_size_cap_on_a_parquet_file(tmp_path):
    """dkmeans fit FILE --max-cluster-size as a process of its own (its embedded cluster of one
    worker): the model's sizes within the cap, its centroids those of KMeans on the same rows (the
    command in process: tests/fit/test_capacity.py)."""
    X = np.random.default_rng(7).normal(size=(800, 3))
    X[600:] += 4
    pd.DataFrame(X, columns=list("abc")).to_parquet(tmp_path / "rows.parquet")
    res = run_cli(
        "fit",
        tmp_path / "rows.parquet",
        "-k",
        4,
        "--max-cluster-size",
        220,
        "--model",
        tmp_path / "m.npz",
        "--random-state",
        0,
        "--workers",
        1,
        "--json",
    )
    assert res.returncode == 0, res.stderr
    model, meta = load_model(tmp_path / "m.npz")
    assert max(meta["cluster_sizes"]) <= 220 and sum(meta["cluster_sizes"]) == 800
    reference = KMeans(4, random_state=0, n_init=1, max_cluster_size=220).fit(X)
    np.testing.assert_allclose(model.centroids, reference.cluster_centers_, rtol=1e-6, atol=1e-9)
    assert meta["objective"] == pytest.approx(reference.inertia_, rel=1e-9)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["fit", "{root}/nothing", "-k", "3", "--model", "{root}/x.npz"], "does not exist"),
        (
            ["fit", "{root}/data", "-k", "3", "--columns", "a", "nope", "--model", "{root}/x.npz"],
            "['nope'] not found",
        ),
        (
            ["fit", "{root}/data", "-k", "0", "--model", "{root}/x.npz"],
            "-k must be an integer >= 1",
        ),
        (
            ["fit", "{root}/data", "-k", "3", "--columns", "id", "--model", "{root}/x.npz"],
            "not numeric",
        ),
        (
            [
                "fit",
                "{root}/data",
                "-k",
                "3",
                "--model",
                "{root}/x.npz",
                "--scheduler",
                "tcp://127.0.0.1:9",
                "--connect-timeout",
                "1s",
            ],
            "cannot reach the scheduler",
        ),
        (
            ["predict", "{root}/missing.npz", "{root}/data", "--output", "{root}/o"],
            "does not exist",
        ),
        (["evaluate", "{root}/data.csv", "{root}/data"], "not a dkmeans model file"),
    ],
)
def test_user_errors_exit_2_with_one_line(parquet_dir, args, fragment):
    root, _ = parquet_dir
    res = run_cli(*[a.format(root=root) for a in args], "--workers", "1")
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().count("\n") == 0
    assert fragment in res.stderr


def test_every_command_has_help():
    for cmd in ("fit", "sweep", "predict", "evaluate", "demo", "warm-up"):
        res = run_cli(cmd, "--help")
        assert res.returncode == 0 and "usage: dkmeans" in res.stdout


def test_quiet_silences_progress(parquet_dir):
    root, _ = parquet_dir
    res = run_cli(
        "fit",
        root / "data.csv",
        "-k",
        4,
        "--exclude",
        "truth",
        "--model",
        root / "q.npz",
        "--workers",
        1,
        "--quiet",
    )
    assert res.returncode == 0, res.stderr
    assert "iteration " not in res.stdout + res.stderr and "model written" in res.stdout


def test_progress_and_summary_come_out_in_order(client, parquet_dir):
    """stdout and stderr merged, as in a batch job's log: the lines read in the order they happened.

    Block-buffered stdout (no PYTHONUNBUFFERED, not a terminal) and a running cluster (no
    worker processes started, which would flush stdout) are where the order broke.
    """
    root, _ = parquet_dir
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "dkmeans",
            "fit",
            str(root / "data.csv"),
            "-k",
            "4",
            "--exclude",
            "truth",
            "--model",
            str(root / "ordered.dkm"),
            "--random-state",
            "0",
            "--scheduler",
            client.scheduler.address,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=180,
        env=env,
    )
    assert res.returncode == 0, res.stdout
    lines = res.stdout.splitlines()
    iterations = [i for i, line in enumerate(lines) if "dkmeans: iteration " in line]
    km = KMeans.load(root / "ordered.dkm")
    assert len(iterations) == km.n_iter_ >= 1
    first = [i for i, line in enumerate(lines) if "leaving out ['id']" in line]
    summary = [i for i, line in enumerate(lines) if line.startswith("fitted k=4")]
    written = [
        i for i, line in enumerate(lines) if line == f"model written to {root / 'ordered.dkm'}"
    ]
    assert len(first) == len(summary) == len(written) == 1, res.stdout
    assert first[0] < iterations[0] and iterations[-1] < summary[0] < written[0], res.stdout
