"""The Lloyd loop over persisted data: stop rules, empty clusters, and where the loop runs.

Each iteration runs :func:`dkmeans.kernels.assign_partials` on every chunk, reduces the
partials, and computes the new centroids: one graph per iteration (one task per worker
thread, see :mod:`dkmeans._graph`) with the update on the client, or the same loop inside
one task for small problems, or SPMD on every worker thread (:mod:`dkmeans._spmd`); see
:func:`lloyd`. Empty clusters follow oneDAL's rule: the centroid of an empty cluster
becomes the row farthest from the new (non-empty) centroids, found with a distributed
top-m, distinct rows for several empty clusters. The loop ends on the stop rule, at a
fixed point (no centroid moved: further iterations cannot change anything), or after
``max_iter`` updates. :func:`assign_dataset` then gives the labels and objective of the
final centroids, exactly what inference returns for them.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import dask.array as da
import numpy as np
from sklearn.exceptions import ConvergenceWarning

from distributed import futures_of

from dkmeans._graph import PersistedData
from dkmeans._spmd import SpmdUnavailable, spmd_enabled
from dkmeans.checkpoint import LoopState
from dkmeans._graph import gather as gather_results
from dkmeans.backend import get_namespace
from dkmeans.errors import InvalidDataError
from dkmeans.kernels import (
    assign,
    assign_partials,
    combine_top,
    combine_partials,
    farthest_points,
    objectives,
    update_centroids,
)

logger = logging.getLogger("dkmeans")


# -- stop rules ------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectiveDecrease:
    """oneDAL's rule: stop when ``Phi(C_t) - Phi(C_t+1) < threshold``.

    Checked after each assignment step against the previous one; the update that would
    follow a satisfied check is not performed.
    """

    threshold: float = 0.0
    name: str = "objective-decrease"


@dataclass(frozen=True)
class CentroidShift:
    """Stop when the total squared centroid shift ``sum_j ||c_j(t) - c_j(t+1)||^2`` is small.

    ``inclusive=True`` is scikit-learn's ``<= tol`` (with ``tol`` already scaled to the
    data); ``inclusive=False`` is the older oneDAL specification's ``< eps``.
    """

    tol: float = 0.0
    inclusive: bool = True
    name: str = "centroid-shift"

    def satisfied(self, shift: float) -> bool:
        return shift <= self.tol if self.inclusive else shift < self.tol


# -- results ---------------------------------------------------------------------------
@dataclass(frozen=True)
class IterationRecord:
    """One Lloyd iteration: the objective of its assignment step and what its update did."""

    iteration: int
    objective: float
    centroid_shift: float
    empty_clusters_fixed: int
    seconds: float

    def as_dict(self) -> dict:
        return {
            "iteration": self.iteration,
            "objective": self.objective,
            "centroid_shift": self.centroid_shift,
            "empty_clusters_fixed": self.empty_clusters_fixed,
            "seconds": self.seconds,
        }


@dataclass
class LloydResult:
    """Centroids after the loop, how many updates ran, why it stopped, and the history."""

    centroids: np.ndarray
    n_iter: int
    stop_reason: str
    converged: bool
    history: list = field(default_factory=list)


# -- chunk functions (run on workers) --------------------------------------------------
def _partials_chunk(X, w, offset, C):
    return assign_partials(X, C, w)


def _farthest_chunk(X, w, offset, C, m):
    return farthest_points(X, C, m, offset, w)


def _check_finite(partials) -> None:
    if not (np.isfinite(partials.objective) and np.all(np.isfinite(partials.sums))):
        raise InvalidDataError(
            "Input contains NaN or infinity (found in the first pass over the data): "
            "remove or impute non-finite values before clustering."
        )


def fill_empty_clusters(data: PersistedData, centroids: np.ndarray, empty: np.ndarray) -> np.ndarray:
    """Move each empty cluster's centroid to a distinct row farthest from the live centroids."""
    m = int(empty.sum())
    live = centroids[~empty].astype(data.dtype)
    far = data.map_reduce(_farthest_chunk, functools.partial(combine_top, m=m), (live, m))
    out = centroids.copy()
    targets = np.flatnonzero(empty)
    out[targets[: len(far.index)]] = far.rows
    if len(far.index) < m or not np.all(np.asarray(far.score) > 0):
        warnings.warn(
            f"{m} clusters are empty and the data has too few distinct points to give each its own row: "
            "some centroids coincide (the data has fewer distinct points than n_clusters).",
            ConvergenceWarning, stacklevel=2,
        )
    return out


# -- the loop --------------------------------------------------------------------------
def _stop_after_update(record: IterationRecord, stop_rule) -> str | None:
    """The rule that ends the loop right after this update, if any."""
    if isinstance(stop_rule, CentroidShift) and stop_rule.satisfied(record.centroid_shift):
        return stop_rule.name
    if record.centroid_shift == 0.0:  # C(t+1) == C(t) exactly: every later pass repeats this one
        return "fixed-point"
    return None


