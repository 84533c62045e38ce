"""Where the chunks live: host memory (NumPy) or a GPU (CuPy), and moving them there once.

Kernels follow their input's namespace, so running on GPUs only needs CuPy chunks:
a CuPy array or a CuPy-backed Dask array is used as it is; ``device="gpu"`` turns a
NumPy or Dask input into CuPy chunks on the workers (one ``cupy.asarray`` per chunk,
when the data is persisted: the data crosses to the GPU once, not per iteration).
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np

from dkmeans.errors import DataTypeError, InvalidDataError, InvalidParameterError
from dkmeans.kernels.namespace import is_cupy_array, is_sparse

DEVICES = (None, "cpu", "gpu")


def check_device(device):
    if device not in DEVICES:
        raise InvalidParameterError(f"device must be one of {DEVICES}, got {device!r}")
    return device


def import_cupy():
    """CuPy, or an error that says how to get it."""
    try:
        import cupy
    except ImportError:
        raise InvalidParameterError(
            "device='gpu' needs CuPy and an NVIDIA GPU: pip install 'dkmeans[gpu]'"
        ) from None
    return cupy


def is_cupy_backed(arr: da.Array) -> bool:
    return is_cupy_array(getattr(arr, "_meta", None))


def to_device(arr: da.Array, device) -> da.Array:
    """``arr`` with its chunks on ``device`` (None: leave them where they are)."""
    if device == "gpu" and not is_cupy_backed(arr):
        if is_sparse(arr._meta):
            raise InvalidParameterError(
                "device='gpu' does not take scipy.sparse input (sparse kernels run on CPUs); "
                "use device=None or 'cpu'"
            )
        cupy = import_cupy()
        return arr.map_blocks(
            cupy.asarray, dtype=arr.dtype, meta=cupy.empty((0,) * arr.ndim, dtype=arr.dtype)
        )
    if device == "cpu" and is_cupy_backed(arr):
        cupy = import_cupy()
        return arr.map_blocks(
            cupy.asnumpy, dtype=arr.dtype, meta=np.empty((0,) * arr.ndim, dtype=arr.dtype)
        )
    return arr


def beside_rows(weights, X):
    """Dask ``weights`` with their chunks where ``X``'s rows are: on the GPU beside CuPy rows,
    in host memory beside host rows (so a kernel sees both in one namespace); None and
    in-memory weights as they are."""
    if weights is None or not isinstance(weights, da.Array) or X is None:
        return weights
    on_gpu = is_cupy_backed(X)
    if on_gpu == is_cupy_backed(weights):
        return weights
    cupy = import_cupy()
    move, meta = (
        (cupy.asarray, cupy.empty(0, weights.dtype))
        if on_gpu
        else (cupy.asnumpy, np.empty(0, weights.dtype))
    )
    return weights.map_blocks(move, dtype=weights.dtype, meta=meta)


def check_cupy_array(X, *, dtype=None, name: str = "X"):
    """A CuPy array checked from its metadata, as float32/float64 (no copy to the host).

    Finiteness is checked in the first pass over the data, as for Dask input.
    """
    if X.ndim != 2:
        raise InvalidDataError(
            f"{name}: expected a 2-D array of shape (n_samples, n_features), got {X.ndim}-D with shape {X.shape}"
        )
    kind = X.dtype.kind
    if kind == "c":
        raise InvalidDataError(f"{name}: Complex data not supported; pass real numbers")
    if kind not in "fiub":
        raise DataTypeError(f"{name}: dtype {X.dtype} is not numeric")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise InvalidDataError(
            f"{name}: empty array of shape {X.shape}; at least 1 sample and 1 feature are needed"
        )
    target = (
        np.dtype(dtype)
        if dtype is not None
        else (
            X.dtype
            if X.dtype in (np.dtype(np.float32), np.dtype(np.float64))
            else np.dtype(np.float64)
        )
    )
    return X.astype(target) if X.dtype != target else X


def chunk_cupy_array(X, n_workers: int) -> da.Array:
    """A CuPy array split into one row chunk per worker (CuPy-backed Dask array)."""
    rows = max(1, math.ceil(X.shape[0] / max(1, n_workers)))
    return da.from_array(X, chunks=(rows, X.shape[1]), asarray=False)
