"""Loading the compiled kernels ahead of a fit: a worker's preparation, and ``dkmeans warm-up``.

numba compiles each loop at its first call (6-9 s for a fit's loops on 2 cores, once per
machine) and keeps it in its disk cache, from which a fresh process loads it in a fraction of a
second. :func:`prepare` runs a plan's loops on a few rows, so that the load (or the compilation)
happens before the fit's first pass; :func:`warm_up` fills the disk cache for the usual widths,
and for the size caps' loops.
"""

from __future__ import annotations

import numpy as np

from dkmeans import config
from dkmeans.kernels import plans
from dkmeans.kernels.capacitated import warm_up as warm_up_capacitated
from dkmeans.kernels.nearest import compiled_kinds
from dkmeans.kernels.pruned import warm_up as warm_up_pruned
from dkmeans.kernels.swap import warm_up as warm_up_swaps

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def prepare(kernel_plan: plans.KernelPlan | None, dtype, n_features: int) -> None:
    """Load a plan's compiled kernels for rows of ``dtype`` and ``n_features`` in this process.

    Runs every compiled loop a fit may take on a few rows (compiling them, or loading them from
    numba's disk cache), once per process, dtype and width. A NumPy plan (or none) loads nothing.
    """
    if kernel_plan is None or kernel_plan.path != "compiled" or int(n_features) < 1:
        return
    if np.dtype(dtype) not in _FLOATS or plans.loaded(dtype, n_features):
        return
    with kernel_plan.applied():
        for _, warm in compiled_kinds(dtype, int(n_features)):
            warm()
        warm_up_pruned(dtype, int(n_features))  # Lloyd's pruned passes
    plans.mark_loaded(dtype, n_features)


def prepare_caller(kernel_plan: plans.KernelPlan | None, dtype, n_features: int) -> None:
    """Load, in the calling process, the compiled kernels that a fit on a cluster runs there.

    The seeding's local search runs on the caller, on the candidates (its swap loops), and
    assigns rows there (the assignment loops of :func:`prepare`, without the pruned passes,
    which run on the workers). The swap loops come first: the workers start with the
    assignment loops, so that with an empty kernel cache the caller and a worker compile
    different loops at once (each loop once per machine, :mod:`.backends.jit`). Does not mark
    the loops loaded for the plan's size rule (:func:`~dkmeans.kernels.plans.plan`): a later
    fit's code path never depends on when this ended.
    """
    if kernel_plan is None or kernel_plan.path != "compiled" or int(n_features) < 1:
        return
    if np.dtype(dtype) not in _FLOATS:
        return
    with kernel_plan.applied():
        warm_up_swaps(np.dtype(dtype))
        for _, warm in compiled_kinds(dtype, int(n_features)):
            warm()


def warm_up(dtypes=("float32", "float64"), n_features=(2, 4, 8, 16, 32)) -> None:
    """Compile the kernels into numba's disk cache now (what ``dkmeans warm-up`` runs).

    A fresh install compiles at the first fit that needs the loops (6-9 s on 2 cores, once per
    machine and CPU); this pays it up front, so that later processes load them from the cache.

    Parameters
    ----------
    dtypes : sequence of dtype
    n_features : sequence of int
        Widths to compile for (the direct loops have one variant per width up to 16).
    """
    for dtype in dtypes:
        compiled = plans.KernelPlan("compiled", config.get("kernels.backend"))
        for d in n_features:
            prepare(compiled, dtype, d)
        with compiled.applied():  # size caps' loops (one variant per dtype, whatever the width)
            warm_up_capacitated(np.dtype(dtype))


__all__ = ["prepare", "prepare_caller", "warm_up"]
