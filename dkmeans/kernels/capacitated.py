"""Assignment under per-cluster prices: the chunk kernels of size-capped k-means.

A capacitated assignment (cluster ``j`` holds between ``L_j`` and ``U_j`` rows) is a
transportation problem whose dual has one price per cluster: at the right prices every row
goes to ``argmin_j d(x, c_j) + p_j``. :mod:`dkmeans.drivers.capacitated` moves the prices
with passes of :func:`price_partials`; this module computes, for one chunk, the priced
labels and what the driver needs to move the prices.

Exactness. Squared distances are rounded once, row by row, to integer multiples of a quantum
``q`` (a power of two about ``2**-44`` of the largest squared distance), so that costs, prices
and their differences are exact integers held in float64: a price moved by a margin makes the
row exactly tied, never off by a rounding. Ties are then broken by a second, lexicographic
cost ``h(i) xor g(j) + Q_j`` (``h`` a 36-bit hash of the global row index ``i``, ``g`` one of the
cluster, ``Q_j`` a second price): rows with equal distances (duplicates) are split between
clusters by their index, whatever the chunking, and two rows' margins are almost never equal.
A pair of prices ``(P_j, Q_j)`` is compared as a pair: ``P`` first.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from dkmeans.kernels import repair
from dkmeans.kernels.backends.layout import LazyModule
from dkmeans.kernels.common import Partials
from dkmeans.kernels.nearest import cluster_sums
from dkmeans.kernels.plans import compiled_allowed

#: Rows per tile of the n x k cost arrays (float64): scratch bounded whatever the chunk size.
TILE_BYTES = 1 << 24


class Margins(NamedTuple):
    """Per-cluster candidate moves, lexicographically smallest first.

    ``cluster`` (int64) the cluster a move concerns, ``primary``/``secondary`` the price
    change (a pair) at which the row moves, ``weight`` the row's weight.
    """

    cluster: np.ndarray
    primary: np.ndarray
    secondary: np.ndarray
    weight: np.ndarray

    @classmethod
    def empty(cls) -> Margins:
        return cls(np.empty(0, np.int64), np.empty(0), np.empty(0), np.empty(0))


class PricePartials(NamedTuple):
    """One pass's contribution to a price round.

    ``partials``: the Lloyd :class:`~dkmeans.kernels.common.Partials` of the priced labels
    (per-cluster weighted sums and sizes, objective from the differences ``x - c``);
    ``rows`` (k,) unweighted rows per cluster;
    ``shed``: for each over-full cluster asked for, the smallest price rises that move a row out;
    ``enter``: for each under-full cluster asked for, the smallest price cuts that move a row in;
    ``exits``: the smallest moves of a row from one set of clusters to another (tagged cluster
    -1): the uniform price change of either set that moves it;
    ``max_sq``: the largest squared distance of any row to any centroid (the quantum's scale);
    ``moves``: the repair's candidate moves asked for (:class:`Moves`);
    ``dual``: the weighted sum over rows of the smallest priced cost (quanta), the first term of
    the dual bound;
    ``exchange``: the exchange lists asked for (:func:`exchange_moves`), or None;
    ``histogram``: the margin histogram asked for (:func:`margin_histogram`), or None.
    """

    partials: Partials
    rows: np.ndarray
    shed: Margins
    enter: Margins
    exits: Margins
    max_sq: float
    moves: Moves
    dual: float
    exchange: Moves | None = None
    histogram: MarginHistogram | None = None


class MarginHistogram(NamedTuple):
    """Rows by the margin at which they would move between two clusters, in bins (sparse):
    ``index`` (int64) ``(a k + b) * nbins + bin`` for rows labelled ``a`` whose priced cost of
    cluster ``b`` exceeds their own by a margin in bin ``bin`` of :func:`margin_edges`, and
    ``count`` their weights' sum (float64; integers for unit weights)."""

    index: np.ndarray
    count: np.ndarray

    @classmethod
    def empty(cls) -> MarginHistogram:
        return cls(np.empty(0, np.int64), np.empty(0))


class Moves(NamedTuple):
    """Candidate moves of single rows for the final repair: ``row`` (global index, int64) from
    cluster ``source`` to ``target`` at an extra cost ``cost`` (unpriced squared distance, quanta)."""

    source: np.ndarray
    target: np.ndarray
    cost: np.ndarray
    row: np.ndarray
    weight: np.ndarray

    @classmethod
    def empty(cls) -> Moves:
        return cls(
            np.empty(0, np.int64),
            np.empty(0, np.int64),
            np.empty(0),
            np.empty(0, np.int64),
            np.empty(0),
        )


class RepairAsk(NamedTuple):
    """What a repair pass reports. ``shed`` True: rows of the clusters in ``source`` (over their cap)
    to their ``alternatives`` cheapest clusters of ``target`` (with room), the ``wanted[j]``
    cheapest moves per source ``j``; False: rows of ``source`` (above their floor) into each
    cluster ``j`` of ``target`` (under its floor), the ``wanted[j]`` cheapest per target.
    Cheapest: by cost, then global row index, then target."""

    shed: bool
    source: np.ndarray
    target: np.ndarray
    wanted: np.ndarray
    alternatives: int = 1


def _cheapest(moves: Moves, group: np.ndarray, wanted: np.ndarray) -> Moves:
    """Per value ``j`` of ``group``, the ``wanted[j]`` cheapest moves (by cost, row, then target),
    sorted."""
    if moves.row.shape[0] == 0:
        return moves
    # one sort by group, then cost, row, target; each group's first ``wanted`` (not a scan of
    # every move per group: k scans a pass)
    by_group = np.lexsort((moves.target, moves.row, moves.cost, group))
    g = group[by_group]
    starts = np.searchsorted(g, g, side="left")
    rank = np.arange(g.shape[0]) - starts
    idx = by_group[rank < np.asarray(wanted)[g]]
    out = Moves(*(field[idx] for field in moves))
    order = np.lexsort((out.target, out.row, out.cost))
    return Moves(*(field[order] for field in out))


def select_moves(moves: Moves, ask: RepairAsk | None) -> Moves:
    """The moves a :class:`RepairAsk` keeps of ``moves`` (associative: chunks' lists, then theirs)."""
    if ask is None or moves.row.shape[0] == 0:
        return Moves.empty()
    return _cheapest(moves, moves.source if ask.shed else moves.target, ask.wanted)


def _concat_moves(parts) -> Moves:
    parts = [p for p in parts if p.row.shape[0]]
    if not parts:
        return Moves.empty()
    return Moves(*(np.concatenate(field) for field in zip(*parts)))


def apply_overrides(labels: np.ndarray, overrides, row_offset: int) -> np.ndarray:
    """Positions (in ``labels``) of the rows the repair moved, their labels set in place.

    ``overrides``: ``(rows, labels)``, global row indices sorted ascending and their clusters.
    """
    if overrides is None or overrides[0].shape[0] == 0:
        return np.empty(0, np.int64)
    rows, new = overrides
    lo, hi = np.searchsorted(rows, [row_offset, row_offset + labels.shape[0]])
    pos = rows[lo:hi] - row_offset
    labels[pos] = new[lo:hi]
    return pos


def _repair_moves(D, labels, wt, row_offset: int, ask: RepairAsk) -> Moves:
    """A tile's candidate moves for ``ask`` (``D`` the unpriced integer costs of the tile)."""
    r = np.flatnonzero(ask.source[labels])
    if r.shape[0] == 0 or not np.any(ask.target):
        return Moves.empty()
    own = D[r, labels[r]]
    if ask.shed:
        # each row's few cheapest clusters with room: where the caller finds the first full, the
        # row takes the next in the same pass (one target a row left most rows to later passes)
        D2 = D[r][:, ask.target]
        cols = np.flatnonzero(ask.target)
        m = max(1, min(int(ask.alternatives), cols.shape[0]))
        if m < cols.shape[0]:
            t = np.argpartition(D2, m - 1, axis=1)[:, :m]
        else:
            t = np.broadcast_to(np.arange(m), (r.shape[0], m))
        moves = Moves(
            np.repeat(labels[r].astype(np.int64), m),
            cols[t].astype(np.int64).ravel(),
            (np.take_along_axis(D2, t, axis=1) - own[:, None]).ravel(),
            np.repeat(r + row_offset, m),
            np.repeat(wt[r], m),
        )
        return _cheapest(moves, moves.source, ask.wanted)
    parts = []
    for j in np.flatnonzero(ask.target):
        moves = Moves(
            labels[r].astype(np.int64),
            np.full(r.shape[0], j, np.int64),
            D[r, j] - own,
            r + row_offset,
            wt[r],
        )
        parts.append(_cheapest(moves, moves.target, ask.wanted))
    return _concat_moves(parts)


def exchange_moves(D, labels, wt, row_offset: int, m: int) -> Moves:
    """A tile's exchange lists: for every pair of clusters ``(a, b)``, the ``m`` cheapest moves
    of a row labelled ``a`` into ``b``, by extra cost ``D[i, b] - D[i, a]`` (integers), then
    global row index (``D`` the unpriced integer costs of the tile)."""
    n, k = D.shape
    if n == 0 or k < 2 or m <= 0:
        return Moves.empty()
    rows_per_tile = max(1, TILE_BYTES // (8 * 4 * k))
    if n > rows_per_tile:  # scratch bounded: tile by tile, then the tiles' lists
        return select_exchange(
            _concat_moves(
                [
                    exchange_moves(D[i0:i1], labels[i0:i1], wt[i0:i1], row_offset + i0, m)
                    for i0, i1 in _tiles(n, k)
                ]
            ),
            m,
        )
    lab = labels.astype(np.int64)
    E = D - D[np.arange(n), lab][:, None]
    order = np.argsort(lab, kind="stable")
    bounds = np.searchsorted(lab[order], np.arange(k + 1))
    parts = []
    for a in range(k):
        rows = order[bounds[a] : bounds[a + 1]]  # ascending row index within a
        if rows.shape[0] == 0:
            continue
        Ea = E[rows]
        if rows.shape[0] > m:  # the m cheapest per column lie at or below its m-th smallest
            cut = np.partition(Ea, m - 1, axis=0)[m - 1]
            r, t = np.nonzero(Ea <= cut[None, :])
        else:
            r, t = np.divmod(np.arange(Ea.size), k)
        keep = t != a
        r, t = r[keep], t[keep]
        parts.append(
            Moves(
                np.full(r.shape[0], a, np.int64),
                t.astype(np.int64),
                Ea[r, t],
                rows[r].astype(np.int64) + row_offset,
                wt[rows[r]],
            )
        )
    return select_exchange(_concat_moves(parts), m)


def _exchange(D, labels, wt, row_offset: int, m: int) -> Moves:
    """:func:`exchange_moves`, by the compiled loops where allowed (the same moves)."""
    n, k = D.shape
    if not (compiled_allowed() and n and k > 1 and m > 0):
        return exchange_moves(D, labels, wt, row_offset, m)
    cost, row = np.empty((k * k, m)), np.empty((k * k, m), np.int64)
    count = np.zeros(k * k, np.int64)
    lab = labels.astype(np.int64)
    _loops.exchange_rows(np.ascontiguousarray(D), lab, row_offset, m, cost, row, count)
    pair, cost, rows = _loops.sorted_heaps(cost, row, count)  # what select_exchange gives
    return Moves(pair // k, pair % k, cost, rows, wt[rows - row_offset])


def _merge_exchange(parts, m: int) -> Moves:
    """The exchange lists of several tiles or chunks, each selected and sorted: the compiled
    merge of the sorted parts where allowed, else :func:`select_exchange` (the same lists)."""
    parts = [p for p in parts if p.row.shape[0]]
    if len(parts) == 1:
        return parts[0]
    moves = _concat_moves(parts)
    if not (compiled_allowed() and moves.row.shape[0]):
        return select_exchange(moves, m)
    bounds = np.cumsum([0] + [p.row.shape[0] for p in parts]).astype(np.int64)
    pair = moves.source * (1 << 31) + moves.target
    keep = _loops.merge_sorted_lists(
        pair, np.ascontiguousarray(moves.cost, dtype=np.float64), moves.row, bounds, m
    )
    return Moves(*(field[keep] for field in moves))


def select_exchange(moves: Moves, m: int) -> Moves:
    """Per pair ``(source, target)`` the ``m`` cheapest of ``moves`` (by cost, then row), sorted
    by pair, cost and row (associative: chunks' lists, then theirs)."""
    if moves.row.shape[0] == 0:
        return moves
    pair = moves.source * (1 << 31) + moves.target
    order = np.lexsort((moves.row, moves.cost, pair))
    pair = pair[order]
    starts = np.flatnonzero(np.r_[True, pair[1:] != pair[:-1]])
    rank = np.arange(pair.shape[0]) - np.repeat(starts, np.diff(np.r_[starts, pair.shape[0]]))
    idx = order[rank < m]
    return Moves(*(field[idx] for field in moves))


#: Bins of the margin histogram per doubling of the margin (:func:`margin_edges`).
MARGIN_BINS_PER_OCTAVE = 4


def margin_edges() -> np.ndarray:
    """The margin histogram's bin edges ``2**(t / MARGIN_BINS_PER_OCTAVE)``, ``t = 0 ..`` up to
    ``2**64`` (float64, each octave's edges its first octave's times a power of two, so that a
    margin's bin follows from its exponent and mantissa): bin 0 holds margins below 1 (exact
    ties), bin ``t + 1`` margins from edge ``t`` to edge ``t + 1``. Four bins an octave: a price
    model good to about 20% of a price change at any scale, in 258 bins a pair of clusters."""
    t = np.arange(64 * MARGIN_BINS_PER_OCTAVE + 1)
    first = np.exp2(np.arange(MARGIN_BINS_PER_OCTAVE) / MARGIN_BINS_PER_OCTAVE)
    return np.ldexp(first[t % MARGIN_BINS_PER_OCTAVE], t // MARGIN_BINS_PER_OCTAVE)


def margin_histogram(
    D, P, labels, a, wt, edges, hrow=None, sample_bits: int = 0, limit: float = math.inf
) -> MarginHistogram:
    """A tile's :class:`MarginHistogram`: every row's margin ``D[i, b] + P[b] - a[i]`` to every
    cluster ``b`` but its own (``a`` its own priced cost, ``D`` the integer costs), up to
    ``limit`` (larger margins are not counted: a model whose price steps are at most half of it
    moves no such row, and most of a row's margins are far larger than a late step).

    ``sample_bits`` s > 0: only the rows whose tie hash ``hrow`` has its ``s`` low bits zero (one in
    ``2**s``, by global row index: the same rows whatever the chunking), each counted ``2**s``
    times: a model of a large gap needs no exact count, and the bins cost ``n k`` scattered adds.
    """
    n, k = D.shape
    if n == 0 or k < 2:
        return MarginHistogram.empty()
    nbins = edges.shape[0] + 1
    if sample_bits:
        mask = np.uint64((1 << sample_bits) - 1)
        rows = np.flatnonzero((hrow & mask) == 0)
        D, labels, a = D[rows], labels[rows], a[rows]
        wt = wt[rows] * float(1 << sample_bits)
        n = rows.shape[0]
        if n == 0:
            return MarginHistogram.empty()
    if compiled_allowed():
        counts = np.zeros(k * k * nbins)
        _loops.margin_counts(
            np.ascontiguousarray(D), P, labels.astype(np.int64), a, wt, edges, float(limit), counts
        )
    else:
        E = D + P[None, :] - a[:, None]
        bins = np.searchsorted(edges, E, side="right")
        key = (labels.astype(np.int64)[:, None] * k + np.arange(k)[None, :]) * nbins + bins
        other = (labels[:, None] != np.arange(k)[None, :]) & (E <= limit)
        weights = np.broadcast_to(wt[:, None], E.shape)[other]
        counts = np.bincount(key[other], weights=weights, minlength=k * k * nbins)
    index = np.flatnonzero(counts)
    return MarginHistogram(index.astype(np.int64), counts[index])


def combine_histograms(parts) -> MarginHistogram:
    """The sum of several :class:`MarginHistogram` (associative; exact for unit weights)."""
    parts = [p for p in parts if p is not None and p.index.shape[0]]
    if not parts:
        return MarginHistogram.empty()
    if len(parts) == 1:
        return parts[0]
    # one count per bin of every pair (a few MiB): a sum without sorting the parts' bins
    dense = np.bincount(
        np.concatenate([p.index for p in parts]), weights=np.concatenate([p.count for p in parts])
    )
    index = np.flatnonzero(dense)
    return MarginHistogram(index.astype(np.int64), dense[index])


#: Bits of the tie-breaking hashes: sums of them and of second prices stay exact in float64.
TIE_BITS = 36


def _mix(z):
    """splitmix64's finaliser on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def row_hashes(row_offset: int, n: int) -> np.ndarray:
    """``h(i)`` (uint64, below ``2**TIE_BITS``) of rows ``row_offset .. row_offset + n``."""
    with np.errstate(over="ignore"):
        rows = _mix(
            np.arange(row_offset, row_offset + n, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        )
    return rows >> np.uint64(64 - TIE_BITS)


def cluster_hashes(k: int) -> np.ndarray:
    """``g(j)`` (uint64, below ``2**TIE_BITS``) of clusters ``0 .. k``."""
    with np.errstate(over="ignore"):
        cols = _mix(np.arange(k, dtype=np.uint64) + np.uint64(0xD1B54A32D192ED03))
    return cols >> np.uint64(64 - TIE_BITS)


def tie_costs(row_offset: int, n: int, k: int) -> np.ndarray:
    """The secondary costs ``h(i) xor g(j)`` (n, k) of rows ``row_offset ..`` (float64 integers
    below ``2**36``)."""
    return (row_hashes(row_offset, n)[:, None] ^ cluster_hashes(k)[None, :]).astype(np.float64)


def max_sq_distance(X, C) -> float:
    """The largest squared distance of a chunk's rows to ``C``, clipped at 0: the ``max_sq`` a
    :class:`CostCache` of the same rows records, to the bit, without keeping the costs."""
    n, k = X.shape[0], C.shape[0]
    if n == 0 or k == 0:
        return 0.0
    C64 = np.asarray(C, dtype=np.float64)
    cn = np.einsum("ij,ij->i", C64, C64)
    compiled = compiled_allowed()
    return max(_tile_costs(X[i0:i1], C64, cn, 0.0, compiled, None) for i0, i1 in _tiles(n, k))


def sq_distances64(X, C) -> np.ndarray:
    """Squared distances (n, k) in float64 by ``||x||^2 - 2 x.c + ||c||^2``, clipped at 0.

    Row by row the same values whatever rows share the call (one product per row tile).
    """
    X64 = np.asarray(X, dtype=np.float64)
    C64 = np.asarray(C, dtype=np.float64)
    d2 = (
        np.einsum("ij,ij->i", X64, X64)[:, None]
        - 2.0 * (X64 @ C64.T)
        + np.einsum("ij,ij->i", C64, C64)[None, :]
    )
    return np.maximum(d2, 0.0, out=d2)


def lex_argmin(A, B):
    """Column of the lexicographically smallest ``(A, B)`` per row, with that pair (lowest column on full ties)."""
    a = A.min(axis=1)
    Bm = np.where(A == a[:, None], B, np.inf)
    labels = Bm.argmin(axis=1)
    b = Bm[np.arange(A.shape[0]), labels]
    return labels, a, b


def _tiles(n: int, k: int):
    """Row ranges whose ``n x k`` float64 scratch arrays (a few of them) fit :data:`TILE_BYTES`;
    ``k`` 0: no scratch (the whole chunk in one)."""
    rows = max(1, TILE_BYTES // (8 * 4 * k)) if k > 0 else max(1, n)
    for i0 in range(0, n, rows):
        yield i0, min(n, i0 + rows)


def priced_labels(X, C, P, Q, q: float, row_offset: int, overrides=None) -> np.ndarray:
    """Labels (int32) of the rows of ``X`` under prices ``(P, Q)`` and quantum ``q``.

    Parameters
    ----------
    X : ndarray (n, d)
    C : ndarray (k, d)
    P, Q : ndarray (k,), float64
        The primary and secondary prices (integers held in float64).
    q : float
        The quantum of squared distances.
    row_offset : int
        Global index of the chunk's first row.
    overrides : tuple of ndarray, optional
        ``(rows, labels)``: the final repair's moves (global rows sorted ascending), which
        replace the priced labels of those rows.
    """
    n, k = X.shape[0], C.shape[0]
    labels = np.empty(n, dtype=np.int32)
    C64 = np.asarray(C, dtype=np.float64)
    P, Q = np.asarray(P, dtype=np.float64), np.asarray(Q, dtype=np.float64)
    hcol = cluster_hashes(k)
    for i0, i1 in _tiles(n, k):
        labels[i0:i1] = _tile_labels(X[i0:i1], C64, P, Q, q, row_offset + i0, hcol)
    apply_overrides(labels, overrides, row_offset)
    return labels


def _tile_labels(X, C64, P, Q, q: float, row_offset: int, hcol) -> np.ndarray:
    """A tile's priced labels (int32) as a pass's :func:`price_partials` chooses them: the costs of
    :func:`cost_cache` (the compiled sweep where allowed), the lexicographic choice of :func:`_best`."""
    tile = cost_cache(X, C64, q, row_offset, None)
    return _best(tile.D, P, Q, tile.hrow, hcol)[0].astype(np.int32)


def _smallest(cluster: int, mA, mB, w, m: int) -> Margins:
    """The ``m`` lexicographically smallest ``(mA, mB)`` (sorted), tagged with ``cluster``."""
    if m <= 0 or mA.shape[0] == 0:
        return Margins.empty()
    if (
        mA.shape[0] > m
    ):  # the m smallest pairs lie among the rows whose mA is at most the m-th smallest
        cut = np.partition(mA, m - 1)[m - 1]
        keep = mA <= cut
        mA, mB, w = mA[keep], mB[keep], w[keep]
    order = np.lexsort((mB, mA))[:m]
    return Margins(np.full(order.shape[0], cluster, np.int64), mA[order], mB[order], w[order])


def _concat(parts: Sequence[Margins]) -> Margins:
    parts = [p for p in parts if p.cluster.shape[0]]
    if not parts:
        return Margins.empty()
    return Margins(*(np.concatenate(field) for field in zip(*parts)))


def select_margins(margins: Margins, wanted: np.ndarray) -> Margins:
    """For each cluster ``j``, the ``wanted[j]`` lexicographically smallest of ``margins``, sorted."""
    if margins.cluster.shape[0] == 0:
        return margins
    out = []
    for j in np.unique(margins.cluster):
        sel = margins.cluster == j
        out.append(
            _smallest(
                int(j),
                margins.primary[sel],
                margins.secondary[sel],
                margins.weight[sel],
                int(wanted[j]),
            )
        )
    return _concat(out)


class CostCache(NamedTuple):
    """A chunk's integer costs under one set of centroids, kept between the passes of one
    assignment (the prices change, the centroids do not): ``tag`` (a digest of the centroids and
    the quantum), ``D`` (n, k) the costs ``rint(d2 / q)``, ``hrow`` (n,) the rows' tie hashes,
    ``max_sq`` the largest squared distance."""

    tag: object
    D: np.ndarray
    hrow: np.ndarray
    max_sq: float


def cost_cache(X, C, q: float, row_offset: int, tag, reuse: CostCache | None = None) -> CostCache:
    """The :class:`CostCache` of a chunk (one float64 distance product per tile of rows).

    ``reuse``: the chunk's previous cache, whose cost array (of the same shape) is overwritten
    rather than a fresh one allocated (a fresh array's first touch costs more than the build
    into it: ``benchmarks/balanced_costs.py``). The compiled loops form the costs from the product in one
    sweep, to the bit those of :func:`sq_distances64` and ``rint(d2 / q)``.
    """
    n, k = X.shape[0], C.shape[0]
    D = reuse.D if reuse is not None and reuse.D.shape == (n, k) else _cost_array(n, k)
    C64 = np.asarray(C, dtype=np.float64)
    cn = np.einsum("ij,ij->i", C64, C64)
    compiled = compiled_allowed() and n > 0 and k > 0
    max_sq = 0.0
    for i0, i1 in _tiles(n, k):
        max_sq = max(max_sq, _tile_costs(X[i0:i1], C64, cn, q, compiled, D[i0:i1]))
    return CostCache(tag, D, row_hashes(row_offset, n), max_sq)


def _tile_costs(X, C64, cn, q: float, compiled: bool, out) -> float:
    """A tile's costs ``rint(d2 / q)`` into ``out`` (0 where ``q`` is 0; None: not kept), by the
    compiled sweep or NumPy (the same bits); returns the tile's largest squared distance."""
    if compiled:
        X64 = np.asarray(X, dtype=np.float64)
        xc = X64 @ C64.T
        # without ``out`` the sweep overwrites each product once read (with 0: q is 0 then)
        into, q = (xc, 0.0) if out is None else (out, float(q))
        return _loops.quantized_costs(np.einsum("ij,ij->i", X64, X64), xc, cn, q, into)
    d2 = sq_distances64(X, C64)
    if out is not None:
        if q:
            np.rint(d2 / q, out=out)
        else:
            out[:] = 0.0
    return float(d2.max()) if d2.size else 0.0


_loops = LazyModule("dkmeans.kernels.backends.compiled_capacitated")  # numba imported at first use

#: Cost arrays from this many bytes are mapped pages of their own (see :func:`_cost_array`).
COST_PAGES_FROM = 1 << 24


def _cost_array(n: int, k: int) -> np.ndarray:
    """An uninitialised ``(n, k)`` float64 array for a chunk's costs.

    NumPy asks the kernel for transparent huge pages for large arrays, and where the kernel
    then compacts memory to find them on the first touch (Linux's default ``defrag`` setting,
    ``madvise``) a fresh cache took 4 times as long as on plain pages: two 1,000,000 x 32
    arrays written at once, 558-684 ms against 135-141 ms, the same read speed after
    (``benchmarks/balanced_costs.py``). Large arrays are therefore anonymous mappings of plain
    pages, released with the array.
    """
    nbytes = 8 * n * k
    if nbytes < COST_PAGES_FROM:
        return np.empty((n, k))
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=np.float64).reshape(n, k)


def _best(D, P, Q, hrow, hcol):
    """Labels and the smallest pair ``(a, b)`` of each row of ``D`` under prices ``(P, Q)``."""
    n = D.shape[0]
    if compiled_allowed() and n:
        labels, a, b = np.empty(n, np.int64), np.empty(n), np.empty(n)
        _loops.best_rows(np.ascontiguousarray(D), P, Q, hrow, hcol, labels, a, b)
        return labels, a, b
    B = (hrow[:, None] ^ hcol[None, :]).astype(np.float64)
    B += Q[None, :]
    return lex_argmin(D + P[None, :], B)


def _next(D, P, Q, hrow, hcol, rows, own, allowed):
    """For rows ``rows`` of ``D``, the smallest pair among the ``allowed`` columns but ``own``."""
    m = rows.shape[0]
    if compiled_allowed() and m:
        a2, b2 = np.empty(m), np.empty(m)
        _loops.next_rows(
            np.ascontiguousarray(D),
            P,
            Q,
            hrow,
            hcol,
            rows.astype(np.int64),
            own.astype(np.int64),
            allowed,
            a2,
            b2,
        )
        return a2, b2
    A2 = D[rows] + P[None, :]
    A2[np.arange(m), own] = np.inf
    A2[:, ~allowed] = np.inf
    B2 = (hrow[rows][:, None] ^ hcol[None, :]).astype(np.float64)
    B2 += Q[None, :]
    _, a2, b2 = lex_argmin(A2, B2)
    return a2, b2


def _pair_at(D, P, Q, hrow, hcol, rows, cols):
    """The pairs ``(A, B)`` of the given rows at the given columns."""
    return (D[rows, cols] + P[cols], (hrow[rows] ^ hcol[cols]).astype(np.float64) + Q[cols])


def _partials(X, X64, wt, weighted: bool, C64, labels, sums, sizes, rows) -> float:
    """Add a tile's Lloyd partials of ``labels`` to ``sums``, ``sizes``, ``rows``; its objective."""
    if compiled_allowed() and labels.shape[0]:
        return float(
            _loops.partial_rows(
                np.ascontiguousarray(X), wt, weighted, C64, labels, sums, sizes, rows
            )
        )
    diff = X64 - C64[labels]
    tile_sums, tile_sizes = cluster_sums(X64, labels.astype(np.int32), C64.shape[0], wt)
    sums += tile_sums
    sizes += tile_sizes
    rows += np.bincount(labels, minlength=C64.shape[0])
    return float(np.dot(np.einsum("ij,ij->i", diff, diff), wt))


def _enter(D, P, Q, hrow, hcol, labels, a, b, clusters, wanted):
    """Per cluster ``j`` of ``clusters``: ``(j, mA, mB, rows)``, the margins ``(A - a, B - b)`` at
    which rows ``rows`` of other clusters would move into ``j``: all of them, or (compiled) those
    whose ``A - a`` is at most the ``wanted[j]``-th smallest (a superset of the smallest pairs)."""
    if compiled_allowed() and labels.shape[0]:
        owner, rows, mA, mB = _loops.enter_candidates(
            np.ascontiguousarray(D),
            P,
            Q,
            hrow,
            hcol,
            labels,
            a,
            b,
            clusters.astype(np.int64),
            np.maximum(np.asarray(wanted)[clusters], 1).astype(np.int64),
        )
        bounds = np.searchsorted(owner, np.arange(clusters.shape[0] + 1))
        for c, j in enumerate(clusters):
            sel = slice(bounds[c], bounds[c + 1])
            yield j, mA[sel], mB[sel], rows[sel]
        return
    for j in clusters:
        sel = np.flatnonzero(labels != j)
        Aj, Bj = _pair_at(D, P, Q, hrow, hcol, sel, np.full(sel.shape[0], j))
        yield j, Aj - a[sel], Bj - b[sel], sel


def price_partials(
    X,
    w,
    row_offset: int,
    C,
    P,
    Q,
    q: float,
    shed_wanted,
    enter_wanted,
    exit_from=None,
    exit_to=None,
    exit_wanted: int = 0,
    overrides=None,
    repair: RepairAsk | None = None,
    cache: CostCache | None = None,
    exchange: int = 0,
    histogram: int = 0,
    margin_limit: float = math.inf,
) -> PricePartials:
    """A chunk's :class:`PricePartials` under prices ``(P, Q)`` and quantum ``q``.

    ``shed_wanted[j]`` (``enter_wanted[j]``) is how many of the smallest moves out of (into)
    cluster ``j`` to report; zero for none. ``exit_wanted``: how many of the smallest moves
    of a row of a cluster in ``exit_from`` (bool, k) to its best cluster in ``exit_to`` (bool,
    k, disjoint). ``q`` 0: only ``max_sq`` is meaningful. ``overrides``: the repair's moved rows
    (see :func:`priced_labels`); ``repair``: the candidate moves to report; ``cache``: the
    chunk's :class:`CostCache` for ``C`` and ``q`` (else the costs are formed here);
    ``exchange``: the moves per pair of clusters of the exchange lists (0: none);
    ``histogram``: 0, or report the :class:`MarginHistogram` of the priced labels (without
    ``overrides``) of one row in ``2**(histogram - 1)``, margins up to ``margin_limit`` (see
    :func:`margin_histogram`).
    """
    n, d = X.shape
    k = C.shape[0]
    weights = np.ones(n) if w is None else np.asarray(w, dtype=np.float64)
    sums, sizes, rows = np.zeros((k, d)), np.zeros(k), np.zeros(k)
    objective, max_sq = 0.0, 0.0
    C64 = np.asarray(C, dtype=np.float64)
    P, Q = np.asarray(P, dtype=np.float64), np.asarray(Q, dtype=np.float64)
    hcol = cluster_hashes(k)
    every = np.ones(k, dtype=bool)
    shed_parts, enter_parts, exit_parts, move_parts, swap_parts = [], [], [], [], []
    bin_parts = []
    edges = margin_edges() if histogram else None
    dual = 0.0
    exits = (
        exit_wanted > 0
        and exit_to is not None
        and bool(np.any(exit_to))
        and bool(np.any(exit_from))
    )
    shed_clusters = np.flatnonzero(shed_wanted) if k > 1 else np.empty(0, np.int64)
    enter_clusters = np.flatnonzero(enter_wanted) if k > 1 else np.empty(0, np.int64)
    # kept costs with the compiled loops: no n x k scratch (the whole chunk at once)
    lean = cache is not None and compiled_allowed()
    for i0, i1 in _tiles(n, 0 if lean else k):
        wt = weights[i0:i1]
        X64 = None if cache is not None and compiled_allowed() else np.asarray(X[i0:i1], np.float64)
        if cache is not None:
            D, hrow = cache.D[i0:i1], cache.hrow[i0:i1]
        else:
            d2 = sq_distances64(X[i0:i1], C64)
            max_sq = max(max_sq, float(d2.max()) if d2.size else 0.0)
            D = np.rint(d2 / q) if q else np.zeros_like(d2)
            hrow = row_hashes(row_offset + i0, i1 - i0)
        labels, a, b = _best(D, P, Q, hrow, hcol)
        dual += float(np.dot(a, wt))
        moved = apply_overrides(labels, overrides, row_offset + i0)
        if moved.shape[0]:
            a[moved], b[moved] = _pair_at(D, P, Q, hrow, hcol, moved, labels[moved])
        if repair is not None:
            move_parts.append(_repair_moves(D, labels, wt, row_offset + i0, repair))
        if exchange:
            swap_parts.append(_exchange(D, labels, wt, row_offset + i0, exchange))
        if histogram:
            bin_parts.append(
                margin_histogram(D, P, labels, a, wt, edges, hrow, int(histogram) - 1, margin_limit)
            )
        objective += _partials(X[i0:i1], X64, wt, w is not None, C64, labels, sums, sizes, rows)
        if shed_clusters.shape[0]:
            r = np.flatnonzero(np.isin(labels, shed_clusters))
            if r.shape[0]:
                # the row's next choice, its own cluster aside
                a2, b2 = _next(D, P, Q, hrow, hcol, r, labels[r], every)
                lr = labels[r]
                order = np.argsort(lr, kind="stable")  # the rows grouped by cluster
                r, lr, a2, b2 = r[order], lr[order], a2[order], b2[order]
                mA, mB, wr = a2 - a[r], b2 - b[r], wt[r]
                bounds = np.searchsorted(lr, np.concatenate([shed_clusters, shed_clusters + 1]))
                for c, j in enumerate(shed_clusters):
                    sel = slice(bounds[c], bounds[c + shed_clusters.shape[0]])
                    shed_parts.append(
                        _smallest(int(j), mA[sel], mB[sel], wr[sel], int(shed_wanted[j]))
                    )
        if enter_clusters.shape[0]:
            for j, mA, mB, sel in _enter(
                D, P, Q, hrow, hcol, labels, a, b, enter_clusters, enter_wanted
            ):
                enter_parts.append(_smallest(int(j), mA, mB, wt[sel], int(enter_wanted[j])))
        if exits:
            r = np.flatnonzero(exit_from[labels])
            if r.shape[0]:
                a2, b2 = _next(D, P, Q, hrow, hcol, r, labels[r], np.asarray(exit_to, dtype=bool))
                exit_parts.append(_smallest(-1, a2 - a[r], b2 - b[r], wt[r], int(exit_wanted)))
    if cache is not None:
        max_sq = cache.max_sq
    partials = Partials(sums, sizes, np.asarray(objective, dtype=np.float64))
    return PricePartials(
        partials,
        rows,
        select_margins(_concat(shed_parts), shed_wanted),
        select_margins(_concat(enter_parts), enter_wanted),
        _smallest_of(_concat(exit_parts), exit_wanted),
        max_sq,
        select_moves(_concat_moves(move_parts), repair),
        dual,
        _merge_exchange(swap_parts, exchange) if exchange else None,
        combine_histograms(bin_parts) if histogram else None,
    )


def _smallest_of(margins: Margins, m: int) -> Margins:
    """The ``m`` smallest of one cluster's margins."""
    if margins.cluster.shape[0] == 0:
        return margins
    return _smallest(int(margins.cluster[0]), margins.primary, margins.secondary, margins.weight, m)


def combine_price_partials(
    parts: Sequence[PricePartials],
    shed_wanted,
    enter_wanted,
    exit_wanted: int = 0,
    repair: RepairAsk | None = None,
    exchange: int = 0,
    histogram: int = 0,
) -> PricePartials:
    """Sum the partials and keep the smallest moves of a sequence of :class:`PricePartials` (associative)."""
    parts = [p for p in parts if p is not None]
    partials = Partials(*(np.sum([p.partials[i] for p in parts], axis=0) for i in range(3)))
    rows = np.sum([p.rows for p in parts], axis=0)
    shed = select_margins(_concat([p.shed for p in parts]), shed_wanted)
    enter = select_margins(_concat([p.enter for p in parts]), enter_wanted)
    exits = _smallest_of(_concat([p.exits for p in parts]), exit_wanted)
    moves = select_moves(_concat_moves([p.moves for p in parts]), repair)
    return PricePartials(
        partials,
        rows,
        shed,
        enter,
        exits,
        max(p.max_sq for p in parts),
        moves,
        float(sum(p.dual for p in parts)),
        _merge_exchange([p.exchange for p in parts if p.exchange is not None], exchange)
        if exchange
        else None,
        combine_histograms([p.histogram for p in parts]) if histogram else None,
    )


def priced_label_objective(X, w, row_offset: int, C, P, Q, q: float, overrides=None):
    """Labels (int32), and per cluster the weighted objective and size, of a chunk under prices.

    The labels are those of a pass's :func:`price_partials` (the costs of :func:`cost_cache`,
    the compiled sweep where allowed, and the same lexicographic choice), tile by tile.
    """
    n, k = X.shape[0], C.shape[0]
    labels = np.empty(n, dtype=np.int32)
    per = np.zeros((k, 2))
    C64 = np.asarray(C, dtype=np.float64)
    P, Q = np.asarray(P, dtype=np.float64), np.asarray(Q, dtype=np.float64)
    hcol = cluster_hashes(k)
    weights = np.ones(n) if w is None else np.asarray(w, dtype=np.float64)
    for i0, i1 in _tiles(n, k):
        lab = _tile_labels(X[i0:i1], C64, P, Q, q, row_offset + i0, hcol)
        apply_overrides(lab, overrides, row_offset + i0)
        diff = np.asarray(X[i0:i1], dtype=np.float64) - C64[lab]
        wt = weights[i0:i1]
        per[:, 0] += np.bincount(lab, weights=np.einsum("ij,ij->i", diff, diff) * wt, minlength=k)
        per[:, 1] += np.bincount(lab, weights=wt, minlength=k)
        labels[i0:i1] = lab
    return labels, per


def exchange_flow_compiled() -> bool:
    """Whether :func:`exchange_flow` runs the compiled loops in this context (the NumPy flow's
    time grows fast with the rows it moves: seconds a pass for hundreds of rows)."""
    return compiled_allowed()


def exchange_flow(*args) -> int:
    """:func:`dkmeans.kernels.exchange.exchange_flow`, by the compiled loops where allowed (the
    same function compiled: the same moves)."""
    from dkmeans.kernels import exchange

    return (_loops.exchange_flow if compiled_allowed() else exchange.exchange_flow)(*args)


def take_moves(
    moves: Moves, shed: bool, sizes, lower: float, upper: float, slack: float
) -> np.ndarray:
    """Positions of the candidate ``moves`` (sorted by cost, row, target) taken greedily by
    :func:`dkmeans.kernels.repair.take_moves` (compiled where allowed: the same moves); ``sizes``
    change in place."""
    kept = np.zeros(moves.row.shape[0], dtype=np.bool_)
    if kept.shape[0] == 0:
        return np.empty(0, np.int64)
    rows, group = np.unique(moves.row, return_inverse=True)
    taken = np.zeros(rows.shape[0], dtype=np.bool_)
    args = (
        np.ascontiguousarray(moves.source, dtype=np.int64),
        np.ascontiguousarray(moves.target, dtype=np.int64),
        np.ascontiguousarray(moves.weight, dtype=np.float64),
        group.astype(np.int64).ravel(),
        bool(shed),
        sizes,
        float(lower),
        float(upper),
        float(slack),
        taken,
        kept,
    )
    (_loops.take_moves if compiled_allowed() else repair.take_moves)(*args)
    return np.flatnonzero(kept)


def exchange_row_costs(ex, group, n_rows: int, k: int) -> np.ndarray:
    """Per row of a pass's exchange lists (``group``: each entry's row, of ``n_rows``), its listed
    moves' extra costs by target cluster (``(n_rows, k)``, 0 at its own, infinite elsewhere)."""
    costs = np.full((n_rows, k), np.inf)
    costs[group, ex.target] = ex.cost
    costs[group, ex.source] = 0.0
    return costs


def exchange_index(ex, k: int):
    """A pass's exchange lists ``ex`` (sorted by pair, cost and row) as :func:`exchange_flow`
    takes them: ``(starts, ends, rows, group)``, each pair's (``source * k + target``) slice of
    the lists, the distinct rows, and each entry's index among them (int64)."""
    pair = ex.source * k + ex.target
    keys = np.arange(k * k)
    starts = np.searchsorted(pair, keys).astype(np.int64)
    ends = np.searchsorted(pair, keys, side="right").astype(np.int64)
    rows, group = np.unique(ex.row, return_inverse=True)
    return starts, ends, rows, group.astype(np.int64)


def warm_up(dtype) -> None:
    """Run the compiled loops of the capped assignment on a few rows of ``dtype`` (compiling them
    into numba's disk cache, or loading them): the priced choice, margins, partials, exchange
    lists, the caller's moves over them and the repair's greedy take."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(24, 2)).astype(dtype)
    C = X[:3].astype(np.float64)
    k, q = 3, 2.0**-30
    P, Q = np.zeros(k), np.zeros(k)
    wanted = np.full(k, 2, np.int64)
    cache = cost_cache(X, C, q, 0, None)
    part = price_partials(
        X,
        None,
        0,
        C,
        P,
        Q,
        q,
        wanted,
        wanted,
        np.array([1, 0, 0], bool),
        np.array([0, 1, 1], bool),
        2,
        cache=cache,
        exchange=2,
        histogram=1,
    )
    ex = part.exchange
    starts, ends, rows, group = exchange_index(ex, k)
    _loops.exchange_flow(
        starts,
        ends,
        np.ascontiguousarray(ex.cost),
        group,
        k,
        part.partials.counts.astype(np.float64),
        0.0,
        8.0,
        0.0,
        np.full(rows.shape[0], -1, np.int64),
        1000,
        np.zeros(k),
        exchange_row_costs(ex, group, rows.shape[0], k),
    )
    take_moves(ex, True, part.partials.counts.astype(np.float64), 0.0, 8.0, 0.0)


__all__ = [
    "CostCache",
    "MARGIN_BINS_PER_OCTAVE",
    "MarginHistogram",
    "Margins",
    "Moves",
    "PricePartials",
    "RepairAsk",
    "TIE_BITS",
    "apply_overrides",
    "cluster_hashes",
    "combine_histograms",
    "combine_price_partials",
    "cost_cache",
    "exchange_flow",
    "exchange_flow_compiled",
    "exchange_index",
    "exchange_row_costs",
    "exchange_moves",
    "lex_argmin",
    "max_sq_distance",
    "margin_edges",
    "margin_histogram",
    "price_partials",
    "priced_label_objective",
    "priced_labels",
    "row_hashes",
    "select_exchange",
    "select_margins",
    "select_moves",
    "take_moves",
    "sq_distances64",
    "tie_costs",
    "warm_up",
]
