"""In-memory data without a Dask client: fitted in the calling process, on a thread per core."""

from __future__ import annotations

import numpy as np

from dkmeans.drivers.lloyd import CentroidShift, lloyd
from dkmeans.engine.local import ChunkList
from dkmeans.kernels import assign_partials, combine_partials, plans


def _partials_chunk(X, w, offset, C):
    return assign_partials(X, C, w)


def _path_chunk(X, w, offset):
    return [(offset, plans.current().path)]


def test_threaded_chunks_combine_in_chunk_order_as_one_thread():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20_000, 6))
    w = rng.uniform(0.5, 2.0, 20_000)
    C = X[:7].copy()
    one = ChunkList.from_array(X, w, n_chunks=4)
    pool = ChunkList.from_array(X, w, n_chunks=4, threads=4)
    try:
        a = one.map_reduce(_partials_chunk, combine_partials, (C,))
        b = pool.map_reduce(_partials_chunk, combine_partials, (C,))
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)  # the same sums in the same order: bit for bit
        ra = lloyd(one, C, max_iter=20, stop_rule=CentroidShift(0.0))
        rb = lloyd(pool, C, max_iter=20, stop_rule=CentroidShift(0.0))
        np.testing.assert_array_equal(ra.centroids, rb.centroids)
        assert ra.n_iter == rb.n_iter
    finally:
        pool.release()


def test_threads_run_in_the_fits_kernel_plan():
    """The pool's threads see the plan the fit applied (each call runs in a copy of the caller's context)."""
    X = np.zeros((1000, 2))
    data = ChunkList.from_array(X, None, n_chunks=4, threads=2)
    try:
        for path in ("numpy", "compiled"):
            with plans.KernelPlan(path, "auto").applied():
                seen = data.map_reduce(_path_chunk, lambda parts: sum(parts, []))
            assert [o for o, _ in seen] == [0, 250, 500, 750] and {p for _, p in seen} == {path}
    finally:
        data.release()
