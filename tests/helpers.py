"""Helpers shared by the tests: independent float64 references, a CLI runner and fresh interpreters.

Fixtures live in ``tests/conftest.py``; this module holds plain functions, imported as
``from tests.helpers import ...``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import scipy.sparse as sp


def sq_distances(X, C) -> np.ndarray:
    """Exact float64 squared distances ``(n, k)`` from differences (dense or sparse ``X``).

    In row blocks of about 2**22 differences (32 MiB), whatever ``k`` and ``d``.
    """
    X = X.toarray() if sp.issparse(X) else np.asarray(X)
    X, C = X.astype(np.float64), np.asarray(C, dtype=np.float64)
    out = np.empty((X.shape[0], C.shape[0]))
    step = max(1, 2**22 // max(1, C.size))
    for start in range(0, X.shape[0], step):
        out[start : start + step] = ((X[start : start + step, None, :] - C[None, :, :]) ** 2).sum(
            -1
        )
    return out


def usable_cupy():
    """CuPy where it is installed and sees a GPU; else the test skips, saying which is missing."""
    import pytest

    cupy = pytest.importorskip("cupy", reason="CuPy is not installed")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"no usable GPU: {exc}")
    if count < 1:  # pragma: no cover
        pytest.skip("no GPU")
    return cupy


def run_cli(*args, cwd=None, timeout=180, env=None) -> subprocess.CompletedProcess:
    """``python -m dkmeans ARGS`` in a subprocess (text output captured)."""
    return subprocess.run(
        [sys.executable, "-m", "dkmeans", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


def run_python(code: str, *, timeout: float = 120) -> str:
    """Run ``code`` in a fresh interpreter (``python -c``); its standard output.

    The test fails, showing the process's standard error, when the process exits with another
    status than 0: an ``assert`` in ``code`` fails the test too.
    """
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def loaded_after(statement: str, modules, *, then: str = "", timeout: float = 120) -> list[str]:
    """Which of ``modules`` are in ``sys.modules`` after ``statement`` runs in a fresh interpreter.

    ``then`` runs next in the same process (what the statement left to load later, checked by
    its own asserts). What a statement loads depends on what ran before it in a process, hence a
    new one for each question.
    """
    code = (
        f"import json as _json, sys as _sys\n{statement}\n"
        f"_loaded = [m for m in {tuple(modules)!r} if m in _sys.modules]\n{then}\n"
        "print('LOADED ' + _json.dumps(_loaded))\n"
    )
    lines = run_python(code, timeout=timeout).splitlines()
    marked = [line for line in lines if line.startswith("LOADED ")]
    assert len(marked) == 1, lines
    return json.loads(marked[0][len("LOADED ") :])


def kill_when(argv, reached, *, timeout: float = 240.0, poll: float = 0.01):
    """Start ``argv``, SIGKILL it as soon as ``reached()`` returns a true value; return that value.

    Fails when the process ends (or ``timeout`` passes) before ``reached`` is true: the test
    could then not interrupt anything.
    """
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline, value = time.monotonic() + timeout, None
    while time.monotonic() < deadline and proc.poll() is None:
        value = reached()
        if value:
            break
        time.sleep(poll)
    proc.kill()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and value, (
        "the process ended before it could be killed"
    )
    return value


class WorkerWatch:
    """Watches the workers during a fit: their addresses (polled), process ids, and the scheduler's log.

    A worker restarted by its nanny has a new process id (and usually a new address); one
    that left the cluster, even briefly, leaves a "Remove worker" line in the scheduler's log.
    """

    def __init__(self, client):
        self.client = client
        self.before = set(client.scheduler_info(n_workers=-1)["workers"])
        self.pids = client.run(os.getpid)
        self.log_before = {line for _, line in client.get_scheduler_logs(n=10_000)}
        self.seen = set(self.before)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        while not self._stop.wait(0.2):
            self.seen |= set(self.client.scheduler_info(n_workers=-1)["workers"])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        if exc[0] is None:
            assert self.seen == self.before, (
                f"workers changed during the fit: {self.seen ^ self.before}"
            )
            assert self.client.run(os.getpid) == self.pids, "a worker process was restarted"
            new = [
                line
                for _, line in self.client.get_scheduler_logs(n=10_000)
                if line not in self.log_before
            ]
            lost = [line for line in new if "Remove worker" in line or "Register worker" in line]
            assert not lost, "a worker left the cluster during the fit:\n" + "\n".join(lost)
