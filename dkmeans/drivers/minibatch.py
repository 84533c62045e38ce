"""Mini-batch k-means over the data protocol (scikit-learn's ``MiniBatchKMeans``, distributed).

A step assigns the rows of a batch to the centers, then moves each center the batch
reached by scikit-learn's per-center learning rate (:func:`dkmeans.kernels.minibatch.
minibatch_update`: the center is the weighted mean of every row it was ever given, with
an optional decay of the past, Spark ``StreamingKMeans``'s rule), and every ``10 k``
batch rows (or while a center has no weight) moves the centers whose weight is below
``reassignment_ratio`` times the largest to rows of the batch, as scikit-learn does.
Two ways to draw the batches:

* :func:`minibatch` (data in memory): scikit-learn's batches, ``batch_size`` rows drawn
  with replacement from all rows, uniformly, or with sample weights in proportion to the
  weight (and then stepped with unit weights, as scikit-learn's ``fit`` does). The global
  row indices of a step's batch (with weights: positions on the exact integer cumulative
  weight, :class:`WeightedDraws`) are drawn here from a generator keyed by
  ``(seed, step)``, whatever the chunking, worker count or execution mode; every chunk
  takes the rows of the batch it holds (with their multiplicity) and returns the k x d
  partials of the batch. The steps run where the
  engine puts the loop (:meth:`~dkmeans.engine.protocol.ChunkedData.run_loop`: inside
  one task, SPMD, or one graph per step), so a step needs no round trip to the caller.
* :func:`minibatch_pass` (out-of-core data, a stream): one sequential pass in row order
  (:meth:`~dkmeans.engine.protocol.ChunkedData.fold`); the batches are the consecutive
  rows ``[j b, (j + 1) b)`` by global row index (a batch may span two chunks: the state
  carries the unfinished batch's rows), so the result does not depend on the chunking
  either. Only the state (centers, counts, under ``batch_size`` pending rows) travels
  from chunk to chunk. This assumes the rows come in random order, as any streaming
  k-means does.

Early stopping is scikit-learn's: an exponentially weighted average of the batch
objective that has not improved for ``max_no_improvement`` steps, or a squared center
change of at most ``tol`` (already scaled to the data by the caller).

Both drivers can hand their :class:`~dkmeans.drivers.state.PassState` to an ``on_state`` callback
(a checkpoint) every ``state_every`` steps and continue from such a state (``resume``):
since every draw is keyed by ``(seed, step)`` and the sequential batches by global row
index, a resumed run ends with the result of an uninterrupted one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from dkmeans.drivers.state import STOPPED, MiniBatchRecord, MiniBatchState, PassState
from dkmeans.drivers.streams import STREAMS
from dkmeans.errors import NON_FINITE_INPUT, InvalidDataError
from dkmeans.kernels import assign_partials, combine_partials
from dkmeans.kernels.minibatch import (
    batch_partials,
    batch_rows,
    combine_rows,
    combine_weighted_batches,
    integer_weight_scale,
    integer_weights,
    minibatch_update,
    reassign_targets,
    reset_counts,
    weighted_batch_partials,
)
from dkmeans.kernels.namespace import to_host

#: stream number of the batch draws in :func:`step_rng` (apart from the initialisation's)
BATCH_STREAM = STREAMS["minibatch.batches"]()


#: Rows per mini-batch step by default, on every face (scikit-learn's is 1024; measured in
#: benchmarks/README.md, ``minibatch.py --defaults``: with the k-means|| start 4096 stopped after
#: about a third of the steps 1024 needed, at the same objective).
DEFAULT_BATCH_SIZE = 4096


@dataclass(frozen=True)
class MiniBatchOptions:
    """A mini-batch run's rules (scikit-learn's names).

    Attributes
    ----------
    batch_size : int
    max_no_improvement : int or None
        Steps without improvement of the smoothed batch objective before stopping.
    reassignment_ratio : float
    decay : float in [0, 1]
        Discount of the past counts per batch (``time_unit="batches"``) or per row
        (``"points"``: the discount of a batch of ``m`` rows is ``decay ** m``).
    time_unit : {"batches", "points"}
    """

    batch_size: int = DEFAULT_BATCH_SIZE
    max_no_improvement: int | None = 10
    reassignment_ratio: float = 0.01
    decay: float = 1.0
    time_unit: str = "batches"

    def discount(self, batch_rows: int) -> float:
        return self.decay if self.time_unit == "batches" else self.decay**batch_rows


@dataclass
class MiniBatchResult:
    """Centers after the run (float64), the state to continue from, and why it stopped."""

    centroids: np.ndarray
    state: MiniBatchState
    n_steps: int
    stop_reason: str
    converged: bool
    history: list = field(default_factory=list)


def step_rng(seed: int, step: int) -> np.random.Generator:
    """The generator of step ``step``'s draws (its batch, then its reassignment rows)."""
    return np.random.default_rng([int(seed) % 2**64, BATCH_STREAM, int(step)])


