"""Array-backend helpers: which namespace (NumPy or CuPy) an array belongs to.

Kernels call :func:`get_namespace` and then use ``xp.<function>`` only, so one code
path serves both backends. CuPy is imported lazily and never required.
"""

from __future__ import annotations

import numpy as np


def is_cupy_array(x) -> bool:
    """True if ``x`` is a CuPy array (checked without importing CuPy)."""
    return type(x).__module__.split(".", 1)[0] == "cupy"


def get_namespace(*arrays):
    """Return ``cupy`` if any argument is a CuPy array, else ``numpy``."""
    for a in arrays:
        if a is not None and is_cupy_array(a):
            import cupy

            return cupy
    return np


def is_sparse(x) -> bool:
    """True if ``x`` is a ``scipy.sparse`` matrix or array (host memory)."""
    if type(x).__module__.split(".", 1)[0] != "scipy":
        return False
    import scipy.sparse

    return scipy.sparse.issparse(x)


def concatenate_rows(blocks):
    """Blocks of rows stacked in order: NumPy, CuPy or ``scipy.sparse`` (stays CSR, never densified)."""
    if blocks and is_sparse(blocks[0]):
        import scipy.sparse

        return scipy.sparse.vstack(blocks, format="csr")
    return get_namespace(*blocks).concatenate(blocks)


def sparse_namespace(xp):
    """The sparse-matrix module matching ``xp`` (``scipy.sparse`` or ``cupyx.scipy.sparse``)."""
    if xp is np:
        import scipy.sparse

        return scipy.sparse
    import cupyx.scipy.sparse

    return cupyx.scipy.sparse


def to_host(x):
    """Copy an array (or a tuple/NamedTuple of arrays) to host NumPy memory."""
    if isinstance(x, tuple):
        converted = [to_host(v) for v in x]
        return type(x)(*converted) if hasattr(x, "_fields") else tuple(converted)
    if is_cupy_array(x):
        return x.get()
    return x
