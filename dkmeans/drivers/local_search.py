"""k-means++ local search: move centroids across empty space, where Lloyd cannot.

Lloyd stops in local optima where two centroids share one group of points and another
group has none: no centroid can cross the empty space between them. Lattanzi and Sohler
(ICML 2019) fix this with swaps: draw a row ``p`` with probability proportional to its
cost (``w d1``, the k-means++ distribution) and replace the centroid whose replacement
by ``p`` lowers the objective most, if any does. This driver batches those steps so that
one pass scores many swaps, and lets Lloyd settle each accepted swap. A round:

1. one pass draws ``candidates_per_round`` distinct rows by ``w d1``
   (:func:`~dkmeans.kernels.swap.sample_by_cost`, keyed by global row index) and
   measures the objective of the current centroids (it is also the previous round's last
   pass). With ``split_share`` (the default fit's search on a sample), a share of the candidates
   are instead the means of the two halves of the clusters whose split lowers the objective
   most (:func:`~dkmeans.drivers.splits.split_candidates`; a few passes more);
2. one pass computes the exact objective under every (candidate, centroid) swap
   (:func:`~dkmeans.kernels.swap.swap_costs`: ``m x k`` numbers per chunk, summed);
3. one pass runs Lloyd's first update for several trials at once: the ``trials`` best
   single swaps by their exact cost, with ``max_swaps > 1`` a set of several improving
   swaps that barely interact (:func:`~dkmeans.drivers.swaps.select_swaps`), and no swap
   at all (what Lloyd alone would do). It returns each trial's partials
   (:func:`~dkmeans.kernels.swap.swap_partials`), hence its exact objective
   ``f(swapped)`` and its update ``mu``; ``f(swapped) - sum_j W_j ||c_j - mu_j||^2`` (the
   recentring gain) is an exact upper bound on the objective after that update;
4. the swap trial with the lowest bound is taken if that bound is below both the current
   objective and Lloyd's own bound by ``min_gain`` of the objective; Lloyd runs
   ``lloyd_iters - 1`` more updates from it (:func:`dkmeans.drivers.lloyd.lloyd`), and the next
   round's sampling pass measures the result, which is kept only if the objective fell:
   the objective never increases.

Why the choice stays exact: nothing is accepted on an estimate. A swap that raises the
objective by itself can still pay off once its neighbours move (a centroid removed from
a crowded group leaves rows that its neighbours then recentre on); step 3 measures that
for several swaps in the pass Lloyd's first update costs anyway, and takes one only when
its bound guarantees a lower objective. Several swaps at once are not additive (two
removed centroids may both be the fallback of the same rows; two candidates may serve
the same rows), so a set of them is one more trial, measured exactly like the others.
With ``lloyd_iters=0`` (the plain swap search) step 3 is skipped and the best swap is
made when its exact cost is lower.

A round costs ``lloyd_iters + 2`` passes when it moves centroids (plus one whenever
Lloyd's empty-cluster rule runs), 3 when no trial improves (scoring, trials, a fresh sample; 2 in
the last round); ``patience`` ends the search after that many rounds in a row without
improvement. Each round draws from its own random stream, so results do not depend on
chunking or worker count.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dkmeans.drivers.lloyd import (
    CentroidShift,
    LloydResult,
    ObjectiveDecrease,
    fill_empty_clusters,
    lloyd,
)
from dkmeans.drivers.splits import SPLIT_POWER_STEPS, SPLIT_STREAMS, split_candidates
from dkmeans.drivers.state import LocalSearchRecord
from dkmeans.drivers.streams import STREAMS
from dkmeans.drivers.swaps import best_swaps, select_swaps
from dkmeans.errors import NON_FINITE_INPUT, InvalidDataError, InvalidParameterError
from dkmeans.kernels import (
    CandidateSample,
    Partials,
    TrialPartials,
    assign_partials,
    combine_candidate_samples,
    combine_swap_costs,
    combine_trial_partials,
    sample_by_cost,
    swap_costs,
    swap_partials,
    update_centroids,
)
from dkmeans.kernels.namespace import get_namespace, to_host

#: Random streams (:mod:`dkmeans.drivers.streams`) of round ``r``'s candidate draw.
ROUND_STREAMS = STREAMS["local-search.rounds"]
#: Recommended settings of the required parameters (benchmarks/quality.py): rounds, candidates
#: per round as a multiple of k, Lloyd updates per round.
RECOMMENDED = {"rounds": 10, "candidates_per_cluster": 2, "lloyd_iters": 3}
#: A change counts as an improvement only if it lowers the objective by more than this
#: fraction of it (float64 sums over different chunkings differ by far less).
REL_TOL = 1e-9


@dataclass
class LocalSearchResult:
    """Centroids after local search and what it took.

    Attributes
    ----------
    centroids : ndarray, shape (k, d)
        In the data's dtype.
    objective : float
        Their (weighted) objective, measured in the last pass.
    swaps_tried : int
        (candidate, centroid) swaps scored over all rounds.
    swaps_accepted : int
        Swaps in the kept results.
    passes : int
        Passes over the data, Lloyd's included.
    rounds : int
        Rounds run.
    stop_reason : str
        ``"rounds"`` (all rounds ran), ``"no-improvement"`` (``patience`` rounds in a
        row improved nothing) or ``"no-candidates"`` (every row lies on a centroid).
    history : list of LocalSearchRecord
    """

    centroids: np.ndarray
    objective: float
    swaps_tried: int
    swaps_accepted: int
    passes: int
    rounds: int
    stop_reason: str
    history: list = field(default_factory=list)


# -- chunk functions (run where the chunks are) ----------------------------------------
def _sample_chunk(X, w, offset, C, m, seed, stream):
    return sample_by_cost(X, C, m, offset, seed, stream, w)


def _swap_chunk(X, w, offset, C, P):
    return swap_costs(X, C, P, w)


#: From this many centroids a trial step assigns the rows to each trial's centroids with Lloyd's
#: kernels (a matrix product per trial) instead of :func:`~dkmeans.kernels.swap.swap_partials`
#: (each row's nearest two in a scalar float64 loop over the centroids, then the trials). The
#: same partials up to float rounding; measured on 2 cores with 6 trials: 41,600 x 128, k = 256,
#: 0.21 s against 1.30 s; 16,700 x 64, k = 2,048, 0.27 s against 1.39 s.
TRIAL_PRODUCT_MIN_K = 64


def _trial_chunk(X, w, offset, C, P, trials):
    if C.shape[0] < TRIAL_PRODUCT_MIN_K:
        return swap_partials(X, C, P, trials, w)
    xp = get_namespace(X)
    C, P, parts = np.asarray(to_host(C)), np.asarray(to_host(P)), []
    for pos, js in trials:
        swapped = C.astype(X.dtype)
        swapped[np.asarray(js, dtype=np.int64)] = P[np.asarray(pos, dtype=np.int64)]
        parts.append(assign_partials(X, xp.asarray(swapped), w))
    return TrialPartials(
        xp.stack([xp.asarray(p.sums, dtype=xp.float64) for p in parts]),
        xp.stack([xp.asarray(p.counts, dtype=xp.float64) for p in parts]),
        xp.stack([xp.asarray(p.objective, dtype=xp.float64) for p in parts]),
    )


def _sample(data, C, m: int, seed: int, stream: int) -> CandidateSample:
    """One pass: ``m`` candidates drawn by ``w d1`` for ``C``, and ``C``'s objective."""
    return data.map_reduce(
        _sample_chunk, functools.partial(combine_candidate_samples, m=m), (C, m, seed, stream)
    )


