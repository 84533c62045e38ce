"""Fused CuPy kernels for the assignment step: nearest centroid, exact distances, partials.

Same semantics as the NumPy path of :func:`dkmeans.kernels.nearest.assign` and
:func:`dkmeans.kernels.nearest.assign_partials`, for 2-D CuPy arrays of float32 or float64:

* **Choice of the centroid.** For a tile of rows and a block of centroids, cuBLAS computes
  ``G = X_tile @ C_block.T`` (``cupy.dot`` into a preallocated buffer) and the
  kernel ``argmin_block`` (:data:`SOURCE_FILE`) folds ``||c||^2/2 - x.c`` (in the data
  dtype; ``||c||^2/2`` from ``half_sq_norms``, summed in float64 and rounded, exactly 1/2
  for a centroid of norm 1 to rounding, as on the NumPy and sparse paths: see
  :data:`~dkmeans.kernels.common.UNIT_SQ_NORM_TOL`) into a running minimum per row. Within a block the lowest index
  wins an exact tie; across blocks the comparison is a strict ``<``, so the earlier block
  (lower index) keeps a tie: the result is that of one ``argmin`` over all ``k`` centroids.
  The product is full float32 (or float64) unless ``CUPY_TF32=1`` lets cuBLAS use TF32,
  which makes the choice of centroid only as precise as TF32.
* **Reported distance.** ``exact_sq`` recomputes ``||x - c_label||^2`` from the difference
  ``x - c`` rounded in the data dtype (as NumPy's ``X - C[labels]``); the squares are summed
  in float64 and the result is rounded to the data dtype.
* **Partials.** ``partials`` computes the same exact distance and adds, with float64
  ``atomicAdd``, ``w * x`` into the per-cluster sums, ``w`` into the counts and ``w * d2``
  into the objective (``w = 1`` without weights; ``d2`` kept in float64, not rounded to the
  data dtype first). The order of the additions is not fixed, so sums can differ from run
  to run in the last bits of float64 (counts without weights are exact integers).

Launches: every kernel runs ``THREADS``-thread blocks; a row is handled by ``lanes``
threads (the smallest power of two >= min(width, 32), width = ``d`` or the centroid block),
which combine with warp shuffles. Each call runs on the current CuPy stream; all work of a
call is ordered on it (cuBLAS included), and nothing is copied to the host.

Memory: one call holds a ``row_tile x centroid_block`` product buffer plus a few vectors
of ``row_tile`` entries, sized by :func:`plan_tiles` (the kernels' one tile planner,
:func:`dkmeans.kernels.common.plan_tiles`, with this path's scratch per row) to stay within ``scratch_bytes``
whatever ``k`` is (the ``n x k`` product is never formed). Besides that scratch, a call
allocates its outputs, a copy of ``C`` when it is not already a C-contiguous array of the
data dtype on the device, ``||c||^2/2`` (``k`` values), and a float64 copy of the weights
when they are not one already.

CuPy is imported inside the functions only: this module imports (and :func:`supports`
answers False) where CuPy is absent. Of dkmeans it imports only :mod:`dkmeans.kernels.common`
and :mod:`dkmeans.kernels.namespace` (NumPy alone), so a benchmark can load the three by path
on a machine with CuPy and NumPy alone (``benchmarks/gpu_lloyd.py``).
"""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dkmeans.kernels.common import (
    DEFAULT_SCRATCH_BYTES,
    MAX_CENTROID_BLOCK,  # noqa: F401 - tests and benchmarks read it here
    UNIT_SQ_NORM_TOL,
)
from dkmeans.kernels.common import plan_tiles as _plan_tiles
from dkmeans.kernels.namespace import is_cupy_array

__all__ = [
    "DEFAULT_SCRATCH_BYTES",
    "SOURCE_FILE",
    "assign_cuda",
    "device_scratch_bytes",
    "kernel_code",
    "kernel_source",
    "nearest_cuda",
    "partials_cuda",
    "plan_tiles",
    "supports",
]

# DEFAULT_SCRATCH_BYTES (one call's scratch: the product buffer and per-row vectors) and
# MAX_CENTROID_BLOCK (centroids in one matrix product) are the other paths' values
# (``benchmarks/gpu_lloyd.py --scratch-mib`` measures other scratch sizes).
#: Scratch of one call dispatched from the kernels' common signatures
#: (:func:`device_scratch_bytes`), where the device has eight times as much free: their
#: ``scratch_bytes`` is sized for host memory, and small tiles leave the GPU waiting on
#: Python's launches. Measured on an H200
#: (``benchmarks/gpu_lloyd.py``, 10M x 128 float32, k = 1,000): a Lloyd iteration in 0.110 s
#: at 64 MiB (the host issuing it took 0.054 s), 0.103 s at 256 MiB, 0.085 s at 1 GiB.
DEVICE_SCRATCH_BYTES = 2**30
#: Largest number of rows in one tile (keeps launch sizes and 32-bit row indices small).
MAX_ROW_TILE = 2**20
#: Threads per block of every launch; a multiple of the warp size (the source assumes it).
THREADS = 256
WARP = 32

