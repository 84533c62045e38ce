"""Plain data every layer may hold: iteration records, loop and fit state, run summaries.

A Lloyd or Hartigan driver produces the records, the fit service keeps the state, the
checkpoint file (:mod:`dkmeans.io.checkpoint`) writes and reads it, and the faces turn
the records into ``history_`` dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class IterationRecord:
    """One Lloyd iteration: the objective of its assignment step and what its update did.

    ``distances_computed``: the share of the row-to-centroid distances its assignment step
    computed (1.0 unpruned; a pruned pass skips those its bounds prove cannot matter, and the
    pass that builds the bounds may compute a little more than all of them).
    """

    iteration: int
    objective: float
    centroid_shift: float
    empty_clusters_fixed: int
    seconds: float
    distances_computed: float = 1.0

    def as_dict(self) -> dict:
        return {
            "iteration": self.iteration,
            "objective": self.objective,
            "centroid_shift": self.centroid_shift,
            "empty_clusters_fixed": self.empty_clusters_fixed,
            "seconds": self.seconds,
            "distances_computed": self.distances_computed,
        }


@dataclass(frozen=True)
class HartiganRecord:
    """One Hartigan round (batch) or sweep (standard), and the partition it left.

    Attributes
    ----------
    iteration : int
        0 for the initial partition, then 1, 2, ...
    objective : float
        Weighted objective of the partition after the round (rows to their own cluster mean).
    moves : int
        Rows moved in the round.
    proposals : int
        Rows that had an improving move at the start of the round (batch); moves (standard).
    mode : str
        ``"initial"``, ``"sweep"`` (standard), ``"safe"``, ``"unsafe"`` (accept-all kept)
        or ``"safe-fallback"`` (accept-all did not lower the objective and was undone).
    predicted_change : float
        Sum of the cost changes of the moves; equals the objective change in safe mode
        and in a sweep (up to rounding).
    seconds : float
    """

    iteration: int
    objective: float
    moves: int
    proposals: int
    mode: str
    predicted_change: float
    seconds: float

    def as_dict(self) -> dict:
        return {
            "iteration": self.iteration,
            "objective": self.objective,
            "moves": self.moves,
            "proposals": self.proposals,
            "mode": self.mode,
            "predicted_change": self.predicted_change,
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class LocalSearchRecord:
    """One round of local search.

    Attributes
    ----------
    round : int
        1-based round number.
    objective : float
        Objective after the round (of the centroids kept).
    objective_before : float
        Objective at the start of the round.
    best_swap_change : float
        Exact change of the objective under the best single swap scored (may be positive).
    best_step_change : float
        Bound on the change after the best trial's Lloyd update, relative to
        ``objective_before`` (0.0 without trials).
    lloyd_step_change : float
        The same bound for a Lloyd update without any swap (0.0 without trials).
    swaps_tried : int
        (candidate, centroid) swaps scored.
    trials : int
        Swap sets given a Lloyd step.
    swaps_accepted : int
        Swaps in the kept result (0 if nothing was kept).
    lloyd_iterations : int
        Lloyd updates run from the swapped centroids (the trial step included).
    passes : int
        Passes over the data in this round.
    kept : bool
        Whether the round's result replaced the centroids (the objective fell).
    seconds : float
    """

    round: int
    objective: float
    objective_before: float
    best_swap_change: float
    best_step_change: float
    lloyd_step_change: float
    swaps_tried: int
    trials: int
    swaps_accepted: int
    lloyd_iterations: int
    passes: int
    kept: bool
    seconds: float

    def as_dict(self) -> dict:
        """The record as a plain dict (JSON-serialisable)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class MiniBatchRecord:
    """One mini-batch step.

    Attributes
    ----------
    iteration : int
        The step's number (1-based).
    objective : float
        The batch's weighted objective against the centers before the step, per batch
        row (scikit-learn's normalised batch inertia).
    ewa_objective : float or None
        Exponentially weighted average of ``objective`` (None in the first step), which
        the ``max_no_improvement`` rule watches.
    centroid_shift : float
        Total squared change of the centers in the step (reassignments included).
    reassigned : int
        Centers moved to batch rows for their low counts.
    seconds : float
        The whole step: drawing the batch, its pass (assignment partials), the update and
        any reassignment.
    """

    iteration: int
    objective: float
    ewa_objective: float | None
    centroid_shift: float
    reassigned: int
    seconds: float

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass
class MiniBatchState:
    """Where a mini-batch run (or a stream fed to ``partial_fit``) stands.

    ``centroids`` and ``counts`` (the weight each center has accumulated, scikit-learn's
    ``_counts``) are float64; the rest is the early-stopping and reassignment bookkeeping.
    """

    centroids: np.ndarray
    counts: np.ndarray
    n_steps: int = 0
    n_since_reassign: int = 0
    ewa_objective: float | None = None
    ewa_objective_min: float | None = None
    no_improvement: int = 0


