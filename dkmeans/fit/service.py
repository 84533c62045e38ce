"""The fit service: one whole fit behind every face.

:class:`KMeans.fit <dkmeans.KMeans>`, :func:`dkmeans.train` and ``dkmeans fit`` map their
users' words onto a :class:`~dkmeans.fit.spec.FitSpec` and call :func:`run_fit`, which owns
the rest:

1. the checks that need the validated data (initial centroids, ``n_clusters`` against
   the rows, weights, the seed);
2. the kernels' code path for the whole fit, and where the data lives
   (:func:`dkmeans.fit.placement.placed`, through the engine's :mod:`dkmeans.engine.place`): in
   this process, persisted on the workers, or read from its source in every pass (out-of-core);
3. the first pass (:mod:`dkmeans.fit.first_pass`: column moments: finiteness, the scale of
   scikit-learn's ``tol``, the checkpoint's fingerprint of the data) and the checkpoint job
   (:mod:`dkmeans.fit.checkpoint_job`);
4. ``n_init`` runs, each: initialisation, Lloyd, local search and/or Hartigan
   (:mod:`dkmeans.fit.runs`), or the mini-batch fit (:mod:`dkmeans.fit.minibatch`);
5. the final assignment and the result (:mod:`dkmeans.fit.results`), then the release of
   the persisted data.

The drivers see only the data protocol; the data's kind, the passes made and the loop
modes used are reported in the :class:`~dkmeans.fit.spec.FitResult`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dkmeans.drivers import init as init_strategies
from dkmeans.drivers.capacitated import CapacitatedPasses
from dkmeans.drivers.lloyd import CentroidShift, ObjectiveDecrease
from dkmeans.drivers.streams import derive_seed, resolve_seed
from dkmeans.engine.sparse_rows import is_sparse_array
from dkmeans.errors import InvalidParameterError
from dkmeans.fit.capacity import (
    capacitated_assignment,
    capped_rows,
    check_capped_spec,
    data_capacity,
)
from dkmeans.fit.checkpoint_job import checkpoint_job
from dkmeans.fit.first_pass import check_rows_when_placed, first_pass
from dkmeans.fit.inputs import (
    Dataset,
    check_n_clusters_vs_rows,
    check_sample_weight,
    check_user_centroids,
    kept_weights,
    named_missing,
)
from dkmeans.fit.metric_inputs import prepare_centroids, prepare_dataset, supports_local_search
from dkmeans.fit.minibatch import fit_minibatch, minibatch_sizes, run_partial_fit
from dkmeans.fit.placement import fit_placement, placed
from dkmeans.fit.results import PlacedFit, final_assignment, fit_result
from dkmeans.fit.runs import FitPlan, callable_init, fit_runs, settles_start
from dkmeans.fit.spec import (
    FitResult,
    FitSpec,
    resolve_prune,
    two_level_clusters,
    wants_local_search,
)
from dkmeans.kernels.warm import warm_up


def run_fit(spec: FitSpec, dataset: Dataset, sample_weight=None) -> FitResult:
    """Fit k-means on validated data (see the module docstring).

    Parameters
    ----------
    spec : FitSpec
    dataset : Dataset
        From :func:`dkmeans.fit.inputs.as_dataset` (or the estimator's equivalent).
    sample_weight : array-like or Dask array, optional
        Checked here against the data.

    Returns
    -------
    FitResult
    """
    k = spec.n_clusters
    dtype = dataset.array.dtype
    C0 = None
    if not isinstance(spec.init, str) and not callable(spec.init):
        C0 = check_user_centroids(
            spec.init, k, dataset.n_features, dtype, name=spec.names.get("init", "init")
        )
        C0 = prepare_centroids(C0, spec.metric, name=spec.names.get("init", "init"))
    if dataset.n_rows is not None:
        check_n_clusters_vs_rows(k, dataset.n_rows, spec.names.get("n_clusters", "n_clusters"))
    weights = check_sample_weight(kept_weights(dataset, sample_weight), dataset.n_rows)
    seed = resolve_seed(spec.random_state)
    searches = supports_local_search(
        spec.metric,
        is_sparse_array(dataset.array),
        algorithm=spec.algorithm,
        refine=spec.refine,
        local_search=spec.local_search,
    )
    dataset = prepare_dataset(
        dataset, spec.metric
    )  # cosine: unit rows, normalised chunk by chunk where read
    if (
        spec.algorithm == "minibatch" and spec.metric != "euclidean"
    ):  # never unit rows with Euclidean updates
        raise InvalidParameterError(
            f"mini-batch k-means is Euclidean only, not metric={spec.metric!r}"
        )
    check_capped_spec(
        spec, is_sparse_array(dataset.array), dataset.is_dask and dataset.missing == "skip"
    )
    dataset = capped_rows(spec, dataset)  # the capped kernels run in host memory
    fit = fit_minibatch if spec.algorithm == "minibatch" else _fit
    with named_missing(dataset), placed(dataset, weights, **fit_placement(spec)) as (data, client):
        return fit(spec, dataset, data, C0, seed, client, searches)


def _fit(spec: FitSpec, dataset: Dataset, data, C0, seed: int, client, searches: bool) -> FitResult:
    """The fit on placed data (in this process when ``client`` is None)."""
    try:
        check_rows_when_placed(spec, dataset, data)
        moments, mean_variance = first_pass(data)
        fitted = fit_placed(spec, dataset, data, C0, seed, client, searches, moments, mean_variance)
    finally:
        data.release()
    return fit_result(spec, dataset, data, fitted.best, fitted.assignment)


def fit_placed(
    spec: FitSpec,
    dataset: Dataset,
    data,
    C0,
    seed: int,
    client,
    searches: bool,
    moments,
    mean_variance: float,
) -> PlacedFit:
    """The runs and the final assignment on placed data whose first pass was made.

    Returns the best run and its :func:`~dkmeans.fit.results.final_assignment`; the caller
    releases the data. A sweep runs this once per k on a view of the same data
    (:mod:`dkmeans.fit.sweep`).
    """
    k = spec.n_clusters
    capacity = data_capacity(
        spec, data
    )  # size caps against the placed rows (an error where they cannot hold)
    capacitated = CapacitatedPasses(capacity) if capacity is not None else None
    checkpointer, state = checkpoint_job(spec, data, moments, C0, seed)
    if spec.stop_rule == "objective-decrease":
        stop_rule = ObjectiveDecrease(spec.tol)
    else:
        stop_rule = CentroidShift(
            spec.tol * (mean_variance if spec.tol_relative else 1.0), inclusive=spec.tol_inclusive
        )

    def initialise(run: int) -> np.ndarray:
        if C0 is not None:
            return C0
        if callable(spec.init):
            return prepare_centroids(callable_init(spec, data, state.seed, run), spec.metric)
        strategy = init_strategies.get_strategy(spec.init)
        options = dataclasses.replace(
            spec.init_options, metric=spec.metric, two_level_min_clusters=two_level_clusters()
        )
        if settles_start(data, plan, k):  # the sample's search chooses better than a second trial
            options = dataclasses.replace(options, recluster_trials=1)
        return prepare_centroids(
            strategy(data, k, derive_seed(state.seed, run), options), spec.metric
        )

    plan = FitPlan(
        n_init=spec.n_init,
        initialise=initialise,
        max_iter=spec.max_iter,
        stop_rule=stop_rule,
        lloyd=spec.algorithm == "lloyd",
        local_search=searches and wants_local_search(spec) and capacity is None,
        seed_of_run=lambda run: derive_seed(state.seed, run),
        hartigan_mode=spec.hartigan_mode if "hartigan" in (spec.algorithm, spec.refine) else None,
        hartigan_tol=spec.hartigan_tol,
        on_iteration=spec.on_iteration,
        metric=spec.metric,
        warm_start=isinstance(spec.init, str),  # a seeding's centroids, never the user's own
        prune=resolve_prune(spec.prune),
        on_run_start=spec.on_run_start,
        on_run_end=spec.on_run_end,
        capacity=capacity,
        capacitated=capacitated,
    )
    best = fit_runs(data, plan, state, checkpointer)
    if capacitated is not None:
        return PlacedFit(
            best, capacitated_assignment(spec, dataset, data, capacitated, best.centroids)
        )
    return PlacedFit(best, final_assignment(spec, dataset, data, client, best.centroids))


__all__ = [
    "FitPlan",
    "FitResult",
    "FitSpec",
    "fit_placed",
    "fit_runs",
    "minibatch_sizes",
    "run_fit",
    "run_partial_fit",
    "warm_up",
]
