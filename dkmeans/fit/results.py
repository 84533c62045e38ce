"""The end of a fit: the final assignment of the kept centroids and the result a face reads."""

from __future__ import annotations

import functools

import numpy as np

from dkmeans.fit import inference
from dkmeans.fit.inputs import Dataset, expand_labels
from dkmeans.fit.spec import FitResult, FitSpec
from dkmeans.kernels.inference import labels_objective_block
from dkmeans.kernels.namespace import is_cupy_array, to_host


def final_assignment(spec: FitSpec, dataset: Dataset, data, client, centroids):
    """Labels and objective of ``centroids`` on the data (what inference gives), the passes made, and per cluster
    the weighted sizes and objective (``dict(cluster_sizes=, cluster_objective=)``, float64), all from one pass."""
    # one pass where the rows are; the rows are the metric's already (a fit's unit rows for cosine)
    block = functools.partial(labels_objective_block, metric=spec.metric, normalize=False, with_weights=True)
    C = np.asarray(centroids).astype(data.dtype)
    # a Dask DataFrame gets index-aligned labels (fit_result): the final pass needs only the objective
    labels, inertia, sums = data.labelled_pass(block, (C,), keep_labels=dataset.frame is None, per_label=C.shape[0])
    if labels is None and dataset.frame is None:  # rows read from their source: labels stay lazy, read when used
        labels = inference.labels(dataset.array, C)
    n_passes = data.passes
    return labels, inertia, n_passes, dict(cluster_sizes=sums[:, 1], cluster_objective=sums[:, 0])


def labels_on_host(labels):
    """``labels`` in host memory: a CuPy array copied, a Dask array of CuPy chunks mapped
    chunk by chunk (lazily); anything else as it is."""
    if is_cupy_array(labels):
        return to_host(labels)
    if is_cupy_array(getattr(labels, "_meta", None)) and hasattr(labels, "map_blocks"):
        meta = np.empty((0,) * labels.ndim, labels.dtype)
        return labels.map_blocks(to_host, dtype=labels.dtype, meta=meta)
    return labels


def fit_result(spec, dataset, data, centroids, labels, inertia, n_iter, stop_reason, converged, history, n_passes,
            with_labels: bool = True, **extra) -> FitResult:
    """The :class:`FitResult`, with labels where the face wants them (after the data's release).

    ``with_labels=False`` (mini-batch's ``compute_labels=False``): no labels at all.
    """
    if not with_labels:
        labels = None
    elif dataset.frame is not None and not spec.capped:  # on the DataFrame's index, from its partitions (the final pass kept none)
        labels = inference.labels(dataset.frame, centroids, spec.metric, missing=dataset.missing)
    elif dataset.unfiltered is not None:  # missing="skip": every input row, -1 where one was left out
        labels = inference.labels(dataset.unfiltered, centroids, spec.metric, missing="skip")
    elif not dataset.is_dask and hasattr(labels, "compute"):  # in-memory input, labels from the cluster
        labels = labels.compute()
    if labels is not None and not dataset.on_device:
        labels = labels_on_host(labels)  # labels follow the input (host data, device="gpu")
    if with_labels and dataset.kept is not None:  # in memory, missing="skip": -1 for the rows left out
        labels = expand_labels(labels, dataset.kept)
    return FitResult(centroids, labels, inertia, n_iter, stop_reason, converged, history,
                     "in-memory" if data.in_memory else "out-of-core", n_passes, list(data.loop_modes), **extra)

