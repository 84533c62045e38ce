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

Two more jobs ride the same passes, for the rules that choose k (:mod:`dkmeans.fit.krules`):
the gap statistic's reference fits (:func:`~dkmeans.fit.gap.reference_curve`, Euclidean only)
and the sample of rows the silhouette of every k is computed on
(:func:`~dkmeans.fit.quality.sample_rows`, one pass).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dkmeans.drivers.streams import resolve_seed
from dkmeans.engine.shared_passes import SharedPasses
from dkmeans.engine.sparse_rows import is_sparse_array
from dkmeans.errors import InvalidParameterError
from dkmeans.fit.capacity import capped_rows, check_capped_spec
from dkmeans.fit.first_pass import check_rows_when_placed, first_pass
from dkmeans.fit.gap import ReferenceCurve, reference_curve
from dkmeans.fit.inputs import (
    Dataset,
    check_n_clusters_vs_rows,
    check_sample_weight,
    kept_weights,
    named_missing,
)
from dkmeans.fit.krules import bic_score
from dkmeans.fit.metric_inputs import prepare_dataset, supports_local_search
from dkmeans.fit.placement import fit_placement, placed
from dkmeans.fit.quality import cluster_scores, sample_rows
from dkmeans.fit.results import PlacedFit, fit_result
from dkmeans.fit.service import fit_placed
from dkmeans.fit.spec import FitResult, FitSpec
from dkmeans.kernels.inference import labels_block
from dkmeans.kernels.namespace import to_host

nan = float("nan")


@dataclass
class SweepFit:
    """One k of a sweep: its fit (as :func:`~dkmeans.fit.service.run_fit` gives it) and its metrics."""

    result: FitResult
    metrics: dict


