"""The SLURM recipes of deploy/slurm/ on a real single-node SLURM (tests/system/slurm.py).

Skipped, saying why, where SLURM is not installed (``apt-get install slurm-wlm munge``) or
this is not root. Small data: most of each job's time is starting Python processes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.system import slurm as slurm_node

ROOT = Path(__file__).resolve().parents[2]
SBATCH_FIT = ROOT / "deploy" / "slurm" / "sbatch_fit.sh"
LAUNCHER = ROOT / "deploy" / "slurm" / "slurm_cluster.py"
SEED = 0
#: A fit long enough to be cancelled while it runs: uniform rows, many clusters, one graph per
#: iteration (Lloyd converges slowly on uniform data: about 100 iterations).
SLOW_FIT = [
    "-k",
    "48",
    "--local-search",
    "false",
    "--max-iter",
    "300",
    "--checkpoint-every",
    "1000",
]
# a fit slow enough to be cancelled mid-way: iterations as graphs, and the small files placed on
# the job's cluster (within dkmeans.in-process-bytes the command would read and fit them in its
# own process, done before scancel comes)
SLOW_ENV = {
    "DASK_DKMEANS__SINGLE_TASK_WORK": "0",
    "DASK_DKMEANS__SPMD": "False",
    "DASK_DKMEANS__IN_PROCESS_BYTES": "0",
}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = slurm_node.unavailable()
    if why:
        pytest.skip(why)
    cluster = slurm_node.Slurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except RuntimeError as exc:
        cluster.stop()
        pytest.fail(f"the single-node SLURM did not start: {exc}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def uniform_parquet(tmp_path_factory):
    """30,000 uniform rows in 3 Parquet files (columns a, b)."""
    folder = tmp_path_factory.mktemp("uniform")
    X = np.random.default_rng(1).random((30_000, 2))
    for i, part in enumerate(np.array_split(X, 3)):
        pd.DataFrame(part, columns=["a", "b"]).to_parquet(folder / f"part{i}.parquet")
    return folder


def _job_env(slurm, **extra):
    env = dict(slurm.env, **extra)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _sbatch_fit(slurm, folder, args, env, name):
    """Submit sbatch_fit.sh (1 scheduler + 1 worker task, one CPU each); the job id and its output file."""
    out = folder / f"{name}-%j.out"
    job = slurm.sbatch(
        "--ntasks=2",
        "--cpus-per-task=1",
        "--mem-per-cpu=1G",
        "--time=00:10:00",
        f"--output={out}",
        SBATCH_FIT,
        *args,
        cwd=folder,
        env=env,
    )
    return job, folder / f"{name}-{job}.out"


def _reference(data, **params):
    """The uninterrupted fit, in this process (results do not depend on where the fit runs)."""
    from dkmeans import KMeans

    df = pd.read_parquet(data)
    return KMeans(random_state=SEED, **params).fit(df[["a", "b"]])


def _model(path):
    from dkmeans import KMeans

    return KMeans.load(path)


def _assert_same_fit(model, reference):
    assert model.n_iter_ == reference.n_iter_
    np.testing.assert_allclose(
        model.cluster_centers_, reference.cluster_centers_, rtol=1e-5, atol=1e-7
    )
    assert model.inertia_ == pytest.approx(reference.inertia_, rel=1e-6)


def test_sbatch_fit_writes_the_model(slurm, uniform_parquet, tmp_path):
    """sbatch deploy/slurm/sbatch_fit.sh on a Parquet folder: the model, and the --json line last."""
    model = tmp_path / "model.npz"
    job, out = _sbatch_fit(
        slurm,
        tmp_path,
        [uniform_parquet, "-k", "4", "--model", model, "--random-state", SEED, "--json"],
        _job_env(slurm),
        "fit",
    )
    state = slurm.wait(job)
    log = out.read_text() if out.exists() else ""
    assert state == "COMPLETED", f"job {job}: {state}\n{log[-3000:]}\n{slurm.logs()}"
    # the job's output also holds the scheduler's and the worker's logs: the fit's stdout is the JSON line
    outcome = json.loads([line for line in log.splitlines() if line.startswith("{")][-1])
    assert (
        outcome["status"] == "done"
        and outcome["exit_status"] == 0
        and outcome["model"] == str(model)
    )
    _assert_same_fit(_model(model), _reference(uniform_parquet, n_clusters=4))
    assert "Traceback" not in log


def test_scancel_leaves_a_checkpoint_that_a_second_job_resumes(slurm, uniform_parquet, tmp_path):
    """scancel while the fit runs: the fit writes its last iteration to the checkpoint and exits
    143; the same job submitted again with --resume ends with the uninterrupted result."""
    from dkmeans.io.checkpoint import Checkpointer

    model, checkpoint = tmp_path / "model.npz", tmp_path / "fit.ckpt"
    args = [
        uniform_parquet,
        *SLOW_FIT,
        "--model",
        model,
        "--random-state",
        SEED,
        "--checkpoint",
        checkpoint,
    ]
    env = _job_env(slurm, **SLOW_ENV)
    job, out = _sbatch_fit(slurm, tmp_path, args, env, "cancelled")
    deadline = time.monotonic() + 240
    while "iteration   10 " not in (out.read_text() if out.exists() else ""):
        state = slurm.job_state(job)
        assert state in ("PENDING", "CONFIGURING", "RUNNING"), (
            f"job {job} {state} before it was cancelled:\n{out.read_text() if out.exists() else ''}"
        )
        assert time.monotonic() < deadline, "the fit did not reach iteration 10 in 240 s"
        time.sleep(0.1)
    slurm.run("scancel", job)
    assert slurm.wait(job, timeout=60) == "CANCELLED"
    log = out.read_text()
    assert "dkmeans: interrupted (SIGTERM)" in log, log[-3000:]
    assert "Traceback" not in log and "leaked semaphore" not in log, log[-3000:]
    saved = Checkpointer(checkpoint, 1, {}).progress()
    # --checkpoint-every 1000: only the final checkpoint, written on the signal, holds these iterations
    assert saved["phase"] == "lloyd" and saved["n_iter"] >= 10, saved
    assert not model.exists()

    job, out = _sbatch_fit(slurm, tmp_path, [*args, "--resume"], env, "resumed")
    state = slurm.wait(job)
    log = out.read_text() if out.exists() else ""
    assert state == "COMPLETED", f"job {job}: {state}\n{log[-3000:]}"
    assert "resuming from checkpoint" in log
    _assert_same_fit(
        _model(model), _reference(uniform_parquet, n_clusters=48, local_search=False, max_iter=300)
    )


def test_slurm_cluster_workers_are_slurm_jobs(slurm, uniform_parquet, tmp_path):
    """deploy/slurm/slurm_cluster.py: dask-jobqueue submits the workers as SLURM jobs, and the fit
    on them equals the local fit."""
    pytest.importorskip(
        "dask_jobqueue", reason="dask-jobqueue is not installed (pip install dask-jobqueue)"
    )
    import subprocess

    model = tmp_path / "model.npz"
    cmd = [
        sys.executable,
        str(LAUNCHER),
        str(uniform_parquet),
        "-k",
        "4",
        "--model",
        str(model),
        "--random-state",
        str(SEED),
        "--cores",
        "1",
        "--processes",
        "1",
        "--memory",
        "1GB",
        "--jobs",
        "2",
        "--walltime",
        "00:10:00",
        "--scheduler-host",
        "127.0.0.1",
        "--local-directory",
        str(tmp_path),
        "--log-directory",
        str(tmp_path / "logs"),
        "--wait-timeout",
        "240",
    ]
    seen_jobs = []

    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_job_env(slurm),
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            ids = slurm.run("squeue", "-h", "-o", "%i %j", check=False).stdout.split("\n")
            seen_jobs += [line for line in ids if line.strip() and line not in seen_jobs]
            time.sleep(0.5)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    assert len([j for j in seen_jobs if "dask-worker" in j]) >= 2, seen_jobs
    _assert_same_fit(_model(model), _reference(uniform_parquet, n_clusters=4))
    assert slurm.run("squeue", "-h", check=False).stdout.strip() == "", "worker jobs left running"
