"""The demo's data: in the workers' memory when demo_blobs returns, the rows of make_blobs_dask."""

from __future__ import annotations

import numpy as np
from distributed import futures_of

from dkmeans.engine.synthetic import blob_block, make_blobs_dask
from dkmeans.fit.demo_data import demo_blobs


def test_demo_blobs_return_once_every_chunk_is_on_the_workers(client):
    X, centres = demo_blobs(client, 20_000, 3, 4, spread=1.0, seed=5, chunk_rows=5_000)
    futures = futures_of(X)
    assert len(futures) == 4 and all(f.status == "finished" for f in futures)
    lazy, same_centres = make_blobs_dask(20_000, 3, 4, spread=1.0, seed=5, chunk_rows=5_000)
    np.testing.assert_array_equal(centres, same_centres)
    rows = X.compute()
    np.testing.assert_array_equal(rows, lazy.compute())
    # each block drawn from its own seed, wherever it was computed
    np.testing.assert_array_equal(
        rows[5_000:10_000],
        blob_block(1, 5_000, centers=centres, spread=1.0, seed=5, out_dtype=np.float32),
    )


def test_a_failing_generation_is_raised_not_waited_on(client):
    import dask.array as da
    import pytest

    from dkmeans.engine.synthetic import persisted_on

    def boom(block):
        raise RuntimeError("generation failed")

    X = da.zeros((40, 2), chunks=(10, 2)).map_blocks(boom, dtype=float)
    with pytest.raises(RuntimeError, match="generation failed"):
        persisted_on(client, X)
