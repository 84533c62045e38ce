"""Vector code for the compiled loops that LLVM does not generate from plain loops.

Written with numba intrinsics (LLVM IR: vector loads and stores, ``shufflevector``, which
LLVM lowers to each CPU's own instructions), called from :mod:`dkmeans.kernels.backends.compiled`.

**Tile transpose.** The direct loops read a tile of rows transposed, one feature per row
of a ``(width, T)`` buffer, so that their loop over the rows vectorises. Written as a
scalar double loop the copy runs at about one element per cycle and took a fifth of the
kernel (small ``d``, few centroids): LLVM does not vectorise it, since every element of a
row goes to a different output row. :func:`transpose_tile` copies square blocks instead:
``B`` rows of ``B`` features are loaded as ``B`` vectors, transposed in registers by
``log2(B)`` rounds of interleaving and stored as ``B`` vectors. Blocks are 8 wide when
``d`` is a multiple of 8, 4 wide when it is a multiple of 4; other widths, and the rows
left over, are copied element by element.

**Per-row partials.** :func:`rows_partials_blocked` and :func:`rows_exact_sq_blocked` do
the per-row work that follows the assignment (the exact squared distance ``||x - c||^2``
from the difference, and adding the row to its cluster's float64 sums) on blocks of 16, 8
or 4 features loaded as vectors. LLVM vectorises the plain loop over the features only
when ``d`` is at least its vector length, so ``d = 8`` ran element by element. Unweighted
sums come out bit for bit as the element-by-element loop's (the same additions in the
same order). :func:`partials_rows` runs the whole loop over the rows: the squares are
summed lane by lane in float64 over the rows, in two alternating accumulators, and across
the lanes once per call. (A per-row horizontal sum and one chain of scalar additions cost
a quarter of its time. Sorting a tile's rows by cluster first, so that the sums gather in
registers, was slower.) :func:`rows_exact_sq_blocked` sums each row's squares pairwise
within a block.

**On AVX2** (16 vector registers) the rows of :func:`nearest_block` for ``d`` of 13 to 16
no longer all fit in registers; compiled for that target on this machine, it measured
about 5% slower than the earlier plain loop there, and faster for smaller ``d``.

**Nearest centroid of a block of rows.** :func:`nearest_block` keeps one vector register of
rows per feature (a block of ``VECTOR_BYTES`` worth of rows of the transposed tile) for
the whole pass over the centroids, and streams the centroid coordinates as scalar
broadcasts, which x86 folds into the multiply-adds. Written as a plain loop over the
rows, LLVM hoisted every centroid coordinate out of that loop as a broadcast vector,
could not keep ``4 x d`` of them in registers and reloaded them from the stack: one
full-width load per multiply-add, about 30% slower. Four centroids go per step, each
dot product a chain of multiply-adds in feature order; the running minimum and its label
stay in registers. :func:`nearest_block_streamed` does the same for any ``d``: the rows
(two vectors of them with AVX-512) are loaded feature by feature from the tile and meet 8
centroids per group, whose coordinates of one feature lie side by side, so that every
load feeds 8 or 16 multiply-adds. On one thread it ran 1.2-2.0x faster than BLAS plus the
argmin pass over its output, for ``d`` from 24 to 1024 and 3 to 8192 centroids.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

from dkmeans.kernels.backends.jit import njit


def _vector_bytes() -> int:
    """Width in bytes of the vector registers numba compiles for (host CPU unless configured)."""
    features = config.CPU_FEATURES if config.CPU_NAME else llvm.get_host_cpu_features().flatten()
    features = set((features or "").split(","))
    if "+avx512f" in features:
        return 64
    return 32 if "+avx" in features else 16


#: Bytes of rows :func:`nearest_block` handles per call (one vector register per feature).
VECTOR_BYTES = _vector_bytes()
#: Centroids per step of :func:`nearest_block` (independent multiply-add chains).
NEAREST_GROUP = 4


def _interleave_masks(width: int) -> tuple[list[int], list[int]]:
    """Shuffle masks taking the low and the high halves of two vectors, interleaved."""
    lo = [v for i in range(width // 2) for v in (i, width + i)]
    hi = [v for i in range(width // 2, width) for v in (i, width + i)]
    return lo, hi


def _vector_pointer(context, builder, ty, value, row, col, vty):
    """Pointer to ``value[row, col]`` (a 2-D array of numba type ``ty``) as a pointer to ``vty``."""
    arr = context.make_array(ty)(context, builder, value)
    shape = cgutils.unpack_tuple(builder, arr.shape, 2)
    strides = cgutils.unpack_tuple(builder, arr.strides, 2)
    ptr = cgutils.get_item_pointer2(
        context, builder, arr.data, shape, strides, ty.layout, [row, col]
    )
    return builder.bitcast(ptr, vty.as_pointer())


def _block_intrinsic(width: int):
    """An intrinsic ``(X, r, q, XT, c)`` doing ``XT[q + j, c + i] = X[r + i, q + j]`` for ``i, j < width``.

    Both arrays are 2-D, C-contiguous and of one float dtype; the caller keeps every
    index in bounds (nothing is checked).
    """
    rounds = width.bit_length() - 1

    def typer(typingctx, X, r, q, XT, c):
        ok = (
            isinstance(X, types.Array)
            and isinstance(XT, types.Array)
            and X.ndim == XT.ndim == 2
            and X.layout == XT.layout == "C"
            and X.dtype == XT.dtype
            and X.dtype in (types.float32, types.float64)
        )
        if not ok:
            return None

        def codegen(context, builder, signature, args):
            xty, rty, qty, tty, cty = signature.args
            r, q, c = (
                context.cast(builder, v, ty, types.intp)
                for v, ty in ((args[1], rty), (args[2], qty), (args[4], cty))
            )
            intp = context.get_value_type(types.intp)
            vec = ir.VectorType(context.get_data_type(xty.dtype), width)
            align = xty.dtype.bitwidth // 8

            def at(ty, value, row, offset, col):  # a vector at value[row + offset, col:]
                row = builder.add(row, ir.Constant(intp, offset))
                return _vector_pointer(context, builder, ty, value, row, col, vec)

            rows = [builder.load(at(xty, args[0], r, i, q), align=align) for i in range(width)]
            lo, hi = (
                ir.Constant(ir.VectorType(ir.IntType(32), width), m)
                for m in _interleave_masks(width)
            )
            half = width // 2
            for _ in range(rounds):  # after log2(width) rounds, vector j holds column j
                rows = [
                    v
                    for i in range(half)
                    for v in (
                        builder.shuffle_vector(rows[i], rows[i + half], lo),
                        builder.shuffle_vector(rows[i], rows[i + half], hi),
                    )
                ]
            for j, v in enumerate(rows):
                builder.store(v, at(tty, args[3], q, j, c), align=align)
            return context.get_dummy_value()

        return types.none(X, r, q, XT, c), codegen

    typer.__name__ = f"transpose_block{width}"
    return intrinsic(typer)


transpose_block8 = _block_intrinsic(8)
transpose_block4 = _block_intrinsic(4)


@njit(nogil=True)
def transpose_tile(X, i0, m, XT):  # pragma: no cover - compiled
    """``XT[:d, :m] = X[i0:i0 + m].T`` for C-contiguous ``X`` (n, d) and ``XT`` (>= d, >= m)."""
    d = X.shape[1]
    r = 0
    if d % 8 == 0:
        while r + 8 <= m:
            for q in range(0, d, 8):
                transpose_block8(X, i0 + r, q, XT, r)
            r += 8
    elif d % 4 == 0:
        while r + 4 <= m:
            for q in range(0, d, 4):
                transpose_block4(X, i0 + r, q, XT, r)
            r += 4
    for rr in range(r, m):
        for f in range(d):
            XT[f, rr] = X[i0 + rr, f]


@intrinsic
def row_block(typingctx, X, i, C, j, q, width):
    """``sum((X[i, q:q+B] - C[j, q:q+B])**2)`` in X's dtype, summed pairwise; ``B`` a literal (4, 8, 16).

    ``X`` and ``C`` are 2-D, C-contiguous, of one float dtype; the caller keeps every
    index in bounds (nothing is checked).
    """
    ok = (
        isinstance(width, types.IntegerLiteral)
        and width.literal_value in (4, 8, 16)
        and all(isinstance(a, types.Array) and a.ndim == 2 and a.layout == "C" for a in (X, C))
        and X.dtype == C.dtype
        and X.dtype in (types.float32, types.float64)
    )
    if not ok:
        return None

    def codegen(context, builder, signature, args):
        xty, ity, cty, jty, qty, wty = signature.args
        i, j, q = (
            context.cast(builder, v, ty, types.intp)
            for v, ty in ((args[1], ity), (args[3], jty), (args[4], qty))
        )
        vec = ir.VectorType(context.get_data_type(xty.dtype), wty.literal_value)
        align = xty.dtype.bitwidth // 8
        x = builder.load(_vector_pointer(context, builder, xty, args[0], i, q, vec), align=align)
        c = builder.load(_vector_pointer(context, builder, cty, args[2], j, q, vec), align=align)
        diff = builder.fsub(x, c)
        return _pairwise_sum(builder, builder.fmul(diff, diff))

    return X.dtype(X, i, C, j, q, width), codegen


def _pairwise_sum(builder, v):
    """Sum of the lanes of vector ``v``: the upper half added onto the lower half, repeatedly."""
    int32 = ir.IntType(32)
    n = v.type.count
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(int32, n), list(range(n))))
        hi = builder.shuffle_vector(
            v, v, ir.Constant(ir.VectorType(int32, n), list(range(n, 2 * n)))
        )
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(int32, 0))


def _fold_half(builder, v):
    """The upper half of the lanes of ``v`` added onto the lower half."""
    int32 = ir.IntType(32)
    n = v.type.count // 2
    lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(int32, n), list(range(n))))
    hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(int32, n), list(range(n, 2 * n))))
    return builder.fadd(lo, hi)


def _item_pointer(context, builder, ty, value, index):
    """Pointer to ``value[index]`` of a 1-D array of numba type ``ty``."""
    arr = context.make_array(ty)(context, builder, value)
    shape = cgutils.unpack_tuple(builder, arr.shape, 1)
    strides = cgutils.unpack_tuple(builder, arr.strides, 1)
    return cgutils.get_item_pointer2(context, builder, arr.data, shape, strides, ty.layout, [index])


@intrinsic
def partials_rows(
    typingctx, X, i0, i1, C, labels, label_offset, weights, has_weights, sums, counts, width
):
    """Fold rows ``i0 <= i < i1`` into ``sums`` and ``counts``; return their objective (float64).

    Row ``i`` (label ``j = labels[i - label_offset]``, weight ``w = weights[i]`` when
    ``has_weights`` else 1) adds ``w * X[i]`` to ``sums[j]`` (float64) and ``w`` to
    ``counts[j]``. Its squared distance takes ``X[i] - C[j]`` and its squares in X's
    dtype and sums them in float64. Features go by vector blocks of ``width`` (a literal
    dividing ``d``). The squares accumulate lane by lane over the rows and are summed
    across the lanes once at the end: no per-row horizontal sum and no chain of scalar
    additions. ``X``, ``C`` and ``sums`` are 2-D C-contiguous; nothing is bounds-checked.
    """
    ok = (
        isinstance(width, types.IntegerLiteral)
        and width.literal_value in (4, 8, 16)
        and all(
            isinstance(a, types.Array) and a.ndim == 2 and a.layout == "C" for a in (X, C, sums)
        )
        and all(isinstance(a, types.Array) and a.ndim == 1 for a in (labels, weights, counts))
        and X.dtype == C.dtype
        and X.dtype in (types.float32, types.float64)
        and isinstance(labels.dtype, types.Integer)
        and weights.dtype == sums.dtype == counts.dtype == types.float64
        and isinstance(has_weights, types.Boolean)
    )
    if not ok:
        return None

    def codegen(context, builder, signature, args):
        xty, i0ty, i1ty, cty, lty, oty, wty, _, sty, nty, bty = signature.args
        X, i0, i1, C, labels, offset, weights, has_weights, sums, counts, _ = args
        intp = context.get_value_type(types.intp)
        f64 = ir.DoubleType()
        vec = ir.VectorType(context.get_data_type(xty.dtype), bty.literal_value)
        dvec = ir.VectorType(f64, vec.count)
        align = xty.dtype.bitwidth // 8
        i0, i1, offset = (
            context.cast(builder, v, ty, types.intp)
            for v, ty in ((i0, i0ty), (i1, i1ty), (offset, oty))
        )
        d = cgutils.unpack_tuple(builder, context.make_array(xty)(context, builder, X).shape, 2)[1]
        hvec = ir.VectorType(f64, vec.count // 2) if xty.dtype == types.float32 else dvec
        accs = [cgutils.alloca_once_value(builder, ir.Constant(hvec, 0.0)) for _ in range(2)]

        def row(i, acc, w):  # fold row i in, its squared distance into the lane-wise ``acc``
            j = builder.load(_item_pointer(context, builder, lty, labels, builder.sub(i, offset)))
            j = context.cast(builder, j, lty.dtype, types.intp)
            with cgutils.for_range_slice(
                builder, ir.Constant(intp, 0), d, ir.Constant(intp, vec.count)
            ) as (q, _):
                x = builder.load(_vector_pointer(context, builder, xty, X, i, q, vec), align=align)
                c = builder.load(_vector_pointer(context, builder, cty, C, j, q, vec), align=align)
                diff = builder.fsub(x, c)
                sq = builder.fmul(diff, diff)
                if xty.dtype == types.float32:  # one addition in float32 halves the conversions
                    sq, x = builder.fpext(_fold_half(builder, sq), hvec), builder.fpext(x, dvec)
                builder.store(
                    builder.fadd(builder.load(acc), builder.fmul(_splat(builder, w, hvec), sq)), acc
                )
                target = _vector_pointer(context, builder, sty, sums, j, q, dvec)
                added = builder.fmul(
                    x, _splat(builder, w, dvec)
                )  # folded away when w is the constant 1
                builder.store(builder.fadd(builder.load(target, align=8), added), target, align=8)
            count = _item_pointer(context, builder, nty, counts, j)
            builder.store(builder.fadd(builder.load(count), w), count)

        def rows(weighted):  # two rows per step, into two accumulators: two independent chains
            def weight(i):
                if not weighted:
                    return ir.Constant(f64, 1.0)
                return builder.load(_item_pointer(context, builder, wty, weights, i))

            odd = builder.srem(builder.sub(i1, i0), ir.Constant(intp, 2))
            pairs_end = builder.sub(i1, odd)
            with cgutils.for_range_slice(builder, i0, pairs_end, ir.Constant(intp, 2)) as (i, _):
                row(i, accs[0], weight(i))
                i_next = builder.add(i, ir.Constant(intp, 1))
                row(i_next, accs[1], weight(i_next))
            with cgutils.for_range_slice(builder, pairs_end, i1, ir.Constant(intp, 1)) as (i, _):
                row(i, accs[0], weight(i))

        with builder.if_else(has_weights) as (weighted, plain):
            with weighted:
                rows(True)
            with plain:
                rows(False)
        return _pairwise_sum(builder, builder.fadd(builder.load(accs[0]), builder.load(accs[1])))

    return types.float64(
        X, i0, i1, C, labels, label_offset, weights, has_weights, sums, counts, width
    ), codegen


# The block width is a compile-time constant of each loop (``numba.literally``): chosen
# inside the loop over the rows, per row, it ran 5x slower.
@njit(nogil=True)
def _exact_sq_loop(X, i0, i1, C, labels, out, width):  # pragma: no cover - compiled
    numba.literally(width)
    for i in range(i0, i1):
        s = X.dtype.type(0)
        for q in range(0, X.shape[1], width):
            s += row_block(X, i, C, labels[i], q, width)
        out[i] = s


@njit(nogil=True)
def rows_partials_blocked(
    X, i0, i1, C, labels, label_offset, weights, has_weights, sums, counts
):  # pragma: no cover
    """:func:`dkmeans.kernels.backends.compiled.rows_partials` by vector blocks of the features (``d % 4 == 0``)."""
    d = X.shape[1]
    if d % 16 == 0:
        return partials_rows(
            X, i0, i1, C, labels, label_offset, weights, has_weights, sums, counts, 16
        )
    if d % 8 == 0:
        return partials_rows(
            X, i0, i1, C, labels, label_offset, weights, has_weights, sums, counts, 8
        )
    return partials_rows(X, i0, i1, C, labels, label_offset, weights, has_weights, sums, counts, 4)


@njit(nogil=True)
def rows_exact_sq_blocked(X, i0, i1, C, labels, out):  # pragma: no cover - compiled
    """:func:`dkmeans.kernels.backends.compiled.rows_exact_sq` by vector blocks of the features (``d % 4 == 0``)."""
    d = X.shape[1]
    if d % 16 == 0:
        _exact_sq_loop(X, i0, i1, C, labels, out, 16)
    elif d % 8 == 0:
        _exact_sq_loop(X, i0, i1, C, labels, out, 8)
    else:
        _exact_sq_loop(X, i0, i1, C, labels, out, 4)


def _splat(builder, value, vty):
    """A vector of type ``vty`` with every lane ``value``."""
    i32 = ir.IntType(32)
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(i32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, vty.count), [0] * vty.count))


def _fma(builder, a, b, c):
    """``a * b + c`` on float vectors, one rounding (``llvm.fma``)."""
    vty = a.type
    bits = 32 if isinstance(vty.element, ir.FloatType) else 64
    fnty = ir.FunctionType(vty, [vty] * 3)
    fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.fma.v{vty.count}f{bits}")
    return builder.call(fn, [a, b, c])


@intrinsic
def nearest_block(typingctx, XT, r, CP, c_half, lab, width):
    """``lab[r:r+L] = argmin_j (c_half[j] - XT[:, r+i] . CP[j])``, ``L = VECTOR_BYTES // itemsize``.

    ``XT`` (>= width, >= r + L) holds a tile of rows transposed, ``CP`` (k, width) the
    centroids padded with zeros to ``width`` (a literal), ``c_half`` (k,) their halved
    squared norms, ``lab`` an int32 array. All C-contiguous, ``XT``, ``CP`` and ``c_half``
    of one float dtype, ``k >= 1``. Strict ``<`` in centroid order: ties go to the lowest
    index, as in the plain loop. Nothing is bounds-checked.
    """
    arrays = (XT, CP, c_half, lab)
    ok = (
        isinstance(width, types.IntegerLiteral)
        and all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)
        and XT.ndim == CP.ndim == 2
        and c_half.ndim == lab.ndim == 1
        and XT.dtype == CP.dtype == c_half.dtype
        and XT.dtype in (types.float32, types.float64)
        and lab.dtype == types.int32
    )
    if not ok:
        return None

    def codegen(context, builder, signature, args):
        tty, rty, cty, hty, lty, wty = signature.args
        W = wty.literal_value
        itemsize = tty.dtype.bitwidth // 8
        vec = ir.VectorType(context.get_data_type(tty.dtype), VECTOR_BYTES // itemsize)
        ivec = ir.VectorType(ir.IntType(32), vec.count)
        intp = context.get_value_type(types.intp)
        r = context.cast(builder, args[1], rty, types.intp)
        xs = [
            builder.load(
                _vector_pointer(context, builder, tty, args[0], ir.Constant(intp, q), r, vec),
                align=itemsize,
            )
            for q in range(W)
        ]
        cdata = context.make_array(cty)(context, builder, args[2]).data
        harr = context.make_array(hty)(context, builder, args[3])
        k = cgutils.unpack_tuple(builder, harr.shape, 1)[0]
        best = cgutils.alloca_once_value(builder, ir.Constant(vec, float("inf")))
        label = cgutils.alloca_once_value(builder, ir.Constant(ivec, 0))

        def step(
            j, group
        ):  # ``group`` centroids from j: compute every distance, then compare in order
            scores = []
            for b in range(group):
                jb = builder.add(j, ir.Constant(intp, b))
                row = builder.gep(cdata, [builder.mul(jb, ir.Constant(intp, W))])
                dot = None
                for q in range(W):
                    c = _splat(builder, builder.load(builder.gep(row, [ir.Constant(intp, q)])), vec)
                    dot = builder.fmul(xs[q], c) if dot is None else _fma(builder, xs[q], c, dot)
                h = _splat(builder, builder.load(builder.gep(harr.data, [jb])), vec)
                scores.append((builder.fsub(h, dot), builder.trunc(jb, ir.IntType(32))))
            bv, bi = builder.load(best), builder.load(label)
            for s, jb in scores:
                less = builder.fcmp_ordered("<", s, bv)
                bv = builder.select(less, s, bv)
                bi = builder.select(less, _splat(builder, jb, ivec), bi)
            builder.store(bv, best)
            builder.store(bi, label)

        full = builder.sub(k, builder.srem(k, ir.Constant(intp, NEAREST_GROUP)))
        with cgutils.for_range_slice(
            builder, ir.Constant(intp, 0), full, ir.Constant(intp, NEAREST_GROUP)
        ) as (j, _):
            step(j, NEAREST_GROUP)
        with cgutils.for_range_slice(builder, full, k, ir.Constant(intp, 1)) as (j, _):
            step(j, 1)
        out = builder.gep(context.make_array(lty)(context, builder, args[4]).data, [r])
        builder.store(builder.load(label), builder.bitcast(out, ivec.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(XT, r, CP, c_half, lab, width), codegen


#: Locality hint of :func:`prefetch` (``llvm.prefetch``: 3 keeps the lines in every cache
#: level, 2 in L2 and beyond).
PREFETCH_LOCALITY = 3


@intrinsic
def prefetch(typingctx, X, start, stop):
    """Ask the CPU to fetch the cache lines of flat elements ``start <= i < stop`` of ``X``.

    ``X`` is C-contiguous. A hint only: nothing is read into a register, and addresses
    are not checked (``stop <= start`` does nothing). The direct loops fetch the next tile
    while they compute the current one, which no hardware prefetcher does across a gap
    that long without loads.
    """
    if not (isinstance(X, types.Array) and X.layout == "C"):
        return None

    def codegen(context, builder, signature, args):
        xty, sty, ety = signature.args
        intp = context.get_value_type(types.intp)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        itemsize = ir.Constant(intp, xty.dtype.bitwidth // 8)
        data = builder.bitcast(context.make_array(xty)(context, builder, args[0]).data, i8p)
        start = builder.mul(context.cast(builder, args[1], sty, types.intp), itemsize)
        stop = builder.mul(context.cast(builder, args[2], ety, types.intp), itemsize)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        hint = [
            ir.Constant(i32, 0),
            ir.Constant(i32, PREFETCH_LOCALITY),
            ir.Constant(i32, 1),
        ]  # read, data
        with cgutils.for_range_slice(builder, start, stop, ir.Constant(intp, 64)) as (offset, _):
            builder.call(fn, [builder.gep(data, [offset])] + hint)
        return context.get_dummy_value()

    return types.none(X, start, stop), codegen


#: Centroids per group of :func:`nearest_block_streamed` (``CG``'s last axis).
STREAM_GROUP = 8
#: Vectors of rows per call of :func:`nearest_block_streamed`: with 32 vector registers
#: (AVX-512) two, so that each broadcast centroid coordinate feeds two multiply-adds.
STREAM_ROW_VECTORS = 2 if VECTOR_BYTES == 64 else 1


def streamed_group_dots(context, builder, tty, XT, cdata, d, g, columns, accs, vec):
    """Emit the dot products of group ``g`` of packed centroids with vectors of rows (LLVM IR, for
    the intrinsics' code generators).

    ``cdata`` points at ``CG`` (groups, d, ``G``) and ``XT`` (numba type ``tty``) holds the rows
    feature by feature; ``accs[rho][b]`` (allocas of type ``vec``) get the products of centroid
    ``b`` of the group with the ``vec.count`` rows at column ``columns[rho]``, each a chain of
    multiply-adds in feature order from 0: one load of a feature's rows feeds ``G`` of them.
    """
    intp = context.get_value_type(types.intp)
    G, itemsize = len(accs[0]), tty.dtype.bitwidth // 8
    for row_accs in accs:
        for acc in row_accs:
            builder.store(ir.Constant(vec, 0.0), acc)
    group_base = builder.mul(g, builder.mul(d, ir.Constant(intp, G)))
    with cgutils.for_range(builder, d) as feature_loop:
        q = feature_loop.index
        xs = [
            builder.load(_vector_pointer(context, builder, tty, XT, q, col, vec), align=itemsize)
            for col in columns
        ]
        base = builder.add(group_base, builder.mul(q, ir.Constant(intp, G)))
        for b in range(G):
            c = _splat(
                builder,
                builder.load(builder.gep(cdata, [builder.add(base, ir.Constant(intp, b))])),
                vec,
            )
            for rho in range(len(accs)):
                builder.store(_fma(builder, xs[rho], c, builder.load(accs[rho][b])), accs[rho][b])


@intrinsic
def nearest_block_streamed(typingctx, XT, r, CG, h_pad, g0, g1, best, lab):
    """:func:`nearest_block` for any ``d``, the rows streamed from ``XT`` feature by feature.

    Handles ``R = STREAM_ROW_VECTORS`` vectors of ``L`` rows from column ``r`` of ``XT``
    (d, >= r + R L) against the centroid groups ``g0 <= g < g1``. ``CG`` (groups, d,
    STREAM_GROUP) holds the centroids by groups, one group's coordinates of a feature side
    by side; ``h_pad`` (groups * STREAM_GROUP,) their halved squared norms, ``+inf`` for
    the padding past ``k`` (never chosen). For each group the ``R x STREAM_GROUP`` dot
    products accumulate in registers over the features (each a chain of multiply-adds in
    feature order), then are compared in centroid order with the running minimum
    ``best[r:r + R L]`` and its label ``lab[r:r + R L]`` (read first, written back; strict
    ``<``, so ties go to the lowest index). All C-contiguous, one float dtype, ``lab``
    int32; nothing is bounds-checked.
    """
    arrays = (XT, CG, h_pad, best, lab)
    ok = (
        all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)
        and XT.ndim == 2
        and CG.ndim == 3
        and h_pad.ndim == best.ndim == lab.ndim == 1
        and XT.dtype == CG.dtype == h_pad.dtype == best.dtype
        and XT.dtype in (types.float32, types.float64)
        and lab.dtype == types.int32
    )
    if not ok:
        return None

    def codegen(context, builder, signature, args):
        tty, rty, gty, hty, g0ty, g1ty, bty, lty = signature.args
        itemsize = tty.dtype.bitwidth // 8
        vec = ir.VectorType(context.get_data_type(tty.dtype), VECTOR_BYTES // itemsize)
        ivec = ir.VectorType(ir.IntType(32), vec.count)
        intp = context.get_value_type(types.intp)
        G, R = STREAM_GROUP, STREAM_ROW_VECTORS
        r, g0, g1 = (
            context.cast(builder, v, ty, types.intp)
            for v, ty in ((args[1], rty), (args[4], g0ty), (args[5], g1ty))
        )
        d = cgutils.unpack_tuple(
            builder, context.make_array(tty)(context, builder, args[0]).shape, 2
        )[0]
        cdata = context.make_array(gty)(context, builder, args[2]).data
        hdata = context.make_array(hty)(context, builder, args[3]).data
        columns = [builder.add(r, ir.Constant(intp, rho * vec.count)) for rho in range(R)]
        bdata = context.make_array(bty)(context, builder, args[6]).data
        ldata = context.make_array(lty)(context, builder, args[7]).data
        best_ptrs = [
            builder.bitcast(builder.gep(bdata, [col]), vec.as_pointer()) for col in columns
        ]
        label_ptrs = [
            builder.bitcast(builder.gep(ldata, [col]), ivec.as_pointer()) for col in columns
        ]
        best = [cgutils.alloca_once(builder, vec) for _ in range(R)]
        label = [cgutils.alloca_once(builder, ivec) for _ in range(R)]
        for rho in range(R):
            builder.store(builder.load(best_ptrs[rho], align=itemsize), best[rho])
            builder.store(builder.load(label_ptrs[rho], align=4), label[rho])
        accs = [[cgutils.alloca_once(builder, vec) for _ in range(G)] for _ in range(R)]
        with cgutils.for_range_slice(builder, g0, g1, ir.Constant(intp, 1)) as (g, _):
            streamed_group_dots(context, builder, tty, args[0], cdata, d, g, columns, accs, vec)
            for b in range(G):
                j = builder.add(builder.mul(g, ir.Constant(intp, G)), ir.Constant(intp, b))
                h = _splat(builder, builder.load(builder.gep(hdata, [j])), vec)
                jv = _splat(builder, builder.trunc(j, ir.IntType(32)), ivec)
                for rho in range(R):
                    s = builder.fsub(h, builder.load(accs[rho][b]))
                    bv = builder.load(best[rho])
                    less = builder.fcmp_ordered("<", s, bv)
                    builder.store(builder.select(less, s, bv), best[rho])
                    builder.store(builder.select(less, jv, builder.load(label[rho])), label[rho])
        for rho in range(R):
            builder.store(builder.load(best[rho]), best_ptrs[rho], align=itemsize)
            builder.store(builder.load(label[rho]), label_ptrs[rho], align=4)
        return context.get_dummy_value()

    return types.none(XT, r, CG, h_pad, g0, g1, best, lab), codegen
