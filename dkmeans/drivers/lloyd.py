"""The Lloyd loop over the data protocol: stop rules, empty clusters, blocks of iterations.

Each iteration runs :func:`dkmeans.kernels.assign_partials` on every chunk (or its pruned
equivalent, :mod:`dkmeans.drivers.pruned_lloyd`, which gives the same partials computing only
the distances that can change a label), reduces the partials, and computes the new centroids. Where
the iterations run (one graph per
iteration, inside one task, SPMD on every worker thread, or streamed from the source) is
the engine's choice (:meth:`dkmeans.engine.protocol.ChunkedData.run_loop`); see
:func:`lloyd`. Empty clusters follow oneDAL's rule: the centroid of an empty cluster
becomes the row farthest from the new (non-empty) centroids, found with a distributed
top-m, distinct rows for several empty clusters. That search assigns every row to the live
centroids; when the next iteration is in the same block, each chunk keeps that assignment
and the next iteration's partials take only a product with the refilled centroids
(:func:`fill_empty_clusters` with ``assign_next``). The loop ends on the stop rule, at a
fixed point (no centroid moved: further iterations cannot change anything), or after
``max_iter`` updates, or where the caller asks it to stop (``on_iteration`` returning True:
a scikit-learn callback's stop request; stop reason ``"stopped"``, after a finished update).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dkmeans.drivers.capacitated import CapacitatedPasses
from dkmeans.drivers.pruned_lloyd import PrunedPasses, _partials_chunk, prune_groups  # noqa: F401 - benchmarks time the chunk function
from dkmeans.drivers.state import STOPPED, IterationRecord, LoopState
from dkmeans.errors import (
    INTERRUPTIONS,
    NON_FINITE_INPUT,
    InvalidDataError,
    warn_distinct_clusters,
)
from dkmeans.kernels import (
    combine_partials,
    combine_top,
    farthest_points,
    objectives,
    update_centroids,
)
from dkmeans.kernels.cosine import objective_scale, unit_centroids
from dkmeans.kernels.nearest import farthest_from, nearest_sq64, refill_partials

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
@dataclass
class LloydResult:
    """Centroids after the loop, how many updates ran, why it stopped, and the history."""

    centroids: np.ndarray
    n_iter: int
    stop_reason: str
    converged: bool
    history: list = field(default_factory=list)
    #: the run's :class:`~dkmeans.drivers.pruned_lloyd.PrunedPasses` as the block left it (given one as
    #: ``prune``; a copy where the block ran in a task), else None
    pruning: object = field(default=None, repr=False, compare=False)
    #: the loop's :class:`~dkmeans.drivers.capacitated.CapacitatedPasses` as the block left it (a
    #: copy where the block ran in a task), else None
    capacitated: object = field(default=None, repr=False, compare=False)


# -- chunk functions (run on workers) --------------------------------------------------
def _farthest_chunk(X, w, offset, C, m):
    return farthest_points(X, C, m, offset, w)


def _check_finite(partials) -> None:
    if not (np.isfinite(partials.objective) and np.all(np.isfinite(partials.sums))):
        raise InvalidDataError(NON_FINITE_INPUT)


def _nearest_live_chunk(X, w, offset, state, live, m):
    labels, d2 = nearest_sq64(X, live)
    return (labels, d2), farthest_from(X, d2, m, offset, w)


def _refill_partials_chunk(X, w, offset, state, L, R, live_index, refill_index, k):
    labels, d2 = state
    return None, refill_partials(X, labels, d2, L, R, live_index, refill_index, k, w)


def fill_empty_clusters(
    data, centroids: np.ndarray, empty: np.ndarray, *, assign_next: bool = False
):
    """Move each empty cluster's centroid to a distinct row farthest from the live centroids.

    Returns the centroids, and with ``assign_next`` also the :class:`Partials` of the
    assignment to them (the next iteration's pass), or None where it could not be formed.
    The search for the farthest rows is a pass of every row against the live centroids;
    with ``assign_next`` each chunk keeps its rows' nearest live centroid from it, and a
    second pass needs only the product with the refilled centroids: one full product
    where the refill and the next assignment would take two.
    """
    m = int(empty.sum())
    live = centroids[~empty].astype(data.dtype)
    if assign_next:
        far, nearest = data.map_reduce_stateful(
            _nearest_live_chunk, functools.partial(combine_top, m=m), (live, m)
        )
    else:
        far, nearest = (
            data.map_reduce(_farthest_chunk, functools.partial(combine_top, m=m), (live, m)),
            None,
        )
    out = centroids.copy()
    targets = np.flatnonzero(empty)
    out[targets[: len(far.index)]] = far.rows
    found = int(np.sum(np.asarray(far.score) > 0))
    if found < m:
        warn_distinct_clusters(len(centroids) - m + found, len(centroids), stacklevel=2)
    if not assign_next:
        return out
    if (
        len(far.index) < m
    ):  # clusters left at their old centroid take part in the assignment: no shortcut
        return out, None
    C = out.astype(data.dtype)
    partials, _ = data.map_reduce_stateful(
        _refill_partials_chunk,
        combine_partials,
        (live, C[targets], np.flatnonzero(~empty), targets, len(C)),
        nearest,
    )
    return out, partials


# -- the loop --------------------------------------------------------------------------
def stop_after_update(record: IterationRecord, stop_rule) -> str | None:
    """The rule that ends the loop right after this update, if any."""
    if isinstance(stop_rule, CentroidShift) and stop_rule.satisfied(record.centroid_shift):
        return stop_rule.name
    if record.centroid_shift == 0.0:  # C(t+1) == C(t) exactly: every later pass repeats this one
        return "fixed-point"
    return None


def lloyd(
    data,
    initial_centroids: np.ndarray,
    *,
    max_iter: int,
    stop_rule: ObjectiveDecrease | CentroidShift,
    on_iteration: Callable[[IterationRecord], None] | None = None,
    resume: LoopState | None = None,
    on_state: Callable[[LoopState], None] | None = None,
    state_every: int | None = None,
    metric: str = "euclidean",
    prune=False,
    capacitated=None,
) -> LloydResult:
    """Run Lloyd iterations over the data protocol.

    The iterations run in blocks that end every ``state_every`` updates (for
    ``on_state``), each block where the engine chooses
    (:meth:`~dkmeans.engine.protocol.ChunkedData.run_loop`): inside one task for small
    problems, SPMD on every worker thread, one graph per iteration, or streamed from the
    source. The result is the same up to float rounding of the combined sums.

    Parameters
    ----------
    data : ChunkedData
    initial_centroids : ndarray, shape (k, d)
        Ignored when ``resume`` is given.
    max_iter : int
        Maximum number of centroid updates in total (0 returns the initial centroids).
    stop_rule : ObjectiveDecrease or CentroidShift
    on_iteration : callable, optional
        Called with each :class:`IterationRecord` (progress display). Where it returns True
        the loop stops after that update (stop reason ``"stopped"``; see
        :meth:`~dkmeans.engine.protocol.ChunkedData.report` for when a loop running on the
        cluster sees the request).
    resume : LoopState, optional
        Continue a loop from a checkpoint: its centroids, update count, last objective
        and history. The result is the one the uninterrupted loop would have given.
    on_state : callable, optional
        Called with the :class:`LoopState` at the end of every block (checkpointing).
    state_every : int, optional
        Block length: ``on_state`` is interested in updates that are multiples of this;
        None: only the final state.
    metric : {"euclidean", "cosine"}
        "cosine": spherical k-means on unit rows (:mod:`dkmeans.kernels.cosine`): the
        centroids are normalised after each update (a cluster whose rows cancel is treated
        as empty) and the objective is ``sum w (1 - cos)``, half the squared distance.
    prune : {"auto", True, False} or PrunedPasses
        Skip the distances that cannot change a label (bounds kept with the rows between
        iterations, :mod:`dkmeans.drivers.pruned_lloyd`); the results are the same either way.
        Only data kept in memory is pruned. A run's
        :meth:`~dkmeans.drivers.pruned_lloyd.PrunedPasses.for_run` keeps its bounds across this
        call's blocks and the run's other calls.
    capacitated : CapacitatedPasses, optional
        Size caps (:mod:`dkmeans.drivers.capacitated`): each assignment is the capacitated one
        (prices moved by counting passes), never pruned; empty clusters (possible with a
        maximum size only) are refilled without carrying an uncapped assignment over.

    Returns
    -------
    LloydResult
        Centroids in the data's dtype.
    """
    state = resume if resume is not None else LoopState(np.asarray(initial_centroids))
    reported = state.n_iter
    stop_asked = False

    def report(record: dict) -> bool:
        nonlocal reported, stop_asked
        if on_iteration is not None and record["iteration"] > reported:
            stop_asked = bool(on_iteration(IterationRecord(**record))) or stop_asked
        reported = max(reported, record["iteration"])
        return stop_asked

    work_per_row = len(state.centroids) * data.n_features
    if capacitated is not None:
        prune = False
    if isinstance(prune, PrunedPasses):
        n_groups = prune.n_groups
    else:
        n_groups = (
            prune_groups(data, len(state.centroids)) if prune is not False else 0
        )  # planned here, in budget
    while True:
        end = max_iter
        if on_state is not None and state_every:
            end = min(max_iter, (state.n_iter // state_every + 1) * state_every)
        try:
            result = data.run_loop(
                lloyd_iterations,
                (state, end, stop_rule, metric, prune, n_groups, capacitated),
                work_per_row=work_per_row,
                on_progress=report,
            )
        except INTERRUPTIONS as stop:
            # a block run here, pass by pass, hands over its last finished update (a block
            # running in a task cannot: the last state is then the previous block's)
            latest = getattr(stop, "loop_state", None)
            if on_state is not None and latest is not None and latest.n_iter > state.n_iter:
                on_state(latest)
            raise
        if isinstance(prune, PrunedPasses) and result.pruning is not None:
            prune.adopt(result.pruning)  # (the block ran in a task: its copy's bookkeeping)
        if capacitated is not None and result.capacitated is not None:
            capacitated.adopt(result.capacitated)  # its assignments' passes, its last prices
        for record in result.history[
            len(state.history) :
        ]:  # what a one-task block could not report live
            report(record.as_dict())
        if result.n_iter > state.n_iter:
            state = LoopState(
                result.centroids, result.n_iter, result.history[-1].objective, list(result.history)
            )
            if on_state is not None:
                on_state(state)
        if result.stop_reason != "max_iter" or result.n_iter >= max_iter:
            return result
        if stop_asked:  # asked while a block ran where the request could not reach it (one task)
            result.stop_reason = STOPPED
            return result


def lloyd_iterations(
    data,
    state: LoopState,
    max_iter: int,
    stop_rule,
    metric: str = "euclidean",
    prune=False,
    n_groups: int | None = None,
    capacitated=None,
) -> LloydResult:
    """Lloyd from ``state`` up to ``max_iter`` updates, one pass per iteration over ``data``.

    The body of :func:`lloyd`'s blocks: runs wherever ``data`` lives (in the caller, in one
    task, on every SPMD rank), reporting each iteration through ``data.report``. ``prune``:
    see :func:`lloyd` (a value: the bounds live as long as this call; a run's ``PrunedPasses``:
    they are picked up and kept where the chunks are), with ``n_groups`` groups of
    centroids (:func:`~dkmeans.drivers.pruned_lloyd.prune_groups`; default: from ``data``).
    """
    C = np.asarray(state.centroids).astype(data.dtype, copy=True)
    history: list[IterationRecord] = list(state.history)
    previous_objective = state.previous_objective
    n_iter = state.n_iter
    reason = stop_after_update(history[-1], stop_rule) if history else None
    if reason is not None:  # the checkpoint was written just before the loop stopped
        return LloydResult(C, n_iter, reason, True, history)
    update, scale = (
        (unit_centroids if metric == "cosine" else update_centroids),
        objective_scale(metric),
    )
    if capacitated is not None:  # the size caps' assignment (its prices kept between iterations)
        passes = capacitated
        passes.begin(data, max_iter - n_iter)
    elif isinstance(prune, PrunedPasses):
        passes = prune
        passes.begin(data, max_iter - n_iter)
    else:
        passes = PrunedPasses(data, prune, len(C), n_groups, max_iter - n_iter)
    try:
        result = _iterate(
            data, passes, C, history, previous_objective, n_iter, max_iter, stop_rule, update, scale
        )
    finally:
        passes.end(data)
    if passes is prune:
        result.pruning = passes
    if passes is capacitated:
        result.capacitated = passes
    return result


def _iterate(
    data, passes, C, history, previous_objective, n_iter, max_iter, stop_rule, update, scale
):
    """The loop of :func:`lloyd_iterations`."""
    n_records = len(history)
    stop_reason, converged = "max_iter", False
    carried = None  # the next iteration's partials, formed with an empty-cluster refill
    best = None  # capped loops: the lowest objective and the centroids updated from it
    try:
        for it in range(n_iter, max_iter):
            t0 = time.perf_counter()
            if carried is not None:
                partials, computed = carried, 1.0
            else:
                partials, computed = passes.partials(data, C)
            carried = None
            if it == 0:
                _check_finite(partials)
            objective = float(partials.objective) * scale
            if (
                isinstance(stop_rule, ObjectiveDecrease)
                and previous_objective is not None
                and previous_objective - objective < stop_rule.threshold
            ):
                stop_reason, converged = stop_rule.name, True
                break
            if isinstance(passes, CapacitatedPasses) and passes.settled:
                # no assignment within the caps cheaper than the last one's at these centroids
                # (the exact solve's, or STOP_PATIENCE uncertified ones): the loop ends
                stop_reason, converged = "objective-decrease", True
                break
            new, empty = update(partials, C)
            n_empty = int(empty.sum())
            capped = isinstance(passes, CapacitatedPasses)
            if n_empty and it + 1 < max_iter and not capped:  # next assignment: with the refill
                new, carried = fill_empty_clusters(data, new, empty, assign_next=True)
            elif n_empty:
                new = fill_empty_clusters(data, new, empty)
            new = new.astype(data.dtype)
            if capped and (best is None or objective < best[0]):
                best = (objective, new)  # the centroids updated from the best assignment
            shift = float(np.sum((new.astype(np.float64) - C.astype(np.float64)) ** 2))
            record = IterationRecord(
                it + 1, objective, shift, n_empty, time.perf_counter() - t0, computed
            )
            history.append(record)
            stop = data.report(record.as_dict())
            C, n_iter, previous_objective, n_records = new, it + 1, objective, len(history)
            reason = stop_after_update(record, stop_rule)
            if reason is not None:
                stop_reason, converged = reason, True
                break
            if stop:  # the caller asked to stop: here, with this update's centroids
                stop_reason = STOPPED
                break
    except INTERRUPTIONS as stop:
        # the last finished update, for a final checkpoint: (C, n_iter, previous_objective,
        # n_records) change together, in one assignment
        stop.loop_state = LoopState(C, n_iter, previous_objective, history[:n_records])
        raise
    if best is not None and previous_objective is not None and best[0] < previous_objective:
        C = best[1]  # a capped loop ends on its best iterate (uncertified assignments can rise)
    return LloydResult(C, n_iter, stop_reason, converged, history)


# -- objective ---------------------------------------------------------------------
def _objectives_chunk(X, w, offset, center_sets):
    return objectives(X, w, center_sets)


def objective(data, centroids: np.ndarray) -> float:
    """Weighted objective of the data for ``centroids`` (one pass, O(workers) tasks)."""
    values = data.map_reduce(
        _objectives_chunk, _sum_arrays, ([np.asarray(centroids).astype(data.dtype)],)
    )
    return float(values[0])


def _sum_arrays(parts):
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


__all__ = [
    "CentroidShift",
    "IterationRecord",
    "LloydResult",
    "ObjectiveDecrease",
    "lloyd",
    "lloyd_iterations",
    "objective",
]
