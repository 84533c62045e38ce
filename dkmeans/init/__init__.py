"""Initial centroids: a name -> strategy registry.

A strategy is ``strategy(data, n_clusters, seed) -> ndarray (k, d)`` where ``data`` is a
:class:`dkmeans._graph.PersistedData` and ``seed`` a resolved 64-bit seed. Every random
draw that touches rows is keyed by the global row index, so the result does not depend on
the chunking or the number of workers.
"""

from __future__ import annotations

from typing import Callable

from dkmeans.init.random import random_rows

STRATEGIES: dict[str, Callable] = {
    "random": random_rows,
}


def get_strategy(name: str) -> Callable:
    """The strategy registered under ``name`` (raises ``KeyError`` for unknown names)."""
    return STRATEGIES[name]


__all__ = ["STRATEGIES", "get_strategy", "random_rows"]