_FLOATS = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
# ``half_sq_norms`` gives exactly 1/2 to a centroid whose float64 squared norm is within
# UNIT_SQ_NORM_TOL (per data dtype) of 1, the other paths' rule, so that exact ties in
# ``x.c`` among unit centroids (cosine: a row orthogonal to several) go to the lowest index.

#: The CUDA C of the kernels, package data next to this module (read at first use, :func:`kernel_source`).
SOURCE_FILE = "cuda_kernels.cu"

#: The kernels of :data:`SOURCE_FILE` (``extern "C"`` names).
KERNEL_NAMES = ("half_sq_norms", "argmin_block", "exact_sq", "partials")


# -- helpers without CuPy ----------------------------------------------------------------------
def supports(X) -> bool:
    """True when the fused kernels handle ``X``: a 2-D CuPy array of float32 or float64."""
    return is_cupy_array(X) and getattr(X, "ndim", 0) == 2 and np.dtype(X.dtype) in _FLOATS


def plan_tiles(n: int, k: int, d: int, itemsize: int, scratch_bytes: int = DEFAULT_SCRATCH_BYTES):
    """:func:`dkmeans.kernels.common.plan_tiles` with this path's scratch per row and row cap.

    Per row of a tile a call holds one row of the product buffer (``centroid_block``
    values), a running minimum (``itemsize``), a label (4 bytes) and, for input that is
    not C-contiguous, a contiguous copy of the row (``d * itemsize``, always counted).

    Returns
    -------
    row_tile, centroid_block : int
        ``1 <= row_tile <= min(max(n, 1), MAX_ROW_TILE)``,
        ``1 <= centroid_block <= min(max(k, 1), MAX_CENTROID_BLOCK)``.
    """
    return _plan_tiles(
        n,
        k,
        d,
        itemsize,
        scratch_bytes,
        row_bytes=itemsize + 4 + d * itemsize,
        max_row_tile=MAX_ROW_TILE,
    )


