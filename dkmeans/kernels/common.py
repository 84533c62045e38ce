"""What every kernel module shares: the scratch budget, result types, and the top-m selection."""

from __future__ import annotations

from typing import Any, NamedTuple

#: Scratch memory one kernel call may use, in bytes (distance tiles, gathered
#: centroids, float64 copies of a row tile), besides centroid-sized arrays (the
#: centroids in the data dtype, padded for the direct loop, and the k x d float64
#: sums). The compiled paths use at most about ``BLAS_BLOCK_BYTES`` of it.
DEFAULT_SCRATCH_BYTES = 32 * 2**20
#: Centroid-sized arrays a worker may hold at once during a pass, counted in float64
#: ``k x d`` arrays (:func:`centroid_bytes`). In one process a Lloyd iteration holds about
#: 5 (the kernel's float64 sums, the combined partials, the new and previous centroids and
#: their shift: measured with tracemalloc); on a worker, the messages add as many again (the
#: centroids a task receives, the partials it sends and, SPMD, those it receives, each once
#: as bytes and once as an array). Measured worker growth during a fit on 2 workers: 356-377
#: MiB at k = 262,144 x 16 and at most 427 MiB at k = 65,536 x 64 (seeding included), 11 to
#: 13 such arrays with the scratch; 12 is the bound the budget plans with.
CENTROID_COPIES_F64 = 12


def centroid_bytes(k: int, d: int, itemsize: int) -> int:
    """Memory a worker holds for ``k`` centroids of ``d`` features during a pass, besides the kernel scratch.

    The centroids in the data dtype and one packed copy of them for the compiled loops
    (``2 k d itemsize``), :data:`CENTROID_COPIES_F64` float64 ``k x d`` arrays and a few
    per-centroid vectors (counts, half squared norms: ``32 k``). At ``k = 262,144`` and
    ``d = 16`` (float32) that is 424 MiB; the memory budget
    (:class:`dkmeans.engine.memory.MemoryBudget`) subtracts it from every worker's room.
    """
    return int(k) * (int(d) * (2 * int(itemsize) + 8 * CENTROID_COPIES_F64) + 32)


def check_centroids(X, C) -> None:
    """Refuse centroids the assignment kernels cannot use (the compiled loops index without checks).

    Raises
    ------
    ValueError
        If ``C`` is not 2-D, has no rows, or has another number of features than ``X``.
    """
    if len(C.shape) != 2 or C.shape[0] == 0:
        raise ValueError(f"the assignment kernels need at least one centroid; got centroids of shape {tuple(C.shape)}")
    if C.shape[1] != X.shape[1]:
        raise ValueError(f"centroids have {C.shape[1]} features but the rows have {X.shape[1]}")


#: Largest number of centroids handled in one matrix product.
MAX_CENTROID_BLOCK = 4096


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
