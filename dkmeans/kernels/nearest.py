"""Assignment kernels: nearest centroid, per-cluster partial sums, farthest points.

Every function takes arrays of one namespace ``xp`` (NumPy or CuPy) and returns arrays
of the same namespace. Squared distances for the *choice* of centroid use the
matrix-product form ``||c||^2/2 - x.c`` (same argmin as ``||x - c||^2``); the distance
*reported* for the chosen centroid is recomputed from the difference ``x - c``, which
does not suffer the cancellation of the expanded form. Work is tiled over rows and
over centroids so that one call's scratch memory is bounded whatever ``k`` is.

NumPy float32/float64 arrays take a compiled path (numba, :mod:`._numba`), chosen per
shape: a direct loop that computes the distances of a block of rows to every centroid in
registers (no BLAS, no ``n x k`` buffer), holding the rows in registers for ``d <= 16`` and
streaming them against groups of 8 centroids above; for ``d > 16`` with fewer than
``STREAM_MIN_CENTROIDS`` centroids, BLAS ``C_block @ X_tile.T`` into a buffer of about
``BLAS_BLOCK_BYTES`` (cache-sized) and a compiled running argmin. Either way the exact
distances, or the float64 sums, counts and objective, are computed per tile while its rows
are in cache. The compiled loops are single-threaded and BLAS uses the threads it is given:
dkmeans' workers start with one BLAS/OpenMP thread per worker thread
(:func:`dkmeans.engine.client.start_local_cluster`).
CuPy float32/float64 arrays take the fused CUDA kernels (:mod:`.cuda`); other dtypes and
Dask config ``dkmeans.kernels.backend = "numpy"`` the namespace code.
``scipy.sparse`` rows go to the same functions of :mod:`.sparse` (never densified). Each
public function asks :func:`~dkmeans.kernels.backends.select.select` once which of these
serves the call (:func:`_backend`) and hands the answer to the helpers it calls.
"""

from __future__ import annotations

import functools

import numpy as np

# fused CuPy kernels (CuPy imported only when called)
from dkmeans.kernels.backends import cuda as _cuda
from dkmeans.kernels.backends import sparse as _sparse
from dkmeans.kernels.backends.layout import LazyModule, Output, direct_width
from dkmeans.kernels.backends.select import Backend, Loops, select
from dkmeans.kernels.common import (
    DEFAULT_SCRATCH_BYTES,
    Partials,
    TopRows,
    check_centroid_shape,
    plan_tiles,
    select_top,
    unit_half_sq_norms,  # unit centroids: ||c||^2 / 2 exactly 1/2 in the choice
)
from dkmeans.kernels.namespace import get_namespace, sparse_namespace

# compiled loops of the NumPy rows, numba imported at their first use
_compiled = LazyModule("dkmeans.kernels.backends.compiled")

#: Compiled BLAS path: target size in bytes of one ``C_block @ X_tile.T`` buffer (about
#: the L2 cache: the buffer is read back by the argmin while it is still in cache).
BLAS_BLOCK_BYTES = 2 * 2**20
#: Compiled BLAS path: rows per tile are kept within these bounds.
BLAS_TILE_ROWS = (64, 512)
#: Compiled direct path: rows per tile (the transposed tile is ``width x rows``).
DIRECT_TILE_ROWS = 256
#: Compiled direct path for ``d > 16`` (the streamed kernel): the transposed tile is kept
#: to about this many bytes, within these row bounds.
STREAM_TILE_BYTES = 128 * 2**10
STREAM_TILE_ROWS = (32, 256)
#: ``d > 16``: the streamed kernel from this many centroids on (it computes whole groups
#: of 8), BLAS below (faster for 1 or 2 centroids).
STREAM_MIN_CENTROIDS = 3
#: Streamed kernel: bytes of packed centroids one pass over a tile's rows takes (they stay
#: in the L2 cache while every block of rows goes past them).
STREAM_BLOCK_BYTES = 256 * 2**10

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

