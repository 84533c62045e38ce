"""The kernel plan: one fit's code path and backend setting, chosen once, in force in every kernel call.

The assignment kernels have compiled loops (numba) and a NumPy code path, which agree up to
float rounding. A fit takes one of them from start to end: the fit service asks :func:`plan`
once, before the fit, and runs the fit under the returned :class:`KernelPlan`
(:meth:`KernelPlan.applied`); the engine takes the plan into its tasks
(:meth:`KernelPlan.bind`), so workers follow the caller's choice and the caller's
``dask.config.set`` of ``dkmeans.kernels.backend``, which their own config never sees.

The rule (Dask config ``dkmeans.compile``, as pynndescent: compile at first need, numba's disk
cache, an explicit warm-up, :func:`dkmeans.kernels.warm.warm_up` or ``dkmeans warm-up``):

* ``"auto"`` (default): compiled, except a fit of less work than :data:`NUMPY_FIT_WORK`
  (elements x centroids x runs) on a cluster, or in a process that has not loaded the compiled
  loops of its dtype and width yet: the NumPy code serves it at once, and nothing compiles (nor
  loads on the workers). Anything else compiles at its first need (seconds once per machine,
  then a fraction of a second from numba's disk cache).
* ``"eager"``: compiled always (the test suite uses it).
* ``"off"``: the NumPy code always.

``dkmeans.kernels.backend = "numpy"`` takes no compiled loops (a NumPy plan). Kernel calls
outside any plan (a kernel called directly) follow the compile setting where they run:
compiled unless it is ``"off"``.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from dkmeans import config

logger = logging.getLogger("dkmeans")

#: The code paths of a plan.
PATHS = ("compiled", "numpy")

#: ``"auto"``: an in-process fit of less work than this (elements x centroids x runs) runs on the
#: NumPy code unless its compiled loops are loaded in the process already. Loading them costs a
#: fresh process 0.12-0.16 s of CPU even from numba's disk cache (most of it numba's first
#: dispatch), 6-9 s cold. Measured on 2 cores (a warm process, one BLAS thread, CPU seconds of a
#: default fit, NumPy against compiled): 100,000 x 8, k = 10 (8e6): 0.076 against 0.046;
#: 200,000 x 8, k = 10 (1.6e7): 0.145 against 0.075; 400,000 x 8, k = 10 (3.2e7): 0.24 against
#: 0.135. The NumPy code costs less than the load plus the compiled fit up to about 3e7; the bound
#: keeps a margin below that. A small fit on a cluster would make every worker load the loops.
NUMPY_FIT_WORK = 2**24

_current: contextvars.ContextVar = contextvars.ContextVar("dkmeans_kernel_plan", default=None)
_lock = threading.Lock()
#: (dtype, n_features) whose compiled loops this process has loaded (a compiled plan ran here, or
#: :func:`dkmeans.kernels.warm.prepare`); small fits of those take the compiled loops too.
_loaded: set = set()


class KernelPlan(NamedTuple):
    """What every kernel call of one fit runs: a code path and a backend setting (picklable).

    Attributes
    ----------
    path : {"compiled", "numpy"}
        The compiled loops (numba), or the NumPy code.
    backend : {"auto", "blas", "numpy"}
        The Dask config ``dkmeans.kernels.backend`` as the caller read it.
    """

    path: str
    backend: str

    @contextlib.contextmanager
    def applied(self):
        """Run the enclosed kernel calls under this plan (a context variable: other threads'
        fits keep theirs; threads started with a copy of this context follow it)."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def call(self, fn: Callable, *args, **kwargs):
        """``fn(*args, **kwargs)`` under this plan."""
        with self.applied():
            return fn(*args, **kwargs)

    def bind(self, fn: Callable) -> Callable:
        """``fn`` running under this plan wherever it is called: picklable (tasks take it), and
        named as ``fn`` (task keys and progress name the function)."""
        bound = _Bound(self, fn)
        return bound

    def numpy(self) -> KernelPlan:
        """This plan on the NumPy code (same backend setting)."""
        return self._replace(path="numpy")


