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
   most (:func:`split_candidates`; a few passes more);
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
import os
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

from dkmeans.drivers.streams import STREAMS
from dkmeans.kernels.namespace import get_namespace, to_host
from dkmeans.engine.local import ChunkList
from dkmeans.errors import NON_FINITE_INPUT, InvalidDataError, InvalidParameterError
from dkmeans.kernels import (
    CandidateSample,
    assign,
    assign_partials,
    Partials,
    TopRows,
    TrialPartials,
    combine_top,
    random_top_rows,
    objectives,
    combine_samples,
    combine_split_sums,
    combine_swap_costs,
    combine_trial_partials,
    sample_by_cost,
    split_sums,
    swap_costs,
    swap_partials,
    update_centroids,
)
from dkmeans.drivers.state import LocalSearchRecord
from dkmeans.drivers.swaps import best_swaps, select_swaps
from dkmeans.drivers.lloyd import CentroidShift, LloydResult, ObjectiveDecrease, fill_empty_clusters, lloyd
from dkmeans.drivers.lloyd import objective as objective_of  # `objective` names the fit's value here

#: Random streams (:mod:`dkmeans.drivers.streams`) of round ``r``'s candidate draw.
ROUND_STREAMS = STREAMS["local-search.rounds"]
#: Random stream of the coreset sample of :func:`coreset_local_search`.
CORESET_STREAMS = STREAMS["local-search.coreset"]
#: Random streams of round ``r``'s split candidates (:func:`split_candidates`).
SPLIT_STREAMS = STREAMS["local-search.split"]
#: Power steps towards each cluster's principal direction before it is split (:func:`split_candidates`).
SPLIT_POWER_STEPS = 2
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


def _split_chunk(X, w, offset, labels, C, V):
    if labels is None:  # the first pass assigns; the later ones reuse its labels
        labels, _ = assign(X, C)
    return labels, split_sums(X, C, V, w, labels)


