"""The fit's first pass over its placed data, and the check it makes possible."""

from __future__ import annotations

import math

import numpy as np

from dkmeans.errors import NON_FINITE_INPUT, InvalidDataError
from dkmeans.kernels import column_moments, combine_moments


def moments_chunk(X, w, offset):
    """Column moments of a chunk: the fit's first pass over its placed data."""
    return column_moments(X)


def first_pass(data):
    """The column moments of the placed data and their mean variance (scikit-learn's scale of ``tol``).

    Raises :class:`~dkmeans.errors.InvalidDataError` for NaN or infinity anywhere in the rows.
    """
    with np.errstate(invalid="ignore", over="ignore"):  # non-finite data: reported below
        moments = data.map_reduce(moments_chunk, combine_moments)
        mean_variance = float(np.mean(moments.m2 / moments.count))
    if not math.isfinite(mean_variance):
        raise InvalidDataError(NON_FINITE_INPUT)
    return moments, mean_variance


def check_rows_when_placed(spec, dataset, data) -> None:
    """``n_clusters`` against the rows, for data whose row count the metadata did not give.

    Known counts are checked before placement (:func:`dkmeans.fit.service.run_fit`); this is
    the same check, once, where the count is first known: the placed data.
    """
    if dataset.n_rows is None:
        # here, not at the top: the workers import this module for moments_chunk, and
        # dkmeans.fit.inputs imports scikit-learn (2 s of a fresh worker on 2 cores)
        from dkmeans.fit.inputs import check_n_clusters_vs_rows

        check_n_clusters_vs_rows(
            spec.n_clusters, data.n_rows, spec.names.get("n_clusters", "n_clusters")
        )