@dataclass(frozen=True)
class _KFit:
    """One k's job of a sweep, as it ended on its view of the shared data."""

    fitted: PlacedFit
    view: Any
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
    reference : ReferenceCurve or None
        The gap statistic's reference curve (None without reference draws, or for cosine).
    """

    fits: list
    n_passes: int
    data_mode: str
    reference: ReferenceCurve | None = None


def cluster_quality(data, centroids, metric: str, objective: float | None = None) -> dict:
    """The metrics of one k of a sweep, computed on its view of the shared data.

    :func:`~dkmeans.fit.quality.cluster_scores`' two passes run combined with the other k's
    like every other pass (``data`` is the k's
    :class:`~dkmeans.engine.shared_passes.SharedView`): the whole sweep's metrics cost two
    passes, whatever the number of k. ``objective`` None: the rows' objective at their nearest
    centroid, from those passes.
    """
    scores = cluster_scores(data, centroids, metric=metric)
    objective = scores.objective if objective is None else objective
    return {
        "objective": float(objective),
        "calinski_harabasz": float(scores.calinski_harabasz),
        "davies_bouldin": float(scores.davies_bouldin),
        "simplified_silhouette": float(scores.simplified_silhouette),
        "imbalance": float(scores.imbalance),
        "bic": bic_score(scores.sizes, float(scores.objective), data.n_features)
        if scores.valid
        else nan,
    }


def sample_silhouettes(rows, centroids: dict, metric: str) -> dict:
    """The silhouette of the sampled ``rows`` labelled by each k's nearest centroid (or NaN).

    scikit-learn's ``silhouette_score`` on the same rows and labels; the rows are the metric's
    rows (unit rows for cosine), as the other scores see them.
    """
    from sklearn.metrics import silhouette_score

    out = {}
    for k, C in centroids.items():
        labels = np.asarray(labels_block(rows, np.asarray(to_host(C)).astype(rows.dtype), metric))
        n_labels = np.unique(labels).size
        out[k] = float(silhouette_score(rows, labels)) if 1 < n_labels < rows.shape[0] else nan
    return out


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
            raise InvalidParameterError(
                "a sweep initialises each k with a strategy or a callable, not given centroids "
                "(their shape depends on k)"
            )
        if spec.checkpoint is not None:
            raise InvalidParameterError(
                "a sweep takes no checkpoint (one file per k would be needed)"
            )
        if spec.algorithm == "minibatch":
            raise InvalidParameterError("a sweep fits KMeans (lloyd or hartigan), not mini-batch")
        for name in ("metric", "out_of_core", "algorithm", "capped"):
            if getattr(spec, name) != getattr(first, name):
                raise InvalidParameterError(f"every k of a sweep needs the same {name}")


def run_sweep(
    specs: Sequence[FitSpec],
    dataset: Dataset,
    sample_weight=None,
    *,
    reference_draws: int = 5,
    reference_rows: int = 20_000,
    silhouette_rows: int = 2_000,
) -> SweepRun:
    """Fit every spec (one per k) on ``dataset``, sharing the passes over the data.

    Parameters
    ----------
    specs : sequence of FitSpec
        One per value of k (distinct ``n_clusters``; the same ``metric``, ``out_of_core`` and
        ``algorithm``); no checkpoint, no initial centroids.
    dataset : Dataset
    sample_weight : array-like or Dask array, optional
    reference_draws : int
        Reference data sets of the gap statistic (0: no gap; Euclidean only).
    reference_rows : int
        Rows of each reference data set (at most the data's).
    silhouette_rows : int
        Rows of the sample every k's silhouette is computed on (0: none).

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
            check_n_clusters_vs_rows(
                spec.n_clusters, dataset.n_rows, spec.names.get("n_clusters", "n_clusters")
            )
    weights = check_sample_weight(kept_weights(dataset, sample_weight), dataset.n_rows)
    seeds = [resolve_seed(spec.random_state) for spec in specs]
    sparse = is_sparse_array(dataset.array)
    searches = [
        supports_local_search(
            spec.metric,
            sparse,
            algorithm=spec.algorithm,
            refine=spec.refine,
            local_search=spec.local_search,
        )
        for spec in specs
    ]
    dataset = prepare_dataset(dataset, specs[0].metric)
    for spec in specs:  # as a single fit checks its caps, before any work
        check_capped_spec(spec, sparse, dataset.is_dask and dataset.missing == "skip")
    dataset = capped_rows(specs[0], dataset)  # the capped kernels run in host memory
    with_gap = reference_draws > 0 and specs[0].metric == "euclidean" and not sparse
    with_sample = silhouette_rows > 0 and not sparse
    # a combined pass carries every k's centroids: the placement's budget counts them all
    placement = fit_placement(specs[0], n_clusters=sum(spec.n_clusters for spec in specs))
    with named_missing(dataset), placed(dataset, weights, **placement) as (data, client):
        try:
            for spec in specs:
                check_rows_when_placed(spec, dataset, data)
            moments, mean_variance = first_pass(data)

            def one_k(i: int, view) -> _KFit:
                spec = specs[i]
                fitted = fit_placed(
                    spec, dataset, view, None, seeds[i], client, searches[i], moments, mean_variance
                )
                return _KFit(
                    fitted,
                    view,
                    cluster_quality(
                        view, fitted.best.centroids, spec.metric, fitted.assignment.objective
                    ),
                )

            jobs = [functools.partial(one_k, i) for i in range(len(specs))]
            names = [f"n_clusters={spec.n_clusters}" for spec in specs]
            if with_gap:
                ks = [spec.n_clusters for spec in specs]
                jobs.append(
                    lambda view: reference_curve(
                        view, ks, seeds[0], draws=reference_draws, max_rows=reference_rows
                    )
                )
                names.append("gap reference")
            if with_sample:
                jobs.append(lambda view: sample_rows(view, silhouette_rows, seeds[0])[1])
                names.append("silhouette sample")
            outcomes = SharedPasses(data).run(jobs, names=names)
        finally:
            data.release()
    reference = outcomes[len(specs)] if with_gap else None
    silhouettes = {}
    if with_sample:
        centroids = {spec.n_clusters: o.fitted.best.centroids for spec, o in zip(specs, outcomes)}
        rows = np.asarray(to_host(outcomes[-1]))
        silhouettes = sample_silhouettes(rows, centroids, specs[0].metric)
    fits = []
    for spec, k_fit in zip(specs, outcomes[: len(specs)]):
        fitted = k_fit.fitted
        result = fit_result(spec, dataset, k_fit.view, fitted.best, fitted.assignment)
        metrics = {**k_fit.metrics, "silhouette": silhouettes.get(spec.n_clusters, nan)}
        if reference is not None and spec.n_clusters in reference.mean_log:
            sd = reference.sd_log[spec.n_clusters] * np.sqrt(1 + 1 / reference.draws)
            gap = reference.gap(spec.n_clusters, fitted.assignment.objective)
            metrics.update(gap=gap, gap_sd=float(sd))
        fits.append(SweepFit(result, metrics))
    mode = "in-memory" if data.in_memory else "out-of-core"
    return SweepRun(fits, int(data.passes), mode, reference)


@dataclass
class ScoredCentroids:
    """The per-k metrics of given centroids (:func:`score_centroids`).

    Attributes
    ----------
    metrics : dict of int to dict
        Per k: :func:`cluster_quality`'s metrics (the objective of every row at its nearest
        centroid), the sampled silhouette, and the gap with its standard error where there
        is a reference curve.
    n_passes : int
    data_mode : {"in-memory", "out-of-core"}
    reference : ReferenceCurve or None
    """

    metrics: dict
    n_passes: int
    data_mode: str
    reference: ReferenceCurve | None = None


def score_centroids(
    centroids: dict,
    dataset: Dataset,
    sample_weight=None,
    *,
    seed: int,
    out_of_core="auto",
    reference_draws: int = 5,
    reference_rows: int = 20_000,
    silhouette_rows: int = 2_000,
) -> ScoredCentroids:
    """The metrics the rules of :mod:`dkmeans.fit.krules` read, for centroids fitted elsewhere.

    The sweep of a bisecting tree (one fit gives the centroids of every k) scores each k's
    centroids here: every row labelled by its nearest centroid (as ``KMeans.predict`` would
    label it), the cluster scores of every k in the same two combined passes, the gap's
    reference fits and the silhouette's sample riding them, as in :func:`run_sweep`.

    Parameters
    ----------
    centroids : dict of int to ndarray (k, n_features)
        Per value of k, Euclidean.
    dataset : Dataset
        Checked already (the fit of the centroids read it).
    sample_weight : array-like or Dask array, optional
    seed : int
        The resolved seed of the gap's reference draws and the silhouette's sample.
    out_of_core : {"auto", True, False}
        Where the data lives, as for a fit.
    reference_draws, reference_rows, silhouette_rows : int
        As :func:`run_sweep` takes them.

    Returns
    -------
    ScoredCentroids
    """
    ks = sorted(centroids)
    weights = check_sample_weight(kept_weights(dataset, sample_weight), dataset.n_rows)
    sparse = is_sparse_array(dataset.array)
    dataset = prepare_dataset(dataset, "euclidean")
    spec = FitSpec(n_clusters=max(ks), out_of_core=out_of_core)
    with_gap, with_sample = reference_draws > 0 and not sparse, silhouette_rows > 0 and not sparse
    placement = fit_placement(spec, n_clusters=sum(ks))
    with named_missing(dataset), placed(dataset, weights, **placement) as (data, _):
        try:
            jobs = [functools.partial(_quality_of, centroids[k]) for k in ks]
            names = [f"n_clusters={k}" for k in ks]
            if with_gap:
                jobs.append(
                    lambda view: reference_curve(
                        view, ks, seed, draws=reference_draws, max_rows=reference_rows
                    )
                )
                names.append("gap reference")
            if with_sample:
                jobs.append(lambda view: sample_rows(view, silhouette_rows, seed)[1])
                names.append("silhouette sample")
            outcomes = SharedPasses(data).run(jobs, names=names)
        finally:
            data.release()
    reference = outcomes[len(ks)] if with_gap else None
    silhouettes = {}
    if with_sample:
        silhouettes = sample_silhouettes(np.asarray(to_host(outcomes[-1])), centroids, "euclidean")
    metrics = {}
    for k, quality in zip(ks, outcomes):
        metrics[k] = {**quality, "silhouette": silhouettes.get(k, nan)}
        if reference is not None and k in reference.mean_log:
            sd = reference.sd_log[k] * np.sqrt(1 + 1 / reference.draws)
            metrics[k].update(gap=reference.gap(k, quality["objective"]), gap_sd=float(sd))
    mode = "in-memory" if data.in_memory else "out-of-core"
    return ScoredCentroids(metrics, int(data.passes), mode, reference)


def _quality_of(centroids, view) -> dict:
    return cluster_quality(view, centroids, "euclidean")


__all__ = [
    "ScoredCentroids",
    "SweepFit",
    "SweepRun",
    "cluster_quality",
    "run_sweep",
    "sample_silhouettes",
    "score_centroids",
]
