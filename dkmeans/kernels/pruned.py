"""Pruned exact assignment: a Lloyd pass that computes only the distances that can change a label.

Each row keeps, between passes, its label, an upper bound ``u`` on its distance to its
centroid and, per group of centroids, a lower bound on its distance to every other centroid of
the group (Yinyang k-means, Ding et al., ICML 2015; one group is Hamerly's single bound). When
the centroids move, ``u`` grows by its centroid's drift and a group's bound shrinks by the
largest drift in the group; a row whose smallest group bound still exceeds ``u`` by the margin
below keeps its label without any distance computed (*settled*). For the others, ``u`` is first
recomputed exactly; those still unsettled (*candidates*) are scored against the groups their
bounds do not exclude, in blocks of rows against a group's centroids with one BLAS product,
and their bounds are set again from the scores.

**The same labels as the assignment kernel, to the bit.** Unpruned Lloyd chooses with the
compiled kernels' float arithmetic (:mod:`dkmeans.kernels.nearest`): the smallest
``h_j - x.c_j``, ``h_j = ||c_j||^2 / 2`` as computed in the data dtype, ties to the lowest
index. Its result differs from the exact ``(||x - c_j||^2 - ||x||^2) / 2`` by at most
``E + dh`` per centroid, with ``E = gamma_(d+2) (||x|| max||c|| + max h)`` (the rounding of
the dot product and the subtraction, ``gamma_m = m eps / (1 - m eps)`` with the dtype's
``eps``, twice the unit roundoff) and ``dh`` the rounding of ``h`` (or the unit rule of
:func:`~dkmeans.kernels.common.unit_half_sq_norms`). So when the true squared distances
satisfy ``D_j - D_a > 4 (E + dh)`` for every ``j != a``, the kernel picks ``a``; the tests
here ask twice that (``margin``). A row is settled only when its bounds prove that, and a
candidate takes the best centroid of its BLAS scores only when the runner-up trails by the
margin; the few rows within the margin of a tie (duplicated centroids, rows midway) are
assigned by the kernel itself, on those rows only. The compiled kernels compute every row
on its own (its lane's multiply-add chain over the features, the centroids compared in index
order), so a row's label does not depend on which other rows are in the call. Pruning
therefore runs only where the call's backend is the compiled direct loops
(:attr:`~dkmeans.kernels.backends.select.Backend.COMPILED`); other backends (BLAS, NumPy,
CUDA, sparse) get the unpruned partials, flagged so that the driver stops asking.

The partials (per-cluster sums, counts, objective) are then folded from the labels by the
same compiled loop, on the same tiles, as the unpruned kernel folds them: equal to the bit.

**The build** (the first pass of a block, or bounds lost) scores every row against every
centroid with the assignment kernel's own streamed products, folded per group in registers as
they come (:func:`~dkmeans.kernels.backends.compiled_pruned.fused_minima`: the smallest score, its
centroid and the second smallest, never stored), and folds each tile of rows into the partials
while its rows are in cache. On one thread (62,500-row chunks) it took 1.27-1.29x an unpruned pass
at d = 128, k = 256 and 1.15x at d = 64, k = 2,048, and 1.07-1.09x at d = 256, k = 16,384-65,536
(3,000 rows); storing the scores and reducing them after took 1.35-1.50x, 1.24-1.34x and
1.6-1.9x (the last with BLAS products).

**Centroids that jump.** After a local-search swap or an empty cluster's refill a few centroids
move far, and shifting their groups' bounds by their drift would leave nearly every row to
compute. Those centroids (:func:`far_centroids`) are scored exactly for every row instead (one
small product, the bounds from the scores with the margin above: lower bounds rounded down,
upper bounds rounded up): a row whose label is one of them gets its exact upper bound, and for
the others each one's distance lowers its group's bound where it is below; the groups are then
shifted by the drifts of the other centroids only, before the rows are settled.

**Passes that prune little.** With ``plain_above`` (``prune="auto"``), a chunk whose bounds
leave more than that share of its distances goes to the unpruned kernel, decided from a sample
of its rows (:data:`NEED_SAMPLE_STRIDE`) before any per-row work: such a pass cost 1.03-1.08x
the unpruned one (62,500 x 128, k = 256, one thread; 1.07-1.09x when every row's bounds were
moved first, 1.14-1.24x when every failing row was also tightened).

Bounds are rigorous after rounding: lower bounds are float32 rounded down, upper bounds
float64 rounded up (:mod:`dkmeans.kernels.backends.compiled_pruned`). Their memory is
``4 G + 16`` bytes per row for ``G`` groups (:func:`group_count` keeps ``4 G`` within half the
row's bytes, and the caller fits it in the memory budget's room).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, NamedTuple

import numpy as np

from dkmeans.kernels.backends.layout import LazyModule
from dkmeans.kernels.backends.select import Backend
from dkmeans.kernels.common import (
    DEFAULT_SCRATCH_BYTES,
    UNIT_SQ_NORM_TOL,
    Partials,
    check_centroid_shape,
    unit_half_sq_norms,
)
from dkmeans.kernels.nearest import (
    STREAM_BLOCK_BYTES,
    _assign,
    _backend,
    _compiled_tiles,
    assign_partials,
)

_loops = LazyModule("dkmeans.kernels.backends.compiled_pruned")  # numba imported at first use

#: Yinyang's group size: about this many centroids per group (Ding et al. use k / 10).
CENTROIDS_PER_GROUP = 10
#: At most this many groups (the bounds take 4 bytes per row and group).
MAX_GROUPS = 64
#: The bounds of a row take at most this share of the row's own bytes.
BOUNDS_SHARE = 0.5
#: The margins ask this many times the rounding error bound.
SAFETY = 2.0
#: A tile of candidates is scored against every centroid, in blocks of whole groups, when at least
#: this share of its row-and-centroid pairs is needed (wide products beat a product per group).
DENSE_SHARE = 0.8
#: Candidate rows per tile (a tile's rows are gathered once; its bounds bookkeeping is per tile).
TILE_ROWS = 8192
#: With ``plain_above`` set, every this-many-th row estimates the pairs the pass
#: would compute before any per-row work (:func:`~dkmeans.kernels.backends.compiled_pruned.sampled_pairs`:
#: the rows' bounds moved, their upper bounds made exact, their groups' needs counted; the same rows
#: whatever the timing): above ``plain_above`` of the pairs the chunk takes the unpruned kernel.
#: Failing the bounds' first test says little by itself: with the exact upper bounds most rows
#: settled again in passes where all had failed it (62,500 x 128, k = 256: 16% of the distances
#: left to compute).
NEED_SAMPLE_STRIDE = 32
#: Far-moved centroids (a swap's, an empty cluster's refill) are scored exactly for every row instead of
#: shifting their groups' bounds: those whose drift exceeds this many times the drifts' quantile
#: :data:`FAR_QUANTILE`, at most :data:`FAR_MAX_SHARE` of the centroids (the farthest), each only where
#: it pays (:func:`far_centroids`).
FAR_FACTOR = 4.0
#: See :data:`FAR_FACTOR`.
FAR_QUANTILE = 0.9
#: See :data:`FAR_FACTOR`.
FAR_MAX_SHARE = 1.0 / 16
#: Every this-many-th row of a chunk estimates whether scoring a far-moved centroid exactly pays
#: (:func:`far_centroids`).
FAR_SAMPLE_STRIDE = 64


#: Bytes of a row's state besides its group bounds: label (4), upper bound (8), norm (4).
ROW_STATE_BYTES = 16


def group_count(k: int, d: int, itemsize: int, room: float = float("inf")) -> int:
    """Groups of centroids for ``k`` centroids of ``d`` features: about ``k / 10``, at most
    :data:`MAX_GROUPS`, ``4 G`` bytes of bounds per row within :data:`BOUNDS_SHARE` of the row's
    bytes, and the whole state (:func:`state_bytes`) within ``room`` bytes per row; 0 where not
    even one group fits (no pruning)."""
    if room < state_bytes(1):
        return 0
    share = max(1, int(BOUNDS_SHARE * d * itemsize) // 4)
    fits = int(min(room, 2.0**40) - ROW_STATE_BYTES) // 4
    return int(max(1, min(k // CENTROIDS_PER_GROUP, share, fits, MAX_GROUPS)))


def state_bytes(n_groups: int) -> int:
    """Bytes per row of a pruned pass's state with ``n_groups`` groups."""
    return ROW_STATE_BYTES + 4 * int(n_groups)


