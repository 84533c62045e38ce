"""Fit specifications and results: what a face asks of the fit service, and what it gets back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dkmeans import config
from dkmeans.drivers.init import InitOptions


class RunSpec:
    """The base of every fit's spec (:class:`FitSpec`,
    :class:`~dkmeans.fit.bisecting.BisectingSpec`): what a face's bookkeeping of a fit's runs
    reads, whatever the fit."""

    #: the fit's per-record progress hook; None: the fit reports no records (a bisecting fit)
    on_iteration: Callable | None = None
    n_init: int = 1

    @property
    def n_runs(self) -> int:
        """The runs the fit starts and ends (``n_init``)."""
        return self.n_init


@dataclass(frozen=True)
class FitSpec(RunSpec):
    """Everything a fit needs besides the data, in the fit service's names (already validated).

    Attributes
    ----------
    n_clusters : int
    init : str, ndarray or callable
        A strategy name (:data:`dkmeans.drivers.init.STRATEGIES`), initial centroids, or
        ``init(X, n_clusters, random_state) -> centroids`` (called on a sample of rows).
    n_init : int
    max_iter : int
    tol : float
    stop_rule : {"centroid-shift", "objective-decrease"}
    tol_relative : bool
        ``tol`` is relative to the data's mean feature variance (scikit-learn's rule).
    tol_inclusive : bool
        Centroid shift: stop at ``<= tol`` (scikit-learn) rather than ``< tol`` (oneDAL).
    algorithm : {"lloyd", "hartigan"}
    refine : {None, "hartigan"}
    hartigan_mode : {"safe", "unsafe"}
    hartigan_tol : float
        Hartigan also stops when a round lowers the objective by less than this.
    local_search : {"auto", True, False}
        Swap-based local search after Lloyd (:mod:`dkmeans.drivers.local_search`), then Lloyd
        again; "auto": when the initial centroids come from a seeding strategy.
    init_options : InitOptions
    random_state : None, int, Generator or RandomState
    checkpoint : path or None
    checkpoint_every : int
    out_of_core : {"auto", True, False}
    prune : {"auto", True, False}
        Pruned Lloyd passes over in-memory data (:mod:`dkmeans.drivers.pruned_lloyd`); "auto"
        resolves through the Dask config ``dkmeans.prune`` (:func:`resolve_prune`).
    on_iteration : callable, optional
        Progress callback for each Lloyd, local-search, Hartigan or mini-batch record. True
        from it asks the fit to stop: the loop ends after that step with its centroids, the
        run ends there (no later phase), and the runs left start only if ``on_run_end``
        allows (a scikit-learn callback's stop request, at the level it came from).
    on_run_start : callable, optional
        ``on_run_start(run)`` where each run (``n_init``; a mini-batch fit makes one) starts,
        before its initialisation: where progress displays begin a run.
    on_run_end : callable, optional
        ``on_run_end(run) -> bool`` after each run (``n_init``); True stops the runs left, and
        the best run made so far is the result (a callback's stop request).
    on_pass : callable, optional
        ``on_pass(event)``: progress within each pass over data read from its source (out of
        core): ``event`` is ``{"pass", "done", "total", "seconds"}``, pieces read of the pass's
        total (:meth:`dkmeans.engine.streamed.StreamedData.watch_passes`).
    job : dict
        The face's description of the job for the checkpoint (its name and parameters).
    names : dict
        What the face calls ``n_clusters`` and ``init`` (in error messages), where it differs.
    metric : {"euclidean", "cosine"}
        "cosine": spherical k-means (:mod:`dkmeans.fit.metric_inputs`): rows normalised where they are
        read, unit centroids, objective ``sum w (1 - cos)``; ``tol_relative`` is then relative
        to the mean feature variance of the normalised rows.
    minibatch : MiniBatchOptions, optional
        With ``algorithm="minibatch"``: the batch rules (:mod:`dkmeans.drivers.minibatch`);
        ``max_iter`` then counts epochs (passes' worth of rows) and ``tol`` bounds the
        squared center change of a step.
    init_size : int, optional
        Mini-batch: rows of the sample each initialisation runs on (scikit-learn's
        ``init_size``; default ``3 * batch_size``).
    compute_labels : bool
        Mini-batch: end with a pass for the labels and the objective (else the objective
        is the smoothed batch objective times the data's weight, as in scikit-learn).
    max_cluster_size, min_cluster_size : int, float or None
        Size caps (a count, or a fraction of the rows), resolved against the data by
        :func:`dkmeans.fit.capacity.resolve_capacity`; Lloyd then assigns under them.
    balanced : bool
        Caps of ``floor(n / k)`` and ``ceil(n / k)``.
    """

    n_clusters: int
    init: Any = "k-means||"
    n_init: int = 1
    max_iter: int = 300
    tol: float = 1e-4
    stop_rule: str = "centroid-shift"
    tol_relative: bool = True
    tol_inclusive: bool = True
    algorithm: str = "lloyd"
    refine: str | None = None
    hartigan_mode: str = "unsafe"
    hartigan_tol: float = 0.0
    local_search: Any = False
    init_options: InitOptions = field(default_factory=InitOptions)
    random_state: Any = None
    checkpoint: Any = None
    checkpoint_every: int = 10
    out_of_core: Any = "auto"
    prune: Any = "auto"
    on_iteration: Callable | None = None
    on_run_start: Callable | None = None
    on_run_end: Callable | None = None
    on_pass: Callable | None = None
    job: dict = field(default_factory=dict)
    names: dict = field(default_factory=dict)
    metric: str = "euclidean"
    minibatch: Any = None
    init_size: int | None = None
    compute_labels: bool = True
    max_cluster_size: Any = None
    min_cluster_size: Any = None
    balanced: bool = False

    @property
    def capped(self) -> bool:
        """Whether the fit assigns under size caps."""
        return (
            self.balanced or self.max_cluster_size is not None or self.min_cluster_size is not None
        )

    @property
    def n_runs(self) -> int:
        """The runs the fit starts and ends: ``n_init``; one for mini-batch (whose ``n_init`` are
        initialisations of its one run)."""
        return 1 if self.algorithm == "minibatch" else self.n_init


@dataclass
class FitResult:
    """A finished fit.

    Attributes
    ----------
    centroids : ndarray (k, d), the data's dtype
    labels : ndarray, dask.array.Array, dask Series, or None
        NumPy for in-memory input, a Dask array for a Dask array (persisted, or lazy for
        out-of-core data), a Dask Series on a Dask DataFrame's index.
    objective : float
        Of ``centroids`` on the data (what inference gives).
    n_iter : int
    stop_reason : str
    converged : bool
    history : list of IterationRecord / HartiganRecord
    data_mode : {"in-memory", "out-of-core"}
    n_passes : int
        Passes over the data, the final assignment included.
    loop_modes : list of str
        How each loop ran ("one-task", "spmd", "graph", "streamed").
    cluster_sizes, cluster_objective : ndarray (k,), float64, or None
        Per cluster: the weighted row count and the (weighted) objective of its rows, from
        the final assignment's pass (None where a fit made none).
    """

    centroids: np.ndarray
    labels: Any
    objective: float
    n_iter: int
    stop_reason: str
    converged: bool
    history: list
    data_mode: str
    n_passes: int
    loop_modes: list
    minibatch_state: Any = None  # MiniBatchState of a mini-batch fit (to continue with partial_fit)
    cluster_sizes: Any = None
    cluster_objective: Any = None
    #: size-capped fits: the passes each capacitated assignment took (its Lloyd partials' pass included)
    capacity_passes: Any = None


def resolve_out_of_core(requested) -> Any:
    """``requested`` unless it is "auto", else the Dask config ``dkmeans.out-of-core`` (default "auto")."""
    if requested != "auto":
        return requested
    return config.get("out-of-core")


def resolve_prune(requested) -> Any:
    """``requested`` unless it is "auto", else the Dask config ``dkmeans.prune`` (default "auto")."""
    if requested != "auto":
        return requested
    return config.get("prune")


def two_level_clusters() -> int:
    """k-means|| takes its two-level path from this ``n_clusters`` (Dask config, see dkmeans.drivers.init.two_level)."""
    return config.get("init.two-level-clusters")


def wants_local_search(spec: FitSpec) -> bool:
    """``local_search="auto"``: after Lloyd from a seeding strategy (not from given centroids)."""
    if spec.local_search == "auto":
        return spec.algorithm == "lloyd" and isinstance(spec.init, str)
    return bool(spec.local_search)
