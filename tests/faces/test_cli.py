"""The command line: the demo runs end to end and writes what it says it wrote."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from dkmeans import KMeans
from dkmeans.io import ModelFileError, load_model, save_model
from dkmeans.model import Model
from tests.helpers import run_cli


def test_demo_small(tmp_path):
    out_dir = tmp_path / "out"
    cmd = [sys.executable, "-m", "dkmeans", "demo", "--n-samples", "60000", "-k", "5",
           "--chunk-rows", "10000", "--output", str(out_dir)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "iteration    1" in res.stdout and "summary" in res.stdout  # not a terminal: logged, to stdout
    assert "iteration " not in res.stderr
    assert (out_dir / "fit.png").exists()
    model, meta = load_model(out_dir / "model.npz")
    assert model.centroids.shape == (5, 8) and meta["iteration_count"] >= 1
    labels = pd.read_parquet(out_dir / "labels.parquet")
    assert len(labels) == 60000 and labels["cluster"].between(0, 4).all()
    assert str(out_dir / "model.npz") in res.stdout


def test_cli_user_error_is_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "dkmeans", "demo", "-k", "0", "--n-samples", "100",
                          "--output", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "-k must be" in res.stderr


def test_model_file_round_trip_and_damage(tmp_path):
    C = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    path = save_model(tmp_path / "m", Model(C), {"objective": 1.5})
    assert path == tmp_path / "m" and sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no suffix added
    model, meta = load_model(path)
    np.testing.assert_array_equal(model.centroids, C)
    assert model.centroids.dtype == np.float32 and meta["objective"] == 1.5
    raw = path.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ModelFileError, match="damaged or truncated"):
        load_model(tmp_path / "trunc.npz")
    np.savez(tmp_path / "pickled.npz", centroids=np.array([{"a": 1}], dtype=object), metadata=np.zeros(1, np.uint8))
    with pytest.raises(ModelFileError, match="pickle"):
        load_model(tmp_path / "pickled.npz")
    with pytest.raises(ModelFileError, match="does not exist"):
        load_model(tmp_path / "missing.npz")


def test_estimator_save_writes_the_file_named(client, tmp_path):
    X = np.random.default_rng(1).normal(size=(200, 3))
    km = KMeans(3, random_state=0).fit(X)
    assert km.save(tmp_path / "m.model") == tmp_path / "m.model"
    assert km.save(str(tmp_path / "plain")) == tmp_path / "plain"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.model", "plain"]
    for name in ("m.model", "plain"):
        loaded = KMeans.load(tmp_path / name)
        np.testing.assert_array_equal(loaded.cluster_centers_, km.cluster_centers_)
        np.testing.assert_array_equal(loaded.predict(X), km.labels_)


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory):
    from dkmeans.testing import make_blobs

    root = tmp_path_factory.mktemp("cli")
    X, truth, _ = make_blobs(6000, 2, 4, spread=0.8, seed=3)
    df = pd.DataFrame(X, columns=["a", "b"])
    df["truth"] = truth
    df["id"] = [f"row{i}" for i in range(len(df))]
    (root / "data").mkdir()
    df.iloc[:2500].to_parquet(root / "data" / "part0.parquet")
    df.iloc[2500:].to_parquet(root / "data" / "part1.parquet")
    df.to_csv(root / "data.csv", index=False)
    return root, df


def test_fit_predict_evaluate(parquet_dir):
    root, df = parquet_dir
    model = root / "m.dkm"  # no .npz: the file named is the file written, and read back
    res = run_cli("fit", root / "data", "-k", 4, "--exclude", "truth", "--model", model,
                  "--random-state", 0, "--workers", 1, "--plot", root / "fit.png")
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
    assert f"accuracy (Hungarian matching): {metrics.accuracy(df['truth'], labels):.4f}" in res.stdout
    assert f"adjusted Rand index: {adjusted_rand_score(df['truth'], labels):.4f}" in res.stdout
    assert "centroid index vs the truth's class means: 0" in res.stdout
    assert f"objective (sum of squared distances): {-km.score(df[['a', 'b']]):.6e}" in res.stdout


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["fit", "{root}/nothing", "-k", "3", "--model", "{root}/x.npz"], "does not exist"),
        (["fit", "{root}/data", "-k", "3", "--columns", "a", "nope", "--model", "{root}/x.npz"], "['nope'] not found"),
        (["fit", "{root}/data", "-k", "0", "--model", "{root}/x.npz"], "-k must be an integer >= 1"),
        (["fit", "{root}/data", "-k", "3", "--columns", "id", "--model", "{root}/x.npz"], "not numeric"),
        (["fit", "{root}/data", "-k", "3", "--model", "{root}/x.npz", "--scheduler", "tcp://127.0.0.1:9",
          "--connect-timeout", "1s"], "cannot reach the scheduler"),
        (["predict", "{root}/missing.npz", "{root}/data", "--output", "{root}/o"], "does not exist"),
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


def _options_without_help(parser, name="dkmeans"):
    """``command option`` for every argument of ``parser`` and its subcommands' parsers that has no help."""
    missing = []
    for action in parser._actions:
        if not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                missing += _options_without_help(sub, f"{name} {command}")
    return missing