#: The namespace code: up to this many centroids (one block), the nearest is found from
#: distances laid out centroid-major (:func:`_nearest_narrow`), a vectorised minimum over
#: centroids, instead of an argmin over each row's few values. Measured (:func:`assign`,
#: 100,000 x 8 float32 rows, one BLAS thread): 1.6 ms at k = 10 against 4.5 by argmin, 4.9
#: against 9.1 at k = 40, equal at k = 100 and 160 (14 and 18 ms), the argmin 5% faster at 255;
#: at d = 32 alike (5.3 against 6.3 ms at k = 10, equal at 160).
NARROW_CENTROIDS = 128  # at most 255: the ranks of :func:`_nearest_narrow` are uint8


def _kind(engine: str, dtype, d: int) -> tuple:
    """The compile unit of a compiled path: its loops for one dtype (and, direct, one width)."""
    dtype = np.dtype(dtype)
    return ("direct", dtype.str, direct_width(d)) if engine == "direct" else ("blas", dtype.str)


def _backend(X, k: int) -> Backend:
    """The backend of one nearest-centroid call on ``X`` against ``k`` centroids.

    The direct loops suit ``d <= 16`` and, streamed, ``k >= STREAM_MIN_CENTROIDS``; BLAS
    plus a compiled argmin the rest (and every shape under the setting ``"blas"``).
    """
    d = X.shape[1]
    dtype = np.dtype(X.dtype)
    if k == 0 or d == 0 or dtype not in _FLOATS:  # no loops to offer (nor to compile)
        return select(X, cuda=True)
    direct, blas = _loops(dtype, d, k)
    return select(X, cuda=True, compiled=direct, blas=blas)


@functools.lru_cache(maxsize=256)
def _loops(dtype: np.dtype, d: int, k: int) -> tuple:
    """The direct loops (None where they do not suit the shape) and the BLAS loops of one shape
    (cached: built on every call they cost as much as the rest of the choice)."""
    warm_up = functools.partial(_warm_up, dtype, d, k)
    direct = direct_width(d) is not None or k >= STREAM_MIN_CENTROIDS
    return (Loops(_kind("direct", dtype, d), warm_up) if direct else None), Loops(
        _kind("blas", dtype, d), warm_up
    )


def compiled_kinds(dtype, d: int) -> list:
    """``(kind, warm_up)`` of every compiled path an assignment of ``d``-feature rows may take.

    What :func:`dkmeans.kernels.warm.prepare` runs to load a fit's loops ahead of it.
    Empty for dtypes without compiled loops and for ``d = 0``.
    """
    dtype = np.dtype(dtype)
    if dtype not in _FLOATS or d < 1:
        return []
    engines = ["direct"] if direct_width(d) is not None else ["direct", "blas"]
    # k = 1 warms the BLAS path, k = STREAM_MIN_CENTROIDS the streamed loop of wide rows
    return [
        (
            _kind(e, dtype, d),
            functools.partial(_warm_up, dtype, d, 1 if e == "blas" else STREAM_MIN_CENTROIDS),
        )
        for e in engines
    ]


def _warm_up(dtype, d: int, k: int) -> None:
    """Run every compiled path a fit takes for this dtype, width and number of centroids, on a few rows."""
    if d < 1 or k < 1:
        raise ValueError(
            f"the compiled kernels warm up on rows of at least one feature and one centroid, "
            f"not d={d}, k={k}"
        )
    rng = np.random.default_rng(0)
    X = rng.random((300, d)).astype(dtype)
    C = X[: min(k, 300)].copy()
    for w in (None, np.ones(len(X))):
        assign_partials(X, C, w)
        farthest_points(X, C, 1, 0, w)
    assign(X, C)


def _nearest_in_tile(xp, Xt, C, c_half_sq, centroid_block, dist_buf):
    """Index of the nearest centroid for each row of one tile."""
    m = Xt.shape[0]
    k = C.shape[0]
    if k <= min(NARROW_CENTROIDS, centroid_block):
        return _nearest_narrow(xp, Xt, C, c_half_sq, dist_buf)
    best_idx = None
    best_val = None
    rows = xp.arange(m)
    for j0 in range(0, k, centroid_block):
        j1 = min(k, j0 + centroid_block)
        D = dist_buf[:m, : j1 - j0]
        xp.matmul(Xt, C[j0:j1].T, out=D)
        xp.subtract(c_half_sq[j0:j1], D, out=D)
        idx = xp.argmin(D, axis=1)
        if j1 - j0 == k:  # a single block: no running minimum needed
            return idx
        val = D[rows, idx]
        if best_idx is None:
            best_idx, best_val = idx, val
        else:
            # strict '<' keeps the lower centroid index on ties, like one argmin
            better = val < best_val
            best_val = xp.where(better, val, best_val)
            best_idx = xp.where(better, idx + j0, best_idx)
    return best_idx


