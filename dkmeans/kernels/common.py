"""What every kernel module shares: the scratch budget, result types, and the top-m selection."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

#: Scratch memory one kernel call may use, in bytes (distance tiles, gathered
#: centroids, float64 copies of a row tile), besides centroid-sized arrays (the
#: centroids in the data dtype, padded for the direct loop, and the k x d float64
#: sums). The compiled paths use at most about ``BLAS_BLOCK_BYTES`` of it.
DEFAULT_SCRATCH_BYTES = 32 * 2**20
#: Centroid-sized arrays a worker may hold at once during a pass, counted in float64
#: ``k x d`` arrays (:func:`centroid_bytes`). In one process a Lloyd iteration holds about
#: 5 (the kernel's float64 sums, the combined partials, the new and previous centroids and
#: their shift: measured with tracemalloc); an update that leaves clusters empty about 9 (its
#: refill keeps the live centroids and forms the next partials too: 106 MiB of traced peak at
#: k = 16,384 x 64, scratch included); on a worker, the messages add as many again (the
#: centroids a task receives, the partials it sends and, SPMD, those it receives, each once
#: as bytes and once as an array). Measured worker growth during a fit with such a refill on 2
#: workers (``benchmarks/large_k.py --default-fit``, 2026-11-27): at most 529 MiB at
#: k = 65,536 x 64 and 475 MiB at k = 262,144 x 16, about 14.5 and 12.6 such arrays besides the
#: scratch (12 was the bound before the refill formed the next partials); 16 is the bound the
#: budget plans with.
CENTROID_COPIES_F64 = 16


def centroid_bytes(k: int, d: int, itemsize: int) -> int:
    """Memory a worker holds for ``k`` centroids of ``d`` features during a pass, besides the kernel scratch.

    The centroids in the data dtype and one packed copy of them for the compiled loops
    (``2 k d itemsize``), :data:`CENTROID_COPIES_F64` float64 ``k x d`` arrays and a few
    per-centroid vectors (counts, half squared norms: ``32 k``). At ``k = 262,144`` and
    ``d = 16`` (float32) that is 552 MiB; the memory budget
    (:class:`dkmeans.engine.memory.MemoryBudget`) subtracts it from every worker's room.
    """
    return int(k) * (int(d) * (2 * int(itemsize) + 8 * CENTROID_COPIES_F64) + 32)


def check_centroid_shape(X, C) -> None:
    """Refuse centroids the assignment kernels cannot use (the compiled loops index without checks).

    Raises
    ------
    ValueError
        If ``C`` is not 2-D, has no rows, or has another number of features than ``X``.
    """
    if len(C.shape) != 2 or C.shape[0] == 0:
        raise ValueError(
            f"the assignment kernels need at least one centroid; got centroids of shape {tuple(C.shape)}"
        )
    if C.shape[1] != X.shape[1]:
        raise ValueError(f"centroids have {C.shape[1]} features but the rows have {X.shape[1]}")


#: A centroid whose squared norm, summed in float64 from its values in the data dtype, is
#: within this of 1 is unit to rounding: the choice of the nearest centroid takes its
#: ``||c||^2 / 2`` as exactly 1/2 (:func:`unit_half_sq_norms`). A unit vector computed in
#: float64 is within a few tens of float64 ulps of norm 1 (d up to 10^6), and rounded to
#: float32 within one float32 ulp; the tolerances leave a wide margin above that. The CuPy
#: kernel ``half_sq_norms`` (:mod:`._cuda`) applies the same values.
UNIT_SQ_NORM_TOL = {np.dtype(np.float32): 2.0**-20, np.dtype(np.float64): 2.0**-40}
#: :func:`unit_half_sq_norms` sums in float64 only the centroids whose ``2 c_half`` (as the
#: kernel computed it, in the data dtype) is within this of 1: far wider than its rounding.
UNIT_PREFILTER = 2.0**-8


#: Centroids checked per tile by :func:`unit_half_sq_norms` (float64 scratch of about this many bytes).
UNIT_TILE_BYTES = 4 * 2**20


def unit_half_sq_norms(xp, C, c_half, dtype):
    """The centroid constants of the nearest-centroid choice: ``c_half``, with exactly 1/2 for unit centroids.

    Every assignment kernel (NumPy, compiled, ``scipy.sparse``; CuPy in its own
    ``half_sq_norms`` kernel) chooses the centroid of smallest ``c_half[j] - x.c_j``, where
    ``c_half[j] = ||c_j||^2 / 2`` as that kernel computed it. For unit centroids (cosine:
    :func:`~dkmeans.kernels.cosine.unit_centroids`, :func:`~dkmeans.kernels.cosine.normalize_rows`,
    ``metric.prepare_centroids``) the squared
    norms are 1 only to rounding, and each path rounds them differently; a row with the
    same dot product with several centroids (a row orthogonal to them: exactly 0) would go
    to the centroid whose norm happened to round lowest, not to the lowest index, and to a
    different one on CSR and dense input. A centroid whose float64 squared norm is within
    :data:`UNIT_SQ_NORM_TOL` of 1 gets exactly 1/2 here, so such ties are exact and go to the
    lowest index on every path. Other centroids keep ``c_half`` unchanged (the Euclidean
    choice moves by at most half the tolerance, below the rounding of ``x.c``, and only for
    centroids of norm 1 to rounding).

    Parameters
    ----------
    xp : namespace of ``C`` and ``c_half`` (NumPy or CuPy)
    C : array, shape (k, d)
        The centroids as the kernel uses them (cast to the data dtype).
    c_half : array, shape (k,)
        ``||c||^2 / 2`` as the kernel computed it (any float dtype; kept).
    dtype : the data dtype (selects the tolerance; float32 or float64)
    """
    tol = UNIT_SQ_NORM_TOL.get(np.dtype(dtype), UNIT_SQ_NORM_TOL[np.dtype(np.float32)])
    # only centroids whose c_half is near 1/2 are summed again in float64 (Euclidean ones: rarely any)
    near = xp.nonzero(xp.abs(2.0 * c_half.astype(xp.float64) - 1.0) <= UNIT_PREFILTER)[0]
    out = xp.array(c_half, copy=True)
    rows = max(1, UNIT_TILE_BYTES // (16 * max(C.shape[1], 1)))  # float64 scratch of a few MiB
    for j0 in range(0, near.shape[0], rows):
        at = near[j0 : j0 + rows]
        C64 = C[at].astype(xp.float64)
        unit = at[xp.abs(xp.sum(C64 * C64, axis=1) - 1.0) <= tol]
        out[unit] = 0.5
    return out


#: Largest number of centroids handled in one matrix product.
MAX_CENTROID_BLOCK = 4096


def plan_tiles(
    n: int,
    k: int,
    d: int,
    itemsize: int,
    scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
    *,
    row_bytes: int | None = None,
    max_row_tile: int | None = None,
):
    """Row-tile and centroid-block sizes that keep scratch memory under ``scratch_bytes``.

    The one tile planner of the dense kernels (the namespace code, the compiled paths' bound,
    the CUDA kernels, the seeding distances). Per row of a tile a call holds one block of
    distances (``centroid_block`` values of ``itemsize`` bytes) and ``row_bytes`` more.

    Parameters
    ----------
    n, k, d : int
        Rows, centroids and features of the call.
    itemsize : int
        Bytes per value of the distance block.
    scratch_bytes : int
        The bound.
    row_bytes : int, optional
        Scratch per row besides its distances; default: the namespace code's one gathered
        centroid and one float64 copy of the row, ``d * (itemsize + 8) + 16``.
    max_row_tile : int, optional
        A cap on the rows of a tile (the CUDA kernels' launch sizes).

    Returns
    -------
    row_tile, centroid_block : int
        ``1 <= row_tile <= max(n, 1)`` (and ``max_row_tile``),
        ``1 <= centroid_block <= min(max(k, 1), MAX_CENTROID_BLOCK)``.
    """
    centroid_block = max(1, min(k, MAX_CENTROID_BLOCK))
    extra = d * (itemsize + 8) + 16 if row_bytes is None else row_bytes
    row_tile = max(1, int(scratch_bytes) // (centroid_block * itemsize + extra))
    cap = max(n, 1) if max_row_tile is None else min(max(n, 1), max_row_tile)
    return int(min(cap, row_tile)), int(centroid_block)


class Moments(NamedTuple):
    """Row count, per-column mean and sum of squared deviations (float64)."""

    count: Any  # () float64
    mean: Any  # (d,) float64
    m2: Any  # (d,) float64


class Partials(NamedTuple):
    """What one chunk contributes to a Lloyd update.

    Attributes
    ----------
    sums : array, shape (k, d), float64
        Per-cluster (weighted) sums of the rows assigned to each cluster.
    counts : array, shape (k,), float64
        Per-cluster (weighted) counts: sum of the weights of the assigned rows.
    objective : array, shape (), float64
        Weighted sum of squared distances of the rows to their nearest centroid.
    """

    sums: Any
    counts: Any
    objective: Any


class TopRows(NamedTuple):
    """The ``m`` rows of a chunk with the largest score (for example, distance).

    Ordered by score (descending), ties by global row index (ascending), so the
    selection does not depend on how the data is chunked.
    """

    score: Any  # (m,) float64
    index: Any  # (m,) int64, global row index
    rows: Any  # (m, d), dtype of the data


def select_top(xp, score, index, m: int, eligible=None):
    """Positions of the ``m`` largest ``score`` (ties: smaller ``index`` first), in that order.

    Only entries where ``eligible`` is True are chosen (default: ``score >= 0``).
    """
    eligible = xp.nonzero(score >= 0 if eligible is None else eligible)[0]
    if eligible.shape[0] == 0 or m <= 0:
        return eligible[:0]
    m = min(m, int(eligible.shape[0]))
    vals = score[eligible]
    if m < vals.shape[0]:
        threshold = xp.partition(vals, vals.shape[0] - m)[vals.shape[0] - m]
        eligible = eligible[vals >= threshold]
    order = xp.lexsort(xp.stack([index[eligible], -score[eligible]]))
    return eligible[order[:m]]