class CentroidGroups(NamedTuple):
    """A partition of the centroids into groups (fixed while bounds refer to it).

    Attributes
    ----------
    order : ndarray (k,), int64
        The centroid indices group by group.
    starts : ndarray (G + 1,), int64
        Group ``g`` is ``order[starts[g]:starts[g + 1]]`` (never empty).
    group_of : ndarray (k,), int32
        Each centroid's group.
    token : int
        Names the partition: state built for another partition is rebuilt.
    """

    order: Any
    starts: Any
    group_of: Any
    token: int = 0

    @property
    def n_groups(self) -> int:
        return len(self.starts) - 1


def centroid_groups(C, n_groups: int, token: int = 0, iterations: int = 5) -> CentroidGroups:
    """Groups of nearby centroids: a few float64 Lloyd steps on the centroids themselves, from
    ``n_groups`` of them evenly spaced in index order (Yinyang's grouping; deterministic).

    Empty groups are dropped. Nearby centroids in one group keep its bound tight: a row far
    from the group's region is far from every centroid in it.
    """
    C = np.asarray(C, dtype=np.float64)
    k = C.shape[0]
    n_groups = max(1, min(int(n_groups), k))
    if n_groups == 1:
        group_of = np.zeros(k, dtype=np.int32)
    else:
        centers = C[np.linspace(0, k - 1, n_groups).round().astype(np.int64)]
        c_sq = np.einsum("ij,ij->i", C, C)
        for _ in range(iterations):
            d2 = (
                c_sq[:, None]
                - 2.0 * C @ centers.T
                + np.einsum("ij,ij->i", centers, centers)[None, :]
            )
            group_of = np.argmin(d2, axis=1)
            counts = np.bincount(group_of, minlength=n_groups)
            sums = np.zeros_like(centers)
            np.add.at(sums, group_of, C)
            keep = counts > 0
            centers = np.where(keep[:, None], sums / np.maximum(counts, 1)[:, None], centers)
        d2 = c_sq[:, None] - 2.0 * C @ centers.T + np.einsum("ij,ij->i", centers, centers)[None, :]
        group_of = np.unique(np.argmin(d2, axis=1), return_inverse=True)[1].astype(np.int32).ravel()
    order = np.argsort(group_of, kind="stable").astype(np.int64)
    counts = np.bincount(group_of)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return CentroidGroups(order, starts, group_of.astype(np.int32), int(token))