# -- one step (runs wherever the loop runs) ----------------------------------------------
def minibatch_step(
    state: MiniBatchState,
    partials,
    batch_len: int,
    options: MiniBatchOptions,
    rng: np.random.Generator,
    batch_rows_at: Callable[[np.ndarray], np.ndarray],
):
    """Apply one batch's partials to ``state``; returns ``(new state, centroid shift, reassigned)``.

    ``batch_rows_at(positions)`` returns the batch's rows at these positions (0-based,
    in the batch's order): the new centers of a reassignment, drawn uniformly without
    replacement from the batch as scikit-learn does.
    """
    C, counts = state.centroids, state.counts
    k = len(C)
    # scikit-learn decides on a reassignment before the step, from the counts before it
    n_since = state.n_since_reassign + options.batch_size
    random_reassign = bool((counts == 0).any()) or n_since >= 10 * k
    if random_reassign:
        n_since = 0
    new, new_counts = minibatch_update(
        C, counts, partials.sums, partials.counts, options.discount(batch_len)
    )
    n_reassigned = 0
    if random_reassign and options.reassignment_ratio > 0:
        targets = reassign_targets(new_counts, batch_len, options.reassignment_ratio)
        n_reassigned = int(targets.sum())
        if n_reassigned:
            positions = rng.choice(batch_len, size=n_reassigned, replace=False)
            new[targets] = batch_rows_at(positions)
        new_counts = reset_counts(new_counts, targets)
    shift = float(np.sum((new - C) ** 2))
    return (
        replace(
            state,
            centroids=new,
            counts=new_counts,
            n_steps=state.n_steps + 1,
            n_since_reassign=n_since,
        ),
        shift,
        n_reassigned,
    )


def _converged(
    state: MiniBatchState,
    batch_objective: float,
    shift: float,
    n_total: int,
    batch_size: int,
    tol: float,
    max_no_improvement,
):
    """scikit-learn's early stopping after step ``state.n_steps``: ``(state, reason or None)``."""
    objective = batch_objective / batch_size
    if state.n_steps == 1:  # the first batch's objective is the initialisation's
        return state, None
    if state.ewa_objective is None:
        ewa = objective
    else:
        alpha = min(1.0, batch_size * 2.0 / (n_total + 1))
        ewa = state.ewa_objective * (1 - alpha) + objective * alpha
    state = replace(state, ewa_objective=ewa)
    if tol > 0.0 and shift <= tol:
        return state, "centroid-shift"
    if state.ewa_objective_min is None or ewa < state.ewa_objective_min:
        state = replace(state, no_improvement=0, ewa_objective_min=ewa)
    else:
        state = replace(state, no_improvement=state.no_improvement + 1)
    if max_no_improvement is not None and state.no_improvement >= max_no_improvement:
        return state, "no-improvement"
    return state, None


def _check_finite(partials) -> None:
    if not (np.isfinite(partials.objective) and np.all(np.isfinite(partials.sums))):
        raise InvalidDataError(NON_FINITE_INPUT)


def advance(
    state, partials, batch_len, options, rng, rows_at, n_total, tol, check_stop=True, started=None
):
    """A step and its early-stopping check: ``(state, record, stop reason or None)``.

    ``started`` (a ``time.perf_counter()`` value) is when the step began (its batch's
    pass included): the record's seconds count from there.
    """
    t0 = time.perf_counter() if started is None else started
    _check_finite(partials)
    state, shift, reassigned = minibatch_step(state, partials, batch_len, options, rng, rows_at)
    reason = None
    if check_stop:
        state, reason = _converged(
            state,
            float(partials.objective),
            shift,
            n_total,
            options.batch_size,
            tol,
            options.max_no_improvement,
        )
    record = MiniBatchRecord(
        state.n_steps,
        float(partials.objective) / batch_len,
        state.ewa_objective,
        shift,
        reassigned,
        time.perf_counter() - t0,
    )
    return state, record, reason


