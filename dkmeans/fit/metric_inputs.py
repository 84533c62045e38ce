"""The metric of a fit (``"euclidean"`` or ``"cosine"``) where the data is read, and what sparse input allows.

The fit service and the faces call these; the drivers see only unit rows and get the
metric's centroid update and objective scale from :mod:`dkmeans.kernels.cosine`.

Cosine (spherical k-means) is Euclidean k-means on unit rows with unit centroids (see
:mod:`dkmeans.kernels.cosine` for why every Euclidean kernel then gives the cosine answer):

* :func:`prepare_array` normalises the rows of a validated Dask array chunk by chunk,
  where the chunks are read (persisted once, or on every pass of out-of-core data), before
  the fit service places it; the fit's first pass (column moments) then sees unit rows, so
  the estimator's relative ``tol`` is relative to the mean feature variance of the
  *normalised* rows (and bounds the squared shift of unit centroids);
* :func:`prepare_centroids` normalises given or seeded initial centroids;
* what ``predict``, ``score`` and ``transform`` run on each chunk is in
  :mod:`dkmeans.kernels.inference` (the same normalisation and kernels as the fit).

:func:`supports_local_search` says which fit phases a metric and sparse input support:
Hartigan's method and the swap-based local search compute Euclidean cost changes on dense
rows, so they are refused for cosine and sparse input (an explicit request raises; the
default ``local_search="auto"`` turns local search off).
"""

from __future__ import annotations

import numpy as np

from dkmeans.engine.rowwise import map_rows_like
from dkmeans.errors import InvalidDataError, InvalidParameterError
from dkmeans.kernels.cosine import normalize_rows


def prepare_array(X, metric: str):
    """The Dask array whose chunks the kernels see: rows normalised per chunk for cosine, else ``X``.

    Lazy: a chunk with a row of norm zero raises :class:`~dkmeans.errors.InvalidDataError`
    when it is computed (persisted or streamed), with the same message as ``predict``.
    """
    if metric != "cosine":
        return X
    return map_rows_like(X, normalize_rows)


def prepare_dataset(dataset, metric: str):
    """A copy of a :class:`~dkmeans.fit.inputs.Dataset` whose array is :func:`prepare_array`'s."""
    from dataclasses import replace

    if metric != "cosine":
        return dataset
    local = (
        None if dataset.local is None else normalize_rows(dataset.local)
    )  # fitted in-process: at once
    return replace(dataset, array=prepare_array(dataset.array, metric), local=local)


def prepare_centroids(C, metric: str, name: str = "init"):
    """Initial centroids for ``metric``: unit rows for cosine (a zero centroid has no direction and is refused)."""
    if metric != "cosine":
        return C
    C = np.asarray(C)
    norms = np.linalg.norm(C.astype(np.float64), axis=1)
    if np.any(norms == 0):
        raise InvalidDataError(
            f"{name}: a centroid of norm zero has no direction; metric='cosine' needs non-zero "
            "centroids"
        )
    return (C / norms[:, None]).astype(C.dtype)


def supports_local_search(
    metric: str, sparse: bool, *, algorithm: str, refine, local_search
) -> bool:
    """Whether local search may run for this metric and input; raises for phases that cannot.

    Hartigan's method (``algorithm``/``method`` or ``refine`` "hartigan") and an explicit
    ``local_search=True`` raise :class:`~dkmeans.errors.InvalidParameterError` with cosine or
    sparse input; ``local_search="auto"`` (or False) gives False there.
    """
    reason = "metric='cosine'" if metric == "cosine" else "sparse input" if sparse else None
    if reason is None:
        return True
    if "hartigan" in (algorithm, refine):
        raise InvalidParameterError(
            f"Hartigan's method is not available with {reason}: it moves dense rows by "
            "their Euclidean cost change; use algorithm='lloyd' without refine"
        )
    if local_search is True:
        raise InvalidParameterError(
            f"local_search=True is not available with {reason}: the swap search scores "
            "Euclidean swaps on dense rows; use local_search='auto' or False"
        )
    return False


__all__ = ["prepare_array", "prepare_centroids", "prepare_dataset", "supports_local_search"]