class PrunedPartials(NamedTuple):
    """A pruned pass's :class:`Partials` and what it computed.

    Attributes
    ----------
    partials : Partials
        Equal to :func:`~dkmeans.kernels.nearest.assign_partials`' for the same rows and centroids.
    distances : float
        Row-to-centroid distances computed (scored pairs, exact distances to a row's own
        centroid included).
    pairs : float
        Rows times centroids: what an unpruned pass computes.
    pruned : bool
        Whether every chunk took the pruned path (False: some backend cannot prune).
    """

    partials: Partials
    distances: float
    pairs: float
    pruned: bool


def combine_pruned(parts) -> PrunedPartials:
    """Sum :class:`PrunedPartials` in the given order (the partials as :func:`combine_partials` sums them)."""
    from dkmeans.kernels.reduce import combine_partials

    parts = [p for p in parts if p is not None]
    return PrunedPartials(
        combine_partials([p.partials for p in parts]),
        float(sum(p.distances for p in parts)),
        float(sum(p.pairs for p in parts)),
        all(p.pruned for p in parts),
    )


class _Prepared(NamedTuple):
    """What every chunk of one pass derives from the centroids (computed once per process and pass)."""

    C_perm: Any  # (k, d) the centroids group by group, data dtype
    h_perm: Any  # (k,) their h in the same order, data dtype
    CG: Any  # [(C_perm packed, h padded, groups padded) for the streamed build], filled when first needed
    k0: float  # the kernel-choice margin is k0 * ||x|| + k1 (squared-distance units)
    k1: float


_cache_lock = threading.Lock()
_cache: dict = {}


def _prepare(C, groups: CentroidGroups) -> _Prepared:
    with _cache_lock:
        hit = _cache.get("last")
        if hit is not None and hit[0]() is C and hit[1] == groups.token and hit[2] is groups.order:
            return hit[3]
    d = C.shape[1]
    dtype = C.dtype
    h = unit_half_sq_norms(
        np, C, 0.5 * np.einsum("ij,ij->i", C, C), dtype
    )  # as the kernel computes it
    C64 = C.astype(np.float64)
    cmax = float(np.sqrt(np.max(np.einsum("ij,ij->i", C64, C64)))) * (1 + 2.0**-40)
    hmax = float(np.max(np.abs(h.astype(np.float64))))
    eps = float(np.finfo(dtype).eps)
    gamma = (d + 2) * eps / (1 - (d + 2) * eps)
    dh = gamma * hmax + UNIT_SQ_NORM_TOL.get(
        np.dtype(dtype), UNIT_SQ_NORM_TOL[np.dtype(np.float32)]
    )
    scale = 4.0 * SAFETY  # D_j - D_a > 4 (E + dh), asked SAFETY times
    C_perm = np.ascontiguousarray(C[groups.order])
    prep = _Prepared(
        C_perm,
        np.ascontiguousarray(h[groups.order]),
        [None],
        scale * gamma * cmax,
        scale * (gamma * hmax + dh),
    )
    try:
        ref = weakref.ref(C)
    except TypeError:  # pragma: no cover - arrays take weak references
        return prep
    with _cache_lock:
        _cache["last"] = (ref, groups.token, groups.order, prep)
    return prep


