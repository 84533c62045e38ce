"""One inference path: labels, distances and the objective of fixed centroids, for every input kind.

``predict``, ``transform`` and ``score`` of both estimators, :func:`dkmeans.infer`, the
DataFrame helpers and the fit's final assignment all come here. In-memory rows (NumPy, CuPy,
SciPy CSR) are computed at once; a Dask array gives lazy results (or one pass, for an
objective); a Dask DataFrame gives results on its index. Each chunk runs the kernels of
:mod:`dkmeans.kernels.inference` under the caller's kernel path, with the same
normalisation as the fit, so training labels are what ``predict`` gives.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from dkmeans.engine.columns import complete_rows, frame_to_array
from dkmeans.engine.rowwise import (
    frame_rows,
    index_meta,
    is_dask_array,
    labelled_pass,
    map_partitions,
    map_row_blocks,
    sum_on_cluster,
)
from dkmeans.io.dataframe import is_dask_dataframe
from dkmeans.kernels import plans
from dkmeans.kernels.inference import (
    distances_block,
    labels_block,
    labels_objective_block,
    objective_block,
)
from dkmeans.kernels.namespace import get_namespace, is_sparse


def _plan(X, C) -> plans.KernelPlan:
    """The kernel plan of an inference on ``X`` against ``C``: the caller's (a fit's), else one chosen
    as for a fit (:func:`dkmeans.kernels.plans.plan`; in-memory rows: with the size rule)."""
    active = plans.current()
    if active is not None:
        return active
    local = not is_dask_array(X) and not is_dask_dataframe(X)
    return plans.plan(
        getattr(X, "dtype", np.float64),
        X.shape[1] if len(X.shape) > 1 else 1,
        n_rows=X.shape[0] if local else None,
        n_clusters=max(1, len(C)) if local else None,
        sparse=is_sparse(X),
    )


def _pinned(fn, X, C):
    """``fn`` run under the caller's kernel plan (or one chosen here) wherever it runs, in tasks too."""
    return _plan(X, C).bind(fn)


def _rows(part, C, missing="error"):
    # every numeric column type, column by column; missing values: the one error, or NaN (missing="skip")
    return frame_to_array(part, C.dtype, missing=missing, where=" of a partition read")


def skipping(block_fn, fill, X, C, *args):
    """``block_fn(X, C, *args)`` on the rows of ``X`` with no NaN; ``fill`` in the rows of the others
    (``missing="skip"``: label -1, distances NaN, objective 0)."""
    if is_sparse(X) or not X.shape[0]:
        return block_fn(X, C, *args)
    keep = complete_rows(X)
    if keep.all():
        return block_fn(X, C, *args)
    part = block_fn(np.ascontiguousarray(X[keep]), C, *args)
    out = np.full((X.shape[0],) + part.shape[1:], fill, dtype=part.dtype)
    out[keep] = part
    return out


def _block(fn, fill, missing):
    return functools.partial(skipping, fn, fill) if missing == "skip" else fn


def _labels_partition(part, C, name, metric, missing="error"):
    out = _block(labels_block, -1, missing)(_rows(part, C, missing), C, metric)
    return pd.Series(out, index=part.index, name=name)


def _distances_partition(part, C, names, metric, missing="error"):
    out = _block(distances_block, np.nan, missing)(_rows(part, C, missing), C, metric)
    return pd.DataFrame(out, index=part.index, columns=names)


def labels(X, C, metric: str = "euclidean", *, name: str = "cluster", missing: str = "error"):
    """Index of the nearest centroid of every row (int32).

    Returns a NumPy/CuPy array for in-memory rows, a lazy Dask array for a Dask array, and a
    Dask Series on the input's index (named ``name``) for a Dask DataFrame. ``missing="skip"``:
    a row with a missing value (NaN) is labelled -1.
    """
    C = np.asarray(C)
    if is_dask_dataframe(X):
        meta = pd.Series(np.empty(0, np.int32), name=name, index=index_meta(X))
        return map_partitions(X, _labels_partition, C, name, metric, missing, meta=meta)
    block = _block(labels_block, -1, missing)
    if is_dask_array(X):
        return map_row_blocks(X, _pinned(block, X, C), C, metric, dtype=np.int32)
    return _plan(X, C).call(block, X, C, metric)


def distances(X, C, metric: str = "euclidean", *, names=None, missing: str = "error"):
    """Distances ``(n, k)`` of every row to every centroid: Euclidean, or ``1 - cos`` for cosine.

    A Dask DataFrame gives a Dask DataFrame with columns ``names`` on the input's index.
    ``missing="skip"``: NaN distances for a row with a missing value.
    """
    C = np.asarray(C)
    if is_dask_dataframe(X):
        names = [str(n) for n in names]
        meta = pd.DataFrame({n: np.empty(0, C.dtype) for n in names}, index=index_meta(X))
        return map_partitions(X, _distances_partition, C, names, metric, missing, meta=meta)
    block = _block(distances_block, np.nan, missing)
    if is_dask_array(X):
        return map_row_blocks(X, _pinned(block, X, C), C, metric, dtype=X.dtype, width=C.shape[0])
    return _plan(X, C).call(block, X, C, metric)


def objective(
    X, C, metric: str = "euclidean", sample_weight=None, *, client=None, missing: str = "error"
) -> float:
    """The (weighted) objective: the sum over rows of the squared distance (``1 - cos``) to the nearest centroid.

    ``sample_weight`` has been checked (:func:`dkmeans.fit.inputs.check_sample_weight`);
    Dask input takes one pass on ``client``. ``missing="skip"``: rows with a missing value add nothing.
    """
    C = np.asarray(C)
    block = _block(objective_block, 0.0, missing)
    if is_dask_dataframe(X):
        X = frame_rows(X, C.dtype, missing=missing)
        if sample_weight is not None:
            X = X.compute_chunk_sizes()
    if is_dask_array(X):
        return sum_on_cluster(
            client,
            map_row_blocks(X, _pinned(block, X, C), C, metric, dtype=np.float64),
            sample_weight,
        )
    d2 = _plan(X, C).call(block, X, C, metric)
    if sample_weight is not None:  # (NumPy weights of CuPy rows go to the device)
        d2 = d2 * get_namespace(d2).asarray(sample_weight, dtype=np.float64)
    return float(d2.sum())


def labels_and_objective(
    X,
    C,
    metric: str = "euclidean",
    weights=None,
    *,
    client=None,
    keep: str = "gather",
    prepared: bool = False,
    generation: int | None = None,
):
    """Labels and (weighted) objective in one pass: the fit's final assignment and :func:`dkmeans.infer`.

    ``prepared``: the rows are already the metric's (a fit's unit rows for cosine), so they
    are not normalised again. For Dask arrays ``keep`` says what becomes of the labels
    ("persist", "gather", "lazy" or "none"; see :func:`dkmeans.engine.rowwise.labelled_pass`);
    in-memory rows are labelled at once.
    """
    C = np.asarray(C).astype(X.dtype)
    block = functools.partial(_labels_objective, metric=metric, normalize=not prepared)
    if not is_dask_array(X):
        out = _plan(X, C).call(
            block, X, C, None if weights is None else np.asarray(weights, np.float64)
        )
        return out[:, 0].astype(np.int32), float(out[:, 1].sum())
    return labelled_pass(
        client, X, _pinned(block, X, C), (C,), weights, keep=keep, generation=generation
    )


def _labels_objective(X, C, w=None, *, metric, normalize):
    return labels_objective_block(X, C, w, metric=metric, normalize=normalize)


__all__ = ["distances", "labels", "labels_and_objective", "objective"]
