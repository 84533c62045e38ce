"""``"random-partition"``: every row joins a uniformly random cluster; centres are the means.

(The seed notes call it random-data.) An empty cluster (possible for tiny data) takes the
row farthest from the other means, as in the Lloyd loop.
"""

from __future__ import annotations

import numpy as np

from dkmeans.drivers.lloyd import fill_empty_clusters
from dkmeans.drivers.streams import STREAMS
from dkmeans.kernels import combine_partials, random_partition_partials, update_centroids
from dkmeans.kernels.cosine import unit_centroids

STREAM = STREAMS["random-partition"]()


def _chunk(X, w, offset, k, seed):
    return random_partition_partials(X, w, offset, k, seed, STREAM)


def random_partition(data, n_clusters: int, seed: int, options=None) -> np.ndarray:
    """Centroids of a uniformly random partition of the rows (one pass); normalised means for cosine.

    Returns
    -------
    ndarray, shape (n_clusters, d), the data's dtype
    """
    partials = data.map_reduce(_chunk, combine_partials, (n_clusters, seed))
    # cosine: normalised means; a part whose rows cancel takes a farthest row, as an empty one
    update = (
        unit_centroids if getattr(options, "metric", "euclidean") == "cosine" else update_centroids
    )
    centroids, empty = update(partials, np.zeros((n_clusters, data.n_features)))
    if empty.any():
        centroids = fill_empty_clusters(data, centroids, empty)
    return centroids.astype(data.dtype)
