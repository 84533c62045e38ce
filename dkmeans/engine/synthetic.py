"""Gaussian blobs generated on the workers as a Dask array: the demo's, tests' and benchmarks' data.

Each block is drawn from its own seed ``(seed, block index)``, so the rows do not depend on where
or in which order the blocks are computed.
"""

from __future__ import annotations

import numpy as np


def blob_block(index: int, n_rows: int, *, centers, spread, seed, out_dtype, noise="normal"):
    """Block ``index`` (of ``n_rows`` rows) of :func:`make_blobs_dask`'s data, computed anywhere."""
    rng = np.random.default_rng([seed, index])
    labels = rng.integers(0, centers.shape[0], size=n_rows)
    shape = (n_rows, centers.shape[1])
    if noise == "uniform":  # about 3 times cheaper to draw: for data sets larger than memory
        X = centers[labels] + spread * np.sqrt(3.0) * (2 * rng.random(shape) - 1)
    else:
        X = centers[labels] + spread * rng.standard_normal(shape)
    return X.astype(out_dtype, copy=False)


def _blob_block(block_info=None, **options):
    info = block_info[None]
    (r0, r1), _ = info["array-location"]
    return blob_block(info["chunk-location"][0], r1 - r0, **options)


def make_blobs_dask(
    n_samples: int,
    n_features: int,
    n_centers: int,
    *,
    chunk_rows: int = 250_000,
    spread: float = 1.0,
    box: float = 10.0,
    seed: int = 0,
    dtype=np.float32,
    noise: str = "normal",
):
    """Gaussian (or uniform: ``noise="uniform"``) blobs generated on the workers, block by block.

    Nothing is shipped from the client, and every block is recomputed from its index
    (:func:`blob_block`), so the array is a recomputable source larger than memory if need be.

    Returns
    -------
    X : dask.array.Array, shape (n_samples, n_features)
    centers : ndarray, shape (n_centers, n_features)
        The true centres.
    """
    import dask.array as da

    centers = np.random.default_rng(seed).uniform(-box, box, size=(n_centers, n_features))
    chunks = (
        tuple(min(chunk_rows, n_samples - i) for i in range(0, n_samples, chunk_rows)),
        (n_features,),
    )
    X = da.map_blocks(
        _blob_block,
        dtype=dtype,
        chunks=chunks,
        meta=np.empty((0, 0), dtype),
        centers=centers,
        spread=spread,
        seed=seed,
        out_dtype=dtype,
        noise=noise,
    )
    return X, centers


def persisted_on(client, X):
    """``X`` persisted on ``client``'s workers, returned once every chunk is in their memory.

    Waited for as every pass is (:func:`dkmeans.engine.futures.gather`, the chunks left on the
    workers): lost workers and failed tasks are named, an interrupt cancels the chunks.
    """
    from distributed import futures_of

    from dkmeans.engine.futures import gather

    X = client.persist(X)
    gather(client, futures_of(X), results=False)
    return X


__all__ = ["blob_block", "make_blobs_dask", "persisted_on"]