def lloyd_passes(result: LloydResult, stop_rule) -> int:
    """Passes a :func:`~dkmeans.drivers.lloyd.lloyd` call made: one per update, per empty-cluster fill,
    and the assignment pass after which an objective-decrease rule stopped it."""
    passes = len(result.history) + sum(1 for r in result.history if r.empty_clusters_fixed)
    if isinstance(stop_rule, ObjectiveDecrease) and result.stop_reason == stop_rule.name:
        passes += 1
    return passes


def _check_int(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise InvalidParameterError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


@dataclass
class _Step:
    """The best swap trial of a round: its Lloyd update (float64; ``empty``: clusters it left
    empty), its bound, and plain Lloyd's bound."""

    centroids: np.ndarray
    swaps: int
    bound: float
    lloyd_bound: float
    n_trials: int
    empty: np.ndarray
    converged: bool


def _trial_step(
    data, C, P, delta, index, n_trials, max_swaps, threshold, resolution, stop_rule
) -> _Step:
    """Step 3 of a round: one Lloyd step for each trial; the trial with the lowest bound.

    Trial 0 swaps nothing: its bound is what Lloyd alone would reach, the baseline a swap
    must beat (centroids a loose stop rule left short of a fixed point would otherwise
    make any swap look useful).
    """
    pos, js = best_swaps(delta, index, n_trials, resolution)
    none = np.empty(0, dtype=np.int64)
    trials = [(none, none)] + [(pos[i : i + 1], js[i : i + 1]) for i in range(len(pos))]
    if max_swaps > 1:
        several = select_swaps(delta, index, P, C, max_swaps, threshold, resolution)
        if len(several[0]) > 1:
            trials.append(several)
    used, inverse = np.unique(np.concatenate([t[0] for t in trials]), return_inverse=True)
    local = np.split(
        inverse.ravel(), np.cumsum([len(t[0]) for t in trials])[:-1]
    )  # positions in P[used]
    parts = data.map_reduce(
        _trial_chunk,
        combine_trial_partials,
        (C, P[used], [(p, t[1]) for p, t in zip(local, trials)]),
    )
    steps = []
    for t, (p, j) in enumerate(trials):
        swapped = C.astype(np.float64)
        swapped[j] = P[p]
        partials = Partials(parts.sums[t], parts.counts[t], parts.objective[t])
        updated, empty = update_centroids(partials, swapped)
        moved = np.sum((updated - swapped) ** 2, axis=1)
        # the updated centroids' objective under the swapped ones' assignment: an upper bound
        steps.append(
            (
                float(parts.objective[t]) - float(np.sum(parts.counts[t] * moved)),
                t,
                updated,
                empty,
                float(np.sum(moved)),
            )
        )
    # bounds equal but for rounding (trials reaching the same centroids) are told apart by trial order
    bound, t, updated, empty, shift = min(
        steps[1:], key=lambda s: (np.floor(s[0] / resolution), s[1])
    )
    converged = isinstance(stop_rule, CentroidShift) and stop_rule.satisfied(shift)
    return _Step(updated, len(trials[t][1]), bound, steps[0][0], len(trials) - 1, empty, converged)


def local_search(
    data,
    centroids: np.ndarray,
    *,
    rounds: int,
    candidates_per_round: int,
    seed: int,
    lloyd_iters: int,
    stop_rule: ObjectiveDecrease | CentroidShift,
    on_iteration: Callable[[LocalSearchRecord], None] | None = None,
    trials: int = 4,
    max_swaps: int = 8,
    min_gain: float = 1e-4,
    patience: int | None = 1,
    split_share: float = 0.0,
) -> LocalSearchResult:
    """Improve centroids by batched k-means++ local search (see the module docstring).

    Parameters
    ----------
    data : data protocol object
        ``n_rows``, ``n_features``, ``dtype``, ``has_weights`` and ``map_reduce``.
    centroids : ndarray, shape (k, d)
        Starting centroids (typically Lloyd's result).
    rounds : int
        Maximum number of rounds (0: only measure the objective).
    candidates_per_round : int
        Rows drawn by ``w d1`` per round; every one is scored against every centroid.
    seed : int
        Resolved random seed (0 <= seed < 2**64).
    lloyd_iters : int
        Lloyd updates after each round's swaps, the trial step included (0: none; then
        only a swap that lowers the objective by itself is made).
    stop_rule : ObjectiveDecrease or CentroidShift
        Lloyd's stop rule within a round.
    on_iteration : callable, optional
        Called with each round's :class:`LocalSearchRecord` (progress display).
    trials : int
        Best single swaps given a Lloyd step per round (the trial step).
    max_swaps : int
        With more than 1, a set of up to this many improving swaps is one more trial.
    min_gain : float
        A round moves centroids only if its best trial's bound is below both the current
        objective and plain Lloyd's bound by this fraction of the objective (with
        ``lloyd_iters=0``: if the best swap lowers the objective by this fraction).
    patience : int, optional
        Stop after this many rounds in a row improved nothing (None: run every round).
    split_share : float
        Share of each round's candidates that split clusters (:func:`~dkmeans.drivers.splits.split_candidates`, at the
        cost of :data:`SPLIT_POWER_STEPS` + 1 passes a round) in place of rows drawn by cost.
        Their halves' sums depend on how the rows are chunked (float64 rounding): the coreset's
        search, on a fixed chunking, uses them.

    Notes
    -----
    Recommended (benchmarks/quality.py): ``rounds=10`` (a cap: with ``patience=1`` the
    search ends at the first round that improves nothing), ``candidates_per_round=2 k``,
    ``lloyd_iters=3`` and the defaults above; see :data:`RECOMMENDED`.

    Returns
    -------
    LocalSearchResult
        Its objective is never above the starting centroids'.
    """
    rounds = _check_int("rounds", rounds, 0)
    m = _check_int("candidates_per_round", candidates_per_round, 1)
    lloyd_iters = _check_int("lloyd_iters", lloyd_iters, 0)
    n_trials = _check_int("trials", trials, 1)
    if not (isinstance(split_share, (int, float, np.floating)) and 0 <= split_share <= 1):
        raise InvalidParameterError(f"split_share must be a number in [0, 1], got {split_share!r}")
    if not (isinstance(min_gain, (int, float, np.floating)) and 0 <= min_gain < 1):
        raise InvalidParameterError(f"min_gain must be a number in [0, 1), got {min_gain!r}")
    max_swaps = _check_int("max_swaps", max_swaps, 1)
    if patience is not None:
        patience = _check_int("patience", patience, 1)
    C = np.array(centroids, dtype=data.dtype)
    if C.ndim != 2 or C.shape[1] != data.n_features or C.shape[0] < 1:
        raise InvalidParameterError(
            f"centroids must have shape (k >= 1, {data.n_features}), got {np.shape(centroids)}"
        )

    sample = _sample(data, C, m, seed, ROUND_STREAMS(0))
    passes = 1
    objective = float(sample.objective)
    if not np.isfinite(objective):
        raise InvalidDataError(NON_FINITE_INPUT)
    history: list[LocalSearchRecord] = []
    tried = accepted = idle = 0
    stop_reason = "rounds"
    for r in range(rounds):
        t0 = time.perf_counter()
        before = objective
        top = sample.top
        if objective <= 0 or len(top.index) == 0:
            stop_reason = "no-candidates"
            break
        P = np.asarray(top.rows).astype(data.dtype)
        index = np.asarray(top.index)
        round_passes = 0
        n_split = int(split_share * m) // 2
        if (
            n_split > 0
        ):  # the rows with the largest keys give way (the rest is still a draw by cost)
            S, _ = split_candidates(data, C, n_split, seed, SPLIT_STREAMS(r))
            round_passes += SPLIT_POWER_STEPS + 1
            keep = max(0, m - len(S))
            P = np.concatenate([P[:keep], S.astype(data.dtype)])
            index = np.concatenate(
                [index[:keep], data.n_rows + np.arange(len(S), dtype=index.dtype)]
            )
        costs = data.map_reduce(_swap_chunk, combine_swap_costs, (C, P))
        round_passes += 1
        base = float(
            costs.objective
        )  # C's objective summed like the costs: changes compare like with like
        if (
            base <= 0
        ):  # every row on a centroid (the sampling pass rounded above zero): nothing to improve
            stop_reason = "no-candidates"
            passes += round_passes
            break
        delta = np.asarray(costs.cost, dtype=np.float64) - base
        tried += delta.size
        threshold = -max(min_gain, REL_TOL) * base
        resolution = REL_TOL * base  # orders alike whatever the chunking (base > 0 here)
        best_pos, best_j = best_swaps(delta, index, 1, resolution)
        best_change = float(delta[best_pos[0], best_j[0]])
        new, swaps, updates, step_change, lloyd_change, n_tried = None, 0, 0, 0.0, 0.0, 0
        if lloyd_iters == 0:
            if best_change < threshold:
                new, swaps = C.copy(), 1
                new[best_j[0]] = P[best_pos[0]]
        else:
            step = _trial_step(
                data, C, P, delta, index, n_trials, max_swaps, threshold, resolution, stop_rule
            )
            round_passes += 1
            step_change, lloyd_change, n_tried = (
                step.bound - base,
                step.lloyd_bound - base,
                step.n_trials,
            )
            # the swap must beat Lloyd alone by a useful margin
            if step.bound < min(step.lloyd_bound, base) - max(min_gain, REL_TOL) * base:
                new, swaps, updates = step.centroids, step.swaps, 1
                if np.any(
                    step.empty
                ):  # Lloyd's empty-cluster rule, as its own update would apply it
                    new = fill_empty_clusters(data, new, step.empty)
                    round_passes += 1
                new = np.asarray(new).astype(data.dtype)
                if lloyd_iters > 1 and not step.converged:
                    result = lloyd(data, new, max_iter=lloyd_iters - 1, stop_rule=stop_rule)
                    round_passes += lloyd_passes(result, stop_rule)
                    new, updates = (
                        np.asarray(result.centroids).astype(data.dtype),
                        1 + result.n_iter,
                    )
        kept = False
        last = r + 1 == rounds or (new is None and patience is not None and idle + 1 >= patience)
        if new is not None or not last:
            # measures `new` (if any) and draws the next round's candidates; after a rejected
            # result they follow its distribution: still valid candidates for C
            sample = _sample(data, C if new is None else new, m, seed, ROUND_STREAMS(r + 1))
            round_passes += 1
            if new is not None and float(sample.objective) < objective:
                C, objective, kept = new, float(sample.objective), True
        passes += round_passes
        accepted += swaps if kept else 0
        idle = 0 if kept else idle + 1
        record = LocalSearchRecord(
            r + 1,
            objective,
            before,
            best_change,
            step_change,
            lloyd_change,
            delta.size,
            n_tried,
            swaps if kept else 0,
            updates,
            round_passes,
            kept,
            time.perf_counter() - t0,
        )
        history.append(record)
        if on_iteration is not None:
            on_iteration(record)
        if patience is not None and idle >= patience:
            stop_reason = "no-improvement"
            break
    return LocalSearchResult(
        C, objective, tried, accepted, passes, len(history), stop_reason, history
    )


__all__ = ["RECOMMENDED", "LocalSearchRecord", "LocalSearchResult", "local_search"]
