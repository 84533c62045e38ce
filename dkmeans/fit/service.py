"""The fit service: one whole fit behind every face.

:class:`KMeans.fit <dkmeans.KMeans>`, :func:`dkmeans.train` and ``dkmeans fit`` map their
users' words onto a :class:`~dkmeans.fit.spec.FitSpec` and call :func:`run_fit`, which owns
the rest:

1. the checks that need the validated data (initial centroids, ``n_clusters`` against
   the rows, weights, the seed);
2. the kernels' code path for the whole fit, and where the data lives
   (the engine's :mod:`dkmeans.engine.place`): in this process, persisted on the workers, or
   read from its source in every pass (out-of-core);
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

import contextlib
import dataclasses
import functools
import logging

import numpy as np
from threadpoolctl import ThreadpoolController, threadpool_limits

from dkmeans.drivers import init as init_strategies
from dkmeans.drivers.lloyd import CentroidShift, ObjectiveDecrease
from dkmeans.drivers.streams import derive_seed, resolve_seed
from dkmeans.engine.client import fit_client
from dkmeans.engine.local import ChunkList
from dkmeans.engine.place import in_process_threads, place_data, watch_passes
from dkmeans.engine.rowwise import weights_beside
from dkmeans.engine.sparse_rows import is_sparse_array
from dkmeans.errors import InvalidParameterError
from dkmeans.drivers.capacitated import CapacitatedPasses
from dkmeans.fit.capacity import capacitated_assignment, check_capped_spec, data_capacity
from dkmeans.fit.checkpoint_job import checkpoint_job
from dkmeans.fit.first_pass import check_rows_when_placed, first_pass
from dkmeans.fit.inputs import (Dataset, check_centroids, check_n_clusters_vs_rows, check_sample_weight,
                                kept_weights, named_missing)
from dkmeans.fit.metric_inputs import prepare_centroids, prepare_dataset, supports_local_search
from dkmeans.fit.minibatch import fit_minibatch, minibatch_sizes, run_partial_fit
from dkmeans.fit.results import final_assignment, fit_result
from dkmeans.fit.runs import FitPlan, callable_init, fit_runs, settles_start
from dkmeans.fit.spec import (FitResult, FitSpec, resolve_out_of_core, resolve_prune, two_level_clusters,
                              wants_local_search)
from dkmeans.kernels.plans import NUMPY_FIT_WORK, KernelPlan, plan as kernel_plan
from dkmeans.kernels.warm import warm_up


logger = logging.getLogger("dkmeans")


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
        C0 = check_centroids(spec.init, k, dataset.n_features, dtype, name=spec.names.get("init", "init"))
        C0 = prepare_centroids(C0, spec.metric, name=spec.names.get("init", "init"))
    if dataset.n_rows is not None:
        check_n_clusters_vs_rows(k, dataset.n_rows, spec.names.get("n_clusters", "n_clusters"))
    weights = check_sample_weight(kept_weights(dataset, sample_weight), dataset.n_rows)
    seed = resolve_seed(spec.random_state)
    searches = supports_local_search(spec.metric, is_sparse_array(dataset.array), algorithm=spec.algorithm,
                                     refine=spec.refine, local_search=spec.local_search)
    dataset = prepare_dataset(dataset, spec.metric)  # cosine: unit rows, normalised chunk by chunk where read
    if spec.algorithm == "minibatch" and spec.metric != "euclidean":  # never unit rows with Euclidean updates
        raise InvalidParameterError(f"mini-batch k-means is Euclidean only, not metric={spec.metric!r}")
    check_capped_spec(spec, is_sparse_array(dataset.array),
                      dataset.is_dask and dataset.missing == "skip")
    fit = fit_minibatch if spec.algorithm == "minibatch" else _fit
    with named_missing(dataset), placed(spec, dataset, weights) as (data, client):
        return fit(spec, dataset, data, C0, seed, client, searches)


@contextlib.contextmanager
def placed(spec: FitSpec, dataset: Dataset, weights, n_clusters: int | None = None):
    """The fit's data where it runs, under the fit's kernel plan: yields ``(data, client)``.

    In this process (``client`` None) when :func:`~dkmeans.engine.place.in_process_threads`
    says so, else placed on the cluster (:func:`~dkmeans.engine.place.place_data`), whose
    memory budget counts ``n_clusters`` centroids (default ``spec.n_clusters``). The kernel
    plan (:func:`dkmeans.kernels.plans.plan`) is chosen here, once, and is in force in this
    process and, carried by the placed data, in every task of the fit. The caller releases
    the data.
    """
    # out_of_core True, not "auto", sends the data to a cluster
    in_process = resolve_out_of_core(spec.out_of_core) != True  # noqa: E712
    threads = in_process_threads(dataset, weights) if in_process else None
    centroids = (spec.n_clusters if n_clusters is None else n_clusters) * max(1, spec.n_init)  # of all its runs
    plan = fit_plan(dataset, centroids, in_process=threads is not None)
    if threads is not None:
        data = ChunkList.from_array(dataset.local, weights, n_chunks=threads, threads=threads)
        # one BLAS thread per chunk thread, as on the workers
        small = plan.path == "numpy" and _small(dataset, centroids)
        with plan.applied(), threadpool_limits(limits=1) if threads > 1 else _one_blas_thread(small):
            yield data, None
        return
    with fit_client() as client:
        weights = weights_beside(weights, dataset.array)  # chunked once, like the rows
        data = place_data(client, dataset, weights, resolve_out_of_core(spec.out_of_core),
                          spec.n_clusters if n_clusters is None else n_clusters,
                          allow_hybrid=spec.algorithm != "minibatch", plan=plan)
        watch_passes(data, spec.on_pass)  # out of core: progress within each pass
        # workers without room for the compiled kernels (full of a previous computation): NumPy kernels
        if data.plan != plan:
            logger.info("the workers have no room below their pause threshold for the compiled kernels: "
                        "the fit runs the NumPy kernels")
        with data.plan.applied():
            yield data, client


def fit_plan(dataset: Dataset, n_clusters: int | None, in_process: bool = True) -> KernelPlan:
    """The kernel plan of a fit over ``dataset`` (:func:`dkmeans.kernels.plans.plan`) computing
    ``n_clusters`` centroids in all (times its runs; None: no size rule), here or on a cluster."""
    return kernel_plan(dataset.array.dtype, dataset.n_features, n_rows=dataset.n_rows, n_clusters=n_clusters,
                       sparse=is_sparse_array(dataset.array), in_process=in_process)


def _small(dataset: Dataset, n_clusters: int) -> bool:
    """Whether an in-process fit is small enough for one BLAS thread (:func:`_one_blas_thread`)."""
    n_rows = dataset.n_rows if dataset.n_rows is not None else 2**22
    return n_rows * max(1, dataset.n_features) * max(1, n_clusters) < NUMPY_FIT_WORK


def _one_blas_thread(small: bool):
    """A small fit on the NumPy code in this process's one thread: under one BLAS thread.

    Its BLAS products are small (k x d by d x rows); BLAS threads that wake and spin for each
    cost more than they share, the more so on a busy machine. Measured, a first default fit
    of 100,000 x 8 float32, k = 10, on 2 cores with other work running: 0.075-0.084 s under
    one OpenBLAS thread, 0.21-0.25 s under two. The thread pools are found once per process
    (:func:`_blas_pools`).
    """
    return _blas_pools().limit(limits=1, user_api="blas") if small else contextlib.nullcontext()


@functools.lru_cache(maxsize=1)
def _blas_pools() -> ThreadpoolController:
    """This process's thread pools (threadpoolctl scans the loaded libraries for them: 10-20 ms, once)."""
    return ThreadpoolController()