class _Bound:
    """A function under a plan (see :meth:`KernelPlan.bind`)."""

    __slots__ = ("plan", "fn", "__name__", "__qualname__")

    def __init__(self, plan: KernelPlan, fn: Callable):
        self.plan, self.fn = plan, fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)

    def __call__(self, *args, **kwargs):
        with self.plan.applied():
            return self.fn(*args, **kwargs)

    def __reduce__(self):
        return _Bound, (self.plan, self.fn)


def compile_mode() -> str:
    """The checked value of Dask config ``dkmeans.compile`` (``"background"``, its former default, reads ``"auto"``)."""
    mode = config.get("compile")
    return "auto" if mode == "background" else mode


def current() -> KernelPlan | None:
    """The plan in force in this context, or None."""
    return _current.get()


def backend_setting() -> str:
    """``dkmeans.kernels.backend`` for this call: the plan's in a fit, else the config's here."""
    active = _current.get()
    return active.backend if active is not None else config.get("kernels.backend")


def compiled_allowed() -> bool:
    """Whether the compiled loops may serve this kernel call: the plan's path, else the compile
    setting here (compiled unless ``"off"``; they compile in the call at first need)."""
    active = _current.get()
    if active is not None:
        return active.path == "compiled"
    return compile_mode() != "off"


def plan(
    dtype,
    n_features: int,
    *,
    n_rows: int | None = None,
    n_clusters: int | None = None,
    sparse: bool = False,
    in_process: bool = True,
) -> KernelPlan:
    """The kernel plan of one fit over ``n_rows x n_features`` rows of ``dtype`` (see the module docstring).

    Parameters
    ----------
    dtype : dtype
        The rows' dtype.
    n_features : int
    n_rows : int, optional
        None: unknown (counts as large).
    n_clusters : int, optional
        The centroids the fit computes, times its runs; None: unknown (no size rule).
    sparse : bool
        ``scipy.sparse`` rows (the CSR kernels serve them whatever the path).
    in_process : bool
        The fit runs in this process (whose loaded loops count); else on a cluster, whose
        workers would each load them for a small fit too.

    Returns
    -------
    KernelPlan
    """
    backend = config.get("kernels.backend")
    mode = compile_mode()
    if mode == "off" or backend == "numpy":
        return KernelPlan("numpy", backend)
    if mode == "eager" or sparse or n_rows is None or n_clusters is None:
        return KernelPlan("compiled", backend)
    key = (np.dtype(dtype).str, int(n_features))
    small = int(n_rows) * max(1, int(n_features)) * max(1, int(n_clusters)) < NUMPY_FIT_WORK
    if small and not (in_process and key in _loaded):
        return KernelPlan("numpy", backend)
    if in_process:
        with _lock:
            _loaded.add(
                key
            )  # the fit loads them (at its first kernel call): later small fits use them too
    return KernelPlan("compiled", backend)


def numpy_plan() -> KernelPlan:
    """The NumPy code, with the backend setting in force here."""
    return KernelPlan("numpy", backend_setting())


def loaded(dtype, n_features: int) -> bool:
    """Whether this process has loaded the compiled loops for rows of ``dtype`` and ``n_features``."""
    return (np.dtype(dtype).str, int(n_features)) in _loaded


def mark_loaded(dtype, n_features: int) -> None:
    """Note that this process has loaded the compiled loops for rows of ``dtype`` and ``n_features``
    (:func:`dkmeans.kernels.warm.prepare`): small fits of such rows take them too."""
    with _lock:
        _loaded.add((np.dtype(dtype).str, int(n_features)))


__all__ = [
    "KernelPlan",
    "NUMPY_FIT_WORK",
    "PATHS",
    "backend_setting",
    "compile_mode",
    "compiled_allowed",
    "current",
    "loaded",
    "mark_loaded",
    "numpy_plan",
    "plan",
]