def test_every_option_has_help():
    from dkmeans.cli import build_parser

    parser = build_parser()
    assert _options_without_help(parser) == []
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) == {"fit", "sweep", "bisect", "predict", "evaluate", "demo", "warm-up"}  # walked too
    demo_help = {a.option_strings[0]: a.help for a in commands["demo"]._actions if a.option_strings}
    for option, default in (("--n-samples", "3000000"), ("--n-features", "8"), ("--chunk-rows", "250000"),
                            ("--max-iter", "100"), ("--tol", "0.0001"), ("--seed", "0"), ("--spread", "2.0")):
        assert demo_help[option].endswith(f"(default {default})"), demo_help[option]


def test_main_closes_the_client_it_opened(client, parquet_dir, monkeypatch, capsys):
    """``--scheduler``: main() disconnects before returning and leaves no logging handler behind.

    A client left open kept trying to reconnect after the test session's cluster closed, and
    logged through a handler bound to a stream pytest had closed by then: ``make test`` ended
    in "--- Logging error --- ... ValueError: I/O operation on closed file".
    """
    import distributed

    from dkmeans.cli import main

    opened = []

    class Recording(distributed.Client):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(distributed, "Client", Recording)
    root, dkmeans_logger = logging.getLogger(), logging.getLogger("dkmeans")
    before = list(root.handlers), list(dkmeans_logger.handlers)
    root_dir, _ = parquet_dir
    code = main(["fit", str(root_dir / "data.csv"), "-k", "4", "--exclude", "truth", "--model",
                 str(root_dir / "closed.dkm"), "--scheduler", client.scheduler.address, "--quiet"])
    assert code == 0, capsys.readouterr().err
    assert len(opened) == 1 and opened[0].status == "closed"
    assert (list(root.handlers), list(dkmeans_logger.handlers)) == before
    assert client.status == "running"  # the scheduler it connected to is untouched


def test_quiet_silences_progress(parquet_dir):
    root, _ = parquet_dir
    res = run_cli("fit", root / "data.csv", "-k", 4, "--exclude", "truth", "--model", root / "q.npz",
                  "--workers", 1, "--quiet")
    assert res.returncode == 0, res.stderr
    assert "iteration " not in res.stdout + res.stderr and "model written" in res.stdout


def test_progress_and_summary_come_out_in_order(client, parquet_dir):
    """stdout and stderr merged, as in a batch job's log: the lines read in the order they happened.

    Block-buffered stdout (no PYTHONUNBUFFERED, not a terminal) and a running cluster (no
    worker processes started, which would flush stdout) are where the order broke.
    """
    root, _ = parquet_dir
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    res = subprocess.run([sys.executable, "-m", "dkmeans", "fit", str(root / "data.csv"), "-k", "4", "--exclude",
                          "truth", "--model", str(root / "ordered.dkm"), "--random-state", "0",
                          "--scheduler", client.scheduler.address],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180, env=env)
    assert res.returncode == 0, res.stdout
    lines = res.stdout.splitlines()
    iterations = [i for i, line in enumerate(lines) if "dkmeans: iteration " in line]
    km = KMeans.load(root / "ordered.dkm")
    assert len(iterations) == km.n_iter_ >= 1
    first = [i for i, line in enumerate(lines) if "leaving out ['id']" in line]
    summary = [i for i, line in enumerate(lines) if line.startswith("fitted k=4")]
    written = [i for i, line in enumerate(lines) if line == f"model written to {root / 'ordered.dkm'}"]
    assert len(first) == len(summary) == len(written) == 1, res.stdout
    assert first[0] < iterations[0] and iterations[-1] < summary[0] < written[0], res.stdout


def test_warm_up_loads_the_compiled_kernels(monkeypatch, capsys):
    """``dkmeans warm-up`` runs the compiled loops of each dtype and width once (numba's disk cache
    keeps them for later processes); this process then counts them as loaded, so that its small
    fits of those rows take them."""
    import json

    import numpy as np

    from dkmeans.cli import main
    from dkmeans.kernels import plans

    monkeypatch.setattr(plans, "_loaded", set())
    assert main(["warm-up", "--n-features", "3", "--json"]) == 0
    outcome = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert outcome["status"] == "done" and outcome["n_features"] == [3]
    assert plans.loaded(np.float32, 3) and plans.loaded(np.float64, 3) and not plans.loaded(np.float32, 4)
    assert main(["warm-up", "--n-features", "0"]) == 2

