"""A whole fit on persisted data: ``n_init`` runs of initialisation, Lloyd and/or Hartigan.

Shared by :class:`dkmeans.KMeans` and :func:`dkmeans.train`. Each run goes through three
phases: ``init`` (initial centroids from a strategy), ``lloyd`` (the Lloyd loop) and
``refine`` (Hartigan, from Lloyd's result or from the initial centroids). With a
:class:`~dkmeans.checkpoint.Checkpointer` the state is saved after each initialisation,
every ``every`` Lloyd updates and after each run, and a fit given a saved
:class:`~dkmeans.checkpoint.FitState` continues from it with the same result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from dkmeans._graph import PersistedData
from dkmeans.checkpoint import Checkpointer, FitState, LoopState, RunSummary
from dkmeans.hartigan import hartigan
from dkmeans.lloyd import lloyd, objective


@dataclass
class FitPlan:
    """What each run does.

    Attributes
    ----------
    n_init : int
        Runs; the one with the lowest objective is kept (scored only when ``n_init > 1``).
    initialise : callable
        ``initialise(run) -> ndarray (k, d)``: the run's initial centroids.
    max_iter : int
        Maximum Lloyd updates, and separately maximum Hartigan rounds.
    stop_rule : ObjectiveDecrease or CentroidShift
        Lloyd's stop rule.
    lloyd : bool
        Run the Lloyd loop.
    hartigan_mode : str or None
        Then (or instead) run batch Hartigan in this mode; None: no Hartigan.
    hartigan_tol : float
        Hartigan also stops when a round lowers the objective by less than this.
    on_iteration : callable, optional
        Progress callback for Lloyd and Hartigan records.
    """

    n_init: int
    initialise: Callable[[int], np.ndarray]
    max_iter: int
    stop_rule: object
    lloyd: bool = True
    hartigan_mode: str | None = None
    hartigan_tol: float = 0.0
    on_iteration: Callable | None = None


def fit_runs(data: PersistedData, plan: FitPlan, state: FitState, checkpoint: Checkpointer | None = None) -> RunSummary:
    """Run (or continue, from ``state``) every run of ``plan``; return the best run."""

    def save():
        if checkpoint is not None:
            checkpoint.save(state)

    while state.run < plan.n_init:
        if state.phase == "init":
            state.phase, state.loop = "lloyd", LoopState(np.asarray(plan.initialise(state.run)))
            save()
        loop = state.loop
        if state.phase == "lloyd":
            if plan.lloyd:
                result = lloyd(data, loop.centroids, max_iter=plan.max_iter, stop_rule=plan.stop_rule,
                               on_iteration=plan.on_iteration, resume=loop,
                               on_state=checkpoint.loop_hook(state) if checkpoint else None,
                               state_every=checkpoint.every if checkpoint else None)
                loop = LoopState(result.centroids, result.n_iter, None, result.history)
                summary = RunSummary(result.centroids, 0.0, result.n_iter, result.stop_reason, result.converged,
                                     list(result.history))
            if plan.hartigan_mode is not None:
                state.phase, state.loop = "refine", loop
                if plan.lloyd:
                    save()
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


__all__ = ["FitPlan", "fit_runs"]