# -- random batches (data in memory) ------------------------------------------------------
def _batch_chunk(X, w, offset, batch_index, C):
    # uniform batches: of unweighted data, or of equal weights (unit-weight steps, as drawn by weight)
    return batch_partials(X, None, offset, batch_index, C)


def _rows_chunk(X, w, offset, wanted):
    return batch_rows(X, w, offset, wanted)


def _weighted_batch_chunk(X, w, offset, draws, scale, starts, C):
    return weighted_batch_partials(X, w, offset, starts[offset], draws, scale, C)


def _weight_range_chunk(X, w, offset):
    w = to_host(w)
    return (float(w.min()), float(w.max())) if len(w) else (math.inf, 0.0)


def _combine_ranges(parts):
    return min(p[0] for p in parts), max(p[1] for p in parts)


def _integer_weight_chunk(X, w, offset, scale):
    return [(int(offset), int(integer_weights(w, scale).sum()))]


def _concat_lists(parts):
    return [item for part in parts for item in part]


@dataclass(frozen=True)
class WeightedDraws:
    """How batches are drawn by weight: positions ``u`` in ``[0, total)`` on the cumulative integer weight.

    ``scale`` turns weights into integers (:func:`~dkmeans.kernels.minibatch.integer_weights`);
    ``starts`` maps each chunk's first global row to the integer weight of the rows before it.
    """

    scale: float
    total: int
    starts: dict

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.sort(rng.integers(0, self.total, size))


def weighted_draws(data) -> WeightedDraws | None:
    """The :class:`WeightedDraws` of weighted data (two passes over the weights), else None.

    None too when every weight is the same (one pass): drawing by weight is then drawing
    uniformly, and the batches are the unweighted fit's (``np.ones(n)`` gives exactly the
    unweighted result, as in scikit-learn).
    """
    if not data.has_weights:
        return None
    low, high = data.map_reduce(_weight_range_chunk, _combine_ranges)
    if low == high:
        return None
    scale = integer_weight_scale(data.n_rows, high)
    sums = sorted(data.map_reduce(_integer_weight_chunk, _concat_lists, (scale,)))
    starts, total = {}, 0
    for offset, chunk_sum in sums:
        starts[offset], total = total, total + chunk_sum
    return WeightedDraws(scale, total, starts)


def gather_rows(data, index):
    """The rows at global ``index`` (repeats allowed) and their weights, in one pass of small results.

    Works on every implementation of the protocol (an SPMD rank's included).
    """
    index = np.asarray(index, dtype=np.int64)
    found, rows, weights = data.map_reduce(_rows_chunk, combine_rows, (np.unique(index),))
    order = np.argsort(found, kind="stable")
    at = order[np.searchsorted(found[order], index)]
    return rows[at], weights[at]


