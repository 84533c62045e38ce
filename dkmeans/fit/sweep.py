"""A k sweep: one fit per k on the same placed data, every pass over the data serving every k.

:func:`run_sweep` checks the specs once, places the data once and makes the first pass once
(column moments: finiteness, the scale of ``tol``, the row count where the metadata did not
give it). Then each k's fit (:func:`~dkmeans.fit.service.fit_placed`: its runs and final
assignment, exactly what :func:`~dkmeans.fit.service.run_fit` runs for that k) runs in a
thread of its own on a view of the data whose passes are combined with the other k's
(:class:`~dkmeans.engine.shared_passes.SharedPasses`): each k's model is the model of a single
fit with the same spec and seed, by construction, while the data is read about as many times
as the longest single fit reads it, not the sum.

Differences from single fits, none in the centroids' meaning:

* the loops of a single fit on persisted data may run inside one task or SPMD; in a sweep
  they run one combined pass at a time, so their sums combine in another order (equal up to
  float rounding, as any change of execution mode);
* the final objective of in-memory rows is summed per chunk (equal up to rounding);
* the memory budget of the placement counts the centroids of every k (all of them travel in
  a combined pass), so data at the edge of the budget may be placed otherwise than for one k.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

from dkmeans.drivers.streams import resolve_seed
from dkmeans.engine.shared_passes import SharedPasses
from dkmeans.engine.sparse_rows import is_sparse_array
from dkmeans.errors import InvalidParameterError
from dkmeans.fit.first_pass import check_rows_when_placed, first_pass
from dkmeans.fit.inputs import Dataset, check_n_clusters_vs_rows, check_sample_weight, kept_weights, named_missing
from dkmeans.fit.metric_inputs import prepare_dataset, supports_local_search
from dkmeans.fit.quality import cluster_scores
from dkmeans.fit.results import fit_result
from dkmeans.fit.service import fit_placed, placed
from dkmeans.fit.spec import FitResult, FitSpec


@dataclass
class SweepFit:
    """One k of a sweep: its fit (as :func:`~dkmeans.fit.service.run_fit` gives it) and its metrics."""

    result: FitResult
    metrics: dict


@dataclass
class SweepRun:
    """A finished sweep.

    Attributes
    ----------
    fits : list of SweepFit
        In the order of the specs. Each ``result.n_passes`` counts the passes that k's
        single fit makes (the first pass included).
    n_passes : int
        Passes over the data the whole sweep made (the first pass, the combined passes, the
        metrics' passes).
    data_mode : {"in-memory", "out-of-core"}
    """

    fits: list
    n_passes: int
    data_mode: str


def cluster_quality(data, centroids, metric: str, objective: float) -> dict:
    """The metrics of one k of a sweep, computed on its view of the shared data.

    :func:`~dkmeans.fit.quality.cluster_scores`' two passes run combined with the other k's
    like every other pass (``data`` is the k's
    :class:`~dkmeans.engine.shared_passes.SharedView`): the whole sweep's metrics cost two
    passes, whatever the number of k.
    """
    scores = cluster_scores(data, centroids, metric=metric)
    return {"objective": float(objective), "calinski_harabasz": float(scores.calinski_harabasz),
            "davies_bouldin": float(scores.davies_bouldin),
            "simplified_silhouette": float(scores.simplified_silhouette), "imbalance": float(scores.imbalance)}


def _check_specs(specs: Sequence[FitSpec]) -> None:
    """What a sweep takes: one fit per k, the same options besides ``n_clusters`` where placement depends on them."""
    if not specs:
        raise InvalidParameterError("a sweep needs at least one value of k")
    ks = [spec.n_clusters for spec in specs]
    if len(set(ks)) != len(ks):
        raise InvalidParameterError(f"the values of k must be distinct, got {ks}")
    first = specs[0]
    for spec in specs:
        if not isinstance(spec.init, str) and not callable(spec.init):
            raise InvalidParameterError("a sweep initialises each k with a strategy or a callable, not given centroids "
                                        "(their shape depends on k)")
        if spec.checkpoint is not None:
            raise InvalidParameterError("a sweep takes no checkpoint (one file per k would be needed)")
        if spec.algorithm == "minibatch":
            raise InvalidParameterError("a sweep fits KMeans (lloyd or hartigan), not mini-batch")
        for name in ("metric", "out_of_core", "algorithm"):
            if getattr(spec, name) != getattr(first, name):
                raise InvalidParameterError(f"every k of a sweep needs the same {name}")


def run_sweep(specs: Sequence[FitSpec], dataset: Dataset, sample_weight=None) -> SweepRun:
    """Fit every spec (one per k) on ``dataset``, sharing the passes over the data.

    Parameters
    ----------
    specs : sequence of FitSpec
        One per value of k (distinct ``n_clusters``; the same ``metric``, ``out_of_core`` and
        ``algorithm``); no checkpoint, no initial centroids.
    dataset : Dataset
    sample_weight : array-like or Dask array, optional

    Returns
    -------
    SweepRun

    Raises
    ------
    InvalidParameterError
        A ``k`` larger than the rows (before any pass where the row count is known, after
        the first pass otherwise), or specs a sweep does not take. An error of one k's fit
        stops the others and is raised with a note naming that k.
    """
    _check_specs(specs)
    if dataset.n_rows is not None:
        for spec in specs:
            check_n_clusters_vs_rows(spec.n_clusters, dataset.n_rows, spec.names.get("n_clusters", "n_clusters"))
    weights = check_sample_weight(kept_weights(dataset, sample_weight), dataset.n_rows)
    seeds = [resolve_seed(spec.random_state) for spec in specs]
    sparse = is_sparse_array(dataset.array)
    searches = [supports_local_search(spec.metric, sparse, algorithm=spec.algorithm, refine=spec.refine,
                                      local_search=spec.local_search) for spec in specs]
    dataset = prepare_dataset(dataset, specs[0].metric)
    # a combined pass carries every k's centroids: the placement's budget counts them all
    with named_missing(dataset), placed(specs[0], dataset, weights,
                                        n_clusters=sum(spec.n_clusters for spec in specs)) as (data, client):
        try:
            for spec in specs:
                check_rows_when_placed(spec, dataset, data)
            moments, mean_variance = first_pass(data)

            def one_k(i: int, view):
                spec = specs[i]
                fitted = fit_placed(spec, dataset, view, None, seeds[i], client, searches[i], moments, mean_variance)
                best, inertia = fitted[0], fitted[2]
                return (*fitted, view, cluster_quality(view, best.centroids, spec.metric, inertia))

            shared = SharedPasses(data)
            outcomes = shared.run([functools.partial(one_k, i) for i in range(len(specs))],
                                  names=[f"n_clusters={spec.n_clusters}" for spec in specs])
        finally:
            data.release()
    fits = []
    for spec, (best, labels, inertia, n_passes, per_cluster, view, metrics) in zip(specs, outcomes):
        result = fit_result(spec, dataset, view, best.centroids, labels, inertia, best.n_iter, best.stop_reason,
                            best.converged, list(best.history), n_passes, **per_cluster)
        fits.append(SweepFit(result, metrics))
    return SweepRun(fits, int(data.passes), "in-memory" if data.in_memory else "out-of-core")


__all__ = ["SweepFit", "SweepRun", "cluster_quality", "run_sweep"]
