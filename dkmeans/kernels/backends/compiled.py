"""Compiled loops for the NumPy path of the assignment kernels (numba, one thread).

Two ways to find the nearest centroid, chosen per shape by :mod:`dkmeans.kernels.nearest`:

* **Direct**: a tile of rows is held transposed in a ``(features, T)`` buffer (copied with
  vector shuffles), and the distances ``||c||^2/2 - x.c`` of a block of rows to every
  centroid are computed in registers, the running minimum with them: no ``n x k``
  intermediate and no BLAS call, which is inefficient when the products are this short.
  For ``d <= 16`` the block's rows stay in registers, one vector per feature, and the
  centroid coordinates go past as broadcasts (:func:`._simd.nearest_block`); for larger
  ``d`` the rows are streamed from the tile feature by feature against groups of 8
  centroids packed side by side, taken in blocks that stay in the L2 cache
  (:func:`._simd.nearest_block_streamed`). While a tile is computed, the next one is
  prefetched (:func:`._simd.prefetch`): the loop computes long enough between reads that
  the hardware prefetchers fell behind, and a quarter of its time went to waiting for
  memory.
* **BLAS + running argmin** (``d > 16`` and 1 or 2 centroids, where the groups of 8 would be
  mostly padding): BLAS computes ``C_block @ X_tile.T`` into a small buffer, and
  :func:`running_argmin_t` folds it into the running minimum.

Both then compute, per tile of rows while the rows are in cache, the exact squared
distance ``||x - c_label||^2`` from the difference and either return it
(:func:`rows_exact_sq`) or fold it into float64 per-cluster sums, counts and the objective
(:func:`rows_partials`); when ``d`` is a multiple of 4 a row is handled in vector blocks
of its features (:mod:`._simd`). Everything runs in one thread, releases the GIL, and keeps
strict ``<`` comparisons in centroid order, so ties go to the lowest centroid index.

The direct loops are generated source, one per feature width (a literal) and one streamed. The
source is written once to a file in a cache directory (:func:`.jit.cache_dirs`:
``NUMBA_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/dkmeans`` or ``~/.cache/dkmeans``, else
the temporary directory) and imported from there, so numba caches the compiled code on disk
like the functions of this module; where no directory is writable it is compiled in memory in
each process.

Arrays are copied element by element in the compiled loops, never by slice assignment
(``a[i0:i1] = b``): numba checks a slice assignment's shapes with code that formats the
error message, whose compilation (string formatting) took 2.5-3.3 s of CPU in every process
that compiled such a loop, about a third of compiling a fit's loops.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading

import numpy as np

from dkmeans.kernels.backends import simd as _simd
from dkmeans.kernels.backends.jit import cache_dirs, njit
from dkmeans.kernels.backends.layout import DIRECT_WIDTHS, Output, direct_width  # noqa: F401 - re-exported
from dkmeans.kernels.backends.simd import (
    STREAM_GROUP,  # noqa: F401 - assign sizes the streamed blocks with it
    rows_exact_sq_blocked,
    rows_partials_blocked,
)

# reassoc lets LLVM vectorise the per-row sum of squared differences.
_REDUCE_MATH = {"reassoc", "contract"}


@njit(nogil=True)
def running_argmin_t(Dt, c_half_sq, j0, best_val, best_idx, first):  # pragma: no cover - compiled
    """Fold one centroid block into the running nearest-centroid state.

    ``Dt`` is ``C_block @ X_tile.T`` (kb, m): row j holds x.c_j for every row x of the
    tile, so the loop over rows is contiguous and vectorises. ``c_half_sq[j] - Dt[j, i]``
    has the same argmin as ``||x_i - c_j||^2``. Strict ``<`` keeps the lowest index on ties.
    """
    kb, m = Dt.shape
    for j in range(kb):
        cj = c_half_sq[j]
        row = Dt[j]
        if first and j == 0:
            for i in range(m):
                best_val[i] = cj - row[i]
                best_idx[i] = j0
            continue
        for i in range(m):
            v = cj - row[i]
            if v < best_val[i]:
                best_val[i] = v
                best_idx[i] = j0 + j
    return None


@njit(nogil=True, fastmath=_REDUCE_MATH)
def rows_exact_sq(X, i0, i1, C, labels, out):  # pragma: no cover - compiled
    """``out[i] = ||X[i] - C[labels[i]]||^2`` for ``i0 <= i < i1`` (in X's dtype)."""
    d = X.shape[1]
    if d % 4 == 0:  # vector blocks of the features (see dkmeans.kernels.backends.simd)
        rows_exact_sq_blocked(X, i0, i1, C, labels, out)
        return
    for i in range(i0, i1):
        x = X[i]
        c = C[labels[i]]
        s = X.dtype.type(0)
        for f in range(d):
            diff = x[f] - c[f]
            s += diff * diff
        out[i] = s


@njit(nogil=True, fastmath=_REDUCE_MATH)
def rows_partials(
    X, i0, i1, C, labels, label_offset, weights, has_weights, sums, counts
):  # pragma: no cover
    """Fold rows ``i0 <= i < i1`` into float64 ``sums``/``counts``; return their objective.

    Row ``i``'s label is ``labels[i - label_offset]`` (a tile's labels, or a whole
    chunk's with offset 0). The squared distance of a row is computed from
    ``x - c_label`` (in X's dtype), the sums, counts and objective accumulate in float64,
    weighted when ``has_weights``.
    """
    d = X.shape[1]
    objective = 0.0
    if d % 4 == 0:  # vector blocks of the features (see dkmeans.kernels.backends.simd)
        return rows_partials_blocked(
            X, i0, i1, C, labels, label_offset, weights, has_weights, sums, counts
        )
    for i in range(i0, i1):
        j = labels[i - label_offset]
        x = X[i]
        c = C[j]
        srow = sums[j]
        s = X.dtype.type(0)
        for f in range(d):
            diff = x[f] - c[f]
            s += diff * diff
        if has_weights:
            w = weights[i]
            for f in range(d):
                srow[f] += w * np.float64(x[f])
            counts[j] += w
            objective += w * np.float64(s)
        else:
            for f in range(d):
                srow[f] += np.float64(x[f])
            counts[j] += 1.0
            objective += np.float64(s)
    return objective


# -- generated direct loops ------------------------------------------------------------------
def direct_source(width: int | None) -> str:
    """Python source of a direct kernel (see :func:`direct_kernel`).

    ``width``: the rows of a block stay in registers, ``d <= width`` features
    (:func:`._simd.nearest_block`); None: they are streamed from the tile, any ``d``
    (:func:`._simd.nearest_block_streamed`).
    """
    if width is not None:
        name, features, buffers = f"direct_{width}", width, ""
        setup = f"""
    B = VECTOR_BYTES // X.itemsize  # rows per call of nearest_block
    CP = np.zeros((k, {width}), X.dtype)
    for j in range(k):
        for f in range(d):
            CP[j, f] = C[j, f]"""
        nearest = f"""
        for r in range(0, m, B):
            prefetch(X, ahead, min(ahead + share, ahead_end))
            ahead += share
            nearest_block(XT, r, CP, c_half, lab, {width})"""
    else:
        name, features = "direct_streamed", "d"
        buffers = """
    best = np.empty(XT.shape[1], X.dtype)  # the running minimum, kept between blocks of centroids"""
        setup = """
    B = STREAM_ROW_VECTORS * (VECTOR_BYTES // X.itemsize)  # rows per call of nearest_block_streamed
    G = STREAM_GROUP
    groups = (k + G - 1) // G
    CG = np.zeros((groups, d, G), X.dtype)  # by groups of G centroids, one feature's side by side
    h = np.full(groups * G, np.inf, X.dtype)  # +inf: the padding past k is never the nearest
    for j in range(k):
        h[j] = c_half[j]
        for f in range(d):
            CG[j // G, f, j % G] = C[j, f]"""
        nearest = """
        best[:] = np.inf
        lab[:] = 0
        for g0 in range(0, groups, block_groups):  # a block of centroids stays in L2 meanwhile
            for r in range(0, m, B):
                if g0 == 0:
                    prefetch(X, ahead, min(ahead + share, ahead_end))
                    ahead += share
                nearest_block_streamed(XT, r, CG, h, g0, min(groups, g0 + block_groups), best, lab)"""
    return f'''"""Generated by dkmeans.kernels.backends.compiled.direct_source: do not edit."""
import numpy as np
from dkmeans.kernels.backends.jit import njit
from dkmeans.kernels.backends.compiled import Output, rows_exact_sq, rows_partials
from dkmeans.kernels.backends.simd import (STREAM_GROUP, STREAM_ROW_VECTORS, VECTOR_BYTES, nearest_block,
                                   nearest_block_streamed, prefetch, transpose_tile)


@njit(cache=True, nogil=True)
def {name}(X, C, c_half, T, block_groups, labels, min_sq, weights, has_weights, sums, counts, output):
    n, d = X.shape
    k = C.shape[0]{setup}
    # whole blocks of rows: the columns past a short last tile hold finite leftovers
    XT = np.zeros(({features}, (T + B - 1) // B * B), X.dtype)
    lab = np.empty(XT.shape[1], np.int32){buffers}
    blocks = XT.shape[1] // B
    share = (T * d + blocks - 1) // blocks  # elements of the next tile to prefetch per block of rows
    objective = 0.0
    for i0 in range(0, n, T):
        m = min(T, n - i0)
        transpose_tile(X, i0, m, XT)
        # the next tile comes from memory while this one is computed
        ahead = (i0 + T) * d
        ahead_end = min(n, i0 + 2 * T) * d{nearest}
        if output == Output.PARTIALS:  # the tile's labels are all the partials need
            objective += rows_partials(X, i0, i0 + m, C, lab, i0, weights, has_weights, sums, counts)
            continue
        for i in range(m):
            labels[i0 + i] = lab[i]
        if output == Output.DISTANCES:
            rows_exact_sq(X, i0, i0 + m, C, labels, min_sq)
    return objective
'''


_direct_lock = threading.Lock()
_direct_kernels: dict = {}


def _write_source(name: str, source: str) -> str | None:
    """Path of a file holding ``source`` (written atomically if absent), or None."""
    for directory in cache_dirs("dkmeans-generated"):
        path = os.path.join(directory, name + ".py")
        try:
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as fh:
                    if fh.read() == source:
                        return path
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(source)
            os.replace(tmp, path)
            return path
        except OSError:
            continue
    return None


def _load_source(name: str, source: str):
    """Import ``source`` as module ``dkmeans.kernels.backends._generated_<name>`` (from a file when possible)."""
    modname = f"dkmeans.kernels.backends._generated_{name}"
    if modname in sys.modules:
        return sys.modules[modname]
    path = _write_source(name, source)
    if path is not None:
        spec = importlib.util.spec_from_file_location(modname, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[modname] = module
        try:
            spec.loader.exec_module(module)
            return module
        except Exception:  # pragma: no cover - unreadable file: compile in memory below
            del sys.modules[modname]
    namespace = {"__name__": modname}
    exec(compile(source.replace("cache=True", "cache=False"), f"<{modname}>", "exec"), namespace)
    module = type(sys)(modname)
    module.__dict__.update(namespace)
    sys.modules[modname] = module
    return module


def _source_digest(source: str) -> str:
    """Hash of the generated source and of the modules its compiled code inlines.

    numba's disk cache checks the timestamp of a function's own file only; naming the
    generated file after this hash makes a change to the inlined helpers
    (``rows_partials``, ``transpose_tile``) recompile the generated loops too.
    """
    h = hashlib.sha256(source.encode())
    for module_file in (__file__, _simd.__file__):
        try:
            with open(module_file, "rb") as fh:
                h.update(fh.read())
        except OSError:  # pragma: no cover - running from a zip: the source hash alone
            pass
    return h.hexdigest()[:12]


def direct_kernel(width: int | None):
    """The compiled direct kernel for ``d <= width`` features (any ``d`` when ``width`` is None).

    ``kernel(X, C, c_half, T, block_groups, labels, min_sq, weights, has_weights, sums,
    counts, output)`` assigns the rows of ``X`` in tiles of ``T`` rows using ``c_half =
    ||c||^2 / 2`` in X's dtype: ``output`` (``int`` of an :class:`Output`) ``LABELS`` writes the labels (int32)
    to ``labels``, ``DISTANCES`` also the exact squared distances to ``min_sq``; ``PARTIALS`` neither
    (``labels`` may be empty) but folds each tile into ``sums``/``counts`` and returns the
    objective (0.0 otherwise). The streamed kernel takes ``block_groups`` groups of
    ``STREAM_GROUP`` centroids per pass over a tile; the others ignore it.
    """
    kernel = _direct_kernels.get(width)
    if kernel is None:
        with _direct_lock:
            kernel = _direct_kernels.get(width)
            if kernel is None:
                source = direct_source(width)
                name = "streamed" if width is None else width
                module = _load_source(f"direct_{name}_{_source_digest(source)}", source)
                kernel = _direct_kernels[width] = getattr(module, f"direct_{name}")
    return kernel


@njit(nogil=True, fastmath=_REDUCE_MATH)
def _sq_to_row(X, c, out):  # pragma: no cover - compiled
    n, d = X.shape
    for i in range(n):
        s = 0.0
        for f in range(d):
            t = X[i, f] - X[c, f]
            s += t * t
        out[i] = s


@njit(nogil=True, fastmath=_REDUCE_MATH)
def kpp_local(X, w, k, trials, u, first):  # pragma: no cover - compiled
    """Greedy k-means++ on in-memory rows: the chosen row indices (see ``seeding.local_kmeans_plusplus``).

    ``u``: ``(k - 1) * trials`` uniforms in (0, 1), step by step; ``first``: the first row.
    Trial ``t`` of step ``j`` is the row where the cumulative ``w d2`` first reaches
    ``u * total``; the trial whose potential is lowest (first on ties) is kept. When every
    row coincides with a chosen one (total 0), the remaining steps take ``first``.
    """
    n, d = X.shape
    chosen = np.empty(k, np.int64)
    chosen[0] = first
    d2 = np.empty(n, np.float64)
    trial = np.empty(n, np.float64)
    best = np.empty(n, np.float64)
    cum = np.empty(n, np.float64)
    _sq_to_row(X, first, d2)
    for j in range(1, k):
        total = 0.0
        for i in range(n):
            total += w[i] * d2[i]
            cum[i] = total
        if not total > 0.0:
            chosen[j] = first
            continue
        best_pot = np.inf
        best_row = first
        for t in range(trials):
            r = u[(j - 1) * trials + t] * total
            row = np.searchsorted(cum, r)
            if row >= n:
                row = n - 1
            while row > 0 and w[row] * d2[row] <= 0.0:  # never a row already at distance 0
                row -= 1
            _sq_to_row(X, row, trial)
            pot = 0.0
            for i in range(n):
                if trial[i] > d2[i]:
                    trial[i] = d2[i]
                pot += w[i] * trial[i]
            if pot < best_pot:
                best_pot = pot
                best_row = row
                for i in range(n):
                    best[i] = trial[i]
        chosen[j] = best_row
        for i in range(n):
            d2[i] = best[i]
    return chosen