def lloyd(
    data: PersistedData,
    initial_centroids: np.ndarray,
    *,
    max_iter: int,
    stop_rule: ObjectiveDecrease | CentroidShift,
    on_iteration: Callable[[IterationRecord], None] | None = None,
    resume: LoopState | None = None,
    on_state: Callable[[LoopState], None] | None = None,
    state_every: int | None = None,
    loop: str = "auto",
) -> LloydResult:
    """Run Lloyd iterations on persisted data.

    How the iterations run (``loop="auto"``), in blocks that end every ``state_every``
    updates: small problems (a pass of at most about 10 ms of one thread's work, see
    :meth:`~dkmeans._graph.PersistedData.fits_one_task`) inside one task on one worker;
    larger ones SPMD, one task per worker thread exchanging only the partials
    (:mod:`dkmeans._spmd`, Dask config ``dkmeans.spmd``), falling back to one graph per
    iteration if the ranks cannot run together. Both avoid a cluster round trip per
    iteration; the result is the same up to float rounding of the combined sums.
    ``loop="graph"`` always runs one graph per iteration.

    Parameters
    ----------
    data : PersistedData
    initial_centroids : ndarray, shape (k, d)
        Ignored when ``resume`` is given.
    max_iter : int
        Maximum number of centroid updates in total (0 returns the initial centroids).
    stop_rule : ObjectiveDecrease or CentroidShift
    on_iteration : callable, optional
        Called with each :class:`IterationRecord` (progress display).
    resume : LoopState, optional
        Continue a loop from a checkpoint: its centroids, update count, last objective
        and history. The result is the one the uninterrupted loop would have given.
    on_state : callable, optional
        Called with the :class:`LoopState` after every update (checkpointing); in the
        single-task mode, at the end of every block.
    state_every : int, optional
        ``on_state`` is only interested in updates that are multiples of this (the
        single-task mode's block length); None: only the final state.

    Returns
    -------
    LloydResult
        Centroids in the data's dtype.
    """
    if resume is None:
        resume = LoopState(np.asarray(initial_centroids))
    if loop == "auto" and isinstance(data, PersistedData):  # not inside a task running the loop
        if data.fits_one_task(len(resume.centroids) * data.n_features):
            loop = "one-task"
        elif spmd_enabled(len(data.placement())):
            loop = "spmd"
    if loop in ("one-task", "spmd"):
        return _lloyd_in_blocks(data, resume, max_iter, stop_rule, on_iteration, on_state, state_every, loop)
    C = np.asarray(resume.centroids).astype(data.dtype, copy=True)
    history: list[IterationRecord] = list(resume.history)
    previous_objective = resume.previous_objective
    n_iter = resume.n_iter
    reason = _stop_after_update(history[-1], stop_rule) if history else None
    if reason is not None:  # the checkpoint was written just before the loop stopped
        return LloydResult(C, n_iter, reason, True, history)
    stop_reason, converged = "max_iter", False
    for it in range(n_iter, max_iter):
        t0 = time.perf_counter()
        partials = data.map_reduce(_partials_chunk, combine_partials, (C,))
        if it == 0:
            _check_finite(partials)
        objective = float(partials.objective)
        if (
            isinstance(stop_rule, ObjectiveDecrease)
            and previous_objective is not None
            and previous_objective - objective < stop_rule.threshold
        ):
            stop_reason, converged = stop_rule.name, True
            break
        new, empty = update_centroids(partials, C)
        n_empty = int(empty.sum())
        if n_empty:
            new = fill_empty_clusters(data, new, empty)
        new = new.astype(data.dtype)
        shift = float(np.sum((new.astype(np.float64) - C.astype(np.float64)) ** 2))
        record = IterationRecord(it + 1, objective, shift, n_empty, time.perf_counter() - t0)
        history.append(record)
        if on_iteration is not None:
            on_iteration(record)
        C, n_iter, previous_objective = new, it + 1, objective
        if on_state is not None:
            on_state(LoopState(C, n_iter, previous_objective, list(history)))
        reason = _stop_after_update(record, stop_rule)
        if reason is not None:
            stop_reason, converged = reason, True
            break
    return LloydResult(C, n_iter, stop_reason, converged, history)


def _lloyd_block(chunks, state: LoopState, end: int, stop_rule) -> LloydResult:
    """Lloyd on the chunks of one task, from ``state`` up to ``end`` updates (runs on a worker)."""
    return lloyd(chunks, None, max_iter=end, stop_rule=stop_rule, resume=state)


def _lloyd_rank_block(chunks, state: LoopState, end: int, stop_rule) -> LloydResult:
    """:func:`_lloyd_block` as one SPMD rank; rank 0 reports each iteration to the client."""
    report = (lambda record: chunks.comm.report(record.as_dict())) if chunks.rank == 0 else None
    return lloyd(chunks, None, max_iter=end, stop_rule=stop_rule, resume=state, on_iteration=report)


