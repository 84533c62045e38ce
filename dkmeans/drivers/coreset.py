"""The default fit's local search: search on a sample of the rows (a coreset), confirm on the data.

:func:`coreset_local_search` draws a uniform sample in one pass, runs
:func:`~dkmeans.drivers.local_search.local_search` on it in this process and keeps its
centroids only where Lloyd on the data confirms a lower objective; :func:`coreset_start` settles
a seeding on such a sample before Lloyd on all the rows.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dkmeans.drivers.lloyd import CentroidShift, LloydResult, ObjectiveDecrease, lloyd
from dkmeans.drivers.lloyd import (
    objective as objective_of,  # `objective` names the fit's value here
)
from dkmeans.drivers.local_search import (
    RECOMMENDED,
    REL_TOL,
    LocalSearchResult,
    lloyd_passes,
    local_search,
)
from dkmeans.drivers.state import LocalSearchRecord
from dkmeans.drivers.streams import STREAMS
from dkmeans.engine.local import ChunkList
from dkmeans.errors import NON_FINITE_INPUT, InvalidDataError
from dkmeans.kernels import TopRows, combine_top, objectives, random_top_rows

#: Random stream of the coreset sample of :func:`coreset_local_search`.
CORESET_STREAMS = STREAMS["local-search.coreset"]
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
    """Whether a sample of :func:`coreset_size` rows is large enough to search ``k`` centroids."""
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
    """Chunks of a sample of ``s`` rows: one per :data:`CORESET_CHUNK_ROWS`, at most
    :data:`CORESET_MAX_CHUNKS`.

    A function of the sample's size alone (never of the machine): the search's sums, combined
    in chunk order, are the same wherever it runs; the chunks run on a thread each.
    """
    return int(max(1, min(CORESET_MAX_CHUNKS, s // CORESET_CHUNK_ROWS)))


def draw_coreset(
    data, k: int, seed: int, stream: int, measure: np.ndarray | None = None, size: int = 0
):
    """One pass: the sample of :func:`coreset_size` rows for ``k`` centroids (``size`` rows where
    given; in this process) and, with ``measure``, the data's objective of those centroids (else
    None).

    The sample is uniform (by weight) and keyed by row index, so it needs no distances: without
    ``measure`` the pass only draws keys. The sample is split into :func:`coreset_chunks` chunks,
    searched on a thread each; release it (``core.release()``) when done.
    """
    s = min(size, data.n_rows) if size else coreset_size(data.n_rows, k)
    sample = data.map_reduce(
        _coreset_chunk, functools.partial(_combine_coreset, s=s), (measure, s, seed, stream)
    )
    f = None if measure is None else _finite(float(sample.objective))
    rows = np.asarray(sample.top.rows).astype(data.dtype)
    n_chunks = coreset_chunks(rows.shape[0])
    return ChunkList.from_array(
        rows, None, n_chunks=n_chunks, threads=min(n_chunks, os.cpu_count() or 1)
    ), f


def _finite(f: float) -> float:
    if not np.isfinite(f):
        raise InvalidDataError(NON_FINITE_INPUT)
    return f


def _fits_sample(n_rows: int, k: int) -> bool:
    """Whether the sample holds :data:`CORESET_FIT_PER_CLUSTER` rows per cluster (see there)."""
    return coreset_size(n_rows, k) >= CORESET_FIT_PER_CLUSTER * k


def _search_coreset(
    core, C: np.ndarray, seed: int, stop_rule, rounds: int, lloyd_iters: int
) -> LocalSearchResult:
    """:func:`~dkmeans.drivers.local_search.local_search` on the sample with the coreset's bounded
    candidates and swaps, until a round improves nothing."""
    k = C.shape[0]
    return local_search(
        core,
        C,
        rounds=rounds,
        candidates_per_round=coreset_candidates(k),
        seed=seed,
        lloyd_iters=lloyd_iters,
        stop_rule=stop_rule,
        patience=1,
        max_swaps=coreset_swaps(k),
        split_share=CORESET_SPLIT_SHARE,
    )


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
    2. :func:`~dkmeans.drivers.local_search.local_search` runs on the sample, in this process (:func:`coreset_chunks`
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
    core, f = draw_coreset(data, k, seed, CORESET_STREAMS(0), measure=None if data.in_memory else C)
    try:
        search = _search_coreset(core, C, seed, stop_rule, rounds, lloyd_iters)
    finally:
        core.release()
    passes = 1
    if f is None and search.swaps_accepted and max_iter > 0:
        f, passes = _finite(objective_of(data, C)), passes + 1
    lloyd_result, kept, objective = None, False, float(objective_bound) if f is None else f
    if search.swaps_accepted and max_iter > 0 and f > 0:
        lloyd_result = lloyd(
            data,
            np.asarray(search.centroids).astype(data.dtype),
            max_iter=max_iter,
            stop_rule=stop_rule,
            on_iteration=on_iteration,
            metric=metric,
            prune=prune,
        )
        passes += lloyd_passes(lloyd_result, stop_rule)
        confirmed = lloyd_result.history[-1].objective if lloyd_result.history else np.inf
        if confirmed < f * (1 - REL_TOL):
            C, objective, kept = (
                np.asarray(lloyd_result.centroids).astype(data.dtype),
                float(confirmed),
                True,
            )
    n_lloyd = lloyd_result.n_iter if lloyd_result is not None else 0
    before = objective if f is None else f
    record = LocalSearchRecord(
        1,
        objective,
        before,
        objective - before,
        0.0,
        0.0,
        search.swaps_tried,
        search.rounds,
        search.swaps_accepted if kept else 0,
        n_lloyd,
        passes,
        kept,
        time.perf_counter() - t0,
    )
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
    own ``max_iter`` allows this loop its whole length) and then
    :func:`~dkmeans.drivers.local_search.local_search` until a
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
    core, _ = draw_coreset(
        data, C.shape[0], seed, CORESET_STREAMS(1)
    )  # the start's objective is never needed
    try:
        settled = lloyd(core, C, max_iter=max_iter, stop_rule=stop_rule).centroids
        settled = np.asarray(settled).astype(data.dtype)
        if not _fits_sample(data.n_rows, C.shape[0]):
            return settled
        search = _search_coreset(core, settled, seed, stop_rule, rounds, min(lloyd_iters, max_iter))
    finally:
        core.release()
    return np.asarray(search.centroids).astype(data.dtype)


__all__ = [
    "CONFIRM_ITERS",
    "CoresetSearchResult",
    "coreset_local_search",
    "coreset_searches",
    "coreset_size",
    "coreset_start",
    "draw_coreset",
]