def device_scratch_bytes(X, scratch_bytes: int) -> int:
    """The scratch bound of a call on ``X``'s device: ``scratch_bytes``, raised up to
    :data:`DEVICE_SCRATCH_BYTES` where the device has eight times that much memory free."""
    cp = _cupy()
    with X.device:
        free, _ = cp.cuda.runtime.memGetInfo()
    return max(int(scratch_bytes), min(DEVICE_SCRATCH_BYTES, free // 8))


def _lanes(width: int) -> int:
    """Threads per row for a row of ``width`` values: the smallest power of two that is at
    least ``min(width, 32)`` (1 for ``width <= 1``)."""
    lanes = 1
    while lanes < min(width, WARP):
        lanes *= 2
    return lanes


def _i32(value: int):
    """A kernel's ``int`` argument (CuPy passes a Python int as a 64-bit integer)."""
    if not -(2**31) <= value < 2**31:
        raise OverflowError(f"{value} does not fit a 32-bit kernel argument")
    return np.int32(value)


# -- CuPy side ---------------------------------------------------------------------------------
def _cupy():
    try:
        import cupy
    except ImportError:
        raise ImportError("the GPU kernels need CuPy: pip install 'dkmeans[gpu]'") from None
    return cupy


@functools.cache
def kernel_source() -> str:
    """The CUDA C of the kernels (:data:`SOURCE_FILE`), read once, at first use.

    From the package's data (:mod:`importlib.resources`: also inside a wheel or a zip);
    loaded by path outside the package (a benchmark), from the file next to this one.
    """
    package = __spec__.parent if __spec__ is not None else ""
    if package:
        return importlib.resources.files(package).joinpath(SOURCE_FILE).read_text(encoding="utf-8")
    return (Path(__file__).parent / SOURCE_FILE).read_text(encoding="utf-8")


def kernel_code(dtype) -> str:
    """The CUDA source compiled for data of ``dtype`` (float32 or float64).

    The definitions the source expects in front of it (the data type ``T``, ``THREADS``,
    ``UNIT_SQ_TOL``), then :func:`kernel_source`.
    """
    dtype = np.dtype(dtype)
    # the blank line in front of the source keeps the code CuPy compiled (and cached) before the .cu file
    return (
        f"typedef {_FLOATS[dtype]} T;\n#define THREADS {THREADS}\n#define UNIT_SQ_TOL {UNIT_SQ_NORM_TOL[dtype]!r}\n"
        f"\n{kernel_source()}"
    )


@functools.cache
def _kernels(dtype_name: str) -> dict:
    """The kernels of :data:`SOURCE_FILE` for one data dtype (compiled on first launch, per
    device, and cached on disk by CuPy)."""
    cp = _cupy()
    code = kernel_code(dtype_name)
    return {name: cp.RawKernel(code, name) for name in KERNEL_NAMES}


def _launch(kernel, threads: int, args: tuple) -> None:
    """Launch ``kernel`` on at least ``threads`` threads, in blocks of :data:`THREADS`."""
    blocks = (threads + THREADS - 1) // THREADS
    kernel((blocks,), (THREADS,), args)


class _Block(NamedTuple):
    """One block of centroids: what ``argmin_block`` needs, prepared once per call."""

    size: int
    CT: object  # (d, size) transposed view of C[j0 : j0 + size]
    c_half: object  # (size,) ||c||^2 / 2 in the data dtype
    lanes: int
    args: tuple  # the int arguments kb, j0, first, lanes of argmin_block (numpy.int32)
    G_full: object  # (row_tile, size) view of the product buffer, for full tiles


class _Plan(NamedTuple):
    """Everything a call prepares once: inputs on the device, tiles, buffers, kernels."""

    X: object
    C: object
    blocks: list
    row_tile: int
    g_buf: object  # row_tile * centroid_block values
    best: object  # (row_tile,) running minimum
    kernels: dict


def _check(X) -> None:
    if not supports(X):
        raise TypeError(
            f"expected a 2-D CuPy array of float32 or float64, got {type(X).__name__} "
            f"of dtype {getattr(X, 'dtype', None)} and ndim {getattr(X, 'ndim', None)}"
        )


def _prepare(cp, X, C, scratch_bytes, row_tile, centroid_block) -> _Plan:
    """Check the inputs, cast ``C`` to the data dtype and prepare tiles, blocks and buffers.

    ``X`` has passed :func:`_check`; must run with ``X.device`` current.
    """
    n, d = X.shape
    C = cp.ascontiguousarray(cp.asarray(C, dtype=X.dtype))
    if C.ndim != 2 or C.shape[1] != d:
        raise ValueError(f"centroids of shape {C.shape} do not match data with {d} features")
    k = C.shape[0]
    if k == 0:
        raise ValueError("no centroids")
    tile, block = plan_tiles(n, k, d, X.dtype.itemsize, scratch_bytes)
    if row_tile is not None:
        tile = max(1, min(int(row_tile), max(n, 1), MAX_ROW_TILE))
    if centroid_block is not None:
        block = max(1, min(int(centroid_block), k))
    kernels = _kernels(X.dtype.name)
    c_half = cp.empty(k, dtype=X.dtype)  # ||c||^2 / 2 in the data dtype
    lanes = _lanes(d)
    _launch(kernels["half_sq_norms"], k * lanes, (C, _i32(k), _i32(d), _i32(lanes), c_half))
    g_buf = cp.empty(tile * block, dtype=X.dtype)
    blocks = []
    for j0 in range(0, k, block):
        size = min(block, k - j0)
        lanes = _lanes(size)
        args = (_i32(size), _i32(j0), _i32(j0 == 0), _i32(lanes))
        G_full = g_buf[: tile * size].reshape(tile, size)
        blocks.append(
            _Block(size, C[j0 : j0 + size].T, c_half[j0 : j0 + size], lanes, args, G_full)
        )
    best = cp.empty(tile, dtype=X.dtype)
    return _Plan(X, C, blocks, tile, g_buf, best, kernels)


def _tiles(cp, plan: _Plan):
    """``(i0, Xt)`` for each row tile; ``Xt`` is C-contiguous (a view when ``X`` is)."""
    X = plan.X
    contiguous = X.flags.c_contiguous
    for i0 in range(0, X.shape[0], plan.row_tile):
        Xt = X[i0 : i0 + plan.row_tile]
        yield i0, (Xt if contiguous else cp.ascontiguousarray(Xt))


def _nearest_tile(cp, plan: _Plan, Xt, labels) -> None:
    """Write the nearest centroid of each row of ``Xt`` to ``labels`` (int32, a view)."""
    m = Xt.shape[0]
    m_arg = _i32(m)
    full = m == plan.row_tile
    best = plan.best if full else plan.best[:m]
    argmin_block = plan.kernels["argmin_block"]
    for b in plan.blocks:
        G = b.G_full if full else plan.g_buf[: m * b.size].reshape(m, b.size)
        cp.dot(Xt, b.CT, out=G)  # cuBLAS GEMM into the buffer: G = Xt @ C_block.T
        kb, j0, first, lanes = b.args
        _launch(argmin_block, m * b.lanes, (G, b.c_half, m_arg, kb, j0, first, lanes, best, labels))


def nearest_cuda(
    X, C, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES, row_tile=None, centroid_block=None
):
    """Index of the nearest centroid of each row (int32 CuPy array, lowest index on ties).

    Parameters as :func:`assign_cuda`.
    """
    cp = _cupy()
    _check(X)
    with X.device:
        plan = _prepare(cp, X, C, scratch_bytes, row_tile, centroid_block)
        labels = cp.empty(X.shape[0], dtype=cp.int32)
        for i0, Xt in _tiles(cp, plan):
            _nearest_tile(cp, plan, Xt, labels[i0 : i0 + Xt.shape[0]])
    return labels


def assign_cuda(
    X, C, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES, row_tile=None, centroid_block=None
):
    """Nearest centroid of each row and the squared distance to it (the fused ``assign``).

    Parameters
    ----------
    X : cupy.ndarray, shape (n, d), float32 or float64
    C : array, shape (k, d)
        Centroids (CuPy, or host memory: copied to ``X``'s device), cast to ``X.dtype``.
    scratch_bytes : int
        Bound on the scratch memory of the call (see :func:`plan_tiles`).
    row_tile, centroid_block : int, optional
        Override the planned tile sizes (tests; ``scratch_bytes`` is then not enforced).

    Returns
    -------
    labels : cupy.ndarray, shape (n,), int32
        Index of the nearest centroid (lowest index on exact ties).
    min_sq_dist : cupy.ndarray, shape (n,), ``X.dtype``
        ``||x - c_label||^2`` from the difference ``x - c``.
    """
    cp = _cupy()
    _check(X)
    with X.device:
        plan = _prepare(cp, X, C, scratch_bytes, row_tile, centroid_block)
        n, d = X.shape
        labels = cp.empty(n, dtype=cp.int32)
        min_sq = cp.empty(n, dtype=X.dtype)
        lanes = _lanes(d)
        exact_sq = plan.kernels["exact_sq"]
        for i0, Xt in _tiles(cp, plan):
            m = Xt.shape[0]
            lab = labels[i0 : i0 + m]
            _nearest_tile(cp, plan, Xt, lab)
            _launch(
                exact_sq,
                m * lanes,
                (
                    Xt,
                    plan.C,
                    lab,
                    _i32(m),
                    _i32(d),
                    _i32(lanes),
                    min_sq[i0 : i0 + m],
                ),
            )
    return labels, min_sq


def partials_cuda(
    X,
    C,
    weights=None,
    *,
    scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
    row_tile=None,
    centroid_block=None,
):
    """Per-cluster float64 sums, counts and objective of the rows (the fused ``assign_partials``).

    Parameters
    ----------
    X, C, scratch_bytes, row_tile, centroid_block
        As :func:`assign_cuda`.
    weights : array, shape (n,), optional
        Non-negative sample weights (CuPy or host memory), used as float64.

    Returns
    -------
    sums : cupy.ndarray, shape (k, d), float64
    counts : cupy.ndarray, shape (k,), float64
    objective : cupy.ndarray, shape (), float64
    """
    cp = _cupy()
    _check(X)
    with X.device:
        plan = _prepare(cp, X, C, scratch_bytes, row_tile, centroid_block)
        n, d = X.shape
        k = plan.C.shape[0]
        sums = cp.zeros((k, d), dtype=cp.float64)
        counts = cp.zeros(k, dtype=cp.float64)
        objective = cp.zeros((), dtype=cp.float64)
        if n == 0:
            return sums, counts, objective
        if weights is None:
            w = None
            no_weights = cp.empty(0, dtype=cp.float64)  # a pointer the kernel never reads
        else:
            w = cp.ascontiguousarray(cp.asarray(weights, dtype=cp.float64)).reshape(-1)
            if w.shape[0] != n:
                raise ValueError(f"{w.shape[0]} weights for {n} rows")
        labels = cp.empty(plan.row_tile, dtype=cp.int32)
        lanes = _lanes(d)
        kernel = plan.kernels["partials"]
        for i0, Xt in _tiles(cp, plan):
            m = Xt.shape[0]
            lab = labels[:m]
            _nearest_tile(cp, plan, Xt, lab)
            wt = no_weights if w is None else w[i0 : i0 + m]
            _launch(
                kernel,
                m * lanes,
                (
                    Xt,
                    plan.C,
                    lab,
                    wt,
                    _i32(w is not None),
                    _i32(m),
                    _i32(d),
                    _i32(lanes),
                    sums,
                    counts,
                    objective,
                ),
            )
    return sums, counts, objective
