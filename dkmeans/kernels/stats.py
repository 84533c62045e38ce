"""Per-column moments of a chunk, combined exactly (Chan et al.'s parallel variance)."""

from __future__ import annotations

from collections.abc import Sequence

from dkmeans.errors import NON_FINITE_INPUT, InvalidDataError
from dkmeans.kernels.common import Moments
from dkmeans.kernels.namespace import get_namespace, is_sparse

#: A tile's float64 copy and its deviations take about this many bytes: the scratch of
#: :func:`column_moments` does not grow with the chunk.
MOMENTS_TILE_BYTES = 4 * 2**20


def column_moments(X) -> Moments:
    """Moments of one chunk (unweighted), accumulated in float64 tile by tile (sparse rows: from the stored values)."""
    from dkmeans.kernels.backends import (
        sparse,  # imported here: the sparse kernels import this package
    )

    if is_sparse(X):
        return sparse.column_moments(X)
    xp = get_namespace(X)
    n, d = X.shape
    if n == 0:
        zeros = xp.zeros(d, dtype=xp.float64)
        return Moments(xp.zeros((), dtype=xp.float64), zeros, zeros.copy())
    rows = max(1, MOMENTS_TILE_BYTES // (2 * 8 * max(d, 1)))  # the float64 tile and its deviations
    return combine_moments([_tile_moments(xp, X[i : i + rows]) for i in range(0, n, rows)])


def _tile_moments(xp, X) -> Moments:
    X64 = X.astype(xp.float64)
    mean = X64.mean(axis=0)
    X64 -= mean  # deviations, in place
    return Moments(xp.asarray(float(X.shape[0])), mean, xp.einsum("ij,ij->j", X64, X64))


def combine_moments(parts: Sequence[Moments]) -> Moments:
    """Combine chunk moments; order-independent up to rounding."""
    count, mean, m2 = parts[0]
    for p in parts[1:]:
        total = count + p.count
        if float(total) == 0.0:
            continue
        delta = p.mean - mean
        mean = mean + delta * (p.count / total)
        m2 = m2 + p.m2 + delta * delta * (count * p.count / total)
        count = total
    return Moments(count, mean, m2)


def check_finite_block(result, X) -> None:
    """Raise :class:`InvalidDataError` if the chunk ``X`` holds NaN or infinity, judged from ``result``.

    ``result`` is what a kernel returned for ``X`` (squared distances to the nearest
    centroid, or distances to every centroid): a non-finite row gives non-finite entries,
    so one ``isfinite`` pass over the result finds it, with no second pass over ``X``.
    ``X`` is read only when the result is not finite, to tell bad data from distances
    that overflowed on finite data (left as they are). Called where the chunk is, so a
    lazy result raises when it is computed, with the same error as at fit.
    """
    xp = get_namespace(result)
    if bool(xp.isfinite(result).all()):
        return
    values = X.data if is_sparse(X) else X  # a sparse chunk: its stored values
    if not bool(xp.isfinite(values).all()):
        raise InvalidDataError(NON_FINITE_INPUT)