def _empty_partials(k: int, d: int) -> Partials:
    return Partials(np.zeros((k, d)), np.zeros(k), np.zeros((), dtype=np.float64))


def new_state(n: int, n_groups: int, token: int) -> dict:
    """Bounds of ``n`` rows before any pass: every row a candidate."""
    return {
        "labels": np.zeros(n, dtype=np.int32),
        "upper": np.full(n, np.inf),
        "lower": np.zeros((n_groups, n), dtype=np.float32),
        "norm": None,
        "lmax": 0.0,
        "token": int(token),
    }


def _state_for_build(old, n: int, n_groups: int, token: int) -> dict:
    """The state a build fills: ``old``'s arrays where their shapes fit (a build writes every entry),
    else new ones. Fresh multi-MiB arrays cost their page faults at the first write: a build into
    new arrays took 1.49x an unpruned pass over 16 chunks of 31,250 x 128 (k = 256, one thread),
    into reused ones 1.31x."""
    if old is None or old["labels"].shape != (n,) or old["lower"].shape != (n_groups, n):
        return new_state(n, n_groups, token)
    old.update(lmax=0.0, token=int(token))
    return old


def _stale(state) -> dict:
    """``state`` marked for a build at the next pass (its arrays kept for it)."""
    state["token"] = None
    return state


