"""A fit's runs: initialisation, Lloyd, the local search and Hartigan's refinement, each run checkpointed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dkmeans.drivers.capped_start import capped_start, capped_start_size
from dkmeans.drivers.coreset import (
    CONFIRM_ITERS,
    coreset_local_search,
    coreset_searches,
    coreset_size,
    coreset_start,
)
from dkmeans.drivers.hartigan import hartigan
from dkmeans.drivers.lloyd import lloyd, objective, stop_after_update
from dkmeans.drivers.pruned_lloyd import PrunedPasses
from dkmeans.drivers.state import STOPPED, FitState, LoopState, RunSummary
from dkmeans.drivers.streams import derive_seed
from dkmeans.errors import INTERRUPTIONS
from dkmeans.fit.inputs import check_user_centroids
from dkmeans.fit.spec import FitSpec
from dkmeans.io.checkpoint import Checkpointer


# -- the runs ---------------------------------------------------------------------------
@dataclass
class FitPlan:
    """What each run does (see :func:`fit_runs`)."""

    n_init: int
    #: ``initialise(run)``: the run's starting centroids
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
    prune: object = False
    #: ``on_run_start(run)`` where each run starts (its initialisation; a resumed run too)
    on_run_start: Callable[[int], None] | None = None
    #: ``on_run_end(run)`` after each run; True stops the runs left (the best so far is the result)
    on_run_end: Callable[[int], bool] | None = None
    #: size caps (:class:`~dkmeans.drivers.capacitated.Capacity`): every run's Lloyd assigns under them
    capacity: object = None
    #: the capped runs' passes (prices carried from run to run), set by :func:`fit_runs`
    capacitated: object = None


#: Coreset searches of a run at most: another follows one whose result the data confirmed.
CORESET_SEARCHES = 3


#: Lloyd updates on the data before the searches (when they run): by then Lloyd is in its slow
#: tail (manyk: the objective within 0.3% of Lloyd's fixed point after 5 of 17 updates), which is
#: paid once, after the searches, instead of before them and again after each confirmation.
SEARCH_AFTER_ITERS = 5


#: A run settles its start on a sample only where the sample holds at most this share of the
#: rows: a larger one costs about what the data's own Lloyd updates cost, and where it is all the
#: rows its Lloyd would be the fit's (measured in ``benchmarks/README.md``, "max_iter and n_iter_").
SETTLE_MAX_SHARE = 0.5
#: Lloyd updates of the settle on the sample at most
#: (:func:`~dkmeans.drivers.coreset.coreset_start`).
SETTLE_MAX_ITER = 300


def settles_start(data, plan: FitPlan, k: int) -> bool:
    """Whether a run of ``plan`` settles and searches its seeding on a sample of the rows before
    Lloyd (:func:`~dkmeans.drivers.coreset.coreset_start`).

    Only where the sample is at most :data:`SETTLE_MAX_SHARE` of the rows, and where
    ``max_iter`` allows the settle its :data:`SETTLE_MAX_ITER` updates: a settle cut short by
    ``max_iter`` would give each cap its own start, and a larger cap could then end higher. So
    below it a run is Lloyd from the seeding (scikit-learn's meaning: ``max_iter=1`` is one
    update from it) and every larger ``max_iter`` ends no higher; from it on the start is the
    same whatever the cap.
    """
    n = data.n_rows
    return (
        plan.local_search
        and plan.lloyd
        and plan.warm_start
        and plan.max_iter >= SETTLE_MAX_ITER
        and coreset_searches(n, k)
        and coreset_size(n, k) <= SETTLE_MAX_SHARE * n
    )


def capped_settles(data, plan: FitPlan, k: int) -> bool:
    """Whether a capped run of ``plan`` settles its seeding under the caps on samples of the rows
    before Lloyd on the data (:func:`~dkmeans.drivers.capped_start.capped_start`): for a
    seeding's centroids (never the user's), any caps, where the first sample is small beside the
    rows (:func:`~dkmeans.drivers.capped_start.capped_start_size`) and ``max_iter`` allows the
    settle its :data:`SETTLE_MAX_ITER` updates (as :func:`settles_start`)."""
    return (
        plan.capacitated is not None
        and plan.lloyd
        and plan.warm_start
        and plan.max_iter >= SETTLE_MAX_ITER
        and capped_start_size(data.n_rows, k) > 0
    )


def _searches(data, plan: FitPlan, k: int) -> bool:
    """Whether a run of ``plan`` searches swaps after Lloyd (:func:`_local_search_phase`)."""
    return plan.local_search and coreset_searches(data.n_rows, k)


def _first_lloyd_iters(data, plan: FitPlan, k: int) -> int:
    """Lloyd updates of a run before its local-search phase (see :data:`SEARCH_AFTER_ITERS`)."""
    return min(plan.max_iter, SEARCH_AFTER_ITERS) if _searches(data, plan, k) else plan.max_iter


def _local_search_phase(
    data, plan: FitPlan, loop: LoopState, run: int, pruning=False
) -> RunSummary:
    """Swaps searched on a sample, confirmed by Lloyd on the data
    (:func:`dkmeans.drivers.coreset.coreset_local_search`).

    ``max_iter`` bounds the run's Lloyd updates on the data in all: Lloyd's first
    :data:`SEARCH_AFTER_ITERS` updates, then the searches' confirmations (kept or not: each
    update is a pass over the data, counted in the run's ``n_iter``), then Lloyd again
    share it. A confirmation runs :data:`~dkmeans.drivers.coreset.CONFIRM_ITERS` updates at most;
    after a confirmed search another one starts from its result (a new sample),
    :data:`CORESET_SEARCHES` at most. Lloyd then goes on from the last confirmed result (or
    from its own, when nothing was confirmed) to its stop rule, with what is left of
    ``max_iter``.

    A larger ``max_iter`` never ends with a higher objective: the searches do not depend on
    the cap, a confirmation cut short by it is kept only when already below the start (and
    then would be kept, lower still, uncut), and the cap only ends the sequence earlier.
    """
    k = len(loop.centroids)
    budget = plan.max_iter - loop.n_iter if plan.lloyd else plan.max_iter
    lloyd_stop = stop_after_update(loop.history[-1], plan.stop_rule) if loop.history else None
    # Lloyd stopped at the cap before the searches, not at its stop rule: it goes on after them
    paused = plan.lloyd and lloyd_stop is None and loop.n_iter >= _first_lloyd_iters(data, plan, k)
    if lloyd_stop is None and plan.lloyd:
        lloyd_stop = "max_iter" if loop.n_iter >= plan.max_iter else None
    paused = paused and loop.n_iter < plan.max_iter
    unchanged = RunSummary(
        loop.centroids.astype(data.dtype),
        0.0,
        loop.n_iter,
        lloyd_stop or "local-search",
        lloyd_stop != "max_iter",
        list(loop.history),
    )
    if budget <= 0 or not coreset_searches(data.n_rows, k):
        return unchanged
    history, summary, centroids, n_iter = list(loop.history), unchanged, loop.centroids, loop.n_iter
    end = loop.n_iter + budget  # the run's last Lloyd update
    settled = None
    for attempt in range(
        CORESET_SEARCHES
    ):  # again from a confirmed result, while the data confirms
        bound = (
            history[-1].objective if history else np.nan
        )  # the last assignment's: >= the centroids'
        search = coreset_local_search(
            data,
            centroids,
            seed=derive_seed(plan.seed_of_run(run), attempt),
            stop_rule=plan.stop_rule,
            max_iter=min(CONFIRM_ITERS, end - n_iter),
            metric=plan.metric,
            on_iteration=plan.on_iteration,
            prune=pruning,
            objective_bound=bound,
        )
        record = dataclasses.replace(search.record, round=attempt + 1)
        asked = plan.on_iteration is not None and bool(plan.on_iteration(record))
        history.append(record)
        if search.lloyd is not None:  # its updates were passes over the data, kept or not
            history += list(search.lloyd.history)
            n_iter += search.lloyd.n_iter
        asked = asked or (search.lloyd is not None and search.lloyd.stop_reason == STOPPED)
        if search.kept:
            settled = search.lloyd
            centroids = search.centroids
            summary = RunSummary(centroids, 0.0, n_iter, settled.stop_reason, settled.converged, [])
        if asked:  # a stop request: the run ends with the best result confirmed so far
            summary = dataclasses.replace(
                summary, stop_reason=STOPPED, converged=False, n_iter=n_iter, history=history
            )
            return summary
        if not search.kept or n_iter >= end:  # (not kept: the last result stands, and its rule)
            break
    goes_on = settled.stop_reason == "max_iter" if settled is not None else paused
    if goes_on and n_iter < end:
        # the last confirmation stopped at its cap, or Lloyd before the searches: Lloyd goes on
        result = lloyd(
            data,
            centroids,
            max_iter=end - n_iter,
            stop_rule=plan.stop_rule,
            on_iteration=plan.on_iteration,
            metric=plan.metric,
            prune=pruning,
        )
        history += list(result.history)
        n_iter += result.n_iter
        summary = RunSummary(
            np.asarray(result.centroids).astype(data.dtype),
            0.0,
            n_iter,
            result.stop_reason,
            result.converged,
            [],
        )
    elif goes_on:  # the cap was spent on confirmations: Lloyd stopped short of its rule
        summary = dataclasses.replace(summary, stop_reason="max_iter", converged=False)
    summary.n_iter = n_iter
    summary.history = history
    return summary


def fit_runs(
    data, plan: FitPlan, state: FitState, checkpoint: Checkpointer | None = None
) -> RunSummary:
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

    try:
        while state.run < plan.n_init:
            if plan.on_run_start is not None:
                plan.on_run_start(state.run)
            if state.phase == "init":
                start = np.asarray(plan.initialise(state.run))
                if settles_start(data, plan, len(start)):
                    # settled and searched on a sample first
                    start = coreset_start(
                        data,
                        start,
                        seed=plan.seed_of_run(state.run),
                        stop_rule=plan.stop_rule,
                        max_iter=SETTLE_MAX_ITER,
                    )
                elif capped_settles(data, plan, len(start)):
                    # the caps' walk out of the natural blobs made on a sample first
                    start = capped_start(
                        data,
                        start,
                        plan.capacitated,
                        seed=plan.seed_of_run(state.run),
                        stop_rule=plan.stop_rule,
                        max_iter=SETTLE_MAX_ITER,
                        metric=plan.metric,
                    )
                state.phase, state.loop = "lloyd", LoopState(start)
                save()
            loop = state.loop
            summary = RunSummary(
                loop.centroids.astype(data.dtype),
                0.0,
                loop.n_iter,
                "max_iter",
                False,
                list(loop.history),
            )
            # one pruning object for the run: its Lloyd blocks share their bounds (dropped at the run's end)
            pruning = PrunedPasses.for_run(
                data, plan.prune, len(loop.centroids), max(0, plan.max_iter - loop.n_iter)
            )
            try:
                if state.phase == "lloyd":
                    if plan.lloyd:
                        result = lloyd(
                            data,
                            loop.centroids,
                            max_iter=_first_lloyd_iters(data, plan, len(loop.centroids)),
                            stop_rule=plan.stop_rule,
                            on_iteration=plan.on_iteration,
                            resume=loop,
                            on_state=checkpoint.loop_hook(state) if checkpoint else None,
                            state_every=checkpoint.every if checkpoint else None,
                            metric=plan.metric,
                            prune=pruning,
                            capacitated=plan.capacitated,
                        )
                        loop = LoopState(result.centroids, result.n_iter, None, result.history)
                        summary = RunSummary(
                            result.centroids,
                            0.0,
                            result.n_iter,
                            result.stop_reason,
                            result.converged,
                            list(result.history),
                        )
                    if summary.stop_reason == STOPPED:  # asked to stop: the run ends here
                        state.phase = "done"
                    elif plan.local_search:
                        enter("local-search", loop)
                    elif plan.hartigan_mode is not None:
                        enter("refine", loop)
                if state.phase == "local-search":
                    summary = _local_search_phase(data, plan, loop, state.run, pruning)
                    loop = LoopState(summary.centroids, summary.n_iter, None, summary.history)
                    if summary.stop_reason == STOPPED:
                        state.phase = "done"
                    elif plan.hartigan_mode is not None:
                        enter("refine", loop)
                if state.phase == "refine":
                    if isinstance(pruning, PrunedPasses):  # its bounds' memory is Hartigan's now
                        pruning.release(data)
                    result = hartigan(
                        data,
                        loop.centroids.astype(data.dtype),
                        max_iter=plan.max_iter,
                        mode=plan.hartigan_mode,
                        tol=plan.hartigan_tol,
                        on_iteration=plan.on_iteration,
                    )
                    history = list(loop.history) + list(
                        result.history[1:]
                    )  # hartigan's [0] is its start
                    summary = RunSummary(
                        result.centroids.astype(data.dtype),
                        0.0,
                        loop.n_iter + result.n_iter,
                        result.stop_reason,
                        result.converged,
                        history,
                    )
            finally:
                if isinstance(pruning, PrunedPasses):
                    pruning.release(data)
            if plan.n_init > 1:
                summary.score = _score(data, plan, summary.centroids)
            if state.best is None or summary.score < state.best.score:
                state.best = summary
            state.run, state.phase, state.loop = state.run + 1, "init", None
            save()
            stop = plan.on_run_end is not None and plan.on_run_end(state.run - 1)
            if stop and state.run < plan.n_init:
                break  # asked to stop (a callback's stop request): the best of the runs made
    except INTERRUPTIONS:
        # stopped from outside (Ctrl-C, SIGTERM): the last state reached (the Lloyd hook keeps
        # ``state.loop`` at the last update it saw), so that a resumed fit loses nothing
        save()
        raise
    return state.best


# -- the whole fit ----------------------------------------------------------------------
def _score(data, plan: FitPlan, centroids) -> float:
    """A run's objective on the data: under the size caps where the fit has some."""
    if plan.capacitated is not None:
        return float(
            plan.capacitated.solve(
                data, np.asarray(centroids).astype(data.dtype)
            ).partials.objective
        )
    return objective(data, centroids)


def callable_init(spec: FitSpec, data, seed: int, run: int) -> np.ndarray:
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
    return check_user_centroids(
        C, spec.n_clusters, data.n_features, data.dtype, name="init (the callable's result)"
    )
