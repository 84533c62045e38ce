"""The machine-wide compile lock of the compiled kernels, in one process (``tests/system/
test_compile_lock.py`` runs several): re-entrant, released after a failed compilation, and
absent where no directory is writable."""

from __future__ import annotations

import fcntl
import os

import numba
import numpy as np
import pytest

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


def test_lock_is_reentrant_and_released(lock_dir):
    with jit.machine_lock("a"):
        assert not _free(lock_dir)
        with jit.machine_lock("a", wait_s=0):  # a callee of the same key: no wait on itself
            pass
        assert not _free(lock_dir)
    assert _free(lock_dir) and not jit._held


def test_compiles_under_the_lock_and_releases_it_after_a_failure(lock_dir):
    def add(x, y):
        return x + y

    kernel = jit.share_compiles(numba.njit(add))
    assert kernel(2, 3) == 5
    assert len(os.listdir(lock_dir)) == 1 and _free(lock_dir)
    with pytest.raises(numba.core.errors.TypingError):
        kernel(np.zeros(2), "text")  # no such addition: the compilation fails
    assert _free(lock_dir) and not jit._held
    assert kernel(2.5, 1.0) == 3.5


def test_without_a_lock_directory_each_process_compiles(monkeypatch):
    monkeypatch.setattr(jit, "_dir", [None])

    def twice(x):
        return 2 * x

    assert jit.share_compiles(numba.njit(twice))(4) == 8