def pruned_partials(
    X,
    C,
    state,
    weights=None,
    groups: CentroidGroups | None = None,
    drift=None,
    *,
    plain_above: float = float("inf"),
    scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
    far: bool = True,
):
    """One pruned Lloyd pass over a chunk: ``(new_state, PrunedPartials)``.

    Parameters
    ----------
    X : ndarray, shape (n, d)
        The chunk's rows (NumPy float32 or float64; anything else gets the unpruned partials).
    C : ndarray, shape (k, d)
        The centroids, in ``X``'s dtype (as the unpruned kernel is given them).
    state : dict or None
        This chunk's bounds from the previous pass (updated in place and returned), or None
        (the first pass, or bounds lost: every row is scored against every centroid). Bounds
        that do not fit this pass (another partition of the centroids, no ``drift``, or marked
        stale) are built again, into their own arrays where the shapes allow.
    weights : ndarray, shape (n,), optional
    groups : CentroidGroups
        The partition the bounds refer to (default: one group).
    drift : ndarray, shape (k,), float64, optional
        Upper bounds on how far each centroid moved since the pass that left ``state``
        (required with a state).
    plain_above : float
        When the bounds leave more than this share of the distances to compute, the chunk takes
        the unpruned kernel instead (as fast, and no bookkeeping) and marks its bounds stale: the
        next pass builds them again, into the same arrays.
    scratch_bytes : int
        Bound on the temporary memory of the call (score blocks and gathered rows), besides
        the bounds themselves.
    far : bool
        Score far-moved centroids exactly (:func:`far_centroids`) instead of shifting their groups.

    Returns
    -------
    state : dict or None
        ``labels`` (int32), ``upper`` (float64), ``lower`` (float32, ``(G, n)``: group by group), ``norm``
        (float32, ``||x||`` rounded up), ``token`` (None: stale); None where the backend cannot prune.
    PrunedPartials
    """
    check_centroid_shape(X, C)
    n, d = X.shape
    k = C.shape[0]
    if groups is None:
        groups = CentroidGroups(
            np.arange(k, dtype=np.int64),
            np.array([0, k], dtype=np.int64),
            np.zeros(k, dtype=np.int32),
        )
    if n == 0:
        return new_state(0, groups.n_groups, groups.token), PrunedPartials(
            _empty_partials(k, d), 0.0, 0.0, True
        )
    backend = _backend(X, k) if isinstance(X, np.ndarray) else None
    if (
        backend is not Backend.COMPILED
    ):  # only the compiled loops give a row's label independently of the call
        return None, PrunedPartials(
            assign_partials(X, C, weights, scratch_bytes=scratch_bytes),
            float(n * k),
            float(n * k),
            False,
        )
    X = np.ascontiguousarray(X)
    C = np.ascontiguousarray(C, dtype=X.dtype)
    prep = _prepare(C, groups)
    G = groups.n_groups
    fresh = (
        state is None
        or state.get("token") != groups.token
        or len(state["labels"]) != n
        or state["lower"].shape[0] != G
        or drift is None
    )
    if fresh:
        state = _state_for_build(state, n, G, groups.token)
    labels, upper, lower = state["labels"], state["upper"], state["lower"]
    if (
        state["norm"] is None
    ):  # filled with the rows' norms as the candidates (every row) are scored
        state["norm"] = np.empty(n, dtype=np.float32)
    norm = state["norm"]
    computed = 0
    if fresh:
        cand = np.arange(n, dtype=np.int64)
        need = None
    else:
        drift = np.asarray(drift, dtype=np.float64)
        jumped = far_centroids(drift, state, groups) if far else np.empty(0, dtype=np.int64)
        if jumped.shape[0]:
            drift = drift.copy()
            drift[jumped] = 0.0  # their distances go into the bounds (below)
        shift = _loops.float32_shift(
            np.maximum.reduceat(drift[groups.order], groups.starts[:-1]), state["lmax"]
        )
        # (before the far-moved centroids' scores: an estimate that leaves them out is lower, so a
        # chunk it sends to the unpruned kernel would have gone there after them too)
        if (
            plain_above < 1.0
            and _loops.sampled_pairs(
                X,
                C,
                labels,
                upper,
                lower,
                norm,
                drift,
                shift,
                prep.k0,
                prep.k1,
                groups.group_of,
                np.diff(groups.starts),
                NEED_SAMPLE_STRIDE,
            )
            > plain_above * n * k
        ):
            partials = assign_partials(X, C, weights, scratch_bytes=scratch_bytes)
            return _stale(state), PrunedPartials(partials, float(n * k), float(n * k), True)
        if jumped.shape[0]:
            computed += _fold_far(X, C, prep, groups, jumped, state, scratch_bytes)
        cand = np.empty(n, dtype=np.int64)
        lmin = np.empty(n, dtype=np.float32)
        m = _loops.settle(labels, upper, lower, norm, drift, shift, prep.k0, prep.k1, cand, lmin)
        m = _loops.tighten(X, C, labels, upper, lmin, norm, prep.k0, prep.k1, cand, m)
        computed += m
        cand = cand[:m]
        need = np.empty((G, m), dtype=np.bool_)
        _loops.group_needs(
            labels, upper, lower, norm, prep.k0, prep.k1, groups.group_of, cand, m, need
        )
        if float(need.sum(axis=1) @ np.diff(groups.starts)) > plain_above * n * k:
            partials = assign_partials(X, C, weights, scratch_bytes=scratch_bytes)
            return _stale(state), PrunedPartials(
                partials, float(n * k + computed), float(n * k), True
            )
    sums = np.zeros((k, d), dtype=np.float64)
    counts = np.zeros(k, dtype=np.float64)
    has_w = weights is not None
    w = np.ascontiguousarray(weights, dtype=np.float64) if has_w else np.empty(0, dtype=np.float64)
    tile, _ = _compiled_tiles(
        backend, n, k, d, X.dtype.itemsize, scratch_bytes
    )  # the unpruned kernel's tiles
    fold = _Fold(tile, w, has_w, sums, counts)
    got, objective = _score_candidates(
        X,
        C,
        prep,
        groups,
        backend,
        cand,
        need,
        state,
        norm,
        scratch_bytes,
        fold if need is None else None,
    )
    computed += got
    if need is not None:  # (a build folded its rows tile by tile, while they were in cache)
        objective = _loops.tiled_partials(X, C, labels, tile, w, has_w, sums, counts, 0, n, 0.0)
    partials = Partials(sums, counts, np.asarray(objective, dtype=np.float64))
    return state, PrunedPartials(partials, float(computed), float(n * k), True)


