"""The workers' side of the memory probe: run on each worker by :meth:`MemoryBudget.of
<dkmeans.engine.memory.MemoryBudget.of>`, in one round trip.

Its own light module (the standard library, psutil, distributed and :mod:`.release`): a fresh
worker answers the probe without importing the engine or the kernels first; the kernels, and
what they import, are loaded in a thread of the worker while the caller places the fit's data.
"""

from __future__ import annotations

import contextlib
import threading

import dask
import numpy as np
from distributed import get_worker
from distributed.system import MEMORY_LIMIT as HOST_MEMORY

from dkmeans.engine.release import release_memory

#: Memory a worker process takes to load the fit's compiled kernels (numba, llvmlite and the cached
#: machine code), measured: 64 -> 327 MiB on a fresh worker; with a margin. Counted as the worker's
#: own memory while its load is under way.
KERNELS_BYTES = 300 * 2**20

#: (dtype, width) of the compiled kernels this process has loaded
_prepared: set = set()
#: the loads started on this worker (:func:`_probe_worker`), by (plan, dtype, width): their threads
_loading: dict = {}
_loading_lock = threading.Lock()


def prepare_worker(plan: tuple | None, dtype, n_features: int) -> int:
    """The engine's worker preparation for a fit: its kernel plan's kernels loaded, the allocators'
    free memory released; returns the process's resident memory (bytes, as distributed measures it).

    A compiled plan's kernels run once on a few rows (compiling them, or loading them from
    numba's cache), once per process, dtype and width (:func:`dkmeans.kernels.warm.prepare`); a
    NumPy plan loads nothing. :meth:`MemoryBudget.of` runs it in a thread of each worker
    (:func:`_probe_worker`), beside the fit's placement of its data. ``plan``: a
    :class:`~dkmeans.kernels.plans.KernelPlan`, or its fields as a tuple.
    """
    if plan is not None and plan[0] == "compiled":
        from dkmeans.kernels.plans import KernelPlan
        from dkmeans.kernels.warm import prepare

        prepare(KernelPlan(*plan), dtype, n_features)
        _prepared.add((str(np.dtype(dtype)), int(n_features)))
        # what the fit's last pass unpickles, imported here beside the placement rather than on
        # the worker's event loop when the labels are asked for
        import dkmeans.engine.rowwise  # noqa: F401
    return _release_and_measure()


def _start_once(key: tuple, target, args: tuple) -> bool:
    """Start ``target(*args)`` in a thread of this process, once per ``key`` (kept in
    :data:`_loading`); whether it runs now (True where started now, False once it has ended)."""
    with _loading_lock:
        thread = _loading.get(key)
        if thread is None:
            thread = _loading[key] = threading.Thread(
                target=target, args=args, name="dkmeans-kernel-load", daemon=True
            )
            thread.start()
            return True
    return thread.is_alive()


def _load_in_background(plan: tuple, dtype, n_features: int) -> bool:
    """Start :func:`prepare_worker` in a thread of this process, once per plan, dtype and width;
    whether a load is under way now (False: the kernels were loaded before; True where it starts
    now: measured before the load, its memory is to be counted)."""
    key = (tuple(plan), str(np.dtype(dtype)), int(n_features))
    return _start_once(key, prepare_worker, (plan, dtype, n_features))


def load_here_in_background(plan, dtype, n_features: int) -> None:
    """Start loading, in a thread of this (the calling) process, the compiled kernels a fit on the
    cluster under ``plan`` runs here (:func:`dkmeans.kernels.warm.prepare_caller`), once per plan,
    dtype and width: beside the workers' own load and the data's placement, instead of at the
    seeding's first kernel call. Results never depend on when it ends (it changes no plan)."""
    if plan is None or plan[0] != "compiled":
        return
    key = ("caller", tuple(plan), str(np.dtype(dtype)), int(n_features))
    _start_once(key, _prepare_caller, (tuple(plan), dtype, n_features))


def _prepare_caller(plan: tuple, dtype, n_features: int) -> None:
    from dkmeans.kernels.plans import KernelPlan
    from dkmeans.kernels.warm import prepare_caller

    prepare_caller(KernelPlan(*plan), dtype, n_features)


def _probe_worker(plan: tuple | None, dtype, n_features: int) -> tuple[bool, int, bool]:
    """Run on a worker: ``(loaded, rss, loading)``: whether the compiled kernels of ``(dtype,
    n_features)`` are loaded, the process's memory after a release (bytes), and whether it
    started (or is still in) loading them in a thread, which it does for a compiled plan where
    they fit below the pause threshold (:data:`KERNELS_BYTES`). ``plan``: the fit's kernel plan's
    fields (a tuple: unpickling a plan would import the kernels before the answer)."""
    rss = _release_and_measure()
    loaded = (str(np.dtype(dtype)), int(n_features)) in _prepared
    loading = False
    if plan is not None and plan[0] == "compiled" and not loaded:
        limit = 0
        with contextlib.suppress(ValueError):
            limit = int(get_worker().memory_manager.memory_limit or 0)
        pause = float(dask.config.get("distributed.worker.memory.pause", 0.8) or 1.0)
        if rss + KERNELS_BYTES <= pause * (limit or HOST_MEMORY):
            loading = _load_in_background(plan, dtype, n_features)
            loaded = not loading
    return loaded, rss, loading


def _release_and_measure() -> int:
    """Run on a worker: what the allocators keep released; the process's resident memory (bytes)."""
    import psutil

    release_memory()
    return int(psutil.Process().memory_info().rss)


__all__ = ["KERNELS_BYTES", "load_here_in_background", "prepare_worker"]
