"""One compilation per machine: processes compiling the same kernel at once share one compile
(``dkmeans.kernels.backends.jit``), and a lock whose holder was killed or hangs never blocks
another process beyond the wait's deadline.

Each case runs fresh Python processes on an empty numba cache (``NUMBA_CACHE_DIR`` in
``tmp_path``), so every kernel really compiles; numba's counters (``dispatcher.stats``: hits are
loads from the disk cache) and its compile events (``numba.core.event``) say who compiled what.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

#: The kernel compiled by the cases: small (about 1-3 s to compile on 2 cores), with a callee.
KERNEL = r"""
import json, os, sys, time
import numpy as np
from dkmeans.kernels.backends import compiled, jit
X = np.random.default_rng(0).random((50, 3))
C = X[:4].copy()
labels = np.arange(50, dtype=np.int32) % 4
out = np.empty(50)
ARGS = (X, 0, 50, C, labels, out)
"""

COMPILE = (
    KERNEL
    + r"""
jit.COMPILE_WAIT_S = float(sys.argv[2])
go = sys.argv[1]
while go and not os.path.exists(go):  # start together with the other process
    time.sleep(0.005)
from numba.core import event
t = time.perf_counter()
with event.install_recorder("numba:compile") as recorder:
    compiled.rows_exact_sq(*ARGS)
seconds = time.perf_counter() - t
starts = sum(1 for _, e in recorder.buffer  # compilations of the kernel started (or abandoned)
             if e.is_start and e.data["dispatcher"] is compiled.rows_exact_sq)
expected = ((X - C[labels]) ** 2).sum(axis=1)
print(json.dumps({"starts": starts, "hits": sum(compiled.rows_exact_sq.stats.cache_hits.values()),
                  "seconds": seconds, "exact": bool(np.allclose(out, expected, rtol=1e-12))}))
"""
)

#: Holds the lock of the kernel's compilation for ARGS, says so, and sleeps.
HOLD = (
    KERNEL
    + r"""
import numba
key = jit.lock_key(compiled.rows_exact_sq, tuple(numba.typeof(a) for a in ARGS))
with jit.machine_lock(key) as held:
    print("held" if held else "not held", flush=True)
    time.sleep(600)
"""
)


def _env(cache) -> dict:
    return dict(os.environ, NUMBA_CACHE_DIR=str(cache))


def _compile(cache, go: str = "", wait_s: float = 120.0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", COMPILE, go, str(wait_s)],
        env=_env(cache),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _holder(cache) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD], env=_env(cache), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_two_processes_compile_once(tmp_path):
    """Two processes needing the same kernel at the same moment on an empty cache: one compiles
    it, the other waits and loads it from numba's disk cache (without the lock both compile)."""
    go = tmp_path / "go"
    procs = [_compile(tmp_path / "numba", str(go)) for _ in range(2)]
    time.sleep(3)  # both imported and waiting for the start
    go.touch()
    results = [_result(p) for p in procs]
    assert all(r["exact"] for r in results)
    # one loaded the kernel from the cache: the other compiled it (the cache was empty)
    assert sorted(r["hits"] for r in results) == [0, 1], results
    assert all(r["starts"] == 1 for r in results if not r["hits"]), results


def test_killed_holder_does_not_block(tmp_path):
    """A lock whose holder was killed is free at once: the next process compiles without waiting
    for the deadline."""
    holder = _holder(tmp_path / "numba")
    holder.kill()
    holder.wait(timeout=30)
    result = _result(_compile(tmp_path / "numba", wait_s=120))
    assert result["exact"] and result["hits"] == 0 and result["starts"] >= 1
    assert result["seconds"] < 60  # far below the 120 s deadline


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="POSIX signals")
def test_hung_holder_blocks_only_until_the_deadline(tmp_path):
    """A holder that never releases (stopped) delays another process by the deadline, after which
    it compiles the kernel itself."""
    holder = _holder(tmp_path / "numba")
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        result = _result(_compile(tmp_path / "numba", wait_s=2))
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert result["exact"] and result["hits"] == 0 and result["starts"] >= 1
    assert 2 <= result["seconds"] < 60