def _fit(spec: FitSpec, dataset: Dataset, data, C0, seed: int, client, searches: bool) -> FitResult:
    """The fit on placed data (in this process when ``client`` is None)."""
    try:
        check_rows_when_placed(spec, dataset, data)
        moments, mean_variance = first_pass(data)
        best, labels, inertia, n_passes, per_cluster = fit_placed(spec, dataset, data, C0, seed, client, searches,
                                                                  moments, mean_variance)
    finally:
        data.release()
    return fit_result(spec, dataset, data, best.centroids, labels, inertia, best.n_iter, best.stop_reason,
                      best.converged, list(best.history), n_passes, **per_cluster)


def fit_placed(spec: FitSpec, dataset: Dataset, data, C0, seed: int, client, searches: bool, moments,
               mean_variance: float):
    """The runs and the final assignment on placed data whose first pass was made.

    Returns ``(best run, labels, objective, passes, per-cluster sums)``
    (:func:`~dkmeans.fit.results.final_assignment`);
    the caller releases the data. A sweep runs this once per k on a view of the same data
    (:mod:`dkmeans.fit.sweep`).
    """
    k = spec.n_clusters
    capacity = data_capacity(spec, data)  # size caps against the placed rows (an error where they cannot hold)
    capacitated = CapacitatedPasses(capacity) if capacity is not None else None
    checkpointer, state = checkpoint_job(spec, data, moments, C0, seed)
    if spec.stop_rule == "objective-decrease":
        stop_rule = ObjectiveDecrease(spec.tol)
    else:
        stop_rule = CentroidShift(spec.tol * (mean_variance if spec.tol_relative else 1.0),
                                  inclusive=spec.tol_inclusive)

    def initialise(run: int) -> np.ndarray:
        if C0 is not None:
            return C0
        if callable(spec.init):
            return prepare_centroids(callable_init(spec, data, state.seed, run), spec.metric)
        strategy = init_strategies.get_strategy(spec.init)
        options = dataclasses.replace(spec.init_options, metric=spec.metric,
                                      two_level_min_clusters=two_level_clusters())
        if settles_start(data, plan, k):  # the sample's search chooses better than a second trial
            options = dataclasses.replace(options, recluster_trials=1)
        return prepare_centroids(strategy(data, k, derive_seed(state.seed, run), options), spec.metric)

    plan = FitPlan(
        n_init=spec.n_init, initialise=initialise, max_iter=spec.max_iter, stop_rule=stop_rule,
        lloyd=spec.algorithm == "lloyd",
        local_search=searches and wants_local_search(spec) and capacity is None,
        seed_of_run=lambda run: derive_seed(state.seed, run),
        hartigan_mode=spec.hartigan_mode if "hartigan" in (spec.algorithm, spec.refine) else None,
        hartigan_tol=spec.hartigan_tol, on_iteration=spec.on_iteration, metric=spec.metric,
        warm_start=isinstance(spec.init, str),  # a seeding's centroids, never the user's own
        prune=resolve_prune(spec.prune), on_run_start=spec.on_run_start, on_run_end=spec.on_run_end,
        capacity=capacity, capacitated=capacitated,
    )
    best = fit_runs(data, plan, state, checkpointer)
    if capacitated is not None:
        labels, inertia, n_passes, per_cluster = capacitated_assignment(spec, dataset, data, capacitated,
                                                                        best.centroids)
        per_cluster["capacity_passes"] = list(capacitated.passes_per_solve)
        return best, labels, inertia, n_passes, per_cluster
    labels, inertia, n_passes, per_cluster = final_assignment(spec, dataset, data, client, best.centroids)
    return best, labels, inertia, n_passes, per_cluster


__all__ = ["FitPlan", "FitResult", "FitSpec", "fit_placed", "fit_plan", "fit_runs", "minibatch_sizes", "place_data",
           "placed", "run_fit", "run_partial_fit", "warm_up"]
