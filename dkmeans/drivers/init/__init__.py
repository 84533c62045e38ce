"""Initial centroids: a name -> strategy registry.

A strategy is ``strategy(data, n_clusters, seed, options) -> ndarray (k, d)`` where
``data`` follows the data protocol (:mod:`dkmeans.engine.protocol`), ``seed`` a resolved 64-bit seed and
``options`` an :class:`InitOptions`. Every random draw that touches rows is keyed by the
global row index, so the result does not depend on the chunking or the number of workers.
"""

from __future__ import annotations

from collections.abc import Callable

from dkmeans.drivers.init.kmeans_parallel import kmeans_parallel
from dkmeans.drivers.init.kmeans_plusplus import kmeans_plusplus
from dkmeans.drivers.init.options import InitOptions
from dkmeans.drivers.init.random import random_rows
from dkmeans.drivers.init.random_partition import random_partition
from dkmeans.drivers.streams import derive_seed

STRATEGIES: dict[str, Callable] = {
    "k-means||": kmeans_parallel,
    "k-means++": kmeans_plusplus,
    "random": random_rows,
    "random-partition": random_partition,
}

#: Strategies that are usually run several times (``n_init="auto"`` -> 10), as in scikit-learn.
CHEAP_RANDOM = ("random", "random-partition")


def get_strategy(name: str) -> Callable:
    """The strategy registered under ``name`` (raises ``KeyError`` for unknown names)."""
    return STRATEGIES[name]


__all__ = [
    "CHEAP_RANDOM",
    "STRATEGIES",
    "InitOptions",
    "derive_seed",
    "get_strategy",
    "random_rows",
]
