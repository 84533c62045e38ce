"""The machine-wide compile lock of the compiled kernels, in one process (``tests/system/
test_compile_lock.py`` runs several): taken by a compilation and released after it, also after a
failed one; a waiting compilation looks again when the lock is released; a held lock delays a
compilation at most by the deadline; no lock where no directory is writable."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import numba
import numpy as np
import pytest
from numba.core import event

from dkmeans.kernels.backends import jit


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(jit, "_dir", [str(tmp_path)])
    return tmp_path


def _free(directory) -> bool:
    """Whether every lock file in ``directory`` can be taken now (by another open file)."""
    for name in os.listdir(directory):
        fd = os.open(os.path.join(directory, name), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
    return True


def test_a_compilation_takes_the_lock_and_releases_it_also_after_a_failure(lock_dir):
    def add(x, y):
        return x + y

    kernel = jit.share_compiles(numba.njit(add))
    assert kernel(2, 3) == 5
    assert len(os.listdir(lock_dir)) == 1 and _free(lock_dir)
    with pytest.raises(numba.core.errors.TypingError):
        kernel(np.zeros(2), "text")  # no such addition: the compilation fails
    assert _free(lock_dir) and getattr(jit._local, "attempt", None) is None
    assert kernel(2.5, 1.0) == 3.5


def test_a_lock_released_while_waiting_is_taken_and_the_loop_compiled_once(lock_dir):
    """Another holder (here a thread with its own lock file descriptor) releases the lock: the
    waiting compilation looks in the cache again and, not finding the loop, compiles it once."""

    def triple(x):
        return 3 * x

    kernel = jit.share_compiles(numba.njit(triple))
    key = jit.lock_key(kernel, (numba.types.int64,))
    held, release = threading.Event(), threading.Event()

    def hold():
        with jit.machine_lock(key):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    threading.Timer(0.5, release.set).start()
    t = time.perf_counter()
    with event.install_recorder("numba:compile") as recorder:
        assert kernel(7) == 21
    holder.join(30)
    assert time.perf_counter() - t >= 0.4  # it waited for the holder
    # its compilation started, was abandoned while it waited, and ran again under the lock
    ends = [e for _, e in recorder.buffer if e.is_end and e.data["dispatcher"] is kernel]
    assert len(ends) == 2 and len(kernel.overloads) == 1
    assert _free(lock_dir)


def test_a_lock_never_released_delays_a_compilation_by_the_deadline(lock_dir, monkeypatch):
    monkeypatch.setattr(jit, "COMPILE_WAIT_S", 0.5)

    def quadruple(x):
        return 4 * x

    kernel = jit.share_compiles(numba.njit(quadruple))
    with jit.machine_lock(jit.lock_key(kernel, (numba.types.int64,))) as held:
        assert held
        t = time.perf_counter()
        assert kernel(2) == 8
        assert time.perf_counter() - t >= 0.45


def test_without_a_lock_directory_each_process_compiles(monkeypatch):
    monkeypatch.setattr(jit, "_dir", [None])

    def twice(x):
        return 2 * x

    assert jit.share_compiles(numba.njit(twice))(4) == 8
    with jit.machine_lock("any") as held:
        assert not held