def far_centroids(drift, state, groups: CentroidGroups):
    """The centroids a pass scores exactly for every row (see the module docstring), in index order.

    Candidates: drifts above :data:`FAR_FACTOR` times the :data:`FAR_QUANTILE` quantile of the drifts
    (above 0), the :data:`FAR_MAX_SHARE` of the centroids that moved farthest at most. One pays where
    it would break its group's bound for enough rows: scoring it costs one distance a row; a row
    whose group bound (above its upper bound by less than the drift, on every
    :data:`FAR_SAMPLE_STRIDE`-th row) it breaks would compute the group's centroids. Kept where that
    share times the group's width is at least 1.
    """
    k = drift.shape[0]
    cap = int(k * FAR_MAX_SHARE)
    n = state["labels"].shape[0]
    if cap < 1 or n == 0:
        return np.empty(0, dtype=np.int64)
    threshold = max(FAR_FACTOR * float(np.quantile(drift, FAR_QUANTILE)), 0.0)
    cand = np.flatnonzero(drift > threshold)
    if cand.shape[0] == 0:
        return cand.astype(np.int64)
    if cand.shape[0] > cap:
        cand = np.sort(cand[np.argsort(-drift[cand], kind="stable")[:cap]])
    sample = np.arange(0, n, FAR_SAMPLE_STRIDE)
    g = groups.group_of[cand]
    gap = state["lower"][:, sample][g].astype(np.float64) - state["upper"][sample][None, :]
    broken = np.mean(gap < drift[cand][:, None], axis=1)
    widths = np.diff(groups.starts)[g]
    return cand[broken * widths >= 1.0].astype(np.int64)


