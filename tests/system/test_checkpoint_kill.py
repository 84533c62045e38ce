"""A ``dkmeans fit`` process SIGKILLed after a checkpoint and run again with ``--resume`` ends with
the model of an uninterrupted run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd

from dkmeans import MiniBatchKMeans
from dkmeans.io.checkpoint import Checkpointer, CheckpointError
from tests.helpers import kill_when


def test_cli_minibatch_killed_mid_run_resumes_to_the_same_model(client, tmp_path):
    """``dkmeans fit --algorithm minibatch --checkpoint``, SIGKILLed after a checkpoint, resumed with --resume."""
    rng = np.random.default_rng(7)
    frame = pd.DataFrame(
        rng.uniform(size=(100_000, 4)).astype(np.float32), columns=[f"f{i}" for i in range(4)]
    )
    data = tmp_path / "data.parquet"
    frame.to_parquet(data)
    base = [
        sys.executable,
        "-m",
        "dkmeans",
        "fit",
        str(data),
        "-k",
        "8",
        "--algorithm",
        "minibatch",
        "--batch-size",
        "64",
        "--max-no-improvement",
        "none",
        "--random-state",
        "1",
        "--max-iter",
        "2",
        "--tol",
        "0",
        "--scheduler",
        client.scheduler.address,
        "--quiet",
    ]
    subprocess.run(
        base + ["--model", str(tmp_path / "reference.npz")],
        check=True,
        capture_output=True,
        timeout=300,
    )
    checkpoint = tmp_path / "job.ckpt"
    run = base + [
        "--model",
        str(tmp_path / "resumed.npz"),
        "--checkpoint",
        str(checkpoint),
        "--checkpoint-every",
        "200",
    ]

    def steps_saved():
        try:
            step = (
                Checkpointer(checkpoint, 1, {}).progress()["n_iter"] if checkpoint.exists() else 0
            )
        except CheckpointError:  # caught between write and rename: read again
            step = 0
        return step if step >= 400 else 0

    step = kill_when(run, steps_saved)
    resumed = subprocess.run(run + ["--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    a, b = (MiniBatchKMeans.load(tmp_path / name) for name in ("reference.npz", "resumed.npz"))
    assert len(a.history_) == len(b.history_) > step  # one record per step
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    untimed = [
        [
            json.dumps({k: v for k, v in h.items() if k != "seconds"}, sort_keys=True)
            for h in m.history_
        ]
        for m in (a, b)
    ]
    assert untimed[0] == untimed[1]
