"""Sparse Dask arrays: recognising them and the bytes a row takes, for memory planning."""

from __future__ import annotations

import numpy as np
from dask.array.utils import meta_from_array

from dkmeans.kernels.namespace import is_sparse


def is_sparse_array(X) -> bool:
    """Whether a Dask array's chunks are ``scipy.sparse`` matrices (from its meta)."""
    return is_sparse(meta_from_array(X))


def _stored_bytes_per_row(X):
    X = X.tocsr()
    return np.array([(X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / max(1, X.shape[0])])


#: The bytes per row of sparse data, estimated from its first chunk, are planned with this margin
#: (other chunks may hold more values per row).
SPARSE_BYTES_MARGIN = 1.5


def sparse_row_bytes(client, X) -> float | None:
    """Bytes per row of a Dask array of ``scipy.sparse`` chunks for memory planning; None for dense chunks.

    The engine counts dense rows as ``n_features * itemsize``, which for sparse rows (text:
    a few hundred values out of 10^5 or more columns) would overstate the data by orders of
    magnitude, refuse chunks that fit and stream data that fits. Here: the stored bytes
    (values, column indices, row pointers) per row of the first chunk, read once, times
    :data:`SPARSE_BYTES_MARGIN`.
    """
    if not is_sparse_array(X):
        return None
    from dkmeans.engine.futures import gather

    first = X.blocks[0].map_blocks(
        _stored_bytes_per_row,
        dtype=np.float64,
        chunks=((1,),),
        drop_axis=1,
        meta=np.empty((0,), np.float64),
    )
    return float(gather(client, client.compute(first))[0]) * SPARSE_BYTES_MARGIN


__all__ = ["SPARSE_BYTES_MARGIN", "is_sparse_array", "sparse_row_bytes"]
