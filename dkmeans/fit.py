"""The fit service: one whole fit on a cluster, behind every face.

:class:`KMeans.fit <dkmeans.KMeans>`, :func:`dkmeans.train` and ``dkmeans fit`` map their
users' words onto a :class:`FitSpec` and call :func:`run_fit`, which owns the rest:

1. the checks that need the validated data (initial centroids, ``n_clusters`` against
   the rows, weights, the seed);
2. where the data lives for the fit (:func:`place_data`): persisted on the workers when it
   fits the cluster's memory budget, read from its source in every pass when it does not
   (out-of-core), as forced by ``out_of_core`` or the Dask config ``dkmeans.out-of-core``;
3. the first pass (column moments: finiteness, the scale of scikit-learn's ``tol``, the
   checkpoint's fingerprint of the data);
4. the checkpoint job and its state;
5. ``n_init`` runs, each: initialisation, Lloyd and/or Hartigan (:func:`fit_runs`);
6. the final assignment (labels and objective of the kept centroids, what inference
   gives for them), then the release of the persisted data.

The drivers see only the data protocol; the data's kind, the passes made and the loop
modes used are reported in the :class:`FitResult`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import dask
import dask.array as da
import numpy as np
from dask.utils import parse_bytes
from threadpoolctl import threadpool_limits

from dkmeans import init as init_strategies
from dkmeans._random import resolve_seed
from dkmeans._validation import Dataset, check_centroids, check_n_clusters_vs_rows, check_sample_weight
from dkmeans.backend import is_sparse
from dkmeans.assignment import assign_dataset, assign_local, lazy_labels
from dkmeans.cluster import current_client, fit_client, in_daemon_process
from dkmeans.engine import MemoryBudget, PersistedData, StreamedData, gather
from dkmeans.engine.local import ChunkList
from dkmeans.engine.hybrid import HybridData
from dkmeans.engine.sources import parquet_source
from dkmeans.engine.streamed import rows_in_block
from dkmeans.errors import NON_FINITE_INPUT, InvalidDataError, InvalidParameterError
from dkmeans.hartigan import hartigan
from dkmeans.init import InitOptions, derive_seed
from dkmeans.init.options import DEFAULT_TWO_LEVEL_CLUSTERS, TWO_LEVEL_CLUSTERS_KEY
from dkmeans.io.checkpoint import Checkpointer, data_fingerprint
from dkmeans.io.dataframe import predict_series
from dkmeans.io.model_file import digest
from dkmeans.kernels import DEFAULT_SCRATCH_BYTES, column_moments, combine_moments
from dkmeans.kernels.common import centroid_bytes
from dkmeans.kernels.assign import compiled_kinds
from dkmeans.kernels.compile import COMPILE_FIRST_ELEMENTS, call_pinned, pinned, resolve_path
from dkmeans.engine.context import InContext
from dkmeans.minibatch import MiniBatchOptions, advance, gather_rows, minibatch, minibatch_pass, step_rng
from dkmeans.lloyd import CentroidShift, ObjectiveDecrease, lloyd, objective, stop_after_update
from dkmeans.local_search import CONFIRM_ITERS, coreset_local_search, coreset_searches, coreset_start
from dkmeans.kernels.cosine import objective_scale
from dkmeans.metric import (is_sparse_array, prepare_centroids, prepare_dataset, sparse_row_bytes,
                            supports_local_search)
from dkmeans.kernels import assign_partials
from dkmeans.kernels.sparse import take_rows
from dkmeans.state import FitState, LoopState, MiniBatchState, PassState, RunSummary

logger = logging.getLogger("dkmeans")

#: Dask config key (env ``DASK_DKMEANS__OUT_OF_CORE``): "auto", True or False; a fit's
#: ``out_of_core`` parameter other than "auto" wins.
OUT_OF_CORE_KEY = "dkmeans.out-of-core"
#: Dask config key (env ``DASK_DKMEANS__IN_PROCESS_BYTES``): in-memory (NumPy, pandas) data
#: of at most this size is fitted in the calling process, in one thread; larger in-memory data
#: too when no Dask client exists, on a thread per core (see :func:`_in_process_threads`); 0
#: sends all data to a cluster.
IN_PROCESS_BYTES_KEY = "dkmeans.in-process-bytes"
#: 100,000 x 8 float32 is 3 MiB; a cluster round trip per pass costs more than such a pass.
DEFAULT_IN_PROCESS_BYTES = "32MiB"


@dataclass(frozen=True)
class FitSpec:
    """Everything a fit needs besides the data, in the fit service's names (already validated).

    Attributes
    ----------
    n_clusters : int
    init : str, ndarray or callable
        A strategy name (:data:`dkmeans.init.STRATEGIES`), initial centroids, or
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
        Swap-based local search after Lloyd (:mod:`dkmeans.local_search`), then Lloyd
        again; "auto": when the initial centroids come from a seeding strategy.
    init_options : InitOptions
    random_state : None, int, Generator or RandomState
    checkpoint : path or None
    checkpoint_every : int
    out_of_core : {"auto", True, False}
    on_iteration : callable, optional
        Progress callback for each Lloyd or Hartigan record.
    job : dict
        The face's description of the job for the checkpoint (its name and parameters).
    names : dict
        What the face calls ``n_clusters`` and ``init`` (in error messages), where it differs.
    metric : {"euclidean", "cosine"}
        "cosine": spherical k-means (:mod:`dkmeans.metric`): rows normalised where they are
        read, unit centroids, objective ``sum w (1 - cos)``; ``tol_relative`` is then relative
        to the mean feature variance of the normalised rows.
    minibatch : MiniBatchOptions, optional
        With ``algorithm="minibatch"``: the batch rules (:mod:`dkmeans.minibatch`);
        ``max_iter`` then counts epochs (passes' worth of rows) and ``tol`` bounds the
        squared center change of a step.
    init_size : int, optional
        Mini-batch: rows of the sample each initialisation runs on (scikit-learn's
        ``init_size``; default ``3 * batch_size``).
    compute_labels : bool
        Mini-batch: end with a pass for the labels and the objective (else the objective
        is the smoothed batch objective times the data's weight, as in scikit-learn).
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
    on_iteration: Callable | None = None
    job: dict = field(default_factory=dict)
    names: dict = field(default_factory=dict)
    metric: str = "euclidean"
    minibatch: Any = None
    init_size: int | None = None
    compute_labels: bool = True


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


# -- where the data lives ---------------------------------------------------------------
#: Out-of-core data keeps its leading chunks persisted when they hold at least this share
#: of the rows (and fit the persist budget); below it, streaming all of it is as fast.
HYBRID_MIN_SHARE = 0.2
#: Data of unknown length is estimated from its first partition times the partition count;
#: it is persisted only if this multiple of the estimate fits (partitions differ in size).
SIZE_ESTIMATE_MARGIN = 1.5

def _moments_chunk(X, w, offset):
    return column_moments(X)


def resolve_out_of_core(requested) -> Any:
    """``requested`` unless it is "auto", else the Dask config ``dkmeans.out-of-core`` (default "auto")."""
    if requested != "auto":
        return requested
    value = dask.config.get(OUT_OF_CORE_KEY, "auto")
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if value not in ("auto", True, False):
        raise InvalidParameterError(f"Dask config {OUT_OF_CORE_KEY!r} must be 'auto', True or False, got {value!r}")
    return value


def _two_level_clusters() -> int:
    """k-means|| takes its two-level path from this ``n_clusters`` (Dask config, see dkmeans.init.two_level)."""
    value = int(dask.config.get(TWO_LEVEL_CLUSTERS_KEY, DEFAULT_TWO_LEVEL_CLUSTERS))
    if value < 1:
        raise InvalidParameterError(f"Dask config {TWO_LEVEL_CLUSTERS_KEY!r} must be a positive integer, got {value}")
    return value


def _estimated_rows(client, X) -> int:
    """Rows of ``X`` estimated from its first chunk (read once) when its chunk lengths are unknown."""
    if not any(math.isnan(c) for c in X.chunks[0]):
        return int(sum(X.chunks[0]))
    first = X.blocks[0].map_blocks(rows_in_block, dtype=np.int64, chunks=((1,),), drop_axis=1)
    return int(gather(client, client.compute(first))[0]) * X.numblocks[0]


def place_data(client, dataset: Dataset, weights, out_of_core="auto", n_clusters: int = 0,
               allow_hybrid: bool = True):
    """The data protocol object for this fit: persisted if it fits the memory budget, else streamed.

    Where the size is not in the metadata (a Dask DataFrame of unknown partition
    lengths, read from Parquet or CSV), it is estimated from the first partition (read
    once) with a margin of :data:`SIZE_ESTIMATE_MARGIN`; streamed data then counts its rows
    exactly in its first pass. The budget counts the memory the ``n_clusters`` centroids
    take on each worker during a pass (:func:`~dkmeans.kernels.common.centroid_bytes`).
    """
    mode = resolve_out_of_core(out_of_core)
    budget = MemoryBudget.of(client, DEFAULT_SCRATCH_BYTES,
                             centroid_bytes(n_clusters, dataset.n_features, dataset.array.dtype.itemsize),
                             kernels=None if is_sparse_array(dataset.array) else (dataset.array.dtype, dataset.n_features))
    overhead = 3.0 if dataset.frame is not None else 1.0  # Arrow -> pandas -> array while reading
    row_bytes = sparse_row_bytes(client, dataset.array)  # None: dense rows, n_features * itemsize
    # Parquet behind a dd.read_parquet frame: the engine reads it in row batches, row counts from the footers
    source = parquet_source(dataset.frame, dataset.array.dtype) if dataset.frame is not None and not row_bytes else None
    if source is not None:
        streamed = StreamedData(client, None, weights, budget, source=source)
        reading = 2 * streamed.read_cost.fixed * len(budget.limits)  # what each worker's reads keep in pools
        if mode is False or (mode == "auto" and streamed.nbytes + reading <= budget.persist_bytes()):
            return PersistedData(client, streamed.X, streamed.weights, budget)
    elif mode is False:
        return PersistedData(client, dataset.array, weights, budget, row_bytes=row_bytes)
    per_row = (row_bytes or dataset.n_features * dataset.array.dtype.itemsize) + (8 if weights is not None else 0)
    if mode == "auto" and source is None:
        known = dataset.n_rows is not None
        rows = dataset.n_rows if known else _estimated_rows(client, dataset.array) * SIZE_ESTIMATE_MARGIN
        if rows * per_row <= budget.persist_bytes():
            return PersistedData(client, dataset.array, weights, budget, row_bytes=row_bytes)
    if source is None:
        streamed = StreamedData(client, dataset.array, weights, budget, read_overhead=overhead, row_bytes=row_bytes)
    if streamed.chunk_rows is None:
        if mode is True or _estimated_rows(client, dataset.array) * per_row * SIZE_ESTIMATE_MARGIN > \
                HYBRID_MIN_SHARE ** -1 * budget.persist_bytes():
            return streamed  # rows counted in the first pass: no pass of its own
    if mode == "auto" and streamed.nbytes <= budget.persist_bytes():
        return PersistedData(client, streamed.X, streamed.weights, budget, row_bytes=row_bytes)
    logger.info("data of %.1f MiB exceeds the cluster's persist budget of %.1f MiB: reading it from its source "
                "in every pass (out-of-core)", streamed.nbytes / 2**20, budget.persist_bytes() / 2**20)
    if mode == "auto" and allow_hybrid and source is None:  # files read in batches: all streamed
        # keep the leading chunks that fit persisted when they are a fair share of the data
        per_row = streamed.nbytes / max(1, streamed.n_rows)
        fits = np.cumsum(streamed.chunk_rows) * per_row <= budget.persist_bytes()
        n_head = int(np.sum(fits))
        head_rows = int(np.sum(streamed.chunk_rows[:n_head]))
        if n_head and head_rows >= HYBRID_MIN_SHARE * streamed.n_rows:
            X, w = streamed.X, streamed.weights
            head = PersistedData(client, X[:head_rows], None if w is None else w[:head_rows], budget,
                                 row_bytes=row_bytes)
            tail = StreamedData(client, X[head_rows:], None if w is None else w[head_rows:], budget,
                                read_overhead=overhead, first_row=head_rows, row_bytes=row_bytes)
            return HybridData(head, tail)
    return streamed


# -- the runs ---------------------------------------------------------------------------
@dataclass
class FitPlan:
    """What each run does (see :func:`fit_runs`)."""

    n_init: int
    initialise: Callable[[int], np.ndarray]
    max_iter: int
    stop_rule: object
    lloyd: bool = True
    local_search: bool = False
    hartigan_mode: str | None = None
    hartigan_tol: float = 0.0
    on_iteration: Callable | None = None
    seed_of_run: Callable[[int], int] = lambda run: run
    metric: str = "euclidean"
    warm_start: bool = True


#: Coreset searches of a run at most: another follows one whose result the data confirmed.
CORESET_SEARCHES = 3
#: Lloyd updates on the data before the searches (when they run): by then Lloyd is in its slow
#: tail (manyk: the objective within 0.3% of Lloyd's fixed point after 5 of 17 updates), which is
#: paid once, after the searches, instead of before them and again after each confirmation.
SEARCH_AFTER_ITERS = 5


def _searches(data, plan: FitPlan, k: int) -> bool:
    """Whether a run of ``plan`` searches swaps after Lloyd (:func:`_local_search_phase`)."""
    return plan.local_search and coreset_searches(data.n_rows, k)


def _first_lloyd_iters(data, plan: FitPlan, k: int) -> int:
    """Lloyd updates of a run before its local-search phase (see :data:`SEARCH_AFTER_ITERS`)."""
    return min(plan.max_iter, SEARCH_AFTER_ITERS) if _searches(data, plan, k) else plan.max_iter


def _local_search_phase(data, plan: FitPlan, loop: LoopState, run: int) -> RunSummary:
    """Swaps searched on a sample, confirmed by Lloyd on the data
    (:func:`dkmeans.local_search.coreset_local_search`).

    ``max_iter`` bounds the run's Lloyd updates in all: Lloyd's first
    :data:`SEARCH_AFTER_ITERS` updates, then the searches' confirmations, then Lloyd again
    share it. A confirmation runs :data:`~dkmeans.local_search.CONFIRM_ITERS` updates at most;
    after a confirmed search another one starts from its result (a new sample),
    :data:`CORESET_SEARCHES` at most. Lloyd then goes on from the last confirmed result (or
    from its own, when nothing was confirmed) to its stop rule, with what is left of
    ``max_iter``.
    """
    k = len(loop.centroids)
    budget = plan.max_iter - loop.n_iter if plan.lloyd else plan.max_iter
    lloyd_stop = stop_after_update(loop.history[-1], plan.stop_rule) if loop.history else None
    # Lloyd stopped at the cap before the searches, not at its stop rule: it goes on after them
    paused = plan.lloyd and lloyd_stop is None and loop.n_iter >= _first_lloyd_iters(data, plan, k)
    if lloyd_stop is None and plan.lloyd:
        lloyd_stop = "max_iter" if loop.n_iter >= plan.max_iter else None
    paused = paused and loop.n_iter < plan.max_iter
    unchanged = RunSummary(loop.centroids.astype(data.dtype), 0.0, loop.n_iter, lloyd_stop or "local-search",
                           lloyd_stop != "max_iter", list(loop.history))
    if budget <= 0 or not coreset_searches(data.n_rows, k):
        return unchanged
    history, summary, centroids, n_iter = list(loop.history), unchanged, loop.centroids, loop.n_iter
    end = loop.n_iter + budget  # the run's last Lloyd update
    settled = None
    for attempt in range(CORESET_SEARCHES):  # again from a confirmed result, while the data confirms
        search = coreset_local_search(data, centroids, seed=derive_seed(plan.seed_of_run(run), attempt),
                                      stop_rule=plan.stop_rule, max_iter=min(CONFIRM_ITERS, end - n_iter),
                                      metric=plan.metric, on_iteration=plan.on_iteration)
        record = dataclasses.replace(search.record, round=attempt + 1)
        if plan.on_iteration is not None:
            plan.on_iteration(record)
        history.append(record)
        if not search.kept:  # the last result stands, and so does the rule that stopped it
            break
        settled = search.lloyd
        history += list(settled.history)
        centroids, n_iter = search.centroids, n_iter + settled.n_iter
        summary = RunSummary(centroids, 0.0, n_iter, settled.stop_reason, settled.converged, [])
        if n_iter >= end:
            break
    if (settled.stop_reason == "max_iter" if settled is not None else paused) and n_iter < end:
        # the last confirmation stopped at its cap, or Lloyd before the searches: Lloyd goes on
        result = lloyd(data, centroids, max_iter=end - n_iter, stop_rule=plan.stop_rule,
                       on_iteration=plan.on_iteration, metric=plan.metric)
        history += list(result.history)
        n_iter += result.n_iter
        summary = RunSummary(np.asarray(result.centroids).astype(data.dtype), 0.0, n_iter, result.stop_reason,
                             result.converged, [])
    summary.history = history
    return summary


def fit_runs(data, plan: FitPlan, state: FitState, checkpoint: Checkpointer | None = None) -> RunSummary:
    """Run (or continue, from ``state``) every run of ``plan``; return the best run.

    Each run goes through its phases: ``init`` (initial centroids), ``lloyd`` (the Lloyd
    loop), ``local-search`` (swaps, then Lloyd again) and ``refine`` (Hartigan), each
    where the plan asks for it. With a checkpoint the state is saved after each
    initialisation, every ``checkpoint.every`` Lloyd updates, at the start of every later
    phase and after each run; a run resumed within a phase redoes that phase from its
    start (every phase is deterministic given its starting centroids), so the result is
    the uninterrupted one.
    """

    def save():
        if checkpoint is not None:
            checkpoint.save(state)

    def enter(phase: str, loop: LoopState) -> None:
        state.phase, state.loop = phase, loop
        save()

    while state.run < plan.n_init:
        if state.phase == "init":
            start = np.asarray(plan.initialise(state.run))
            if plan.local_search and plan.lloyd and plan.warm_start and coreset_searches(data.n_rows, len(start)):
                # settled and searched on a sample first
                start = coreset_start(data, start, seed=plan.seed_of_run(state.run), stop_rule=plan.stop_rule)
            state.phase, state.loop = "lloyd", LoopState(start)
            save()
        loop = state.loop
        summary = RunSummary(loop.centroids.astype(data.dtype), 0.0, loop.n_iter, "max_iter", False,
                             list(loop.history))
        if state.phase == "lloyd":
            if plan.lloyd:
                result = lloyd(data, loop.centroids, max_iter=_first_lloyd_iters(data, plan, len(loop.centroids)),
                               stop_rule=plan.stop_rule,
                               on_iteration=plan.on_iteration, resume=loop,
                               on_state=checkpoint.loop_hook(state) if checkpoint else None,
                               state_every=checkpoint.every if checkpoint else None, metric=plan.metric)
                loop = LoopState(result.centroids, result.n_iter, None, result.history)
                summary = RunSummary(result.centroids, 0.0, result.n_iter, result.stop_reason, result.converged,
                                     list(result.history))
            if plan.local_search:
                enter("local-search", loop)
            elif plan.hartigan_mode is not None:
                enter("refine", loop)
        if state.phase == "local-search":
            summary = _local_search_phase(data, plan, loop, state.run)
            loop = LoopState(summary.centroids, summary.n_iter, None, summary.history)
            if plan.hartigan_mode is not None:
                enter("refine", loop)
        if state.phase == "refine":
            result = hartigan(data, loop.centroids.astype(data.dtype), max_iter=plan.max_iter,
                              mode=plan.hartigan_mode, tol=plan.hartigan_tol, on_iteration=plan.on_iteration)
            history = list(loop.history) + list(result.history[1:])  # hartigan's [0] is its start
            summary = RunSummary(result.centroids.astype(data.dtype), 0.0, loop.n_iter + result.n_iter,
                                 result.stop_reason, result.converged, history)
        if plan.n_init > 1:
            summary.score = objective(data, summary.centroids)
        if state.best is None or summary.score < state.best.score:
            state.best = summary
        state.run, state.phase, state.loop = state.run + 1, "init", None
        save()
    return state.best


# -- the whole fit ----------------------------------------------------------------------
def _callable_init(spec: FitSpec, data, seed: int, run: int) -> np.ndarray:
    """Centroids from a user callable ``init(X, n_clusters, random_state)``, given the data's rows.

    Like scikit-learn, the callable sees the data: here all rows when they fit one task's
    budget, else a uniform sample of ``max(100 k, 10,000)`` rows (keyed by row index).
    """
    n = data.n_rows
    size = min(n, max(100 * spec.n_clusters, 10_000))
    rng = np.random.default_rng(derive_seed(seed, run) % 2**63)
    idx = np.arange(n) if size == n else np.sort(rng.choice(n, size=size, replace=False))
    X = data.rows(idx)
    C = spec.init(X, spec.n_clusters, np.random.RandomState(derive_seed(seed, run) % 2**32))
    return check_centroids(C, spec.n_clusters, data.n_features, data.dtype, name="init (the callable's result)")


def _wants_local_search(spec: FitSpec) -> bool:
    """``local_search="auto"``: after Lloyd from a seeding strategy (not from given centroids)."""
    if spec.local_search == "auto":
        return spec.algorithm == "lloyd" and isinstance(spec.init, str)
    return bool(spec.local_search)


def _in_process_threads(dataset: Dataset, weights) -> int | None:
    """Threads to fit in this process with, or None to fit on a cluster (see :data:`IN_PROCESS_BYTES_KEY`).

    In-memory data (NumPy or pandas) of at most ``dkmeans.in-process-bytes`` is fitted
    where it is, in one thread: a cluster round trip per pass would cost more than the
    passes. Larger in-memory data is fitted here too when no Dask client exists (the
    user has set up no cluster), on a thread per core: the rows are in this process
    already, and starting a cluster and copying them there cost more than it saves
    (2,000,000 x 16 float32: about 2 s of the fit). So is any in-memory data when no
    cluster is current and none can be started here (a daemonic process, such as a
    joblib/loky worker of ``GridSearchCV(n_jobs=2)``). ``dkmeans.in-process-bytes = 0``
    sends all data to a cluster.
    """
    if dataset.local is None or (weights is not None and not isinstance(weights, np.ndarray)):
        return None
    limit = float(parse_bytes(str(dask.config.get(IN_PROCESS_BYTES_KEY, DEFAULT_IN_PROCESS_BYTES))))
    X = dataset.local
    nbytes = X.data.nbytes + X.indices.nbytes + X.indptr.nbytes if is_sparse(X) else X.nbytes
    if nbytes <= limit:
        return 1
    if current_client() is None and (limit > 0 or in_daemon_process()):
        return 1 if in_daemon_process() else max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                                 else (os.cpu_count() or 1))
    return None


def run_fit(spec: FitSpec, dataset: Dataset, sample_weight=None) -> FitResult:
    """Fit k-means on validated data (see the module docstring).

    Parameters
    ----------
    spec : FitSpec
    dataset : Dataset
        From :func:`dkmeans._validation.as_dataset` (or the estimator's equivalent).
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
    weights = check_sample_weight(sample_weight, dataset)
    seed = resolve_seed(spec.random_state)
    searches = supports_local_search(spec.metric, is_sparse_array(dataset.array), algorithm=spec.algorithm,
                                     refine=spec.refine, local_search=spec.local_search)
    dataset = prepare_dataset(dataset, spec.metric)  # cosine: unit rows, normalised chunk by chunk where read
    if spec.algorithm == "minibatch" and spec.metric != "euclidean":  # never unit rows with Euclidean updates
        raise InvalidParameterError(f"mini-batch k-means is Euclidean only, not metric={spec.metric!r}")
    fit = _fit_minibatch if spec.algorithm == "minibatch" else _fit
    path = _kernel_path(dataset)
    with pinned(path):  # one code path for the whole fit: here, and (InContext) in its tasks
        threads = _in_process_threads(dataset, weights) if resolve_out_of_core(spec.out_of_core) != True else None
        if threads is not None:  # noqa: E712 - out_of_core True, not "auto", sends the data to a cluster
            data = ChunkList.from_array(dataset.local, weights, n_chunks=threads, threads=threads)
            # one BLAS thread per chunk thread, as on the workers
            with threadpool_limits(limits=1) if threads > 1 else contextlib.nullcontext():
                return fit(spec, dataset, data, C0, seed, None, searches)
        with fit_client() as client:
            if isinstance(weights, np.ndarray):
                weights = da.from_array(weights, chunks=dataset.array.chunks[0] if dataset.n_rows is not None else -1)
            data = place_data(client, dataset, weights, spec.out_of_core, spec.n_clusters,
                              allow_hybrid=spec.algorithm != "minibatch")
            return fit(spec, dataset, InContext(data, functools.partial(call_pinned, path)), C0, seed, client,
                       searches)


def _kernel_path(dataset: Dataset) -> str:
    """The kernels' code path for this whole fit (:func:`dkmeans.kernels.compile.resolve_path`).

    Rows of unknown count (a DataFrame of unknown partition lengths) count as large.
    """
    n_rows = dataset.n_rows if dataset.n_rows is not None else COMPILE_FIRST_ELEMENTS
    kinds = [] if is_sparse_array(dataset.array) else compiled_kinds(dataset.array.dtype, dataset.n_features)
    return resolve_path(kinds, n_rows * max(1, dataset.n_features))


def _fit(spec: FitSpec, dataset: Dataset, data, C0, seed: int, client, searches: bool) -> FitResult:
    """The fit on placed data (in this process when ``client`` is None)."""
    k = spec.n_clusters
    try:
        check_n_clusters_vs_rows(k, data.n_rows, spec.names.get("n_clusters", "n_clusters"))
        with np.errstate(invalid="ignore", over="ignore"):  # non-finite data: reported below
            moments = data.map_reduce(_moments_chunk, combine_moments)
            mean_variance = float(np.mean(moments.m2 / moments.count))
        if not math.isfinite(mean_variance):
            raise InvalidDataError(NON_FINITE_INPUT)
        checkpointer, state = _checkpoint(spec, data, moments, C0, seed)
        if spec.stop_rule == "objective-decrease":
            stop_rule = ObjectiveDecrease(spec.tol)
        else:
            stop_rule = CentroidShift(spec.tol * (mean_variance if spec.tol_relative else 1.0),
                                      inclusive=spec.tol_inclusive)

        def initialise(run: int) -> np.ndarray:
            if C0 is not None:
                return C0
            if callable(spec.init):
                return prepare_centroids(_callable_init(spec, data, state.seed, run), spec.metric)
            strategy = init_strategies.get_strategy(spec.init)
            options = dataclasses.replace(spec.init_options, metric=spec.metric,
                                          two_level_min_clusters=_two_level_clusters())
            return prepare_centroids(strategy(data, k, derive_seed(state.seed, run), options), spec.metric)

        plan = FitPlan(
            n_init=spec.n_init, initialise=initialise, max_iter=spec.max_iter, stop_rule=stop_rule,
            lloyd=spec.algorithm == "lloyd", local_search=searches and _wants_local_search(spec),
            seed_of_run=lambda run: derive_seed(state.seed, run),
            hartigan_mode=spec.hartigan_mode if "hartigan" in (spec.algorithm, spec.refine) else None,
            hartigan_tol=spec.hartigan_tol, on_iteration=spec.on_iteration, metric=spec.metric,
            warm_start=isinstance(spec.init, str),  # a seeding's centroids, never the user's own
        )
        best = fit_runs(data, plan, state, checkpointer)
        labels, inertia, n_passes = _final_assignment(spec, dataset, data, client, best.centroids)
    finally:
        data.release()
    return _result(spec, dataset, data, best.centroids, labels, inertia, best.n_iter, best.stop_reason,
                   best.converged, list(best.history), n_passes)


def _final_assignment(spec: FitSpec, dataset: Dataset, data, client, centroids):
    """Labels and objective of ``centroids`` on the data (what inference gives), and the passes made."""
    if data.kind == "local":
        labels, inertia = assign_local(dataset.local, centroids, data.weights[0] if data.has_weights else None)
    elif data.kind in ("persisted", "local"):
        # a Dask DataFrame gets index-aligned labels below: the final pass needs only the objective
        labels, inertia = assign_dataset(client, data.X, centroids, data.weights,
                                         keep_labels=dataset.frame is None, generation=data.generation)
    else:  # labels stay lazy, computed from the source when used; the objective takes one pass
        inertia = objective(data, centroids)
        labels = lazy_labels(dataset.array, centroids)
    inertia *= objective_scale(spec.metric)  # cosine: 1 - cos is half the squared distance of unit vectors
    n_passes = data.passes + 1 - (data.kind == "streamed" or data.kind == "hybrid")  # streamed: counted
    return labels, inertia, n_passes


def _result(spec, dataset, data, centroids, labels, inertia, n_iter, stop_reason, converged, history, n_passes,
            with_labels: bool = True, **extra) -> FitResult:
    """The :class:`FitResult`, with labels where the face wants them (after the data's release).

    ``with_labels=False`` (mini-batch's ``compute_labels=False``): no labels at all.
    """
    if not with_labels:
        labels = None
    elif dataset.frame is not None:  # on the DataFrame's index, from its partitions (the final pass kept none)
        labels = predict_series(dataset.frame, centroids, metric=spec.metric)
    elif not dataset.is_dask and data.kind != "local":
        labels = labels.compute()
    in_memory = data.kind in ("persisted", "local")
    return FitResult(centroids, labels, inertia, n_iter, stop_reason, converged, history,
                     "in-memory" if in_memory else "out-of-core", n_passes, list(data.loop_modes), **extra)


# -- mini-batch --------------------------------------------------------------------------
#: stream of the initialisation samples' draws (apart from the batches')
MINIBATCH_INIT_STREAM = 0x696E


def _weight_sum_chunk(X, w, offset):
    return float(w.sum())


def minibatch_sizes(spec: FitSpec, n_rows: int) -> tuple[int, int]:
    """scikit-learn's ``(batch_size, init_size)`` for ``n_rows`` rows (and its warning for ``init_size < k``)."""
    b = min(spec.minibatch.batch_size, n_rows)
    size = spec.init_size
    if size is None:
        size = 3 * b if 3 * b >= spec.n_clusters else 3 * spec.n_clusters
    elif size < spec.n_clusters:
        warnings.warn(f"init_size={size} should be larger than n_clusters={spec.n_clusters}. Setting it to "
                      "min(3*n_clusters, n_samples)", RuntimeWarning, stacklevel=2)  # scikit-learn's words
        size = 3 * spec.n_clusters
    return b, min(size, n_rows)


def minibatch_init(spec: FitSpec, X, w, seed: int, run: int) -> np.ndarray:
    """Initial centers from the rows ``X`` (weights ``w``) of a sample, by the spec's strategy."""
    if not isinstance(spec.init, str) and not callable(spec.init):
        return np.asarray(spec.init)
    sample = ChunkList.from_array(X, w)
    if callable(spec.init):
        C = spec.init(X, spec.n_clusters, np.random.RandomState(derive_seed(seed, run) % 2**32))
        C = check_centroids(C, spec.n_clusters, X.shape[1], X.dtype, name="init (the callable's result)")
    else:
        options = dataclasses.replace(spec.init_options, metric=spec.metric)
        # a sample of a few thousand rows, on the caller: scikit-learn's OpenMP threads (k-means||'
        # recluster) only contend with the workers there (several times slower on a busy host)
        with threadpool_limits(limits=1):
            C = init_strategies.get_strategy(spec.init)(sample, spec.n_clusters, derive_seed(seed, run), options)
    return prepare_centroids(C, spec.metric)


def _fit_minibatch(spec: FitSpec, dataset: Dataset, data, C0, seed: int, client, searches: bool) -> FitResult:
    """Mini-batch k-means on placed data (:mod:`dkmeans.minibatch`).

    Data in memory (persisted or in this process): scikit-learn's scheme. A pass of column
    moments (finiteness, the scale of ``tol``); ``n_init`` initialisations, each on its own
    uniform sample of ``init_size`` rows, of which the one with the lowest objective on a
    further sample is kept; then the steps on batches drawn with replacement. Out-of-core
    data: the initialisation (and the scale of ``tol``) from the first ``init_size`` rows,
    then one sequential pass in row order per epoch (``max_iter`` at most), so a single
    epoch reads the data once. Then the final assignment (``compute_labels``).

    With a checkpoint the run's state is saved after the initialisation, every
    ``checkpoint_every`` steps and at its end; a fit that finds its checkpoint skips the
    initialisation and continues the run (the checkpoint's job check reads the moments
    pass, or the first ``init_size`` rows out of core).
    """
    opts: MiniBatchOptions = spec.minibatch
    k = spec.n_clusters
    one_pass = data.kind in ("streamed", "hybrid")
    try:
        n = data.n_rows
        check_n_clusters_vs_rows(k, n, spec.names.get("n_clusters", "n_clusters"))
        b, init_size = minibatch_sizes(spec, n)
        opts = dataclasses.replace(opts, batch_size=b)
        if one_pass:  # the stream's head: no pass of its own
            head = np.asarray(data.rows(np.arange(init_size)))
            if not np.all(np.isfinite(head)):
                raise InvalidDataError(NON_FINITE_INPUT)
            moments = column_moments(head)
            mean_variance = float(np.mean(np.var(head.astype(np.float64), axis=0)))
        else:
            head = None
            with np.errstate(invalid="ignore", over="ignore"):
                moments = data.map_reduce(_moments_chunk, combine_moments)
                mean_variance = float(np.mean(moments.m2 / moments.count))
            if not math.isfinite(mean_variance):
                raise InvalidDataError(NON_FINITE_INPUT)
        # the two ways of drawing batches give different runs: a checkpoint never crosses over
        checkpointer, state = _checkpoint(spec, data, moments, C0, seed,
                                          batches="sequential" if one_pass else "random")
        if state.minibatch is None:
            centers = _minibatch_centers(spec, data, C0, state.seed, head, init_size)
            state.phase, state.minibatch = "minibatch", PassState(MiniBatchState(centers, np.zeros(k)))
            if checkpointer is not None:
                checkpointer.save(state)
        tol = spec.tol * (mean_variance if spec.tol_relative else 1.0)
        resume = state.minibatch
        checkpointing = dict(on_state=checkpointer.minibatch_hook(state) if checkpointer else None,
                             state_every=checkpointer.every if checkpointer else None)
        if one_pass:
            result = minibatch_pass(data, resume.run, seed=state.seed, options=opts, tol=tol,
                                    max_passes=max(1, spec.max_iter), n_total=n, on_step=spec.on_iteration,
                                    resume=resume, **checkpointing)
        else:
            result = minibatch(data, resume.run, n_steps=(spec.max_iter * n) // b, seed=state.seed, options=opts,
                               tol=tol, on_step=spec.on_iteration, resume=resume, **checkpointing)
        n_epochs = math.ceil(result.n_steps * b / n)
        centroids = result.centroids.astype(data.dtype)
        if spec.compute_labels:
            labels, inertia, n_passes = _final_assignment(spec, dataset, data, client, centroids)
        else:
            total_weight = float(data.map_reduce(_weight_sum_chunk, sum)) if data.has_weights else float(n)
            ewa = result.state.ewa_objective
            labels, inertia = None, (float("nan") if ewa is None else ewa * total_weight)
            n_passes = data.passes
    finally:
        data.release()
    return _result(spec, dataset, data, centroids, labels, inertia, n_epochs, result.stop_reason, result.converged,
                   list(result.history), n_passes, with_labels=spec.compute_labels, minibatch_state=result.state)


def _minibatch_centers(spec: FitSpec, data, C0, seed: int, head, init_size: int) -> np.ndarray:
    """A mini-batch run's initial centers (float64): ``C0``, or the best of ``n_init`` initialisations.

    In memory each initialisation runs on its own uniform sample of ``init_size`` rows
    and is scored on a further sample; out of core (``head`` given) all run on the head.
    """
    if C0 is not None:
        return np.asarray(C0, dtype=np.float64)
    if head is not None:
        samples, valid = [(head, None)] * spec.n_init, (head, None)
    else:
        rng = np.random.default_rng([seed, MINIBATCH_INIT_STREAM])
        draws = [rng.integers(0, data.n_rows, init_size) for _ in range(1 + spec.n_init)]
        rows, weights = gather_rows(data, np.concatenate(draws))  # one pass for all the samples
        if len(weights) and np.all(weights == weights[0]):  # equal weights: the unweighted fit's samples
            weights = np.ones_like(weights)
        cut = np.cumsum([len(d) for d in draws])[:-1]
        parts = list(zip(np.split(rows, cut), np.split(weights, cut)))
        valid, samples = parts[0], parts[1:]
    best = None
    for run, (Xs, ws) in enumerate(samples):
        C = minibatch_init(spec, Xs.astype(data.dtype), ws, seed, run)
        score = float(assign_partials(valid[0].astype(data.dtype), C.astype(data.dtype), valid[1]).objective)
        if best is None or score < best[0]:
            best = (score, C)
    return np.asarray(best[1], dtype=np.float64)


def run_partial_fit(spec: FitSpec, X, sample_weight, state: MiniBatchState | None, seed: int):
    """One mini-batch step on the in-memory batch ``X`` (``partial_fit``); returns ``(state, record)``.

    Without ``state`` (the first batch) the centers are initialised from ``X`` first, on a
    sample of ``init_size`` of its rows as scikit-learn does. ``spec.minibatch.batch_size``
    is the batch size the reassignment schedule counts (scikit-learn's ``_batch_size``).
    The step's draws are keyed by ``(seed, step)``.
    """
    X = X if is_sparse_array(X) else np.asarray(X)  # sparse (CSR) rows are assigned as they are
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    if w is not None and np.all(w == 1.0):  # unit weights: exactly the unweighted step (and initialisation)
        w = None
    if state is None:
        _, init_size = minibatch_sizes(spec, X.shape[0])
        if not isinstance(spec.init, str) and not callable(spec.init):
            centers = check_centroids(spec.init, spec.n_clusters, X.shape[1], X.dtype, name="init")
        else:
            rng = np.random.default_rng([seed, MINIBATCH_INIT_STREAM])
            idx = rng.integers(0, X.shape[0], init_size) if init_size < X.shape[0] else np.arange(X.shape[0])
            centers = minibatch_init(spec, take_rows(X, idx), None if w is None else w[idx], seed, 0)
        state = MiniBatchState(np.asarray(centers, dtype=np.float64), np.zeros(spec.n_clusters))
    partials = assign_partials(X, state.centroids.astype(X.dtype), w)
    rng = step_rng(seed, state.n_steps)
    state, record, _ = advance(state, partials, X.shape[0], spec.minibatch, rng, lambda p: take_rows(X, p),
                                X.shape[0], 0.0, check_stop=False)
    return state, record


def _checkpoint(spec: FitSpec, data, moments, C0, seed, **job_extra):
    """The checkpoint of this fit (or None) and the state to start from.

    ``job_extra``: more of the job's description, checked on resume (mini-batch: how the
    batches are drawn).
    """
    if spec.checkpoint is None:
        return None, FitState(seed)
    job = dict(spec.job)
    if C0 is not None:
        job["init"] = "array sha256 " + digest(np.asarray(C0))
    job.update(n_rows=data.n_rows, n_features=data.n_features, dtype=str(data.dtype),
               weighted=data.has_weights, data=data_fingerprint(moments), **job_extra)
    checkpointer = Checkpointer(spec.checkpoint, spec.checkpoint_every, job)
    state = checkpointer.load() if checkpointer.exists() else FitState(seed)
    return checkpointer, state


__all__ = ["FitPlan", "FitResult", "FitSpec", "OUT_OF_CORE_KEY", "fit_runs", "minibatch_sizes", "place_data", "run_fit",
           "run_partial_fit"]
