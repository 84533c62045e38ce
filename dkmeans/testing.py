"""Data generators and an independent float64 reference Lloyd, for tests and benchmarks.

The reference computes every distance by brute force from differences (no matrix-product
expansion, no tiling, no Dask), so it shares no code with the kernels it checks.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np


def __getattr__(name: str):
    """:func:`~dkmeans.engine.synthetic.make_blobs_dask` and its ``blob_block``, here too.

    The Dask generator lives with the engine (the demo's data is made there too); it is loaded
    on first use so that importing this module stays as light as NumPy.
    """
    if name in ("blob_block", "make_blobs_dask"):
        from dkmeans.engine import synthetic

        return getattr(synthetic, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_blobs(
    n_samples: int,
    n_features: int,
    n_centers: int,
    *,
    spread: float = 1.0,
    box: float = 10.0,
    seed: int = 0,
    dtype=np.float64,
):
    """Gaussian blobs: returns ``(X, true_labels, true_centers)``.

    Centres are uniform in ``[-box, box]^d``; points are centre + ``spread`` * N(0, I).
    """
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-box, box, size=(n_centers, n_features))
    labels = rng.integers(0, n_centers, size=n_samples)
    X = centers[labels] + spread * rng.standard_normal((n_samples, n_features))
    return X.astype(dtype), labels, centers


@dataclass
class ReferenceResult:
    centroids: np.ndarray
    labels: np.ndarray
    objective: float
    n_iter: int
    objectives: list


def _sq_dists(X, C):
    return ((X[:, None, :] - C[None, :, :]) ** 2).sum(axis=2)


def reference_lloyd(
    X,
    C0,
    *,
    max_iter: int,
    tol: float | None = None,
    tol_inclusive: bool = True,
    threshold: float | None = None,
    weights=None,
) -> ReferenceResult:
    """Plain float64 Lloyd with the semantics dkmeans documents.

    Stop rules: ``threshold`` (stop before the update when the objective decreased by
    less than it), ``tol`` (stop after an update whose total squared shift is ``<= tol``,
    or ``< tol`` if not ``tol_inclusive``), a fixed point, or ``max_iter`` updates. Empty
    clusters take the distinct rows farthest from the new non-empty centroids (ties:
    lower row index; zero-weight rows never).
    """
    X = np.asarray(X, dtype=np.float64)
    C = np.asarray(C0, dtype=np.float64).copy()
    n, k = X.shape[0], C.shape[0]
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    prev, n_iter, objectives = None, 0, []
    for it in range(max_iter):
        D = _sq_dists(X, C)
        labels = D.argmin(axis=1)
        obj = float((D[np.arange(n), labels] * w).sum())
        if threshold is not None and prev is not None and prev - obj < threshold:
            break
        objectives.append(obj)
        new = C.copy()
        empty = np.zeros(k, dtype=bool)
        for j in range(k):
            mask = labels == j
            wj = w[mask].sum()
            if wj > 0:
                new[j] = (X[mask] * w[mask, None]).sum(axis=0) / wj
            else:
                empty[j] = True
        if empty.any():
            d2 = _sq_dists(X, new[~empty]).min(axis=1)
            d2[w <= 0] = -1
            order = np.lexsort((np.arange(n), -d2))
            new[np.flatnonzero(empty)] = X[order[: empty.sum()]]
        shift = float(((new - C) ** 2).sum())
        C, n_iter, prev = new, it + 1, obj
        if tol is not None and (shift <= tol if tol_inclusive else shift < tol):
            break
        if shift == 0:  # C is unchanged (even with empty clusters refilled in place): a fixed point
            break
    D = _sq_dists(X, C)
    labels = D.argmin(axis=1)
    return ReferenceResult(
        C, labels, float((D[np.arange(n), labels] * w).sum()), n_iter, objectives
    )


def pick_rows(X, k: int, seed: int = 0):
    """k distinct rows of ``X`` (a fixed NumPy draw), e.g. as shared initial centroids."""
    idx = np.random.default_rng(seed).choice(X.shape[0], k, replace=False)
    return np.asarray(X)[idx].copy()


def persist_rows(client, X, n_chunks: int = 4, weights=None):
    """``X`` (and ``weights``) split into ``n_chunks`` row chunks and persisted: a ``PersistedData``."""
    import dask.array as da

    from dkmeans.engine import PersistedData

    rows = -(-len(X) // n_chunks)
    wd = None if weights is None else da.from_array(np.asarray(weights), chunks=rows)
    return PersistedData(client, da.from_array(np.asarray(X), chunks=(rows, X.shape[1])), wd)


@contextmanager
def local_cluster(n_workers: int = 2, *, set_as_default: bool = False):
    """A loopback LocalCluster (processes, 1 thread each) and its client, closed on exit."""
    from dkmeans.engine.client import start_local_cluster

    client = start_local_cluster(
        n_workers=n_workers, dashboard_address=None, set_as_default=set_as_default
    )
    try:
        yield client
    finally:
        cluster = client.cluster
        client.close()
        cluster.close()


@dataclass
class FitOutcome:
    """A finished run of a driver plus the final assignment (labels and objective of its centroids)."""

    result: object
    labels: object
    objective: float


def _with_assignment(data, result, keep_labels: bool) -> FitOutcome:
    import functools

    from dkmeans.fit.inference import labels
    from dkmeans.kernels.inference import labels_objective_block

    C = np.asarray(result.centroids).astype(data.dtype)
    block = functools.partial(labels_objective_block, normalize=False)
    found, objective = data.labelled_pass(block, (C,), keep_labels=keep_labels)
    if found is None and keep_labels:  # rows read from their source: lazy labels
        found = labels(data.X, C)
    labels = found
    return FitOutcome(result, labels, objective)


def fit_lloyd(data, initial_centroids, *, keep_labels: bool = True, **loop_options) -> FitOutcome:
    """:func:`dkmeans.drivers.lloyd.lloyd` on ``data`` (persisted or streamed) followed by the final assignment."""
    from dkmeans.drivers.lloyd import lloyd

    return _with_assignment(data, lloyd(data, initial_centroids, **loop_options), keep_labels)


def fit_hartigan(data, init, *, keep_labels: bool = True, **options) -> FitOutcome:
    """:func:`dkmeans.drivers.hartigan.hartigan` followed by the nearest-centroid assignment pass for its centroids.

    At a converged Hartigan partition every row of positive weight is strictly nearest
    its own centroid, so these labels are the partition's (up to exact ties and
    zero-weight rows).
    """
    from dkmeans.drivers.hartigan import hartigan

    return _with_assignment(data, hartigan(data, init, **options), keep_labels)
