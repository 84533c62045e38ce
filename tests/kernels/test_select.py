"""The one choice of a kernel call's backend: its rules, the config key, and the plan that carries it."""

from __future__ import annotations

import pickle

import dask
import numpy as np
import pytest
import scipy.sparse as sp

from dkmeans.errors import InvalidParameterError
from dkmeans.kernels import plans
from dkmeans.kernels.backends import select as select_module
from dkmeans.kernels.backends.select import ALWAYS, Backend, Loops, select

READY = Loops(("test-ready",), lambda: None)


@pytest.mark.parametrize("kernel_plan", ["compiled"], indirect=True)
def test_rules_in_order(kernel_backend, kernel_plan):
    X = np.ones((5, 3), np.float32)
    numpy = kernel_backend == "numpy"
    assert (
        select(sp.csr_matrix(X), compiled=READY, blas=READY) is Backend.SPARSE
    )  # whatever the setting
    assert select(X, compiled=READY) is (Backend.NUMPY if numpy else Backend.COMPILED)
    assert select(X, blas=READY) is (Backend.NUMPY if numpy else Backend.BLAS)
    assert (
        select(X, compiled=READY, blas=READY)
        is {"auto": Backend.COMPILED, "blas": Backend.BLAS, "numpy": Backend.NUMPY}[kernel_backend]
    )
    assert select(X, compiled=ALWAYS) is (Backend.NUMPY if numpy else Backend.COMPILED)
    assert select(X) is Backend.NUMPY  # an operation without compiled loops
    for other in (X.astype(np.int64), X.astype(np.float16), np.ones((0, 3)), np.ones((4, 0))):
        assert select(other, compiled=READY, blas=READY) is Backend.NUMPY


@pytest.mark.parametrize("kernel_plan", ["numpy"], indirect=True)
def test_a_numpy_plan_takes_the_namespace_code(kernel_plan):
    assert select(np.ones((5, 3)), compiled=READY, blas=READY) is Backend.NUMPY
    assert select(np.ones((5, 3)), compiled=ALWAYS) is Backend.COMPILED  # compiled in the call


def test_outside_a_plan_the_compile_setting_decides():
    """A kernel called directly compiles at its first need, unless ``dkmeans.compile`` is "off"."""
    assert plans.current() is None
    for mode, backend in (
        ("auto", Backend.COMPILED),
        ("eager", Backend.COMPILED),
        ("off", Backend.NUMPY),
    ):
        with dask.config.set({"dkmeans.compile": mode}):
            assert select(np.ones((5, 3)), compiled=READY) is backend


def test_the_key_is_checked():
    with dask.config.set({"dkmeans.kernels.backend": "BLAS"}):
        assert select_module.setting() == "blas"
    with (
        dask.config.set({"dkmeans.kernels.backend": "xp"}),
        pytest.raises(InvalidParameterError, match="backend"),
    ):
        select(np.ones((2, 2)))
    with (
        dask.config.set({"dkmeans.compile": "later"}),
        pytest.raises(InvalidParameterError, match="compile"),
    ):
        plans.plan(np.float32, 2)


def test_the_plan_carries_the_setting_read_once():
    """A plan keeps the setting in force when it was made; calls under it ignore later config changes,
    and a bound function carries it through pickling (tasks take it)."""
    with dask.config.set({"dkmeans.kernels.backend": "numpy"}):
        plan = plans.plan(np.float32, 3)
    with plan.applied(), dask.config.set({"dkmeans.kernels.backend": "auto"}):
        assert select_module.setting() == "numpy"
    assert plan == plans.KernelPlan("numpy", "numpy")
    assert plans.current() is None and select_module.setting() == "auto"
    bound = pickle.loads(pickle.dumps(plans.KernelPlan("compiled", "blas").bind(plans.current)))
    assert bound() == plans.KernelPlan("compiled", "blas") and bound.__name__ == "current"
    assert plans.KernelPlan("compiled", "blas").call(select_module.setting) == "blas"
    assert plans.current() is None
