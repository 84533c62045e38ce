"""The command line: the demo runs end to end and writes what it says it wrote."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from dkmeans.io import ModelFileError, load_model, save_model
from dkmeans.model import Model


def test_demo_small(tmp_path):
    out_dir = tmp_path / "out"
    cmd = [sys.executable, "-m", "dkmeans", "demo", "--n-samples", "60000", "-k", "5",
           "--chunk-rows", "10000", "--output", str(out_dir)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "iteration    1" in res.stdout and "summary" in res.stdout
    model, meta = load_model(out_dir / "model.npz")
    assert model.centroids.shape == (5, 8) and meta["iteration_count"] >= 1
    labels = pd.read_parquet(out_dir / "labels.parquet")
    assert len(labels) == 60000 and labels["cluster"].between(0, 4).all()
    assert str(out_dir / "model.npz") in res.stdout


def test_cli_user_error_is_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "dkmeans", "demo", "-k", "0", "--n-samples", "100",
                          "--output", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "n_clusters" in res.stderr


def test_model_file_round_trip_and_damage(tmp_path):
    C = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    path = save_model(tmp_path / "m", Model(C), {"objective": 1.5})
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
