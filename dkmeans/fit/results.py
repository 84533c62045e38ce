"""The end of a fit: the final assignment of the kept centroids and the result a face reads."""

from __future__ import annotations

from dkmeans.drivers.lloyd import objective
from dkmeans.fit import inference
from dkmeans.fit.inputs import Dataset
from dkmeans.fit.spec import FitResult, FitSpec
from dkmeans.kernels.cosine import objective_scale


def final_assignment(spec: FitSpec, dataset: Dataset, data, client, centroids):
    """Labels and objective of ``centroids`` on the data (what inference gives), and the passes made."""
    # the rows are the metric's already (a fit's unit rows for cosine)
    if data.kind == "local":
        labels, inertia = inference.labels_and_objective(dataset.local, centroids, spec.metric,
                                                         data.weights[0] if data.has_weights else None,
                                                         prepared=True)
    elif data.kind == "persisted":
        # a Dask DataFrame gets index-aligned labels below: the final pass needs only the objective
        labels, inertia = inference.labels_and_objective(data.X, centroids, spec.metric, data.weights, client=client,
                                                         keep="persist" if dataset.frame is None else "none",
                                                         prepared=True, generation=data.generation)
    else:  # labels stay lazy, computed from the source when used; the objective takes one pass
        # cosine: 1 - cos is half the squared distance of unit vectors
        inertia = objective(data, centroids) * objective_scale(spec.metric)
        labels = inference.labels(dataset.array, centroids.astype(dataset.array.dtype))
    n_passes = data.passes + 1 - (data.kind == "streamed" or data.kind == "hybrid")  # streamed: counted
    return labels, inertia, n_passes


def fit_result(spec, dataset, data, centroids, labels, inertia, n_iter, stop_reason, converged, history, n_passes,
            with_labels: bool = True, **extra) -> FitResult:
    """The :class:`FitResult`, with labels where the face wants them (after the data's release).

    ``with_labels=False`` (mini-batch's ``compute_labels=False``): no labels at all.
    """
    if not with_labels:
        labels = None
    elif dataset.frame is not None:  # on the DataFrame's index, from its partitions (the final pass kept none)
        labels = inference.labels(dataset.frame, centroids, spec.metric)
    elif not dataset.is_dask and data.kind != "local":
        labels = labels.compute()
    in_memory = data.kind in ("persisted", "local")
    return FitResult(centroids, labels, inertia, n_iter, stop_reason, converged, history,
                     "in-memory" if in_memory else "out-of-core", n_passes, list(data.loop_modes), **extra)