def _lloyd_in_blocks(data, state: LoopState, max_iter, stop_rule, on_iteration, on_state, state_every, loop):
    """:func:`lloyd` run in blocks of iterations, each in one task or SPMD (callbacks run between blocks).

    SPMD blocks report their iterations while they run. A block whose ranks cannot run
    together is run again from its start one graph per iteration, and so are the blocks
    after it; iterations already reported are not reported twice.
    """
    reported = state.n_iter

    def report(record: IterationRecord):
        nonlocal reported
        if on_iteration is not None and record.iteration > reported:
            on_iteration(record)
        reported = max(reported, record.iteration)

    while True:
        end = max_iter
        if on_state is not None and state_every:
            end = min(max_iter, (state.n_iter // state_every + 1) * state_every)
        if loop == "spmd":
            try:
                result = data.run_spmd(_lloyd_rank_block, state, end, stop_rule,
                                       on_progress=lambda record: report(IterationRecord(**record)))
            except SpmdUnavailable as exc:
                logger.info("SPMD Lloyd block failed (%s); running it one graph per iteration", exc)
                loop = "graph"
        if loop == "graph":
            result = lloyd(data, None, max_iter=end, stop_rule=stop_rule, resume=state, on_iteration=report,
                           loop="graph")
        elif loop == "one-task":
            result = data.run_in_one_task(_lloyd_block, state, end, stop_rule)
        for record in result.history[len(state.history):]:
            report(record)
        if result.n_iter > state.n_iter:
            state = LoopState(result.centroids, result.n_iter, result.history[-1].objective, list(result.history))
            if on_state is not None:
                on_state(state)
        if result.stop_reason != "max_iter" or result.n_iter >= max_iter:
            return result


# -- final assignment ------------------------------------------------------------------
def _label_block(X, C, w=None):
    labels, min_sq = assign(X, C)
    d2 = min_sq.astype(np.float64)
    if w is not None:
        d2 = d2 * w.reshape(-1)
    xp = get_namespace(labels)
    return xp.stack([labels.astype(xp.float64), d2], axis=1)


def assign_dataset(client, X: da.Array, centroids: np.ndarray, weights: da.Array | None = None, *,
                   gather: bool = False, keep_labels: bool = True, generation: int | None = None):
    """Labels and (weighted) objective of ``X`` for fixed centroids, in one pass.

    Parameters
    ----------
    client : distributed.Client
    X : dask.array.Array, shape (n, d)
    centroids : ndarray, shape (k, d)
    weights : dask.array.Array, shape (n,), optional
    gather : bool
        Return the labels as a NumPy array instead of a persisted Dask array.
    keep_labels : bool
        False: compute only the objective (the caller labels the rows another way).
    generation : int, optional
        :attr:`PersistedData.generation` of a persisted ``X`` (to report a cluster restart).

    Returns
    -------
    labels : dask.array.Array (persisted), ndarray (int32), or None without ``keep_labels``
    objective : float
    """
    C = np.asarray(centroids).astype(X.dtype)
    # weights as an (n, 1) column so blockwise aligns them with X's rows
    args = [X, C] if weights is None else [X, C, weights.rechunk((X.chunks[0],))[:, None]]
    blocks = da.map_blocks(
        _label_block, *args, dtype=np.float64, chunks=(X.chunks[0], (2,)),
        meta=get_namespace(X._meta).empty((0, 2), dtype=np.float64),  # CuPy chunks give CuPy labels
    )
    labels = blocks[:, 0].astype(np.int32)
    objective = blocks[:, 1].sum()
    inputs = futures_of(X)
    if not keep_labels:
        labels, objective = None, gather_results(client, client.compute(objective), inputs, generation)
    elif gather:
        labels, objective = gather_results(client, client.compute([labels, objective]), inputs, generation)
    else:
        labels, objective = client.persist([labels, objective])
        objective = gather_results(client, client.compute(objective), inputs, generation)
    objective = float(objective)
    if not np.isfinite(objective):
        raise InvalidDataError(
            "Input contains NaN or infinity: remove or impute non-finite values before assigning."
        )
    return labels, objective


def _objectives_chunk(X, w, offset, center_sets):
    return objectives(X, w, center_sets)


def objective(data: PersistedData, centroids: np.ndarray) -> float:
    """Weighted objective of the persisted data for ``centroids`` (one pass, O(workers) tasks)."""
    values = data.map_reduce(_objectives_chunk, _sum_arrays, ([np.asarray(centroids).astype(data.dtype)],))
    return float(values[0])


def _sum_arrays(parts):
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


@dataclass
class FitOutcome:
    """A finished Lloyd run: the loop's result plus the final assignment."""

    result: LloydResult
    labels: da.Array
    objective: float


def fit_lloyd(data: PersistedData, initial_centroids: np.ndarray, *, keep_labels: bool = True,
              **loop_options) -> FitOutcome:
    """:func:`lloyd` followed by the final assignment pass for the returned centroids."""
    result = lloyd(data, initial_centroids, **loop_options)
    labels, objective = assign_dataset(data.client, data.X, result.centroids, data.weights,
                                       keep_labels=keep_labels, generation=data.generation)
    return FitOutcome(result, labels, objective)


__all__ = [
    "CentroidShift",
    "IterationRecord",
    "LloydResult",
    "ObjectiveDecrease",
    "FitOutcome",
    "assign_dataset",
    "fit_lloyd",
    "lloyd",
    "objective",
]