def split_candidates(data, C: np.ndarray, n_split: int, seed: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
    """Candidates that split clusters: the means of the two halves of the ``n_split`` clusters whose split
    lowers the objective most (``2 n_split`` rows at most, with the clusters' indices).

    A row drawn by cost stands for its neighbourhood badly where clusters are wide: in 128
    dimensions a row lies about a cluster's radius from its cluster's centre, so a centroid
    covering two blobs keeps its rows from any one row put beside it, and swaps of rows move
    nothing (wide: 11 blobs without a centroid of their own, 11 with two, after the search). Each
    cluster is halved by the hyperplane through its centroid normal to its principal direction
    (:data:`SPLIT_POWER_STEPS` power steps from a random direction, a pass each, and a pass for the
    halves: :func:`~dkmeans.kernels.swap.split_sums`; only the first assigns the rows, the others
    reuse its labels); halving cluster ``j`` into halves of weights
    ``n1``, ``n2`` and means ``m1``, ``m2`` lowers its cost by exactly ``n1 n2 / (n1 + n2) ||m1 - m2||^2``.
    The two means of the clusters with the largest such gains are candidates like rows: a swap
    puts one where a centroid that its neighbours can spare was, and the trial's Lloyd update
    moves the split cluster's own centroid to the other half.
    """
    k, d = C.shape
    rng = np.random.default_rng([int(seed) % 2**64, stream])
    V = rng.standard_normal((k, d))
    labels = None  # the rows' nearest centroids, kept by each chunk after the first pass
    for step in range(SPLIT_POWER_STEPS + 1):
        V /= np.maximum(np.linalg.norm(V, axis=1, keepdims=True), np.finfo(np.float64).tiny)
        sums, labels = data.map_reduce_stateful(_split_chunk, combine_split_sums, (C, V), labels)
        if step < SPLIT_POWER_STEPS:
            power = np.asarray(sums.power)
            V = np.where(np.linalg.norm(power, axis=1, keepdims=True) > 0, power, V)  # (a cluster of one row)
    counts = np.asarray(sums.half_counts).reshape(k, 2)
    means = np.asarray(sums.half_sums).reshape(k, 2, d) / np.maximum(counts, np.finfo(np.float64).tiny)[:, :, None]
    both = np.all(counts > 0, axis=1)
    gain = np.where(both, counts[:, 0] * counts[:, 1] / np.where(both, counts.sum(axis=1), 1.0)
                    * np.sum((means[:, 0] - means[:, 1]) ** 2, axis=1), 0.0)
    order = np.lexsort((np.arange(k), -gain))[:n_split]  # the largest gains, ties by index
    order = order[gain[order] > 0]
    return means[order].reshape(-1, d), np.repeat(order, 2)


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
    return TrialPartials(xp.stack([xp.asarray(p.sums, dtype=xp.float64) for p in parts]),
                         xp.stack([xp.asarray(p.counts, dtype=xp.float64) for p in parts]),
                         xp.stack([xp.asarray(p.objective, dtype=xp.float64) for p in parts]))


def _sample(data, C, m: int, seed: int, stream: int) -> CandidateSample:
    """One pass: ``m`` candidates drawn by ``w d1`` for ``C``, and ``C``'s objective."""
    return data.map_reduce(_sample_chunk, functools.partial(combine_samples, m=m), (C, m, seed, stream))


def _lloyd_passes(result: LloydResult, stop_rule) -> int:
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


def _trial_step(data, C, P, delta, index, n_trials, max_swaps, threshold, resolution, stop_rule) -> _Step:
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
    local = np.split(inverse.ravel(), np.cumsum([len(t[0]) for t in trials])[:-1])  # positions in P[used]
    parts = data.map_reduce(_trial_chunk, combine_trial_partials,
                            (C, P[used], [(p, t[1]) for p, t in zip(local, trials)]))
    steps = []
    for t, (p, j) in enumerate(trials):
        swapped = C.astype(np.float64)
        swapped[j] = P[p]
        partials = Partials(parts.sums[t], parts.counts[t], parts.objective[t])
        updated, empty = update_centroids(partials, swapped)
        moved = np.sum((updated - swapped) ** 2, axis=1)
        # the updated centroids' objective under the swapped ones' assignment: an upper bound
        steps.append((float(parts.objective[t]) - float(np.sum(parts.counts[t] * moved)), t, updated, empty,
                      float(np.sum(moved))))
    # bounds equal but for rounding (trials reaching the same centroids) are told apart by trial order
    bound, t, updated, empty, shift = min(steps[1:], key=lambda s: (np.floor(s[0] / resolution), s[1]))
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
        Share of each round's candidates that split clusters (:func:`split_candidates`, at the
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
        if n_split > 0:  # the rows with the largest keys give way (the rest is still a draw by cost)
            S, _ = split_candidates(data, C, n_split, seed, SPLIT_STREAMS(r))
            round_passes += SPLIT_POWER_STEPS + 1
            keep = max(0, m - len(S))
            P = np.concatenate([P[:keep], S.astype(data.dtype)])
            index = np.concatenate([index[:keep], data.n_rows + np.arange(len(S), dtype=index.dtype)])
        costs = data.map_reduce(_swap_chunk, combine_swap_costs, (C, P))
        round_passes += 1
        base = float(costs.objective)  # C's objective summed like the costs: changes compare like with like
        if base <= 0:  # every row on a centroid (the sampling pass rounded above zero): nothing to improve
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
            step = _trial_step(data, C, P, delta, index, n_trials, max_swaps, threshold, resolution, stop_rule)
            round_passes += 1
            step_change, lloyd_change, n_tried = step.bound - base, step.lloyd_bound - base, step.n_trials
            # the swap must beat Lloyd alone by a useful margin
            if step.bound < min(step.lloyd_bound, base) - max(min_gain, REL_TOL) * base:
                new, swaps, updates = step.centroids, step.swaps, 1
                if np.any(step.empty):  # Lloyd's empty-cluster rule, as its own update would apply it
                    new = fill_empty_clusters(data, new, step.empty)
                    round_passes += 1
                new = np.asarray(new).astype(data.dtype)
                if lloyd_iters > 1 and not step.converged:
                    result = lloyd(data, new, max_iter=lloyd_iters - 1, stop_rule=stop_rule)
                    round_passes += _lloyd_passes(result, stop_rule)
                    new, updates = np.asarray(result.centroids).astype(data.dtype), 1 + result.n_iter
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
        record = LocalSearchRecord(r + 1, objective, before, best_change, step_change, lloyd_change, delta.size,
                                   n_tried, swaps if kept else 0, updates, round_passes, kept,
                                   time.perf_counter() - t0)
        history.append(record)
        if on_iteration is not None:
            on_iteration(record)
        if patience is not None and idle >= patience:
            stop_reason = "no-improvement"
            break
    return LocalSearchResult(C, objective, tried, accepted, passes, len(history), stop_reason, history)


# -- the default: search on a sample, confirm on the data -----------------------------------
#: Coreset rows per cluster, and the bounds of the coreset size (:func:`coreset_size`).
CORESET_PER_CLUSTER = 256
CORESET_MIN_ROWS = 4096
#: One coreset round scores ``s (k + m) d`` products where a Lloyd iteration computes
#: ``n k d``: the coreset is at most this fraction of the rows.
CORESET_MAX_SHARE = 1 / 12
#: Entries of the candidate x centroid cost matrix of one round (float64): candidates per
#: round are ``min(2 k, CORESET_COST_ENTRIES // k)``, at least ``CORESET_MIN_CANDIDATES``.
CORESET_COST_ENTRIES = 2**22
CORESET_MIN_CANDIDATES = 8


def coreset_size(n_rows: int, k: int) -> int:
    """Rows of the coreset for ``n_rows`` rows and ``k`` centroids (all rows for small data)."""
    s = max(CORESET_MIN_ROWS, CORESET_PER_CLUSTER * k)
    s = min(s, max(CORESET_MIN_ROWS, int(CORESET_MAX_SHARE * n_rows)))
    return int(min(n_rows, s))


#: The search needs this many sample rows per cluster at least; with fewer (k close to the
#: sample's size, as at k = 65,536 on 500,000 rows) it does not run.
CORESET_MIN_PER_CLUSTER = 4


#: Rows of a sample chunk (one thread each), and the most chunks (:func:`coreset_chunks`).
CORESET_CHUNK_ROWS = 4096
CORESET_MAX_CHUNKS = 4
#: Below this many sample rows per cluster the sample is fitted, not searched, before Lloyd, and
#: each search after Lloyd makes one round: a round's swaps and Lloyd updates fit that sample's
#: few rows, so a second round on it improves nothing (manyk, 8 rows per cluster: every second
#: round found nothing, at the cost of two data iterations), and the swaps that the data
#: confirms come from fresh samples. A search before Lloyd on such a sample moved 4 centroids
#: in 5 rounds there.
CORESET_FIT_PER_CLUSTER = 32
#: Lloyd updates of a confirmation on the data (:func:`coreset_local_search`): enough for its
#: objective to fall below the start's when the swaps pay (manyk: 1-2 updates; the rest of a
#: confirmation run to convergence was the same slow tail that Lloyd's own run has). 2, not 3:
#: on manyk (seed 0) every search was confirmed after its second update, the third one's work
#: is done by Lloyd after the searches, where it is pruned: 17 updates instead of 21, the same
#: objective (460,576,241 against 460,541,573), 33.4 against 34.6 CPU seconds.
CONFIRM_ITERS = 2
#: Share of a coreset round's candidates that split clusters (:func:`split_candidates`).
CORESET_SPLIT_SHARE = 0.25


def coreset_searches(n_rows: int, k: int) -> bool:
    """Whether a sample of :func:`coreset_size` rows is large enough to search ``k`` centroids on."""
    return coreset_size(n_rows, k) >= CORESET_MIN_PER_CLUSTER * k


def coreset_candidates(k: int) -> int:
    """Candidates per coreset round: ``2 k``, bounded so the ``m x k`` costs stay within memory."""
    return int(max(1, min(2 * k, max(CORESET_MIN_CANDIDATES, CORESET_COST_ENTRIES // k))))


def coreset_swaps(k: int) -> int:
    """Swaps one trial of a coreset round may make together: 8, and k / 64 at large k (manyk,
    k = 2,048: a search of 8 swaps at a time kept finding 8 more, one full confirmation each)."""
    return max(8, k // 64)


class _CoresetPass(NamedTuple):
    top: TopRows
    objective: np.ndarray


def _coreset_chunk(X, w, offset, C, s, seed, stream):
    top = random_top_rows(X, w, offset, s, seed, stream)
    return _CoresetPass(top, None if C is None else objectives(X, w, [C])[0])


def _combine_coreset(parts, s):
    objective = None if parts[0].objective is None else sum(p.objective for p in parts)
    return _CoresetPass(combine_top([p.top for p in parts], s), objective)


def coreset_chunks(s: int) -> int:
    """Chunks of a sample of ``s`` rows: one per :data:`CORESET_CHUNK_ROWS`, at most :data:`CORESET_MAX_CHUNKS`.

    A function of the sample's size alone (never of the machine): the search's sums, combined
    in chunk order, are the same wherever it runs; the chunks run on a thread each.
    """
    return int(max(1, min(CORESET_MAX_CHUNKS, s // CORESET_CHUNK_ROWS)))


def _draw_coreset(data, k: int, seed: int, stream: int, measure: np.ndarray | None = None):
    """One pass: the sample of :func:`coreset_size` rows for ``k`` centroids (in this process) and, with
    ``measure``, the data's objective of those centroids (else None).

    The sample is uniform (by weight) and keyed by row index, so it needs no distances: without
    ``measure`` the pass only draws keys. The sample is split into :func:`coreset_chunks` chunks,
    searched on a thread each; release it (``core.release()``) when done.
    """
    s = coreset_size(data.n_rows, k)
    sample = data.map_reduce(_coreset_chunk, functools.partial(_combine_coreset, s=s), (measure, s, seed, stream))
    f = None if measure is None else _finite(float(sample.objective))
    rows = np.asarray(sample.top.rows).astype(data.dtype)
    n_chunks = coreset_chunks(rows.shape[0])
    return ChunkList.from_array(rows, None, n_chunks=n_chunks, threads=min(n_chunks, os.cpu_count() or 1)), f


def _finite(f: float) -> float:
    if not np.isfinite(f):
        raise InvalidDataError(NON_FINITE_INPUT)
    return f


def _fits_sample(n_rows: int, k: int) -> bool:
    """Whether the sample holds :data:`CORESET_FIT_PER_CLUSTER` rows per cluster (see there)."""
    return coreset_size(n_rows, k) >= CORESET_FIT_PER_CLUSTER * k


def _search_coreset(core, C: np.ndarray, seed: int, stop_rule, rounds: int, lloyd_iters: int) -> LocalSearchResult:
    """:func:`local_search` on the sample with the coreset's bounded candidates and swaps, until a round improves nothing."""
    k = C.shape[0]
    return local_search(core, C, rounds=rounds, candidates_per_round=coreset_candidates(k), seed=seed,
                        lloyd_iters=lloyd_iters, stop_rule=stop_rule, patience=1, max_swaps=coreset_swaps(k),
                        split_share=CORESET_SPLIT_SHARE)


@dataclass
class CoresetSearchResult:
    """What :func:`coreset_local_search` did.

    Attributes
    ----------
    centroids : ndarray, shape (k, d)
        The starting centroids, or the confirmed result when it is better.
    objective : float
        Objective of the starting centroids on the data (measured), or an upper bound on
        that of the confirmed result (the objective of its last assignment, which its last
        Lloyd update can only lower); when nothing moved on the sample of data in memory,
        the caller's ``objective_bound`` (not measured).
    kept : bool
        Whether the confirmed result replaced the starting centroids.
    lloyd : LloydResult or None
        The confirmation run on the data (None when the coreset found no better centroids).
    coreset : LocalSearchResult
        The search on the coreset.
    passes : int
        Passes over the data (the sample, and the confirmation's).
    record : LocalSearchRecord
        One summary record for the fit's history.
    """

    centroids: np.ndarray
    objective: float
    kept: bool
    lloyd: LloydResult | None
    coreset: LocalSearchResult
    passes: int
    record: LocalSearchRecord


def coreset_local_search(
    data,
    centroids: np.ndarray,
    *,
    seed: int,
    stop_rule: ObjectiveDecrease | CentroidShift,
    max_iter: int,
    rounds: int = RECOMMENDED["rounds"],
    lloyd_iters: int = RECOMMENDED["lloyd_iters"],
    metric: str = "euclidean",
    on_iteration: Callable | None = None,
    prune=False,
    objective_bound: float = np.nan,
) -> CoresetSearchResult:
    """Local search on a sample of the rows, confirmed by Lloyd on all of them.

    1. One pass draws a uniform sample of :func:`coreset_size` rows (proportional to
       ``sample_weight``, keyed by global row index: independent of the chunking); out of
       core the same read measures the objective ``f`` of ``centroids``, in memory a pass
       of its own does, and only when step 2 moved centroids.
    2. :func:`local_search` runs on the sample, in this process (:func:`coreset_chunks`
       threads), with :func:`coreset_candidates` candidates per round (the ``m x k`` cost
       matrix stays within :data:`CORESET_COST_ENTRIES` whatever ``k``), until a round
       improves nothing or after ``rounds`` rounds (one with fewer than
       :data:`CORESET_FIT_PER_CLUSTER` sample rows per cluster).
    3. Only when it moved centroids, Lloyd runs from them on all rows (at most ``max_iter``
       updates: the fit gives :data:`CONFIRM_ITERS`); its result replaces ``centroids``
       only if the objective of its last assignment is below ``f``: nothing is accepted on
       the sample's estimate, and the objective never increases. A confirmation stopped by
       ``max_iter`` is a lower objective, not yet Lloyd's fixed point: the caller's Lloyd
       goes on from it.

    A search that moves nothing on the sample costs one pass over the data, which only draws the
    sample (in memory: no distances). Its result's objective is then ``objective_bound``: the
    caller's upper bound on that of ``centroids`` (the fit's last measured assignment), not a
    measurement.
    """
    t0 = time.perf_counter()
    C = np.asarray(centroids, dtype=data.dtype)
    k = C.shape[0]
    if not _fits_sample(data.n_rows, k):
        rounds = min(rounds, 1)
    # the objective of the start is needed only to confirm moves: out of core it rides on the
    # sample's read; in memory a pass measures it only when the sample moved centroids
    core, f = _draw_coreset(data, k, seed, CORESET_STREAMS(0), measure=None if data.in_memory else C)
    try:
        search = _search_coreset(core, C, seed, stop_rule, rounds, lloyd_iters)
    finally:
        core.release()
    passes = 1
    if f is None and search.swaps_accepted and max_iter > 0:
        f, passes = _finite(objective_of(data, C)), passes + 1
    lloyd_result, kept, objective = None, False, float(objective_bound) if f is None else f
    if search.swaps_accepted and max_iter > 0 and f > 0:
        lloyd_result = lloyd(data, np.asarray(search.centroids).astype(data.dtype), max_iter=max_iter,
                             stop_rule=stop_rule, on_iteration=on_iteration, metric=metric, prune=prune)
        passes += _lloyd_passes(lloyd_result, stop_rule)
        confirmed = lloyd_result.history[-1].objective if lloyd_result.history else np.inf
        if confirmed < f * (1 - REL_TOL):
            C, objective, kept = np.asarray(lloyd_result.centroids).astype(data.dtype), float(confirmed), True
    n_lloyd = lloyd_result.n_iter if lloyd_result is not None else 0
    before = objective if f is None else f
    record = LocalSearchRecord(1, objective, before, objective - before, 0.0, 0.0, search.swaps_tried, search.rounds,
                               search.swaps_accepted if kept else 0, n_lloyd, passes, kept,
                               time.perf_counter() - t0)
    return CoresetSearchResult(C, objective, kept, lloyd_result, search, passes, record)


def coreset_start(
    data,
    centroids: np.ndarray,
    *,
    seed: int,
    stop_rule: ObjectiveDecrease | CentroidShift,
    max_iter: int = 300,
    rounds: int = RECOMMENDED["rounds"],
    lloyd_iters: int = RECOMMENDED["lloyd_iters"],
) -> np.ndarray:
    """A start for Lloyd: ``centroids`` (a seeding's) settled and searched on a sample of the rows.

    One pass draws the sample of :func:`coreset_local_search`; on it, in this process,
    Lloyd runs to ``stop_rule`` (``max_iter`` updates at most: the fit settles only where its
    own ``max_iter`` allows this loop its whole length) and then :func:`local_search` until a
    round improves nothing (its rounds' Lloyd updates, ``lloyd_iters``, capped by ``max_iter``
    too; no search with fewer than :data:`CORESET_FIT_PER_CLUSTER` sample rows per cluster:
    Lloyd's fixed point on the sample is then the start). Lloyd on all the rows
    then starts near a fixed point of the sample, in the basin the swaps chose: it needs
    fewer full passes than from the seeding itself, and the search after it
    (:func:`coreset_local_search`) mostly confirms there is nothing left to move. The
    sample only proposes a start; every objective the fit reports and compares is
    measured on the data.
    """
    C = np.asarray(centroids, dtype=data.dtype)
    core, _ = _draw_coreset(data, C.shape[0], seed, CORESET_STREAMS(1))  # the start's objective is never needed
    try:
        settled = lloyd(core, C, max_iter=max_iter, stop_rule=stop_rule).centroids
        settled = np.asarray(settled).astype(data.dtype)
        if not _fits_sample(data.n_rows, C.shape[0]):
            return settled
        search = _search_coreset(core, settled, seed, stop_rule, rounds, min(lloyd_iters, max_iter))
    finally:
        core.release()
    return np.asarray(search.centroids).astype(data.dtype)


__all__ = ["RECOMMENDED", "CoresetSearchResult", "LocalSearchRecord", "LocalSearchResult", "coreset_local_search",
           "coreset_searches", "coreset_start", "local_search"]