def _nearest_narrow(xp, Xt, C, c_half_sq, dist_buf):
    """:func:`_nearest_in_tile` for at most :data:`NARROW_CENTROIDS` centroids (one block).

    The distances are laid out centroid-major (``k x m``): the minimum over centroids is then
    one vectorised reduction, and the label the lowest index reaching it (the ties an argmin
    gives), where an argmin over rows of a few values pays its per-row cost.
    """
    m = Xt.shape[0]
    k = C.shape[0]
    if k == 1:
        return xp.zeros(m, dtype=xp.int32)
    D = dist_buf.reshape(-1)[: k * m].reshape(k, m)
    xp.matmul(C, Xt.T, out=D)
    xp.subtract(c_half_sq[:, None], D, out=D)
    best = D.min(axis=0)
    # the lowest index reaching the minimum: the largest of (D == best) * (k - j), a product and a
    # maximum over contiguous rows (a where() or an argmax over the centroids is 20x slower)
    # (made in int64 and cast: CuPy's arange casts the step -1 to the dtype, which uint8 refuses)
    rank = xp.arange(k, 0, -1).astype(xp.uint8)[:, None]
    labels = k - ((D == best).view(xp.uint8) * rank).max(axis=0).astype(xp.int32)
    missed = (
        labels == k
    )  # a NaN distance (overflow) matches nothing: argmin's choice, as the wide path's
    if bool(missed.any()):
        labels[missed] = xp.argmin(D[:, missed], axis=0)
    return labels


def _first_copies(xp, C):
    """For centroids with exact copies, each centroid's first copy (int32, ``(k,)``); None without copies.

    A matrix product may round identical columns in different positions differently (OpenBLAS's
    float32 kernels on some processors: a row exactly on a duplicated centroid went to its later
    copy), so the product-based paths map each label to its first copy afterwards: the tie rule
    (the lowest index) exactly, as the compiled loops give it. ``-0.0`` and ``0.0`` count as equal.
    """
    k = C.shape[0]
    if k < 2:
        return None
    rows = np.ascontiguousarray(
        np.asarray(C.get() if hasattr(C, "get") else C) + 0.0
    )  # (-0.0 -> 0.0)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    if first.shape[0] == k:
        return None
    return xp.asarray(first[inverse.ravel()].astype(np.int32))


