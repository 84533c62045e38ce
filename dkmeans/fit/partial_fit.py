"""``partial_fit``'s work below the face: one mini-batch step on a checked batch, and the stream.

The face checks the batch (the one dataset check) and keeps the stream between calls; this module
checks what the step needs (rows against ``n_clusters`` on the first batch, the weights, finite
values), resolves the seed and batch size the first time, runs the step and labels the batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from dkmeans.drivers.state import MiniBatchState, history_dicts
from dkmeans.drivers.streams import resolve_seed
from dkmeans.errors import NON_FINITE_INPUT, InvalidDataError
from dkmeans.fit.inference import labels_and_objective
from dkmeans.fit.inputs import check_n_clusters_vs_rows, check_sample_weight
from dkmeans.fit.minibatch import run_partial_fit
from dkmeans.fit.spec import FitSpec


@dataclass
class PartialFitStep:
    """One ``partial_fit`` step's outcome and the stream after it.

    Attributes
    ----------
    state : MiniBatchState
        The stream after the step (centroids in float64 and the counts).
    seed, batch_size : int
        The stream's seed and the batch size its reassignment schedule counts.
    history : list of dict
        The step's record.
    labels, inertia : ndarray and float, or None
        The batch's labels and objective (None without ``compute_labels``).
    """

    state: MiniBatchState
    seed: int
    batch_size: int
    history: list
    labels: np.ndarray | None = None
    inertia: float | None = None


def partial_fit_step(
    spec: FitSpec,
    X,
    sample_weight,
    *,
    random_state,
    compute_labels: bool,
    stream: MiniBatchState | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    centers=None,
    counts=None,
) -> PartialFitStep:
    """One mini-batch step of ``spec`` on the in-memory batch ``X`` (rows checked by the face).

    Without ``centers`` this is the first batch: the centers are initialised from it. With
    ``centers`` but no ``stream`` (a model read from a file) the stream starts at ``centers``
    with ``counts`` (zeros where unknown); otherwise it continues from ``stream``, ``seed`` and
    ``batch_size``.
    """
    first = centers is None
    if first:
        check_n_clusters_vs_rows(spec.n_clusters, X.shape[0], "n_clusters")
    w = check_sample_weight(
        sample_weight, X.shape[0], positive_sum=False
    )  # a batch may weigh nothing
    if w is not None and np.all(w == 1.0):
        w = None  # unit weights: exactly the unweighted step, labels and inertia
    if not np.all(np.isfinite(X.data if sp.issparse(X) else X)):
        raise InvalidDataError(NON_FINITE_INPUT)
    if first:
        seed, batch_size, stream = (
            resolve_seed(random_state),
            min(spec.minibatch.batch_size, X.shape[0]),
            None,
        )
    elif stream is None:  # loaded from a file: counts unknown, start them at zero
        seed, batch_size = resolve_seed(random_state), min(spec.minibatch.batch_size, X.shape[0])
        stream = MiniBatchState(
            np.asarray(centers, np.float64), np.zeros(len(centers)) if counts is None else counts
        )
    spec = dataclasses.replace(
        spec, minibatch=dataclasses.replace(spec.minibatch, batch_size=batch_size)
    )
    state, record = run_partial_fit(spec, X, w, stream, seed)
    step = PartialFitStep(state, seed, batch_size, history_dicts([record]))
    if compute_labels:
        step.labels, step.inertia = labels_and_objective(
            X, state.centroids.astype(X.dtype), weights=w
        )
    return step


__all__ = ["PartialFitStep", "partial_fit_step"]