def minibatch(
    data,
    state: MiniBatchState,
    *,
    n_steps: int,
    seed: int,
    options: MiniBatchOptions,
    tol: float = 0.0,
    on_step: Callable[[MiniBatchRecord], None] | None = None,
    resume: PassState | None = None,
    on_state: Callable[[PassState], None] | None = None,
    state_every: int | None = None,
) -> MiniBatchResult:
    """Mini-batch steps with scikit-learn's batches, from ``state`` up to ``n_steps`` steps in all.

    The steps run in blocks that end every ``state_every`` steps (for ``on_state``), each
    block where the engine chooses (:meth:`~dkmeans.engine.protocol.ChunkedData.run_loop`).

    Parameters
    ----------
    data : ChunkedData
    state : MiniBatchState
        Initial centers (counts zero) or a run to continue. Ignored when ``resume`` is given.
    n_steps : int
        scikit-learn's ``(max_iter * n_samples) // batch_size``.
    seed : int
        Batch ``s`` is drawn by :func:`step_rng` ``(seed, s)``.
    options : MiniBatchOptions
        ``batch_size`` at most ``data.n_rows``.
    tol : float
        Squared center change to stop at (already scaled; 0 disables the rule).
    on_step : callable, optional
        Called with each :class:`MiniBatchRecord`; True from it stops the steps (stop reason
        ``"stopped"``; see :meth:`~dkmeans.engine.protocol.ChunkedData.report`).
    resume : PassState, optional
        Continue a run from a checkpoint: its state, records and stop reason.
    on_state : callable, optional
        Called with the :class:`PassState` (every record so far) at the end of every block.
    state_every : int, optional
        Block length: blocks end at multiples of this step count; None: one block.
    """
    progress = resume if resume is not None else PassState(state)
    state, reason, history = progress.run, progress.stop_reason, list(progress.history)
    reported = state.n_steps
    stop_asked = False

    def report(record: dict) -> bool:
        nonlocal reported, stop_asked
        if on_step is not None and record["iteration"] > reported:
            stop_asked = bool(on_step(MiniBatchRecord(**record))) or stop_asked
        reported = max(reported, record["iteration"])
        return stop_asked

    work_per_row = len(state.centroids) * data.n_features * options.batch_size / max(1, data.n_rows)
    draws = weighted_draws(data)
    while reason is None and state.n_steps < n_steps:
        end = n_steps
        if on_state is not None and state_every:
            end = min(n_steps, (state.n_steps // state_every + 1) * state_every)
        result = data.run_loop(
            minibatch_steps,
            (state, end, seed, options, tol, draws),
            work_per_row=work_per_row,
            on_progress=report,
        )
        for record in result.history:  # what a one-task block could not report live
            report(record.as_dict())
        history += result.history
        state, reason = result.state, (result.stop_reason if result.converged else None)
        if stop_asked:  # (a block in one task hears the request only when it ends)
            reason = STOPPED
        if on_state is not None:
            on_state(PassState(state, history=list(history), stop_reason=reason))
    return MiniBatchResult(
        state.centroids,
        state,
        state.n_steps,
        reason or "max_iter",
        reason not in (None, STOPPED),
        history,
    )


def minibatch_steps(
    data,
    state: MiniBatchState,
    n_steps: int,
    seed: int,
    options: MiniBatchOptions,
    tol: float,
    draws: WeightedDraws | None = None,
) -> MiniBatchResult:
    """The body of :func:`minibatch` (runs in the caller, in one task, or on every SPMD rank).

    ``draws``: weighted data's :class:`WeightedDraws` (batches drawn by weight, unit-weight steps).
    """
    n, b = data.n_rows, options.batch_size
    history, reason = [], None
    while state.n_steps < n_steps:
        t0 = time.perf_counter()
        rng = step_rng(seed, state.n_steps)
        C = state.centroids.astype(data.dtype)
        if draws is None:
            index = rng.integers(0, n, b)
            partials = data.map_reduce(_batch_chunk, combine_partials, (np.sort(index), C))
        else:  # the batch's global rows come back with its partials
            partials, index = data.map_reduce(
                _weighted_batch_chunk,
                combine_weighted_batches,
                (draws.draw(rng, b), draws.scale, draws.starts, C),
            )

        def rows_at(positions, index=index):
            wanted = index[positions]
            return gather_rows(data, wanted)[0]

        state, record, reason = advance(
            state, partials, b, options, rng, rows_at, n, tol, started=t0
        )
        history.append(record)
        if data.report(record.as_dict()) and reason is None:  # the caller asked to stop
            return MiniBatchResult(state.centroids, state, state.n_steps, STOPPED, False, history)
        if reason is not None:
            break
    converged = reason is not None
    return MiniBatchResult(
        state.centroids, state, state.n_steps, reason or "max_iter", converged, history
    )


# -- one sequential pass (out-of-core data, streams) ----------------------------------------
def _run_batches(st: PassState, X, w, seed, options, tol, n_total, dtype, final: bool) -> PassState:
    """Every full batch of ``pending + X`` (and the remainder too when ``final``)."""
    X = np.asarray(to_host(X))
    w = None if w is None else np.asarray(to_host(w), dtype=np.float64)
    if st.pending is not None and len(st.pending):
        X = np.concatenate([st.pending, X])
        if w is not None or st.pending_w is not None:
            w = np.concatenate(
                [
                    st.pending_w if st.pending_w is not None else np.ones(len(st.pending)),
                    w if w is not None else np.ones(len(X) - len(st.pending)),
                ]
            )
    b, pos = options.batch_size, 0
    run, history, reason = st.run, list(st.history), st.stop_reason
    while reason is None and (len(X) - pos >= b or (final and len(X) - pos > 0)):
        t0 = time.perf_counter()
        Xb = X[pos : pos + b]
        wb = None if w is None else w[pos : pos + b]
        pos += len(Xb)
        rng = step_rng(seed, run.n_steps)
        partials = assign_partials(Xb, run.centroids.astype(dtype), wb)
        run, record, reason = advance(
            run, partials, len(Xb), options, rng, lambda p, Xb=Xb: Xb[p], n_total, tol, started=t0
        )
        history.append(record)
    return replace(
        st,
        run=run,
        pending=X[pos:].copy(),
        pending_w=None if w is None else w[pos:].copy(),
        history=history,
        stop_reason=reason,
    )


def _fold_chunk(X, w, offset, st: PassState, seed, options, tol, n_total, dtype):
    if st.stop_reason is not None:
        return st
    n_rows = X.shape[0]
    skip = st.next_row - offset  # rows a resumed pass already took (its chunks may end elsewhere)
    if skip > 0:
        X, w = X[skip:], (None if w is None else w[skip:])
    st = _run_batches(st, X, w, seed, options, tol, n_total, dtype, final=False)
    return replace(st, next_row=max(st.next_row, offset + n_rows))


def minibatch_pass(
    data,
    state: MiniBatchState,
    *,
    seed: int,
    options: MiniBatchOptions,
    tol: float = 0.0,
    max_passes: int = 1,
    n_total: int | None = None,
    on_step: Callable[[MiniBatchRecord], None] | None = None,
    resume: PassState | None = None,
    on_state: Callable[[PassState], None] | None = None,
    state_every: int | None = None,
) -> MiniBatchResult:
    """Mini-batch k-means in sequential passes over the data in row order (see the module docstring).

    Each pass is one :meth:`~dkmeans.engine.protocol.ChunkedData.fold`: batches of
    ``batch_size`` consecutive rows (the last batch of a pass may be shorter). Stops
    early by scikit-learn's rules (later chunks are then not read), else after
    ``max_passes`` passes. ``n_total`` (default ``data.n_rows``) sets the smoothing of
    the batch objective as in scikit-learn. ``on_step`` sees the records as the state
    comes back between groups of chunks.

    ``on_state`` is called with the :class:`PassState` (position, pending rows, every
    record so far) between groups of chunks once at least ``state_every`` steps ran since
    its last call, and at the end of the run (``state_every`` None: only then). A run
    resumed from such a state (``resume``; ``state`` is then ignored) does not read the
    chunks before its position again.
    """
    n_total = int(n_total if n_total is not None else data.n_rows)
    st = resume if resume is not None else PassState(state)
    history, st = list(st.history), replace(st, history=[])  # st.history: this pass's new records
    args = (seed, options, tol, n_total, data.dtype)
    reported, saved_at, stop_asked = 0, st.run.n_steps, False

    def report(s: PassState) -> None:
        nonlocal reported, stop_asked
        if on_step is not None:
            for record in s.history[reported:]:
                stop_asked = bool(on_step(record)) or stop_asked
        reported = len(s.history)

    def save(s: PassState, final: bool = False) -> None:
        nonlocal saved_at
        if on_state is not None and (
            final or (state_every and s.run.n_steps - saved_at >= state_every)
        ):
            on_state(replace(s, history=history + s.history))
            saved_at = s.run.n_steps

    def between_windows(s: PassState) -> None:
        report(s)
        save(s)

    while st.stop_reason is None and st.epoch < max_passes:
        st = data.fold(
            _fold_chunk,
            st,
            args,
            on_state=between_windows,
            start_row=st.next_row,
            stop=lambda s: s.stop_reason is not None or stop_asked,
        )
        if st.stop_reason is None and not stop_asked:  # the pass's last, shorter batch
            st = _run_batches(
                st, np.empty((0, data.n_features), data.dtype), None, *args, final=True
            )
        report(st)
        if stop_asked and st.stop_reason is None:  # the caller asked to stop (seen between windows)
            st = replace(st, stop_reason=STOPPED)
        history += st.history
        st, reported = PassState(st.run, stop_reason=st.stop_reason, epoch=st.epoch + 1), 0
        save(st, final=st.stop_reason is not None or st.epoch >= max_passes)
    return MiniBatchResult(
        st.run.centroids,
        st.run,
        st.run.n_steps,
        st.stop_reason or "max_iter",
        st.stop_reason not in (None, STOPPED),
        history,
    )


__all__ = [
    "BATCH_STREAM",
    "PassState",
    "WeightedDraws",
    "advance",
    "gather_rows",
    "MiniBatchOptions",
    "MiniBatchResult",
    "minibatch",
    "minibatch_pass",
    "minibatch_step",
    "minibatch_steps",
    "step_rng",
    "weighted_draws",
]
