"""Compiled loops of the pruned Lloyd assignment (numba, one thread): :mod:`dkmeans.kernels.pruned`.

Every loop here is O(rows x groups) or O(rows x features) bookkeeping, or a reduction over
score blocks a BLAS product computed: no distance is computed here (the products are BLAS,
the labels that need the assignment kernel's own arithmetic come from that kernel).

The bounds must stay bounds after rounding. Lower bounds are float32: set from a float64 root
lowered by a relative ``2**-22`` before its conversion (which moves it by at most ``2**-24``),
moved by drifts enlarged to cover the float32 subtraction's rounding (:func:`float32_shift`), and
kept at least 0. Upper bounds are float64, enlarged by a relative ``2**-50`` after each addition.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from dkmeans.kernels.backends.compiled import rows_partials
from dkmeans.kernels.backends.jit import njit
from dkmeans.kernels.backends.simd import (
    STREAM_GROUP,
    STREAM_ROW_VECTORS,
    VECTOR_BYTES,
    _splat,
    _vector_pointer,
    streamed_group_dots,
    transpose_tile,
)


@njit(nogil=True, inline="always")
def _excludes(low, u, slack):  # pragma: no cover - compiled
    """Whether a lower bound ``low`` on the distances to some centroids excludes them all for a row
    whose upper bound is ``u``: ``low > u`` with ``low^2 - u^2`` above ``slack`` (the margin of
    the assignment kernel's rounding, ``k0 ||x|| + k1``)."""
    return low > u and low * low - u * u > slack


@njit(nogil=True)
def settle(
    labels, upper, lower, norm, drift, shift, k0, k1, cand, lmin
):  # pragma: no cover - compiled
    """Move every row's bounds by the centroids' drift; list the rows the bounds do not settle.

    ``upper[i] += drift[labels[i]]`` (float64, rounded up); ``lower[g, i] = max(lower[g, i] -
    shift[g], 0)`` in the bounds' float32, where ``shift`` (float32) is the group's largest drift
    enlarged by the rounding of that subtraction (see :func:`float32_shift`); ``lmin[i]`` (float32)
    gets ``min_g lower[g, i]``. Row ``i`` is settled when ``lmin[i] > upper[i]`` and ``lmin^2 -
    upper^2 > k0 * norm[i] + k1`` (the margin of the assignment kernel's rounding). The others go
    to ``cand`` in row order; returns how many. The bounds lie group by group (``(G, n)``): the
    loops over the rows vectorise (0.3x the time of a row's groups side by side, G = 25).
    """
    G, n = lower.shape
    zero = lower.dtype.type(0)
    for g in range(G):  # (G >= 1)
        row = lower[g]
        sg = shift[g]
        if g == 0:
            for i in range(n):
                v = max(row[i] - sg, zero)
                row[i] = v
                lmin[i] = v
        else:
            for i in range(n):
                v = max(row[i] - sg, zero)
                row[i] = v
                lmin[i] = min(lmin[i], v)
    m = 0
    for i in range(n):
        u = (upper[i] + drift[labels[i]]) * (1.0 + 2.0**-50)
        upper[i] = u
        if not _excludes(np.float64(lmin[i]), u, k0 * norm[i] + k1):
            cand[m] = i
            m += 1
    return m


@njit(nogil=True)
def fold_far(
    St, h, far, far_group, i0, sq_lo, sq_up, slack, labels, lower, upper
):  # pragma: no cover - compiled
    """Fold the exact distances of the rows ``i0 <= i < i0 + m`` to a few far-moved centroids into their bounds.

    ``St`` (``f x m``) is ``C_far @ X_tile.T``, ``h`` the far centroids' ``h``, ``far`` their indices
    and ``far_group`` their groups; ``sq_lo``, ``sq_up`` and ``slack`` the tile's rows' as
    :func:`new_bounds` takes them. A row's own centroid among them sets its upper bound (rounded up);
    every other lowers its group's bound to the distance rounded down where that is below. The
    loops over the rows are innermost (they vectorise).
    """
    f, m = St.shape
    for q in range(f):
        j = far[q]
        g = far_group[q]
        hj = np.float64(h[q])
        row = St[q]
        low = lower[g]
        for t in range(m):
            i = i0 + t
            score = hj - np.float64(row[t])
            sq = max(sq_lo[t] + 2.0 * (score - slack[t]), 0.0)
            b = np.float32(np.sqrt(sq) * (1.0 - 2.0**-22) - 1e-30)
            own = labels[i] == j
            low[i] = low[i] if own or b >= low[i] else b
            if own:
                upper[i] = np.sqrt(max(sq_up[t] + 2.0 * (score + slack[t]), 0.0)) * (1.0 + 2.0**-50)
    return None


#: Reassociated sums (vectorised): the bounds' rounding terms hold for any order of a sum of squares.
_SUM_MATH = {"reassoc", "contract"}


@njit(nogil=True, fastmath=_SUM_MATH, inline="always")
def _distance_up(X, i, C, j):  # pragma: no cover - compiled
    """``||x_i - c_j||`` from the difference in float64, rounded up (the rounding of ``d`` squares,
    their sum and the root)."""
    d = X.shape[1]
    s = 0.0
    for f in range(d):
        diff = np.float64(X[i, f]) - np.float64(C[j, f])
        s += diff * diff
    return np.sqrt(s) * (1.0 + (d + 4) * 2.0**-52)


@njit(nogil=True, fastmath=_SUM_MATH)
def tighten(X, C, labels, upper, lmin, norm, k0, k1, cand, m):  # pragma: no cover - compiled
    """Exact upper bounds for the rows ``cand[:m]`` (from ``x - c_label`` in float64); the rows still
    not settled by their smallest group bound ``lmin`` (:func:`settle`'s) are moved to the front of
    ``cand``; returns their count."""
    r = 0
    for t in range(m):
        i = cand[t]
        u = _distance_up(X, i, C, labels[i])
        upper[i] = u
        if not _excludes(np.float64(lmin[i]), u, k0 * norm[i] + k1):
            cand[r] = i
            r += 1
    return r


@njit(nogil=True)
def group_needs(
    labels, upper, lower, norm, k0, k1, group_of, cand, m, need
):  # pragma: no cover - compiled
    """``need[g, t]``: group ``g`` may hold a centroid the kernel prefers to row ``cand[t]``'s label
    (its bound does not exclude it), or holds the label itself; returns how many pairs of rows and
    groups are needed."""
    G = lower.shape[0]
    total = 0
    for g in range(G):
        row = lower[g]
        for t in range(m):
            i = cand[t]
            need[g, t] = not _excludes(np.float64(row[i]), upper[i], k0 * norm[i] + k1)
    for t in range(m):
        need[group_of[labels[cand[t]]], t] = True
    for g in range(G):
        for t in range(m):
            total += need[g, t]
    return total


@njit(nogil=True, fastmath=_SUM_MATH)
def sampled_pairs(
    X, C, labels, upper, lower, norm, drift, shift, k0, k1, group_of, widths, stride
):  # pragma: no cover - compiled
    """Row-and-centroid pairs a pass would compute, estimated from every ``stride``-th row, before
    :func:`settle` (the state is only read).

    Each sampled row is tested as :func:`settle`, then :func:`tighten` and :func:`group_needs`
    would test it (its bounds moved by the drifts, then its upper bound exact); a row still
    unsettled counts the widths of the groups it needs. Returns the count times ``stride``.
    """
    G, n = lower.shape
    zero = lower.dtype.type(0)
    total = 0.0
    for i in range(0, n, stride):
        j = labels[i]
        u = (upper[i] + drift[j]) * (1.0 + 2.0**-50)
        low = np.inf
        for g in range(G):
            low = min(low, np.float64(max(lower[g, i] - shift[g], zero)))
        slack = k0 * norm[i] + k1
        if _excludes(low, u, slack):
            continue
        u = _distance_up(X, i, C, j)
        if _excludes(low, u, slack):
            continue
        own = group_of[j]
        for g in range(G):
            if g == own or not _excludes(np.float64(max(lower[g, i] - shift[g], zero)), u, slack):
                total += widths[g]
    return total * stride


@njit(nogil=True)
def gather_rows(X, idx, out):  # pragma: no cover - compiled
    """``out[t] = X[idx[t]]`` (rows of C-contiguous arrays)."""
    d = X.shape[1]
    for t in range(idx.shape[0]):
        i = idx[t]
        for f in range(d):
            out[t, f] = X[i, f]
    return None


@njit(nogil=True, inline="always")
def _fold_score(v, b1, b2, j1, j):  # pragma: no cover - compiled
    """One score into a row's smallest, second smallest and the smallest's index (strict ``<``: the
    first on ties); branch-free, so that the loop over rows vectorises."""
    return min(b1, v), min(b2, max(b1, v)), (j if v < b1 else j1)


@njit(nogil=True)
def block_minima(
    St, h, order, starts, g0, g1, rows, gm, gi, gs, b1, b2, j1, m=-1
):  # pragma: no cover - compiled
    """Per group of a block of scores, each row's smallest score, its centroid and the second smallest.

    ``St`` is ``C_block @ X_tile.T`` (``x.c`` of every centroid of groups ``g0 <= g < g1``, laid out
    by group, against the tile's rows ``rows``): row ``j`` holds one centroid's products with every
    row of the tile, so the loop over the rows is contiguous and vectorises (as
    :func:`~dkmeans.kernels.backends.compiled.running_argmin_t`). The score is ``h[j] - St[j, t]``;
    per group and row the smallest (the first in centroid order on ties: strict ``<``), its
    centroid's index ``order[...]`` and the second smallest go to ``gm``, ``gi``, ``gs`` at
    ``[g, rows[t]]``. ``b1``, ``b2``, ``j1`` are scratch of at least the tile's length; ``m``: the
    tile's rows, the first ``m`` columns of ``St`` (default: all). Four centroids go per pass over
    the rows: the running minima are read and written once for the four (0.7x the time of one).
    """
    if m < 0:
        m = St.shape[1]
    base = starts[g0]
    for g in range(g0, g1):
        lo, hi = starts[g] - base, starts[g + 1] - base
        for t in range(m):
            b1[t] = np.inf
            b2[t] = np.inf
            j1[t] = lo
        j = lo
        while j + 4 <= hi:
            ha, hb, hc, hd = h[j], h[j + 1], h[j + 2], h[j + 3]
            ra, rb, rc, rd = St[j], St[j + 1], St[j + 2], St[j + 3]
            ja, jb, jc, jd = np.int32(j), np.int32(j + 1), np.int32(j + 2), np.int32(j + 3)
            for t in range(m):
                o, s, i = _fold_score(ha - ra[t], b1[t], b2[t], j1[t], ja)
                o, s, i = _fold_score(hb - rb[t], o, s, i, jb)
                o, s, i = _fold_score(hc - rc[t], o, s, i, jc)
                o, s, i = _fold_score(hd - rd[t], o, s, i, jd)
                b1[t], b2[t], j1[t] = o, s, i
            j += 4
        while j < hi:
            hj, row, jj = h[j], St[j], np.int32(j)
            for t in range(m):
                o, s, i = _fold_score(hj - row[t], b1[t], b2[t], j1[t], jj)
                b1[t], b2[t], j1[t] = o, s, i
            j += 1
        for t in range(m):
            r = rows[t]
            gm[g, r] = b1[t]
            gi[g, r] = order[j1[t] + base]
            gs[g, r] = b2[t]
    return None


@njit(nogil=True)
def choose(gm, gi, gs, margin, labels, ok):  # pragma: no cover - compiled
    """Each row's best centroid over the computed groups (``gm[g, t]`` is ``+inf`` for the others), and
    whether the runner-up trails it by more than ``margin[t]`` (then the assignment kernel, whose
    scores differ from these by less than half the margin, picks it too). Loops over the rows
    innermost (they vectorise); the first group holding the smallest wins ties."""
    G, m = gm.shape
    best = gm[0].copy()
    second = gs[0].copy()
    gbest = np.zeros(m, dtype=np.int32)
    # one pass over the groups: a group that takes the lead leaves the old best as a runner-up, and
    # its own second smallest; any other offers its smallest (ties: the first group leads, and the
    # runner-up equals the best)
    for g in range(1, G):
        row, row2 = gm[g], gs[g]
        for t in range(m):
            v = row[t]
            less = v < best[t]
            second[t] = min(best[t], row2[t]) if less else min(second[t], v)
            best[t] = v if less else best[t]
            gbest[t] = g if less else gbest[t]
    for t in range(m):
        labels[t] = gi[gbest[t], t]
        ok[t] = np.float64(second[t]) - np.float64(best[t]) > margin[t]
    return None


@njit(nogil=True, fastmath=_SUM_MATH)
def new_bounds(
    X, C, rows, labels, gm, gi, gs, group_of, sq_lo, sq_up, slack, lower, upper, out_labels
):  # pragma: no cover - compiled
    """The bounds of the rows ``rows[t]`` after their distances were computed, and their labels;
    returns the largest finite lower bound set.

    A computed group's lower bound is its smallest score (the second smallest where the smallest
    is the row's label) turned into a distance: ``||x - c||^2 >= ||x||^2 + 2 (score - slack[t])``,
    rounded down; groups not computed (``gm`` is ``+inf``) keep theirs. The upper bound comes the
    same way from the label's score (``<= ||x||^2 + 2 (score + slack[t])``, rounded up) where it
    is its group's smallest, else from ``x - c`` in float64.
    """
    G, m = gm.shape
    largest = 0.0
    bound = np.empty(m, dtype=np.float32)
    for g in range(G):
        for t in range(m):  # branch-free: it vectorises
            v = np.float64(gs[g, t]) if gi[g, t] == labels[t] else np.float64(gm[g, t])
            sq = max(sq_lo[t] + 2.0 * (v - slack[t]), 0.0)
            # rounded down: the root's rounding and the float32 conversion's, below a relative 2^-22
            bound[t] = np.float32(np.sqrt(sq) * (1.0 - 2.0**-22) - 1e-30)
        for t in range(m):
            if gm[g, t] != np.inf:  # computed: the new bound
                lower[g, rows[t]] = bound[t]
                if bound[t] != np.inf:
                    largest = max(largest, np.float64(bound[t]))
    for t in range(m):
        i = rows[t]
        lab = labels[t]
        own = group_of[lab]
        if gi[own, t] == lab and gm[own, t] != np.inf:
            sq = sq_up[t] + 2.0 * (np.float64(gm[own, t]) + slack[t])
            upper[i] = np.sqrt(max(sq, 0.0)) * (1.0 + 2.0**-50)
        else:
            upper[i] = _distance_up(X, i, C, lab)
        out_labels[i] = lab
    return largest


@njit(nogil=True, fastmath=_SUM_MATH)
def row_norms(X, rows, norm_up, sq_lo, sq_up):  # pragma: no cover - compiled
    """``||x||`` rounded up, ``||x||^2`` rounded down and up (float64), of the rows ``rows``."""
    d = X.shape[1]
    lo, hi = 1.0 - (d + 4) * 2.0**-52, 1.0 + (d + 4) * 2.0**-52
    for t in range(rows.shape[0]):
        i = rows[t]
        s = 0.0
        for f in range(d):
            v = np.float64(X[i, f])
            s += v * v
        norm_up[t] = np.sqrt(s * hi) * (1.0 + 2.0**-50)
        sq_lo[t] = s * lo
        sq_up[t] = s * hi
    return None


@njit(nogil=True)
def tiled_partials(
    X, C, labels, T, weights, has_weights, sums, counts, start, stop, objective
):  # pragma: no cover - compiled
    """The partials of the rows ``start <= i < stop`` (labels known), folded tile by tile as the direct
    kernels fold them (:func:`~dkmeans.kernels.backends.compiled.rows_partials` on tiles of ``T`` rows
    from ``start``, a multiple of ``T``), their objectives added in row order to ``objective``, which
    is returned: over consecutive ranges, the same sums, counts and objective as the kernel's, to the bit."""
    for i0 in range(start, stop, T):
        objective += rows_partials(
            X, i0, min(stop, i0 + T), C, labels, 0, weights, has_weights, sums, counts
        )
    return objective


def float32_shift(shift, lower_max: float):
    """The float32 amounts :func:`settle` subtracts: each group's largest drift (float64), enlarged so
    that the float32 subtraction from any bound in ``[0, lower_max]`` rounds to at most the exact
    difference (a relative ``2**-23`` of ``lower_max + shift`` covers half an ulp), rounded up;
    0 where the group did not move."""
    shift = np.asarray(shift, dtype=np.float64)
    wanted = np.where(shift > 0, shift + 2.0**-23 * (lower_max + shift), 0.0)
    out = wanted.astype(np.float32)
    return np.where(out.astype(np.float64) < wanted, np.nextafter(out, np.float32(np.inf)), out)


# -- the bounds' build: every score of a tile of rows, by the streamed kernel's arithmetic ---------
@intrinsic
def group_minima_streamed(typingctx, XT, r, CG, h_pad, pack_group, p0, p1, gm, gi, gs):
    """Per group of centroids, the smallest score of ``R = STREAM_ROW_VECTORS`` vectors of ``L`` rows,
    its centroid and the second smallest, the scores never stored.

    The products of :func:`~dkmeans.kernels.backends.simd.nearest_block_streamed` (the same
    registers and multiply-add chains, so the same scores as the assignment kernel's), each turned
    into the score ``h_pad[j] - x . c_j`` and folded as :func:`block_minima` folds it (strict ``<``: the
    first of ``CG``'s order on ties), for the packs ``p0 <= p < p1`` of ``CG`` (centroids ``8 p`` to
    ``8 p + 7`` of its order, which holds each group's centroids together). ``pack_group[j]`` is
    centroid ``j``'s group (int32; the padding past ``k`` the last group's, with ``h_pad`` ``+inf``).
    A group's running minimum, its index (in ``CG``'s order) and second minimum live in registers
    while the group lasts and in ``gm``, ``gi``, ``gs`` (``(G, columns)``) at columns ``r`` on,
    read there when a group starts within the call (or the call starts within it) and written back
    when it ends: ``gm`` and ``gs`` must hold ``+inf`` before a tile's first call. All C-contiguous,
    one float dtype, ``gi`` and ``pack_group`` int32; nothing is bounds-checked.
    """
    arrays = (XT, CG, h_pad, pack_group, gm, gi, gs)
    ok = (
        all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)
        and XT.ndim == 2
        and CG.ndim == 3
        and h_pad.ndim == pack_group.ndim == 1
        and gm.ndim == gi.ndim == gs.ndim == 2
        and XT.dtype == CG.dtype == h_pad.dtype == gm.dtype == gs.dtype
        and XT.dtype in (types.float32, types.float64)
        and gi.dtype == pack_group.dtype == types.int32
    )
    if not ok:
        return None

    def codegen(context, builder, signature, args):
        tty, rty, gty, hty, pty, p0ty, p1ty, mty, ity, sty = signature.args
        itemsize = tty.dtype.bitwidth // 8
        vec = ir.VectorType(context.get_data_type(tty.dtype), VECTOR_BYTES // itemsize)
        ivec = ir.VectorType(ir.IntType(32), vec.count)
        intp = context.get_value_type(types.intp)
        G, R = STREAM_GROUP, STREAM_ROW_VECTORS
        r, p0, p1 = (
            context.cast(builder, v, ty, types.intp)
            for v, ty in ((args[1], rty), (args[5], p0ty), (args[6], p1ty))
        )
        d = cgutils.unpack_tuple(
            builder, context.make_array(tty)(context, builder, args[0]).shape, 2
        )[0]
        cdata = context.make_array(gty)(context, builder, args[2]).data
        hdata = context.make_array(hty)(context, builder, args[3]).data
        pdata = context.make_array(pty)(context, builder, args[4]).data
        columns = [builder.add(r, ir.Constant(intp, rho * vec.count)) for rho in range(R)]
        b1 = [cgutils.alloca_once(builder, vec) for _ in range(R)]
        b2 = [cgutils.alloca_once(builder, vec) for _ in range(R)]
        j1 = [cgutils.alloca_once(builder, ivec) for _ in range(R)]
        current = cgutils.alloca_once(builder, intp)

        def pointers(g, rho):
            return (
                _vector_pointer(context, builder, mty, args[7], g, columns[rho], vec),
                builder.bitcast(
                    _vector_pointer(context, builder, ity, args[8], g, columns[rho], vec),
                    ivec.as_pointer(),
                ),
                _vector_pointer(context, builder, sty, args[9], g, columns[rho], vec),
            )

        def load_group(g):
            for rho in range(R):
                pm, pi, ps = pointers(g, rho)
                builder.store(builder.load(pm, align=itemsize), b1[rho])
                builder.store(builder.load(pi, align=4), j1[rho])
                builder.store(builder.load(ps, align=itemsize), b2[rho])

        def store_group(g):
            for rho in range(R):
                pm, pi, ps = pointers(g, rho)
                builder.store(builder.load(b1[rho]), pm, align=itemsize)
                builder.store(builder.load(j1[rho]), pi, align=4)
                builder.store(builder.load(b2[rho]), ps, align=itemsize)

        def group_of(j):
            return builder.sext(builder.load(builder.gep(pdata, [j])), intp)

        first = group_of(builder.mul(p0, ir.Constant(intp, G)))
        builder.store(first, current)
        load_group(first)
        accs = [[cgutils.alloca_once(builder, vec) for _ in range(G)] for _ in range(R)]
        with cgutils.for_range_slice(builder, p0, p1, ir.Constant(intp, 1)) as (p, _):
            streamed_group_dots(context, builder, tty, args[0], cdata, d, p, columns, accs, vec)
            for b in range(G):
                j = builder.add(builder.mul(p, ir.Constant(intp, G)), ir.Constant(intp, b))
                g = group_of(j)
                with builder.if_then(
                    builder.icmp_signed("!=", g, builder.load(current)), likely=False
                ):
                    store_group(builder.load(current))
                    builder.store(g, current)
                    load_group(g)
                h = _splat(builder, builder.load(builder.gep(hdata, [j])), vec)
                jv = _splat(builder, builder.trunc(j, ir.IntType(32)), ivec)
                for rho in range(R):
                    v = builder.fsub(h, builder.load(accs[rho][b]))
                    low = builder.load(b1[rho])
                    less = builder.fcmp_ordered("<", v, low)
                    high = builder.select(builder.fcmp_ordered(">", v, low), v, low)  # max(b1, v)
                    second = builder.load(b2[rho])
                    builder.store(
                        builder.select(builder.fcmp_ordered("<", high, second), high, second),
                        b2[rho],
                    )
                    builder.store(builder.select(less, v, low), b1[rho])
                    builder.store(builder.select(less, jv, builder.load(j1[rho])), j1[rho])
        store_group(builder.load(current))
        return context.get_dummy_value()

    return types.none(XT, r, CG, h_pad, pack_group, p0, p1, gm, gi, gs), codegen


@njit(nogil=True)
def fused_minima(
    X, CG, block_packs, h_pad, pack_group, order, T, XT, gm, gi, gs
):  # pragma: no cover - compiled
    """:func:`block_minima` of every group for every row of ``X`` into ``gm``, ``gi``, ``gs`` (``(G, n)``),
    tile by tile (``T`` rows) with :func:`group_minima_streamed`: the scores are folded in registers,
    never stored. ``XT`` (d, >= T rounded up to the rows of a call) is scratch; ``block_packs`` packs of
    ``CG`` per pass over a tile's rows (they stay in L2). The indices come back in ``X``'s centroid
    numbering (``order`` maps ``CG``'s)."""
    n = X.shape[0]
    B = STREAM_ROW_VECTORS * (VECTOR_BYTES // X.itemsize)
    packs = CG.shape[0]
    G = gm.shape[0]
    # the call's columns run past a short last tile: its scratch columns live in XT's width
    width = XT.shape[1]
    tm = np.empty((G, width), gm.dtype)
    ti = np.empty((G, width), np.int32)
    ts = np.empty((G, width), gm.dtype)
    for t0 in range(0, n, T):
        m = min(T, n - t0)
        transpose_tile(X, t0, m, XT)
        tm[:] = np.inf
        ts[:] = np.inf
        ti[:] = 0
        for q0 in range(0, packs, block_packs):
            q1 = min(packs, q0 + block_packs)
            for r in range(0, m, B):
                group_minima_streamed(XT, r, CG, h_pad, pack_group, q0, q1, tm, ti, ts)
        for g in range(G):
            for t in range(m):
                gm[g, t0 + t] = tm[g, t]
                gs[g, t0 + t] = ts[g, t]
                gi[g, t0 + t] = order[ti[g, t]]
    return None


def packed_groups(C):
    """``C`` (k, d) packed for :func:`group_minima_streamed`: ``(ceil(k / STREAM_GROUP), d, STREAM_GROUP)``, one
    group's coordinates of a feature side by side, zeros past ``k``."""
    k, d = C.shape
    groups = -(-k // STREAM_GROUP)
    CG = np.zeros((groups * STREAM_GROUP, d), dtype=C.dtype)
    CG[:k] = C
    return np.ascontiguousarray(CG.reshape(groups, STREAM_GROUP, d).transpose(0, 2, 1))
