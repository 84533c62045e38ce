"""Randomness: ``random_state`` resolved once into a 64-bit seed, and the one table of random streams.

Every random number of a fit is a pure function of ``(seed, stream, global row index)``
(:func:`dkmeans.kernels.sampling.uniform_by_index`) or, for the mini-batch draws, of
``(seed, stream, step)`` through NumPy's ``SeedSequence``; so results never depend on
chunking, worker count or execution mode. A *stream* separates the independent uses of one
seed: each use has its own range of stream numbers in :data:`STREAMS`, and no two ranges of
the same kind overlap (``tests/drivers/test_streams.py``). Drivers take their numbers from
here, never from a literal.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from dkmeans.errors import InvalidParameterError

_GOLDEN = 0x9E3779B97F4A7C15


@dataclass(frozen=True)
class Stream:
    """A range of stream numbers, ``first .. first + count - 1``, for one use of the seed."""

    name: str
    first: int
    count: int
    kind: str  # "row": uniform_by_index keys; "generator": a SeedSequence entropy word
    use: str

    def __call__(self, i: int = 0) -> int:
        """The ``i``-th stream number of this range (round, step, group, ...)."""
        if not 0 <= i < self.count:
            raise InvalidParameterError(
                f"random stream {self.name!r} has {self.count} numbers; asked for number {i}"
            )
        return self.first + i


#: The one table of random streams (numbers kept from before the table where they were clear).
STREAMS: dict[str, Stream] = {
    s.name: s
    for s in (
        Stream(
            "random.rows", 1, 1, "row", "init='random': the k rows with the smallest weighted keys"
        ),
        Stream("k-means||.first", 2, 1, "row", "k-means||: its first centre"),
        Stream("k-means++.first", 3, 1, "row", "k-means++: its first centre"),
        Stream("random-partition", 4, 1, "row", "init='random-partition': each row's cluster"),
        Stream("two-level.sample", 5, 1, "row", "two-level k-means||: the sample's rows"),
        Stream(
            "two-level.coarse-order",
            6,
            1,
            "row",
            "two-level k-means||: the order of the sample before the coarse step",
        ),
        Stream("two-level.coarse", 7, 1, "row", "two-level k-means||: the coarse k-means++"),
        Stream(
            "silhouette.sample", 8, 1, "row", "silhouette_score(sample_size=): the sample's rows"
        ),
        Stream("k-means||.rounds", 16, (1 << 20) - 16, "row", "k-means||: round r's candidates"),
        Stream(
            "k-means++.steps", 1 << 20, (1 << 24) - (1 << 20), "row", "k-means++: step j's trials"
        ),
        Stream(
            "two-level.fine",
            1 << 24,
            (1 << 32) - (1 << 24),
            "row",
            "two-level k-means||: group g's k-means++",
        ),
        Stream(
            "first-centre.fallback",
            1 << 32,
            8,
            "row",
            "the weighted fallback draw of a first centre, offset by that centre's stream",
        ),
        Stream(
            "local-search.rounds",
            3 << 32,
            1 << 32,
            "row",
            "local search on the data: round r's candidates",
        ),
        Stream(
            "local-search.coreset",
            5 << 32,
            1 << 32,
            "row",
            "local search on a sample: the sample's rows",
        ),
        Stream(
            "local-search.split",
            6 << 32,
            1 << 32,
            "generator",
            "local search: round r's starting directions of the clusters' splits",
        ),
        Stream(
            "gap.reference",
            7 << 32,
            1 << 16,
            "row",
            "the gap statistic: reference draw b's uniform rows (one key per row and column)",
        ),
        Stream(
            "bisecting.draws",
            8 << 32,
            1 << 32,
            "row",
            "bisecting k-means: draw j (0: a start's rows, 1 and 2: k-means++'s candidates) of a leaf at depth "
            "l is number 4 l + j (a row is in one leaf per depth)",
        ),
        Stream(
            "capacity.sample",
            9 << 32,
            8,
            "row",
            "size caps: the rows of the samples whose capped fits start the data's, number l the "
            "l-th and larger sample (per run's seed)",
        ),
        Stream("minibatch.batches", 0x6D62, 1, "generator", "mini-batch: the rows of every batch"),
        Stream("minibatch.init", 0x696E, 1, "generator", "mini-batch: the initialisation's sample"),
    )
}


def stream(name: str, i: int = 0) -> int:
    """Stream number ``i`` of the range ``name`` of :data:`STREAMS`."""
    return STREAMS[name](i)


def derive_seed(seed: int, i: int) -> int:
    """The ``i``-th independent seed derived from ``seed`` (for ``n_init`` runs and trials)."""
    return (seed + (i * _GOLDEN)) % 2**64


def resolve_seed(random_state) -> int:
    """A non-negative 64-bit seed from ``None``, an int, a ``Generator`` or a ``RandomState``.

    ``None`` draws fresh entropy; a ``Generator``/``RandomState`` is advanced by one
    draw (as scikit-learn does), so repeated fits with the same generator differ.
    """
    if random_state is None:
        return int(np.random.SeedSequence().generate_state(1, np.uint64)[0])
    if isinstance(random_state, (bool, np.bool_)):
        raise InvalidParameterError(
            f"random_state must be None, an int or a numpy Generator, got {random_state!r}"
        )
    if isinstance(random_state, numbers.Integral):
        if random_state < 0:
            raise InvalidParameterError(f"random_state must be non-negative, got {random_state}")
        return int(random_state) % 2**64
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**63))
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**31 - 1))
    raise InvalidParameterError(
        f"random_state must be None, an int, a numpy.random.Generator or RandomState, got {type(random_state).__name__}"
    )


__all__ = ["STREAMS", "Stream", "derive_seed", "resolve_seed", "stream"]
