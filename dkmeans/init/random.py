"""``"random"``: k distinct rows, drawn uniformly (or proportionally to ``sample_weight``)."""

from __future__ import annotations

import functools

import numpy as np

from dkmeans.errors import InvalidDataError
from dkmeans.kernels import combine_top, random_top_rows, uniform_by_index

#: Stream of :func:`dkmeans.kernels.uniform_by_index` used by this strategy.
STREAM = 1


def _chunk(X, w, offset, k, seed, stream):
    return random_top_rows(X, w, offset, k, seed, stream)


def random_rows(data, n_clusters: int, seed: int, options=None, *, stream: int = STREAM) -> np.ndarray:
    """k distinct rows of ``data`` chosen at random, keyed by global row index.

    Parameters
    ----------
    data : PersistedData
    n_clusters : int
    seed : int
    options : InitOptions, optional
        Unused (the registry's common signature).
    stream : int
        Random stream (other strategies draw their first centre with their own).

    Returns
    -------
    ndarray, shape (n_clusters, d), the data's dtype
    """
    top = data.map_reduce(_chunk, functools.partial(combine_top, m=n_clusters), (n_clusters, seed, stream))
    if len(top.index) < n_clusters:
        raise InvalidDataError(
            f"only {len(top.index)} rows have a positive sample_weight, fewer than n_clusters={n_clusters}"
        )
    return np.asarray(top.rows)


def first_centre(data, seed: int, stream: int) -> np.ndarray:
    """One row drawn uniformly (proportionally to ``sample_weight``): shape (1, d).

    Without weights the global row index is drawn on the client from ``(seed, stream)``
    and only the chunk holding that row is read; with weights it takes one pass.
    """
    if data.weights is not None:
        return random_rows(data, 1, seed, stream=stream)
    u = float(uniform_by_index(np.zeros(1, dtype=np.int64), seed, stream)[0])
    return data.rows([min(int(u * data.n_rows), data.n_rows - 1)])