def _compiled_tiles(backend: Backend, n: int, k: int, d: int, itemsize: int, scratch_bytes: int):
    """Row tile and centroid block of a compiled path (within ``scratch_bytes``)."""
    budget_rows, block = plan_tiles(n, k, d, itemsize, scratch_bytes)
    if backend is Backend.COMPILED:  # the direct loops
        rows = DIRECT_TILE_ROWS
        if d > 16:  # the streamed kernel: a transposed tile of about STREAM_TILE_BYTES
            lo, hi = STREAM_TILE_ROWS
            rows = max(lo, min(hi, STREAM_TILE_BYTES // (d * itemsize)))
        return max(1, min(rows, budget_rows, n)), k
    lo, hi = BLAS_TILE_ROWS
    cache_rows = max(lo, min(hi, BLAS_BLOCK_BYTES // (block * itemsize)))
    return max(1, min(cache_rows, budget_rows, n)), block


def _run_compiled(backend: Backend, X, C, output: Output, weights, scratch_bytes):
    """Labels of the nearest centroids, and the exact distances or the partials as ``output`` asks.

    ``backend``: :attr:`Backend.COMPILED` (the direct loops) or :attr:`Backend.BLAS`. ``X`` and
    ``C`` are C-contiguous NumPy arrays of one float dtype. Works tile by tile: the labels of
    a tile, then its exact distances or its partial sums while its rows are in cache.
    Returns ``(labels, min_sq, sums, counts, objective)``.
    """
    n, d = X.shape
    k = C.shape[0]
    partials = output is Output.PARTIALS
    labels = np.empty(0 if partials else n, dtype=np.int32)  # partials need a tile's labels only
    min_sq = np.empty(n if output is Output.DISTANCES else 0, dtype=X.dtype)
    sums = np.zeros((k, d) if partials else (0, 0), dtype=np.float64)
    counts = np.zeros(k if partials else 0, dtype=np.float64)
    has_w = weights is not None
    w = np.ascontiguousarray(weights, dtype=np.float64) if has_w else np.empty(0, dtype=np.float64)
    c_half = unit_half_sq_norms(np, C, 0.5 * np.einsum("ij,ij->i", C, C), X.dtype)
    tile, block = _compiled_tiles(backend, n, k, d, X.dtype.itemsize, scratch_bytes)
    if backend is Backend.COMPILED:
        kernel = _compiled.direct_kernel(direct_width(d))
        groups = max(1, STREAM_BLOCK_BYTES // (d * _compiled.STREAM_GROUP * X.dtype.itemsize))
        # the member's value: numba types an IntEnum argument in Python, about 15 us a call
        objective = kernel(
            X, C, c_half, tile, groups, labels, min_sq, w, has_w, sums, counts, int(output)
        )
        return labels, min_sq, sums, counts, objective
    best = np.empty(tile, dtype=X.dtype)
    buf = np.empty(block * tile, dtype=X.dtype)
    tile_labels = np.empty(tile if partials else 0, dtype=np.int32)
    first = _first_copies(np, C)
    objective = 0.0
    for i0 in range(0, n, tile):
        i1 = min(n, i0 + tile)
        m = i1 - i0
        Xt_T = X[i0:i1].T
        lab = tile_labels[:m] if partials else labels[i0:i1]
        for j0 in range(0, k, block):
            j1 = min(k, j0 + block)
            Dt = buf[: (j1 - j0) * m].reshape(j1 - j0, m)
            np.matmul(C[j0:j1], Xt_T, out=Dt)
            _compiled.running_argmin_t(Dt, c_half[j0:j1], j0, best[:m], lab, j0 == 0)
        if first is not None:
            np.take(first, lab, out=lab)
        if output is Output.DISTANCES:
            _compiled.rows_exact_sq(X, i0, i1, C, labels, min_sq)
        elif partials:
            objective += _compiled.rows_partials(X, i0, i1, C, lab, i0, w, has_w, sums, counts)
    return labels, min_sq, sums, counts, objective


def _nearest_labels(xp, X, C, scratch_bytes):
    """Labels (int32) of the nearest centroid (the namespace code)."""
    n, d = X.shape
    k = C.shape[0]
    if n == 0:
        return xp.empty(0, dtype=xp.int32)
    labels = xp.empty(n, dtype=xp.int32)
    c_half_sq = unit_half_sq_norms(xp, C, 0.5 * xp.sum(C * C, axis=1), X.dtype)
    row_tile, block = plan_tiles(n, k, d, X.dtype.itemsize, scratch_bytes)
    dist_buf = xp.empty((row_tile, block), dtype=X.dtype)
    for i0 in range(0, n, row_tile):
        i1 = min(n, i0 + row_tile)
        labels[i0:i1] = _nearest_in_tile(xp, X[i0:i1], C, c_half_sq, block, dist_buf)
    first = _first_copies(xp, C)
    return labels if first is None else xp.take(first, labels)


def assign(X, C, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES):
    """Nearest centroid of each row and the squared distance to it.

    Parameters
    ----------
    X : array, shape (n, d)
        Rows to assign (float32 or float64).
    C : array, shape (k, d)
        Centroids, same namespace; cast to ``X.dtype``.
    scratch_bytes : int
        Bound on the temporary memory of the call (in device memory, CuPy input may take up
        to :data:`~dkmeans.kernels.backends.cuda.DEVICE_SCRATCH_BYTES` where its GPU has room).

    Returns
    -------
    labels : array, shape (n,), int32
        Index of the nearest centroid (lowest index on exact ties).
    min_sq_dist : array, shape (n,), ``X.dtype``
        ``||x - c_label||^2`` computed from the difference.
    """
    check_centroid_shape(X, C)
    return _assign(_backend(X, C.shape[0]), X, C, scratch_bytes)


def _assign(backend: Backend, X, C, scratch_bytes):
    """:func:`assign` on the chosen backend."""
    if backend is Backend.SPARSE:
        return _sparse.assign(X, C, scratch_bytes=scratch_bytes)
    if backend is Backend.CUDA:
        return _cuda.assign_cuda(X, C, scratch_bytes=_cuda.device_scratch_bytes(X, scratch_bytes))
    xp = get_namespace(X, C)
    n, d = X.shape
    C = xp.ascontiguousarray(xp.asarray(C, dtype=X.dtype))
    if backend in (Backend.COMPILED, Backend.BLAS):
        labels, min_sq, *_ = _run_compiled(
            backend, np.ascontiguousarray(X), C, Output.DISTANCES, None, scratch_bytes
        )
        return labels, min_sq
    labels = _nearest_labels(xp, X, C, scratch_bytes)
    min_sq = xp.empty(n, dtype=X.dtype)
    if n == 0:
        return labels, min_sq
    row_tile, _ = plan_tiles(n, C.shape[0], d, X.dtype.itemsize, scratch_bytes)
    for i0 in range(0, n, row_tile):
        i1 = min(n, i0 + row_tile)
        diff = xp.take(C, labels[i0:i1], axis=0)  # take, not C[labels]: 10x faster at d = 8
        xp.subtract(X[i0:i1], diff, out=diff)
        # einsum: a row's few products summed in one pass (sum over axis 1 pays per row: 2x slower at d = 8)
        if xp is np:
            np.einsum("ij,ij->i", diff, diff, out=min_sq[i0:i1])
        else:  # CuPy's einsum takes no out=
            min_sq[i0:i1] = xp.einsum("ij,ij->i", diff, diff)
    return labels, min_sq


def assign_partials(X, C, weights=None, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES) -> Partials:
    """Assign rows to centroids and return the chunk's :class:`Partials`.

    Parameters
    ----------
    X : array, shape (n, d)
    C : array, shape (k, d)
    weights : array, shape (n,), optional
        Non-negative sample weights (default: all ones).
    scratch_bytes : int
        Bound on the temporary memory of the call (in device memory, CuPy input may take up
        to :data:`~dkmeans.kernels.backends.cuda.DEVICE_SCRATCH_BYTES` where its GPU has room).

    Returns
    -------
    Partials
        Sums and counts accumulated in float64; objective in float64.
    """
    check_centroid_shape(X, C)
    backend = _backend(X, C.shape[0])
    if backend is Backend.SPARSE:
        return _sparse.assign_partials(X, C, weights, scratch_bytes=scratch_bytes)
    if backend is Backend.CUDA:
        scratch_bytes = _cuda.device_scratch_bytes(X, scratch_bytes)
        return Partials(*_cuda.partials_cuda(X, C, weights, scratch_bytes=scratch_bytes))
    xp = get_namespace(X, C)
    n, d = X.shape
    k = C.shape[0]
    if n == 0:
        zeros = xp.zeros(k, dtype=xp.float64)
        return Partials(xp.zeros((k, d), dtype=xp.float64), zeros, xp.zeros((), dtype=xp.float64))
    w = None if weights is None else xp.asarray(weights, dtype=xp.float64)
    if backend in (Backend.COMPILED, Backend.BLAS):
        X = np.ascontiguousarray(X)
        C = np.ascontiguousarray(C, dtype=X.dtype)
        _, _, sums, counts, objective = _run_compiled(
            backend, X, C, Output.PARTIALS, w, scratch_bytes
        )
        return Partials(sums, counts, np.asarray(objective, dtype=np.float64))
    labels, min_sq = _assign(backend, X, C, scratch_bytes)
    sums, counts = _cluster_sums(backend, X, labels, k, w, scratch_bytes)
    d2 = min_sq.astype(xp.float64)
    objective = xp.sum(d2 if w is None else d2 * w)
    return Partials(sums, counts, xp.asarray(objective, dtype=xp.float64))


def cluster_sums(X, labels, k: int, weights=None, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES):
    """Per-cluster weighted sums and counts of rows with given labels, in float64.

    A one-hot sparse product, tiled over rows: O(n d) work, no scatter-add.

    Returns
    -------
    sums : array, shape (k, d), float64
    counts : array, shape (k,), float64
    """
    return _cluster_sums(select(X), X, labels, k, weights, scratch_bytes)


def _cluster_sums(backend: Backend, X, labels, k: int, weights, scratch_bytes):
    """:func:`cluster_sums`: the CSR kernel, or the namespace code for every dense backend."""
    if backend is Backend.SPARSE:
        return _sparse.cluster_sums(X, labels, k, weights, scratch_bytes=scratch_bytes)
    xp = get_namespace(X)
    n, d = X.shape
    sums = xp.zeros((k, d), dtype=xp.float64)
    if n == 0:
        return sums, xp.zeros(k, dtype=xp.float64)
    w = None if weights is None else xp.asarray(weights, dtype=xp.float64)
    counts = xp.bincount(labels, weights=w, minlength=k).astype(xp.float64)
    sparse = sparse_namespace(xp)
    row_tile, _ = plan_tiles(n, k, d, X.dtype.itemsize, scratch_bytes)
    for i0 in range(0, n, row_tile):
        i1 = min(n, i0 + row_tile)
        m = i1 - i0
        data = xp.ones(m, dtype=xp.float64) if w is None else w[i0:i1]
        onehot = sparse.csc_matrix(
            (data, labels[i0:i1], xp.arange(m + 1, dtype=xp.int32)), shape=(k, m)
        )
        sums += onehot @ X[i0:i1].astype(xp.float64)
    return sums, counts


def nearest_sq64(X, C, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES):
    """Nearest centroid of each row and the float64 squared distance by which rows are ranked as farthest.

    The labels and distances of :func:`farthest_points` (sparse rows: computed in float64).
    """
    check_centroid_shape(X, C)
    return _nearest_sq64(_backend(X, C.shape[0]), X, C, scratch_bytes)


def _nearest_sq64(backend: Backend, X, C, scratch_bytes):
    """:func:`nearest_sq64` on the chosen backend."""
    if backend is Backend.SPARSE:
        return _sparse.assign64(X, C, scratch_bytes=scratch_bytes)
    labels, min_sq = _assign(backend, X, C, scratch_bytes)
    return labels, min_sq.astype(get_namespace(X, C).float64)


def farthest_from(X, d2, m: int, row_offset: int, weights=None) -> TopRows:
    """The ``m`` rows of largest ``d2`` (float64, from :func:`nearest_sq64`); zero-weight rows never."""
    xp = get_namespace(d2)
    if weights is not None:
        d2 = xp.where(xp.asarray(weights) > 0, d2, -1.0)
    index = xp.arange(row_offset, row_offset + X.shape[0], dtype=xp.int64)
    keep = select_top(xp, d2, index, m)
    return TopRows(d2[keep], index[keep], _sparse.take_rows(X, keep))


def farthest_points(
    X, C, m: int, row_offset: int, weights=None, *, scratch_bytes: int = DEFAULT_SCRATCH_BYTES
) -> TopRows:
    """The ``m`` rows farthest from their nearest centroid in ``C``.

    Rows with zero weight are never chosen (a centroid placed there would stay empty).

    Parameters
    ----------
    X : array, shape (n, d)
    C : array, shape (k, d)
    m : int
        How many rows to return (fewer if the chunk has fewer eligible rows).
    row_offset : int
        Global index of the chunk's first row.
    weights : array, shape (n,), optional

    Returns
    -------
    TopRows
        Rows as dense arrays (also for sparse ``X``).
    """
    _, d2 = nearest_sq64(X, C, scratch_bytes=scratch_bytes)
    return farthest_from(X, d2, m, row_offset, weights)


def _choice_scores(sparse: bool, X, C, labels):
    """``||c||^2/2 - x.c`` of each row for its centroid ``C[labels]``, in float64, with the unit rule
    of :func:`~dkmeans.kernels.common.unit_half_sq_norms`: the quantity every assignment kernel
    compares, so equal values are the ties a full assignment gives to the lower index."""
    xp = np if sparse else get_namespace(X)
    C64 = xp.asarray(C, dtype=xp.float64)
    half = unit_half_sq_norms(xp, C64, 0.5 * xp.sum(C64 * C64, axis=1), X.dtype)
    picked = C64[labels]
    if sparse:
        dots = np.asarray(X.multiply(picked).sum(axis=1)).ravel()
    else:
        dots = xp.sum(xp.asarray(X, dtype=xp.float64) * picked, axis=1)
    return half[labels] - dots


def refill_partials(
    X,
    live_labels,
    live_d2,
    L,
    R,
    live_index,
    refill_index,
    k: int,
    weights=None,
    *,
    scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
) -> Partials:
    """The :class:`Partials` of ``X`` against all ``k`` centroids, given its nearest live centroid.

    ``live_labels``/``live_d2`` (:func:`nearest_sq64` against the live centroids ``L``, whose
    indices among the ``k`` are ``live_index``) and the centroids ``R`` that refilled the
    clusters ``refill_index``: a row moves to its nearest refilled centroid when that is
    nearer, so only an n x m product is computed for m refilled clusters. A tie of the
    quantity the assignment kernels compare (``||c||^2/2 - x.c``, unit centroids exactly
    1/2: rows orthogonal to both under the cosine metric) goes to the lower index, as in a
    full assignment; the squared distances differ there by rounding only.
    """
    xp = get_namespace(live_d2)
    check_centroid_shape(X, R)
    backend = _backend(X, R.shape[0])
    r_labels, r_d2 = _nearest_sq64(backend, X, R, scratch_bytes)
    live = xp.asarray(live_index)[live_labels]
    refill = xp.asarray(refill_index)[r_labels]
    sparse = backend is Backend.SPARSE
    tie = _choice_scores(sparse, X, R, r_labels) == _choice_scores(sparse, X, L, live_labels)
    moved = xp.where(tie, refill < live, r_d2 < live_d2)
    labels = xp.where(moved, refill, live).astype(xp.int32)
    d2 = xp.where(moved, r_d2, live_d2)
    w = None if weights is None else xp.asarray(weights, dtype=xp.float64)
    sums, counts = _cluster_sums(backend, X, labels, k, w, scratch_bytes)
    objective = xp.sum(d2 if w is None else d2 * w)
    return Partials(sums, counts, xp.asarray(objective, dtype=xp.float64))


def distances(X, C):
    """Euclidean distances from each row to every centroid, shape (n, k), ``X.dtype``.

    Computed in float64 (float32 rows too, as scikit-learn's ``euclidean_distances`` does)
    by the expanded formula ``||x||^2 - 2 x.c + ||c||^2``, clipped at 0 before the square
    root; a pair whose squared distance is within rounding of zero (at most ``2**-20``
    times ``||x||^2 + ||c||^2``) is recomputed from the difference ``x - c``, so a row
    equal to a centroid is at distance exactly 0 (``transform(cluster_centers_)`` has a
    zero diagonal) and nearby rows keep their small distances' digits. Memory: the n x k
    output plus float64 blocks of rows of about ``DEFAULT_SCRATCH_BYTES``.
    """
    check_centroid_shape(X, C)
    if select(X) is Backend.SPARSE:
        return _sparse.distances(X, C)
    xp = get_namespace(X, C)  # every dense backend: the namespace code
    C64 = xp.asarray(C, dtype=xp.float64)
    c_sq = xp.sum(C64 * C64, axis=1)[None, :]
    n, k = X.shape[0], C64.shape[0]
    out = xp.empty((n, k), dtype=X.dtype)
    rows = max(1, DEFAULT_SCRATCH_BYTES // (8 * max(1, k, X.shape[1])))
    for i0 in range(0, n, rows):
        Xb = xp.asarray(X[i0 : i0 + rows], dtype=xp.float64)
        x_sq = xp.sum(Xb * Xb, axis=1)[:, None]
        d2 = x_sq - 2.0 * (Xb @ C64.T) + c_sq
        i, j = xp.nonzero(d2 <= 2.0**-20 * (x_sq + c_sq))
        if i.shape[0]:
            diff = Xb[i] - C64[j]
            d2[i, j] = xp.sum(diff * diff, axis=1)
        out[i0 : i0 + rows] = xp.sqrt(xp.maximum(d2, 0.0))
    return out