@dataclass
class PassState:
    """Where a mini-batch run stands: what its driver carries from step to step, and what a checkpoint saves.

    In a sequential pass (:func:`dkmeans.drivers.minibatch.minibatch_pass`) it travels from chunk
    to chunk, so it stays small: the run, the rows of the unfinished batch (fewer than
    ``batch_size``) and the records of the pass's steps since the driver last collected
    them. A saved state holds every step's record.

    Attributes
    ----------
    run : MiniBatchState
    pending, pending_w : ndarray or None
        Rows (and weights) read but not yet in a batch: the rows just before ``next_row``.
    history : list of MiniBatchRecord
    stop_reason : str or None
        Set once an early-stopping rule ended the run.
    epoch : int
        Sequential passes finished.
    next_row : int
        Global index of the row the current pass continues from.
    """

    run: MiniBatchState
    pending: np.ndarray | None = None
    pending_w: np.ndarray | None = None
    history: list = field(default_factory=list)
    stop_reason: str | None = None
    epoch: int = 0
    next_row: int = 0


@dataclass
class LoopState:
    """Where a Lloyd loop stands after ``n_iter`` centroid updates."""

    centroids: np.ndarray
    n_iter: int = 0
    previous_objective: float | None = None
    history: list = field(default_factory=list)  # IterationRecord


#: The stop reason of a loop its caller asked to stop (its progress callback returned True: a
#: scikit-learn callback's stop request); the loop ends after a finished step, with a valid state.
STOPPED = "stopped"


@dataclass
class RunSummary:
    """A finished run (one initialisation followed by the algorithm)."""

    centroids: np.ndarray
    score: float
    n_iter: int
    stop_reason: str
    converged: bool
    history: list  # IterationRecord / HartiganRecord


@dataclass
class FitState:
    """Everything a fit needs to continue: see the module docstring."""

    seed: int
    run: int = 0
    # "init": run not started; "lloyd": loop in progress; "local-search": Lloyd done, swaps next;
    # "settle": Lloyd again after the swaps; "refine": Hartigan next; "minibatch": a mini-batch run
    phase: str = "init"
    loop: LoopState | None = None
    best: RunSummary | None = None
    minibatch: PassState | None = None


def history_dicts(records) -> list:
    """Iteration records as dicts tagged with their ``algorithm`` ("lloyd", "hartigan" or "local-search")."""
    return [dict(r.as_dict(), algorithm=_ALGORITHM_OF[type(r)]) for r in records]


def history_records(dicts) -> list:
    """The inverse of :func:`history_dicts`."""
    out = []
    for d in dicts:
        d = dict(d)
        out.append(_RECORD_OF[d.pop("algorithm")](**d))
    return out


_ALGORITHM_OF = {
    IterationRecord: "lloyd",
    HartiganRecord: "hartigan",
    LocalSearchRecord: "local-search",
    MiniBatchRecord: "minibatch",
}
_RECORD_OF = {name: cls for cls, name in _ALGORITHM_OF.items()}


__all__ = [
    "FitState",
    "LocalSearchRecord",
    "MiniBatchRecord",
    "MiniBatchState",
    "HartiganRecord",
    "IterationRecord",
    "LoopState",
    "PassState",
    "RunSummary",
    "STOPPED",
    "history_dicts",
    "history_records",
]
