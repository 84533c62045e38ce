"""The end of a fit: the final assignment of the kept centroids and the result a face reads."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from dkmeans.drivers.state import RunSummary
from dkmeans.engine.place import labels_like
from dkmeans.fit import inference
from dkmeans.fit.inputs import Dataset, expand_labels
from dkmeans.fit.spec import FitResult, FitSpec
from dkmeans.kernels.inference import labels_objective_block
from dkmeans.kernels.namespace import is_cupy_array, to_host


@dataclass(frozen=True)
class FinalAssignment:
    """The final assignment's pass (:func:`final_assignment`).

    Attributes
    ----------
    labels : ndarray, dask.array.Array or None
        Where the pass kept them (None: rows read from a DataFrame, labelled on its index later).
    objective : float
        Of the centroids on the data (what inference gives).
    n_passes : int
        Passes over the data, this one included.
    cluster_sizes, cluster_objective : ndarray (k,), float64, or None
        Per cluster: the weighted row count and the objective of its rows (None: no such pass).
    capacity_passes : list of int or None
        Size caps: the passes of each capacitated assignment of the fit (None: no caps).
    """

    labels: Any
    objective: float
    n_passes: int
    cluster_sizes: Any = None
    cluster_objective: Any = None
    capacity_passes: Any = None


@dataclass(frozen=True)
class PlacedFit:
    """A fit's runs and final assignment on placed data (:func:`dkmeans.fit.service.fit_placed`)."""

    best: RunSummary
    assignment: FinalAssignment


def final_assignment(spec: FitSpec, dataset: Dataset, data, client, centroids) -> FinalAssignment:
    """Labels and objective of ``centroids`` on the data (what inference gives), the passes made, and per cluster
    the weighted sizes and objective (float64), all from one pass."""
    # one pass where the rows are; the rows are the metric's already (a fit's unit rows for cosine)
    block = functools.partial(
        labels_objective_block, metric=spec.metric, normalize=False, with_weights=True
    )
    C = np.asarray(centroids).astype(data.dtype)
    # a Dask DataFrame gets index-aligned labels (fit_result): the final pass needs only the objective
    labels, inertia, sums = data.labelled_pass(
        block, (C,), keep_labels=dataset.frame is None, per_label=C.shape[0]
    )
    if (
        labels is None and dataset.frame is None
    ):  # rows read from their source: labels stay lazy, read when used
        labels = inference.labels(dataset.array, C)
    return FinalAssignment(
        labels, inertia, data.passes, cluster_sizes=sums[:, 1], cluster_objective=sums[:, 0]
    )


def labels_on_host(labels):
    """``labels`` in host memory: a CuPy array copied, a Dask array of CuPy chunks mapped
    chunk by chunk (lazily); anything else as it is."""
    if is_cupy_array(labels):
        return to_host(labels)
    if is_cupy_array(getattr(labels, "_meta", None)) and hasattr(labels, "map_blocks"):
        meta = np.empty((0,) * labels.ndim, labels.dtype)
        return labels.map_blocks(to_host, dtype=labels.dtype, meta=meta)
    return labels


def labels_on_device(labels):
    """``labels`` on the GPU, for input that was there but was fitted in host memory
    (``device="cpu"``, size caps, a mini-batch step, the bisecting tree): a NumPy array copied,
    a Dask array of NumPy chunks mapped chunk by chunk (lazily); CuPy labels as they are."""
    if labels is None or is_cupy_array(labels):
        return labels
    from dkmeans.engine.device import import_cupy, to_device

    if hasattr(labels, "map_blocks"):
        return to_device(labels, "gpu")  # (Dask arrays of CuPy chunks as they are)
    return import_cupy().asarray(labels)


def fit_result(
    spec: FitSpec,
    dataset: Dataset,
    data,
    run: RunSummary,
    assignment: FinalAssignment,
    *,
    with_labels: bool = True,
    minibatch_state=None,
) -> FitResult:
    """The :class:`FitResult` of the kept ``run`` and its final ``assignment`` (after the data's
    release), with labels where the face wants them.

    ``with_labels=False`` (mini-batch's ``compute_labels=False``): no labels at all.
    """
    centroids, labels = run.centroids, assignment.labels
    if not with_labels:
        labels = None
    elif (
        dataset.frame is not None and not spec.capped
    ):  # on the DataFrame's index, from its partitions (the final pass kept none)
        labels = inference.labels(dataset.frame, centroids, spec.metric, missing=dataset.missing)
    elif (
        dataset.unfiltered is not None
    ):  # missing="skip": every input row, -1 where one was left out
        labels = inference.labels(dataset.unfiltered, centroids, spec.metric, missing="skip")
    elif not dataset.is_dask and hasattr(
        labels, "compute"
    ):  # in-memory input, labels from the cluster
        labels = labels.compute()
    elif (
        dataset.is_dask
    ):  # a small Dask array fitted in this process: its labels a Dask array all the same
        labels = labels_like(labels, dataset)
    if labels is not None:  # labels follow the input (device="gpu" on host rows, "cpu" on CuPy)
        labels = labels_on_device(labels) if dataset.on_device else labels_on_host(labels)
    if (
        with_labels and dataset.kept is not None
    ):  # in memory, missing="skip": -1 for the rows left out
        labels = expand_labels(labels, dataset.kept)
    mode = "in-memory" if data.in_memory else "out-of-core"
    return FitResult(
        centroids,
        labels,
        assignment.objective,
        run.n_iter,
        run.stop_reason,
        run.converged,
        list(run.history),
        mode,
        assignment.n_passes,
        list(data.loop_modes),
        minibatch_state=minibatch_state,
        cluster_sizes=assignment.cluster_sizes,
        cluster_objective=assignment.cluster_objective,
        capacity_passes=assignment.capacity_passes,
    )


__all__ = ["FinalAssignment", "PlacedFit", "final_assignment", "fit_result", "labels_on_host"]
