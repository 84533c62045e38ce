"""`dkmeans` commands stopped by SIGTERM (scancel, a time limit, a pod's termination) and SIGINT
(Ctrl-C), sent to the whole process group as a batch system and a terminal send them: one line,
exit 143 / 130, a final checkpoint that resumes to the uninterrupted result, no traceback, no
leaked semaphore, no process left. And two fits at once close their clusters quietly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest

psutil = pytest.importorskip("psutil")

DKMEANS = [sys.executable, "-m", "dkmeans"]
SEED = 0
#: Lloyd on uniform rows with many clusters converges slowly (about 100 iterations), one graph per iteration.
SLOW_FIT = [
    "-k",
    "48",
    "--local-search",
    "false",
    "--max-iter",
    "300",
    "--random-state",
    str(SEED),
    "--workers",
    "2",
]
SLOW_ENV = {
    "DASK_DKMEANS__SINGLE_TASK_WORK": "0",
    "DASK_DKMEANS__SPMD": "False",
    "DASK_DKMEANS__IN_PROCESS_BYTES": "0",
}
NOISE = ("Traceback", "leaked semaphore", "still alive", "CancelledError", "NameError")


@pytest.fixture(scope="module")
def uniform_parquet(tmp_path_factory):
    folder = tmp_path_factory.mktemp("uniform")
    X = np.random.default_rng(1).random((30_000, 2))
    for i, part in enumerate(np.array_split(X, 3)):
        pd.DataFrame(part, columns=["a", "b"]).to_parquet(folder / f"part{i}.parquet")
    return folder


class Command:
    """A `dkmeans` command in its own process group; its stdout read line by line as it runs."""

    def __init__(self, args, cwd, env=None):
        self.proc = subprocess.Popen(
            [*DKMEANS, *map(str, args)],
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines, self.children = [], set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def wait_for(self, text, timeout=240.0):
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, (
                f"ended before {text!r}: {''.join(self.lines)[-2000:]}"
                f"{self.proc.stderr.read()[-2000:]}"
            )
            assert time.monotonic() < deadline, f"no {text!r} in {timeout:.0f} s"
            self._note_children()
            time.sleep(0.05)
        self._note_children()

    def _note_children(self):
        try:
            self.children |= {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def signal_group(self, signum):
        os.killpg(self.proc.pid, signum)

    def finish(self, timeout=120.0):
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._reader.join(timeout=10)
        return self.proc.returncode, "".join(self.lines), self.proc.stderr.read()

    def left_running(self):
        alive = []
        for pid in self.children:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return alive


def _assert_clean_stop(cmd, rc, stderr, expected_rc, signame):
    assert rc == expected_rc, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dkmeans: interrupted ({signame})"), stderr[
        -3000:
    ]
    time.sleep(0.5)
    assert cmd.left_running() == [], "processes left running"


def test_sigterm_saves_the_last_iteration_and_resume_gives_the_uninterrupted_fit(
    uniform_parquet, tmp_path
):
    from dkmeans import KMeans
    from dkmeans.io.checkpoint import Checkpointer

    model, checkpoint = tmp_path / "model.npz", tmp_path / "fit.ckpt"
    args = [
        "fit",
        uniform_parquet,
        *SLOW_FIT,
        "--model",
        model,
        "--checkpoint",
        checkpoint,
        "--checkpoint-every",
        "1000",
    ]
    cmd = Command(args, tmp_path, SLOW_ENV)
    cmd.wait_for("iteration   10 ")
    t0 = time.monotonic()
    cmd.signal_group(signal.SIGTERM)  # as scancel: every process of the job
    rc, out, err = cmd.finish()
    seconds = time.monotonic() - t0
    _assert_clean_stop(cmd, rc, err, 143, "SIGTERM")
    assert f"the fit's state is in {checkpoint}" in err
    assert seconds < 20, (
        f"{seconds:.1f} s from SIGTERM to exit"
    )  # the grace period, inside SLURM's 30 s
    saved = Checkpointer(checkpoint, 1, {}).progress()
    assert saved["phase"] == "lloyd" and saved["n_iter"] >= 10, saved  # written on the signal
    assert not model.exists()

    rc, out, err = Command([*args, "--resume", "--json"], tmp_path, SLOW_ENV).finish(timeout=300)
    assert rc == 0, err[-3000:]
    assert not any(noise in err for noise in NOISE), err[-3000:]
    outcome = json.loads(out)  # with --json, stdout is the JSON line alone
    resumed = KMeans.load(model)
    reference = KMeans(n_clusters=48, local_search=False, max_iter=300, random_state=SEED).fit(
        pd.read_parquet(uniform_parquet)[["a", "b"]]
    )
    assert outcome["n_iter"] == resumed.n_iter_ == reference.n_iter_
    np.testing.assert_allclose(
        resumed.cluster_centers_, reference.cluster_centers_, rtol=1e-5, atol=1e-7
    )
    assert outcome["inertia"] == pytest.approx(reference.inertia_, rel=1e-6)


@pytest.mark.parametrize("command", ["fit", "sweep", "predict"])
def test_ctrl_c_stops_a_command_with_one_line(uniform_parquet, tmp_path, command):
    """SIGINT while the cluster works: 130, one line. To the process group (a terminal's Ctrl-C)
    once the fit iterates; to the command alone as soon as its cluster is up (its workers, still
    starting, may not ignore the signal yet)."""
    if command == "predict":
        from dkmeans import KMeans

        km = KMeans(3, random_state=0).fit(pd.read_parquet(uniform_parquet)[["a", "b"]])
        km.save(tmp_path / "m.npz")
        big = tmp_path / "big"  # enough rows that labelling them outlasts the signal's way
        big.mkdir()
        X = np.random.default_rng(2).random((400_000, 2))
        for i, part in enumerate(np.array_split(X, 8)):
            pd.DataFrame(part, columns=["a", "b"]).to_parquet(big / f"part{i}.parquet")
        args = ["predict", tmp_path / "m.npz", big, "--output", tmp_path / "out", "--workers", "2"]
        when = "started a local Dask cluster"
    elif command == "sweep":
        args = [
            "sweep",
            uniform_parquet,
            "-k",
            "40:48:4",
            "--local-search",
            "false",
            "--workers",
            "2",
        ]
        when = "started a local Dask cluster"
    else:
        args = ["fit", uniform_parquet, *SLOW_FIT, "--model", tmp_path / "m.npz"]
        when = "iteration    5 "
    cmd = Command(args, tmp_path, SLOW_ENV)
    cmd.wait_for(when)
    if command == "fit":
        cmd.signal_group(signal.SIGINT)
    else:
        os.kill(cmd.proc.pid, signal.SIGINT)
    rc, out, err = cmd.finish()
    _assert_clean_stop(cmd, rc, err, 130, "SIGINT")


def test_two_fits_at_once_end_quietly(uniform_parquet, tmp_path):
    """Each closes its embedded cluster, the worker processes exiting by themselves (no kill)."""
    cmds = [
        Command(
            [
                "fit",
                uniform_parquet,
                "-k",
                "4",
                "--model",
                tmp_path / f"m{i}.npz",
                "--workers",
                "2",
                "--quiet",
            ],
            tmp_path,
        )
        for i in range(2)
    ]
    for cmd in cmds:
        rc, out, err = cmd.finish(timeout=300)
        assert rc == 0 and err.strip() == "", err[-3000:]
        assert "model written to" in out
