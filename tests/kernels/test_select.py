"""The one choice of a kernel call's backend: its rules, the config key, and the pin that carries it."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp

from dkmeans.errors import InvalidParameterError
from dkmeans.kernels.backends import compile as kernel_compile
from dkmeans.kernels.backends import select as select_module
from dkmeans.kernels.backends.select import ALWAYS, Backend, Loops, select

READY = Loops(("test-ready",), lambda: None)


@pytest.fixture
def ready(monkeypatch):
    """Every compile unit counts as compiled; the units asked for are recorded."""
    asked = []
    monkeypatch.setattr(select_module, "compiled_ready", lambda kind, warm_up: asked.append(kind) or True)
    return asked


def test_rules_in_order(kernel_backend, ready):
    X = np.ones((5, 3), np.float32)
    numpy = kernel_backend == "numpy"
    assert select(sp.csr_matrix(X), compiled=READY, blas=READY) is Backend.SPARSE  # whatever the setting
    assert select(X, compiled=READY) is (Backend.NUMPY if numpy else Backend.COMPILED)
    assert select(X, blas=READY) is (Backend.NUMPY if numpy else Backend.BLAS)
    assert select(X, compiled=READY, blas=READY) is {"auto": Backend.COMPILED, "blas": Backend.BLAS,
                                                     "numpy": Backend.NUMPY}[kernel_backend]
    assert select(X, compiled=ALWAYS) is (Backend.NUMPY if numpy else Backend.COMPILED)
    assert select(X) is Backend.NUMPY  # an operation without compiled loops
    for other in (X.astype(np.int64), X.astype(np.float16), np.ones((0, 3)), np.ones((4, 0))):
        assert select(other, compiled=READY, blas=READY) is Backend.NUMPY
    assert ready == ([] if numpy else [("test-ready",)] * 3)  # ALWAYS and empty rows ask nothing


def test_loops_not_ready_take_the_namespace_code(monkeypatch):
    monkeypatch.setattr(select_module, "compiled_ready", lambda kind, warm_up: False)
    assert select(np.ones((5, 3)), compiled=READY, blas=READY) is Backend.NUMPY
    assert select(np.ones((5, 3)), compiled=ALWAYS) is Backend.COMPILED  # compiled in the call


def test_the_key_is_checked():
    with dask.config.set({"dkmeans.kernels.backend": "BLAS"}):
        assert select_module.setting() == "blas"
    with dask.config.set({"dkmeans.kernels.backend": "xp"}), pytest.raises(InvalidParameterError, match="backend"):
        select(np.ones((2, 2)))
    with pytest.raises(ValueError, match="must be one of"):
        with kernel_compile.pinned("numpy", "fast"):
            pass


def test_the_pin_carries_the_setting_read_once():
    """A pin keeps the setting in force when it was made; calls under it ignore later config changes."""
    with dask.config.set({"dkmeans.kernels.backend": "numpy"}):
        with kernel_compile.pinned("compiled"):
            pin = kernel_compile.current_pin()
            with dask.config.set({"dkmeans.kernels.backend": "auto"}):
                assert select_module.setting() == "numpy"
    assert pin == kernel_compile.Pin("compiled", "numpy")
    assert kernel_compile.current_pin() == kernel_compile.Pin(None, "auto")
    assert kernel_compile.call_pinned(pin, select_module.setting) == "numpy"
    assert kernel_compile.call_pinned(pin, kernel_compile.current_path) == "compiled"
    assert kernel_compile.call_pinned("numpy", kernel_compile.current_pin) == kernel_compile.Pin("numpy", "auto")


def test_the_numpy_setting_starts_no_compilation(monkeypatch):
    """A fit under the setting "numpy" takes no compiled loops: its path is NumPy, nothing compiles for it."""
    monkeypatch.setattr(kernel_compile, "_started", set())
    kinds = [(("test-kind-numpy",), lambda: None)]
    with dask.config.set({"dkmeans.compile": "background", "dkmeans.kernels.backend": "numpy"}):
        assert kernel_compile.resolve_path(kinds, 10**12) == "numpy"  # large data compiles first otherwise
    assert kernel_compile._started == set()
