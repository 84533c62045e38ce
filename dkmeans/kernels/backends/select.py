"""The one place a kernel call's backend is chosen: from the rows, the compile state and one key.

Every public kernel asks :func:`select` once, with its rows and the compiled loops it has,
and dispatches on the answer; the functions it calls with the same rows take that answer
along instead of asking again, so one call never mixes two backends. The rules, in order:

1. ``scipy.sparse`` rows: :attr:`Backend.SPARSE` (the CSR kernels, :mod:`.sparse`; there is
   no other code for them, whatever the setting).
2. Dask config ``dkmeans.kernels.backend`` (:mod:`dkmeans.config`) is ``"numpy"``:
   :attr:`Backend.NUMPY`, the namespace code (NumPy or CuPy) of the operation module.
3. A 2-D CuPy float32/float64 array, for an operation with fused CUDA kernels:
   :attr:`Backend.CUDA` (:mod:`.cuda`).
4. A non-empty NumPy float32/float64 array, for an operation with compiled loops (numba):
   :attr:`Backend.COMPILED`, or :attr:`Backend.BLAS` for loops around a BLAS product (the
   nearest-centroid kernels, for shapes the direct loops do not suit, or always when the
   key is ``"blas"``), when the loops may serve (:func:`dkmeans.kernels.plans.compiled_allowed`:
   the fit's kernel plan, or the compile setting). Empty arrays never compile anything (Dask
   probes functions with them).
5. Otherwise :attr:`Backend.NUMPY`.

The key is read where a fit starts and travels with its tasks in the fit's
:class:`~dkmeans.kernels.plans.KernelPlan`, like its code path, so workers follow the
client's ``dask.config.set``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable
from typing import NamedTuple

import numpy as np

from dkmeans.kernels.backends import cuda as _cuda  # imports CuPy only when its kernels run
from dkmeans.kernels.namespace import is_sparse
from dkmeans.kernels.plans import backend_setting, compiled_allowed

#: The values of Dask config ``dkmeans.kernels.backend``.
SETTINGS = ("auto", "blas", "numpy")

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


class Backend(str, enum.Enum):  # noqa: UP042 - str() of a member names it, as messages show
    """The code one kernel call runs."""

    #: ``scipy.sparse`` CSR kernels (:mod:`dkmeans.kernels.backends.sparse`).
    SPARSE = "sparse"
    #: Fused CuPy/CUDA kernels (:mod:`dkmeans.kernels.backends.cuda`).
    CUDA = "cuda"
    #: numba loops on NumPy rows (:mod:`dkmeans.kernels.backends.compiled` and its siblings).
    COMPILED = "compiled"
    #: numba loops around a BLAS matrix product (the nearest-centroid kernels).
    BLAS = "blas"
    #: The operation module's namespace code (NumPy or CuPy).
    NUMPY = "numpy"


class Loops(NamedTuple):
    """An operation's compiled loops for one call, as :func:`select` needs them.

    Attributes
    ----------
    kind : hashable or None
        The compile unit, whose loops serve where the kernel plan takes the compiled path
        (:func:`~dkmeans.kernels.plans.compiled_allowed`); None: loops that serve whatever
        the path (they compile in the call on first use).
    warm_up : callable or None
        Runs the loops of ``kind`` once on a few rows (None with ``kind`` None).
    """

    kind: Hashable | None = None
    warm_up: Callable[[], None] | None = None

    def ready(self) -> bool:
        """Whether these loops may serve the call now."""
        return self.kind is None or compiled_allowed()


#: Loops that serve on either code path (they compile in the call on first use).
ALWAYS = Loops()


def setting() -> str:
    """The ``dkmeans.kernels.backend`` setting of this call (a fit's plan's value, else the config's)."""
    return backend_setting()


def select(
    X, *, cuda: bool = False, compiled: Loops | None = None, blas: Loops | None = None
) -> Backend:
    """The backend of one kernel call on the rows ``X`` (see the module docstring for the rules).

    Parameters
    ----------
    X : array or scipy.sparse matrix, shape (n, d)
        The call's rows.
    cuda : bool
        The operation has fused CUDA kernels.
    compiled : Loops, optional
        The operation's compiled loops suited to this call's shape (none: it has none, or
        they do not suit it).
    blas : Loops, optional
        The operation's compiled loops around a BLAS product: taken when ``compiled`` is
        None, and in its place when the setting is ``"blas"``.

    Returns
    -------
    Backend
    """
    if is_sparse(X):
        return Backend.SPARSE
    chosen = setting()
    if chosen == "numpy":
        return Backend.NUMPY
    if cuda and _cuda.supports(X):
        return Backend.CUDA
    if not isinstance(X, np.ndarray) or X.dtype not in _FLOATS or X.size == 0:
        return Backend.NUMPY
    if blas is not None and (compiled is None or chosen == "blas"):
        return Backend.BLAS if blas.ready() else Backend.NUMPY
    if compiled is not None:
        return Backend.COMPILED if compiled.ready() else Backend.NUMPY
    return Backend.NUMPY


__all__ = ["ALWAYS", "Backend", "Loops", "SETTINGS", "select", "setting"]
