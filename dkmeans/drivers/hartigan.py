"""Hartigan's k-means: standard (one process, row by row) and batch (distributed, safe/unsafe).

Hartigan moves one row at a time to the cluster where it lowers the objective most,
using the exact cost change of the move (see :mod:`dkmeans.kernels.hartigan`) rather
than the distance to the old centroids. Its fixed points are Lloyd fixed points, and it
leaves many Lloyd fixed points: a row nearer its own centroid can still be better off
elsewhere, because removing it moves its own centroid towards the rest.

:func:`standard_hartigan` sweeps in-memory NumPy rows in order with a compiled loop.

:func:`hartigan` is the batch variant over the data protocol (:mod:`dkmeans.engine.protocol`). Labels
stay on the workers as per-chunk state. One pass per round: each chunk applies the
moves the client accepted in the previous round, reports its cluster sums, weights and
objective for the new partition, and proposes each row's best move against the new
centroids, which the client derived from the previous sums plus the accepted moves.
Only the best proposal per (source, target) cluster pair (top ``max_candidates``
pairs) and, in unsafe mode, the per-cluster totals of all proposals come back.

* safe mode accepts proposals, most negative first, while neither cluster involved
  was touched in the round: each accepted move changes the objective by exactly its
  ``dcost``, so the objective strictly decreases.
* unsafe mode accepts every proposal at once; the next pass measures the objective,
  and if it did not decrease the round is reverted and redone in safe mode (one extra
  pass). Accept-all is skipped where it would empty a cluster or equals the safe choice.

No move ever empties a cluster; clusters that start empty are filled by the rows whose
removal saves most (an empty target costs nothing). Ties are broken by cluster index
and by global row index, so results do not depend on the chunking.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from dkmeans.drivers.state import STOPPED, HartiganRecord
from dkmeans.errors import NON_FINITE_INPUT, InvalidDataError, InvalidParameterError
from dkmeans.kernels import assign, cluster_sums
from dkmeans.kernels.hartigan import (
    REL_TOL,
    Candidates,
    MoveDeltas,
    apply_moves,
    best_moves,
    combine_candidates,
    combine_deltas,
    move_deltas,
    positive_counts,
    select_disjoint,
    sweep,
    top_candidates,
)
from dkmeans.kernels.namespace import get_namespace

MODES = ("safe", "unsafe")


# -- results -------------------------------------------------------------------------------
@dataclass
class StandardHartiganResult:
    """Result of :func:`standard_hartigan`.

    ``labels`` is the final partition and ``centroids`` its means; ``objective`` is the
    partition's objective. ``n_iter`` counts sweeps (the last one made no move when
    ``converged``). ``history[0]`` is the initial partition.
    """

    centroids: np.ndarray
    labels: np.ndarray
    n_iter: int
    history: list
    objective: float
    converged: bool
    stop_reason: str


@dataclass
class HartiganResult:
    """Result of :func:`hartigan` (batch).

    Attributes
    ----------
    centroids : ndarray (k, d), the data's dtype
        Means of the final partition.
    labels : dask.array.Array (n,), int32, persisted
        The final partition (Hartigan's labels, same row chunks as the data).
    objective : float
        Objective of the final partition.
    n_iter : int
        Rounds that moved rows.
    stop_reason : str
        ``"no-improving-move"`` or ``"objective-decrease"`` (converged), or ``"max_iter"``.
    converged : bool
    history : list of HartiganRecord
        ``history[0]`` is the initial partition.
    n_passes : int
        Passes over the data, including the initial one(s) and undone unsafe rounds.
    """

    centroids: np.ndarray
    labels: Any
    objective: float
    n_iter: int
    stop_reason: str
    converged: bool
    history: list = field(default_factory=list)
    n_passes: int = 0


# -- shared helpers -------------------------------------------------------------------------
def _means(S, W, npos, fallback):
    """Cluster means; empty clusters keep ``fallback`` (finite, never used in a cost)."""
    live = npos > 0
    C = np.array(fallback, dtype=np.float64, copy=True)
    C[live] = S[live] / W[live][:, None]
    return C


def _resolve_init(init, n_clusters, n_rows: int, n_features: int):
    """``("centroids", C0, k)`` or ``("labels", labels, k)`` from an array of either kind."""
    arr = np.asarray(init)
    if arr.ndim == 2:
        if arr.shape[1] != n_features:
            raise InvalidParameterError(
                f"initial centroids have {arr.shape[1]} features, the data {n_features}"
            )
        if n_clusters is not None and n_clusters != arr.shape[0]:
            raise InvalidParameterError(
                f"n_clusters={n_clusters} but {arr.shape[0]} initial centroids"
            )
        if not np.all(np.isfinite(arr)):
            raise InvalidDataError("initial centroids contain NaN or infinity")
        return "centroids", arr.astype(np.float64), int(arr.shape[0])
    if arr.ndim == 1 and np.issubdtype(arr.dtype, np.integer):
        if arr.shape[0] != n_rows:
            raise InvalidParameterError(
                f"initial labels have {arr.shape[0]} entries, the data {n_rows} rows"
            )
        k = int(n_clusters) if n_clusters is not None else int(arr.max()) + 1
        if arr.min() < 0 or arr.max() >= k:
            raise InvalidParameterError(f"initial labels must lie in [0, {k})")
        return "labels", arr.astype(np.int32), k
    raise InvalidParameterError(
        "init must be centroids of shape (k, d) or integer labels of shape (n,)"
    )


# -- standard Hartigan ------------------------------------------------------------------------
def _objective(X, labels, C, w):
    d2 = np.sum((X.astype(np.float64) - C[labels]) ** 2, axis=1)
    return float(np.sum(d2 if w is None else d2 * w))


def _exact_state(X, labels, k, w, fallback):
    S, W = cluster_sums(X, labels, k, w)
    npos = positive_counts(labels, w, k)
    return _means(S, W, npos, fallback), W, npos


def _fill_empty(X, labels, C, W, npos, w, fallback):
    """Move into each empty cluster the row whose removal saves most (its best single move)."""
    k = C.shape[0]
    while np.any(npos == 0):
        j = int(np.flatnonzero(npos == 0)[0])
        wi = np.ones(len(X)) if w is None else w
        Wl = W[labels]
        movable = (wi > 0) & (npos[labels] >= 2) & (Wl - wi > 0)
        own = np.sum((X.astype(np.float64) - C[labels]) ** 2, axis=1)
        gain = np.where(movable, wi * Wl / np.where(movable, Wl - wi, 1.0) * own, 0.0)
        i = int(np.argmax(gain))  # first maximum: lowest row index on ties
        if gain[i] <= 0:
            warnings.warn(
                f"{int(np.sum(npos == 0))} cluster(s) stay empty: no row can fill them",
                UserWarning,
                stacklevel=3,
            )
            break
        labels[i] = j
        C[:], W[:], npos[:] = _exact_state(X, labels, k, w, fallback)
    return labels


def standard_hartigan(
    X,
    init,
    *,
    n_clusters: int | None = None,
    sample_weight=None,
    max_iter: int = 300,
    rel_tol: float = REL_TOL,
) -> StandardHartiganResult:
    """Standard Hartigan k-means on in-memory data: single-row moves, rows swept in order.

    Each row moves to the cluster with the most negative exact cost change (if negative);
    the two centroids and weights involved are updated at once (float64). A sweep is a
    pass over all rows; the run ends after a sweep with no move, or ``max_iter`` sweeps.
    Centroids are recomputed from scratch after every sweep, so rounding does not build up.

    Parameters
    ----------
    X : ndarray (n, d)
    init : ndarray (k, d) of centroids, or integer ndarray (n,) of labels
        Centroids start from the nearest-centroid partition.
    n_clusters : int, optional
        k when ``init`` is labels (default: ``labels.max() + 1``).
    sample_weight : ndarray (n,), optional
        Non-negative weights; a row of weight ``w`` moves as ``w`` identical rows at once.
        Zero-weight rows never move (they do not change the objective).
    max_iter : int
        Maximum number of sweeps.
    rel_tol : float
        Relative margin a cost change must beat to count as improving.

    Returns
    -------
    StandardHartiganResult
    """
    X = np.asarray(X)
    if int(max_iter) < 0:
        raise InvalidParameterError(f"max_iter must be >= 0, got {max_iter}")
    if X.ndim != 2:
        raise InvalidDataError(f"X must be 2-D, got shape {X.shape}")
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    if w is not None and (w.shape != (X.shape[0],) or np.any(w < 0)):
        raise InvalidDataError("sample_weight must be non-negative with one entry per row")
    kind, value, k = _resolve_init(init, n_clusters, X.shape[0], X.shape[1])
    t0 = time.perf_counter()
    if kind == "centroids":
        labels = assign(X, value.astype(X.dtype))[0].astype(np.int32)
        fallback = value
    else:
        labels = value.copy()
        fallback = np.broadcast_to(np.average(X, axis=0, weights=w), (k, X.shape[1]))
    C, W, npos = _exact_state(X, labels, k, w, fallback)
    labels = _fill_empty(X, labels, C, W, npos, w, fallback)
    objective = _objective(X, labels, C, w)
    history = [HartiganRecord(0, objective, 0, 0, "initial", 0.0, time.perf_counter() - t0)]
    converged, n_iter = False, 0
    for it in range(1, max_iter + 1):
        t0 = time.perf_counter()
        moves, change = sweep(X, labels, C, W, npos, w, rel_tol=rel_tol)
        C, W, npos = _exact_state(X, labels, k, w, C)
        objective = _objective(X, labels, C, w)
        history.append(
            HartiganRecord(it, objective, moves, moves, "sweep", change, time.perf_counter() - t0)
        )
        n_iter = it
        if moves == 0:
            converged = True
            break
    return StandardHartiganResult(
        C.astype(X.dtype),
        labels,
        n_iter,
        history,
        objective,
        converged,
        "no-improving-move" if converged else "max_iter",
    )


# -- batch Hartigan: chunk side ------------------------------------------------------------------
class RoundPartial(NamedTuple):
    """What one chunk (then the whole data) reports in a pass of batch Hartigan."""

    sums: Any  # (k, d) float64 sums of the partition after the pass's moves
    weights: Any  # (k,) float64
    npos: Any  # (k,) int64 rows of positive weight
    objective: float  # of that partition, against the centroids the client sent
    n_proposals: int  # rows with an improving move
    candidates: Any  # Candidates or None (first pass)
    deltas: Any  # MoveDeltas (unsafe mode) or None


def _round_chunk(X, w, offset, state, action, C, W, npos, k, m, want_deltas):
    """Apply the client's action to this chunk's labels, then measure and propose (on a worker)."""
    xp = get_namespace(X)
    kind = action[0]
    prev = None
    # Labels are replaced, never modified in place: a recomputed task must see the old state.
    if kind == "init-centroids":
        labels = assign(X, xp.asarray(action[1], dtype=X.dtype))[0].astype(xp.int32)
    elif kind == "init-labels":
        labels = xp.asarray(action[1][offset : offset + X.shape[0]], dtype=xp.int32)
    elif kind == "all":  # unsafe: every pending proposal; keep the old labels to undo it
        prev = state["labels"]
        labels = xp.where(state["target"] >= 0, state["target"], prev).astype(xp.int32)
    elif kind in ("list", "revert"):
        base = state["prev"] if kind == "revert" else state["labels"]
        labels = apply_moves(base.copy(), action[1], action[2], offset)
    else:
        labels = state["labels"]
    sums, weights = cluster_sums(X, labels, k, w)
    counts = positive_counts(labels, w, k)
    if C is None:
        return {"labels": labels}, RoundPartial(sums, weights, counts, 0.0, 0, None, None)
    moves = best_moves(X, labels, C, W, npos, w)
    own = moves.own_sq if w is None else moves.own_sq * w
    partial = RoundPartial(
        sums,
        weights,
        counts,
        float(xp.sum(own)),
        int(xp.sum(moves.target >= 0)),
        top_candidates(X, labels, moves, offset, k, m, w),
        move_deltas(X, labels, moves, k, w) if want_deltas else None,
    )
    return {"labels": labels, "prev": prev, "target": moves.target}, partial


def _combine_round(parts, k, m):
    first = parts[0]
    sums, weights, npos = first.sums.copy(), first.weights.copy(), first.npos.copy()
    for p in parts[1:]:
        sums += p.sums
        weights += p.weights
        npos += p.npos
    cands = (
        None
        if first.candidates is None
        else combine_candidates([p.candidates for p in parts], k, m)
    )
    deltas = None if first.deltas is None else combine_deltas([p.deltas for p in parts])
    return RoundPartial(
        sums,
        weights,
        npos,
        sum(p.objective for p in parts),
        sum(p.n_proposals for p in parts),
        cands,
        deltas,
    )


def _safe_step(cands: Candidates, k, S, W, npos):
    """Accept disjoint candidates; returns (rows, targets, new S, W, npos, n, predicted)."""
    sel = select_disjoint(cands, k)
    S, W, npos = S.copy(), W.copy(), npos.copy()
    for i in sel:
        s, t, wi = int(cands.source[i]), int(cands.target[i]), float(cands.weight[i])
        S[s] -= wi * cands.x[i]
        S[t] += wi * cands.x[i]
        W[s] -= wi
        W[t] += wi
        npos[s] -= 1
        npos[t] += 1
    return (
        np.asarray(cands.row)[sel],
        np.asarray(cands.target)[sel],
        S,
        W,
        npos,
        len(sel),
        float(np.sum(np.asarray(cands.dcost)[sel])),
    )


def _accept_all_ok(d: MoveDeltas, W, npos, n_safe: int) -> bool:
    """Accept-all is worth a try: it adds moves beyond the safe choice and empties no cluster."""
    if d.n_moves <= n_safe:
        return False
    live = npos > 0
    return bool(np.all(npos[live] + d.npos[live] >= 1) and np.all(W[live] + d.weights[live] > 0))


# -- batch Hartigan: driver ------------------------------------------------------------------------
def hartigan(
    data,
    init,
    *,
    n_clusters: int | None = None,
    max_iter: int = 300,
    mode: str = "safe",
    tol: float = 0.0,
    max_candidates: int | None = None,
    on_iteration: Callable[[HartiganRecord], None] | None = None,
) -> HartiganResult:
    """Batch Hartigan k-means on persisted data (labels kept on the workers).

    Parameters
    ----------
    data : ChunkedData
    init : ndarray (k, d) of centroids, or integer ndarray (n,) of labels
        Centroids start from the nearest-centroid partition (computed on the workers).
        Labels are sent to every worker once (O(n) per worker): prefer centroids at scale.
    n_clusters : int, optional
        k when ``init`` is labels (default: ``labels.max() + 1``).
    max_iter : int
        Maximum number of rounds that move rows (0: the initial partition and its means).
    mode : {"safe", "unsafe"}
        See the module doc.
    tol : float
        Also stop when a round lowers the objective by less than ``tol`` (oneDAL's
        ``accuracy_threshold``); with 0 every round lowers it, so only the other rules stop.
    max_candidates : int, optional
        Cluster pairs whose best proposal comes back each round (default ``max(8 k, 64)``);
        a safe round accepts at most ``k / 2`` moves, the first ones of this list.
    on_iteration : callable, optional
        Called with each :class:`HartiganRecord` (the initial partition first); where it
        returns True the refinement stops with the partition just measured (stop reason
        ``"stopped"``).

    Returns
    -------
    HartiganResult
    """
    if mode not in MODES:
        raise InvalidParameterError(f"mode must be one of {MODES}, got {mode!r}")
    if int(max_iter) < 0:
        raise InvalidParameterError(f"max_iter must be >= 0, got {max_iter}")
    if not tol >= 0:
        raise InvalidParameterError(f"tol must be >= 0, got {tol}")
    kind, value, k = _resolve_init(init, n_clusters, data.n_rows, data.n_features)
    m = int(max_candidates) if max_candidates is not None else max(8 * k, 64)
    combine = functools.partial(_combine_round, k=k, m=m)
    unsafe = mode == "unsafe"
    history: list[HartiganRecord] = []

    def emit(record) -> bool:
        history.append(record)
        return on_iteration is not None and bool(on_iteration(record))

    t0 = time.perf_counter()
    action = (
        ("init-centroids", value.astype(data.dtype))
        if kind == "centroids"
        else ("init-labels", value)
    )
    part, state = data.map_reduce_stateful(
        _round_chunk, combine, (action, None, None, None, k, m, False), None
    )
    if not (np.all(np.isfinite(part.sums)) and np.all(np.isfinite(part.weights))):
        raise InvalidDataError(NON_FINITE_INPUT)
    if kind == "centroids":
        fallback = value
    else:
        fallback = np.broadcast_to(
            part.sums.sum(axis=0) / max(part.weights.sum(), 1e-300), (k, data.n_features)
        )
    S, W, npos = part.sums, part.weights, part.npos
    C = _means(S, W, npos, fallback)
    action = ("none",)
    n_passes, rounds = 1, 0
    round_info = (
        "initial",
        0,
        0,
        0.0,
    )  # mode, moves, proposals, predicted change of the round being measured
    undo = None  # what an unsafe round needs if it has to be undone
    stop_reason, converged = "max_iter", False
    while True:
        part, state = data.map_reduce_stateful(
            _round_chunk, combine, (action, C, W, npos, k, m, unsafe), state
        )
        n_passes += 1
        if undo is not None:
            before, undo = undo, None
            if not part.objective < before["objective"]:
                # accept-all did not lower the objective: back to the old labels plus the safe moves
                rows, targets, S, W, npos, n_moves, predicted = _safe_step(
                    before["candidates"], k, before["S"], before["W"], before["npos"]
                )
                C = _means(S, W, npos, before["C"])
                action = ("revert", rows, targets)
                round_info = ("safe-fallback", n_moves, before["proposals"], predicted)
                continue
        # the partition measured in this pass stands: start from its exact sums
        S, W, npos = part.sums, part.weights, part.npos
        objective = float(part.objective)
        mode_name, n_moves, proposals, predicted = round_info
        asked = emit(
            HartiganRecord(
                rounds,
                objective,
                n_moves,
                proposals,
                mode_name,
                predicted,
                time.perf_counter() - t0,
            )
        )
        t0 = time.perf_counter()
        if asked:  # the caller asked to stop: the partition just measured stands
            stop_reason = STOPPED
            break
        if part.n_proposals == 0:
            stop_reason, converged = "no-improving-move", True
            break
        if rounds > 0 and history[-2].objective - objective < tol:
            stop_reason, converged = "objective-decrease", True
            break
        if rounds >= max_iter:
            break
        rounds += 1
        C_now = _means(S, W, npos, C)
        rows, targets, S_safe, W_safe, npos_safe, n_safe, pred_safe = _safe_step(
            part.candidates, k, S, W, npos
        )
        if unsafe and _accept_all_ok(part.deltas, W, npos, n_safe):
            d = part.deltas
            undo = {
                "objective": objective,
                "candidates": part.candidates,
                "S": S,
                "W": W,
                "npos": npos,
                "C": C_now,
                "proposals": part.n_proposals,
            }
            S, W, npos = S + d.sums, W + d.weights, npos + d.npos
            action = ("all",)
            round_info = ("unsafe", d.n_moves, part.n_proposals, d.predicted)
        else:
            S, W, npos = S_safe, W_safe, npos_safe
            action = ("list", rows, targets)
            round_info = ("safe", n_safe, part.n_proposals, pred_safe)
        C = _means(S, W, npos, C_now)
    centroids = _means(S, W, npos, C).astype(data.dtype)
    labels = data.state_column(state, "labels")
    del state
    return HartiganResult(
        centroids, labels, objective, rounds, stop_reason, converged, history, n_passes
    )


__all__ = [
    "HartiganRecord",
    "HartiganResult",
    "MODES",
    "StandardHartiganResult",
    "hartigan",
    "standard_hartigan",
]
