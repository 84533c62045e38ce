"""Resolving ``random_state`` once, on the client, into a 64-bit seed."""

from __future__ import annotations

import numbers

import numpy as np

from dkmeans.errors import InvalidParameterError


def resolve_seed(random_state) -> int:
    """A non-negative 64-bit seed from ``None``, an int, a ``Generator`` or a ``RandomState``.

    ``None`` draws fresh entropy; a ``Generator``/``RandomState`` is advanced by one
    draw (as scikit-learn does), so repeated fits with the same generator differ.
    """
    if random_state is None:
        return int(np.random.SeedSequence().generate_state(1, np.uint64)[0])
    if isinstance(random_state, (bool, np.bool_)):
        raise InvalidParameterError(f"random_state must be None, an int or a numpy Generator, got {random_state!r}")
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
