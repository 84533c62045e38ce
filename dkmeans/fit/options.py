"""The driver options a face's parameters become in a :class:`~dkmeans.fit.spec.FitSpec`.

Faces speak their users' words; the drivers' option objects (the seeding's, mini-batch's) and the
resolved seed are built here, so no face names a driver.
"""

from __future__ import annotations

from dkmeans.drivers.minibatch import DEFAULT_BATCH_SIZE, MiniBatchOptions
from dkmeans.drivers.streams import resolve_seed


def init_options(**options):
    """The seeding's :class:`~dkmeans.drivers.init.InitOptions` (``oversampling_factor``,
    ``init_rounds``; defaults if not given)."""
    from dkmeans.drivers.init import InitOptions  # the seedings load with a fit, not with the CLI

    return InitOptions(**options)


def minibatch_options(**rules) -> MiniBatchOptions:
    """A mini-batch run's rules (``batch_size``, ``max_no_improvement``, ``reassignment_ratio``,
    ``decay``, ``time_unit``; the defaults where not given)."""
    return MiniBatchOptions(**rules)


def auto_n_init(init) -> int:
    """scikit-learn's ``n_init="auto"`` of ``KMeans``: 10 for a cheap random start (``"random"``,
    ``"random-partition"``) or a callable, else 1."""
    from dkmeans.drivers.init import CHEAP_RANDOM

    return 10 if (isinstance(init, str) and init in CHEAP_RANDOM) or callable(init) else 1


__all__ = ["DEFAULT_BATCH_SIZE", "auto_n_init", "init_options", "minibatch_options", "resolve_seed"]