def _fold_far(X, C, prep: _Prepared, groups: CentroidGroups, far, state, scratch_bytes) -> int:
    """Every row's distances to the centroids ``far`` into its bounds (:func:`~dkmeans.kernels.backends.
    compiled_pruned.fold_far`), in tiles of rows within ``scratch_bytes``; returns the distances computed."""
    n, d = X.shape
    f = far.shape[0]
    itemsize = X.dtype.itemsize
    position = np.empty(len(groups.order), dtype=np.int64)
    position[groups.order] = np.arange(len(groups.order))
    h = np.ascontiguousarray(prep.h_perm[position[far]])
    CF = np.ascontiguousarray(C[far])
    rows = int(max(1, min(n, TILE_ROWS, scratch_bytes // max(1, 2 * f * itemsize + 32))))
    buf = np.empty(f * rows, dtype=X.dtype)
    far_group = np.ascontiguousarray(groups.group_of[far])
    labels, lower, upper = state["labels"], state["lower"], state["upper"]
    for t0 in range(0, n, rows):
        mt = min(rows, n - t0)
        Xt = X[t0 : t0 + mt]
        St = np.matmul(CF, Xt.T, out=buf[: f * mt].reshape(f, mt))
        norm_up, sq_lo, sq_up = np.empty(mt), np.empty(mt), np.empty(mt)
        _loops.row_norms(Xt, np.arange(mt, dtype=np.int64), norm_up, sq_lo, sq_up)
        slack = (prep.k0 * norm_up + prep.k1) / (2.0 * SAFETY)
        _loops.fold_far(St, h, far, far_group, t0, sq_lo, sq_up, slack, labels, lower, upper)
    return n * f


class _Fold(NamedTuple):
    """The partials a build folds as it goes (:func:`_score_candidates`): the kernel's row tile, the
    weights and the sums and counts to add to."""

    tile: int
    weights: Any
    has_weights: bool
    sums: Any
    counts: Any


def _score_candidates(
    X,
    C,
    prep: _Prepared,
    groups: CentroidGroups,
    backend,
    cand,
    need,
    state,
    norm,
    scratch_bytes,
    fold: _Fold | None = None,
):
    """Score the candidate rows ``cand`` against the groups ``need`` marks (all when None), set their
    labels and bounds in ``state``; returns the distances computed and the objective.

    With ``fold`` (a build: every row, in order) each tile of rows also goes into the partials as
    soon as its labels are set, while its rows are in cache (reading them again after the whole
    chunk cost a 62,500 x 128 build 4 ms of 30, against 1.2 from cache): the tiles are whole
    multiples of the kernel's tile, so the sums and the objective are the kernel's, to the bit.

    Tiles of candidate rows are gathered once; a group that most of a tile's rows need (or every
    group, when most of the tile's pairs are needed) is scored for the whole tile in blocks of
    groups, the others for the rows that need them. The products write into buffers allocated once
    per call: fresh multi-MiB outputs cost their page faults each time.
    """
    m = cand.shape[0]
    if m == 0:
        return 0, 0.0
    k, d = C.shape
    G = groups.n_groups
    itemsize = X.dtype.itemsize
    starts = groups.starts
    widths = np.diff(starts)
    widest = int(widths.max())
    per_row = (
        2 * widest * itemsize + 2 * d * itemsize + G * 12 + 64
    )  # scores, the row (twice), gm/gi/gs
    rows_per_tile = max(1, min(m, TILE_ROWS, int(scratch_bytes) // per_row))
    if fold is not None:  # whole kernel tiles
        rows_per_tile = max(1, rows_per_tile // fold.tile) * fold.tile
    objective = 0.0
    computed = 0
    labels, upper, lower = state["labels"], state["upper"], state["lower"]
    scratch = (
        np.empty(rows_per_tile, X.dtype),
        np.empty(rows_per_tile, X.dtype),
        np.empty(rows_per_tile, np.int32),
    )
    # gathered rows go to buffers allocated once per call: a fresh output per gather paid its page
    # faults each time (a pass's per-group gathers on a 62,500-row chunk took 12 ms by np.take)
    tile_rows = np.empty((rows_per_tile if need is not None else 0, d), X.dtype)
    minima = (
        np.empty(G * rows_per_tile, X.dtype),
        np.empty(G * rows_per_tile, np.int32),
        np.empty(G * rows_per_tile, X.dtype),
    )
    group_rows = np.empty((rows_per_tile if need is not None else 0, d), X.dtype)
    scores = np.empty(widest * rows_per_tile, dtype=X.dtype)
    scores_rt = np.empty(widest * rows_per_tile, dtype=X.dtype)
    streamed = _streamed_plan(
        X, k, d, backend, scratch_bytes
    )  # (whole tiles: the build's products)
    for t0 in range(0, m, rows_per_tile):
        rows = cand[t0 : t0 + rows_per_tile]
        mt = rows.shape[0]
        if need is None:  # every row (cand is 0..n-1): no gather
            Xt = X[t0 : t0 + mt]
        else:
            Xt = tile_rows[:mt]
            _loops.gather_rows(X, rows, Xt)
        local = np.arange(mt, dtype=np.int64)
        # by group, then row (the loops over rows vectorise); +inf: a group not scored
        gm, gi, gs = (buf[: G * mt].reshape(G, mt) for buf in minima)
        nd = None if need is None else need[:, t0 : t0 + mt]
        dense = nd is None or float(nd.sum(axis=1) @ widths) >= DENSE_SHARE * mt * k
        if not dense:  # (the dense paths write every group)
            gm.fill(np.inf)
            gi.fill(0)
            gs.fill(np.inf)
        if dense:
            T, block_packs, XT = streamed = _streamed_scratch(streamed, X.dtype)
            if prep.CG[0] is None:  # (a k x d copy: only passes that score whole tiles need it)
                prep.CG[0] = _packed(prep.C_perm, prep.h_perm, groups)
            CG, h_pad, pack_group = prep.CG[0]
            _loops.fused_minima(
                Xt[:mt], CG, block_packs, h_pad, pack_group, groups.order, T, XT, gm, gi, gs
            )
            computed += mt * k
        else:
            for g in range(G):
                sel = np.flatnonzero(nd[g])
                if sel.shape[0] == 0:
                    continue
                a, b = int(starts[g]), int(starts[g + 1])
                if (
                    sel.shape[0] >= DENSE_SHARE * mt
                ):  # nearly all rows need it: score them all, no gather
                    sel, Xg = local, Xt
                else:
                    Xg = group_rows[: sel.shape[0]]
                    _loops.gather_rows(Xt, sel, Xg)
                St = _scores_t(prep.C_perm[a:b], Xg, scores, scores_rt)
                _loops.block_minima(
                    St, prep.h_perm[a:b], groups.order, starts, g, g + 1, sel, gm, gi, gs, *scratch
                )
                computed += sel.shape[0] * (b - a)
        norm_up, sq_lo, sq_up = np.empty(mt), np.empty(mt), np.empty(mt)
        _loops.row_norms(Xt, local, norm_up, sq_lo, sq_up)  # the gathered rows: in cache
        if need is None:  # the state's norms: float32, rounded up
            up32 = norm_up.astype(np.float32)
            norm[t0 : t0 + mt] = np.where(
                up32.astype(np.float64) < norm_up, np.nextafter(up32, np.float32(np.inf)), up32
            )
        margin = prep.k0 * norm_up + prep.k1
        lab = np.empty(mt, dtype=np.int32)
        ok = np.empty(mt, dtype=np.bool_)
        _loops.choose(gm, gi, gs, margin, lab, ok)
        near_tie = np.flatnonzero(~ok)
        if near_tie.shape[
            0
        ]:  # the kernel's own choice, on these rows only (its rows do not interact)
            lab[near_tie] = _assign(backend, Xt[near_tie], C, scratch_bytes)[0]
            computed += near_tie.shape[0] * k
        largest = _loops.new_bounds(
            X,
            C,
            rows,
            lab,
            gm,
            gi,
            gs,
            groups.group_of,
            sq_lo,
            sq_up,
            margin / (2.0 * SAFETY),
            lower,
            upper,
            labels,
        )
        state["lmax"] = max(state["lmax"], float(largest))
        if fold is not None:
            objective = _loops.tiled_partials(
                X,
                C,
                labels,
                fold.tile,
                fold.weights,
                fold.has_weights,
                fold.sums,
                fold.counts,
                t0,
                t0 + mt,
                objective,
            )
    return computed, objective


def _packed(C_perm, h_perm, groups: CentroidGroups):
    """``(CG, h_pad, pack_group)`` of the streamed build: the centroids in ``C_perm``'s order packed
    (:func:`~dkmeans.kernels.backends.compiled_pruned.packed_groups`), their ``h`` padded with
    ``+inf`` and their groups (int32) padded with the last group."""
    CG = _loops.packed_groups(C_perm)
    total = CG.shape[0] * _loops.STREAM_GROUP
    k = C_perm.shape[0]
    h_pad = np.full(total, np.inf, dtype=C_perm.dtype)
    h_pad[:k] = h_perm
    pack_group = np.full(total, groups.n_groups - 1, dtype=np.int32)
    pack_group[:k] = np.repeat(np.arange(groups.n_groups, dtype=np.int32), np.diff(groups.starts))
    return CG, h_pad, pack_group


def _streamed_plan(X, k: int, d: int, backend, scratch_bytes):
    """``(T, block_packs, XT shape)`` of :func:`~dkmeans.kernels.backends.compiled_pruned.fused_minima`: the
    assignment kernel's tile of rows (``XT``, transposed, rounded up to whole calls) and packs of
    centroids per block (they stay in L2)."""
    itemsize = X.dtype.itemsize
    T, _ = _compiled_tiles(backend, X.shape[0], k, d, itemsize, scratch_bytes)
    rows = _loops.STREAM_ROW_VECTORS * (_loops.VECTOR_BYTES // itemsize)
    block_packs = max(1, STREAM_BLOCK_BYTES // (d * _loops.STREAM_GROUP * itemsize))
    return T, block_packs, (d, -(-T // rows) * rows)


def _streamed_scratch(plan, dtype):
    """The plan with its buffer (allocated at the first tile that needs it, kept for the call)."""
    T, block_packs, XT = plan
    if isinstance(XT, tuple):
        XT = np.zeros(XT, dtype=dtype)
    return T, block_packs, XT


def _scores_t(Cg, Xg, out, work):
    """``Cg @ Xg.T`` (the layout :func:`block_minima` reads) into ``out``, by the faster BLAS call: for a
    narrow group of wide rows, ``Xg @ Cg.T`` then a transposed copy ran 1.5x as fast (one thread,
    d >= 64 and fewer than 64 centroids; the other way round otherwise)."""
    w, m = Cg.shape[0], Xg.shape[0]
    St = out[: w * m].reshape(w, m)
    if w < 64 and Cg.shape[1] >= 64:
        S = np.matmul(Xg, Cg.T, out=work[: m * w].reshape(m, w))
        St[...] = S.T
        return St
    return np.matmul(Cg, Xg.T, out=St)


def warm_up(dtype, d: int) -> None:
    """Run the pruned pass's compiled loops once on a few rows (compiling them, or loading numba's cache)."""
    rng = np.random.default_rng(0)
    X = rng.random((300, d)).astype(dtype)
    C = X[:3].copy()
    groups = centroid_groups(C, 2)
    moved = C + np.asarray(0.01, dtype=dtype)
    for w in (None, np.ones(len(X))):
        state, _ = pruned_partials(X, C, None, w, groups)
        pruned_partials(X, moved, state, w, groups, np.full(len(C), 0.02 * np.sqrt(d)))
    state, _ = pruned_partials(
        X, C, None, None, groups
    )  # and the sampled estimate's loop (plain_above < 1)
    pruned_partials(
        X, moved, state, None, groups, np.full(len(C), 0.02 * np.sqrt(d)), plain_above=0.99
    )
    # the far-moved centroids' loop (a pass after a swap or a refill), which the passes above do not
    # reach: compiled mid-fit it cost one pass 0.55 s (manyk, 200k x 64, k = 2,048: 5x the pass)
    state, _ = pruned_partials(X, C, None, None, groups)
    if state is not None:  # (None: this call's backend is not the compiled loops)
        _fold_far(
            X,
            moved,
            _prepare(moved, groups),
            groups,
            np.array([0], dtype=np.int64),
            state,
            DEFAULT_SCRATCH_BYTES,
        )


__all__ = [
    "CentroidGroups",
    "PrunedPartials",
    "centroid_groups",
    "combine_pruned",
    "far_centroids",
    "group_count",
    "new_state",
    "pruned_partials",
    "state_bytes",
    "warm_up",
]
