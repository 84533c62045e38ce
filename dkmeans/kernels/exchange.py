"""Exact capped assignment on the clusters' exchange graph: shortest paths and negative cycles.

A capped assignment (rows of unit weight, cluster ``j`` holding between ``lower`` and ``upper``
rows) is an optimal transport of its centroids exactly when it is within the caps and no set
of moves that keeps it so is cheaper. Moves compose along the graph of the ``k`` clusters, an
edge ``a -> b`` weighing the cheapest move of a row of ``a`` into ``b`` (its extra integer cost
``D[i, b] - D[i, a]``), and a node ``k`` for the caps' room (``k -> a`` weighing 0 where ``a``
can lose a row, ``b -> k`` where ``b`` can take one): the assignment is optimal when that graph
has no negative cycle, and then its shortest distances, negated, are optimal prices.

:func:`exchange_flow` works on a pass's exchange lists (every pair's cheapest moves, sorted):
it cancels negative cycles and pushes the rows of over-full (under-floor) clusters along
shortest paths to clusters with room (from donors), one row per edge, until the assignment is
within the caps and no negative cycle is left in the lists, or a list runs out. It is written
in plain loops (its helpers inner functions), so that the compiled variant
(:mod:`dkmeans.kernels.backends.compiled_capacitated`) is this same function compiled: both
give the same moves.
"""

from __future__ import annotations

import numpy as np

from dkmeans._lazy import lazy_module

_csgraph = lazy_module("scipy.sparse.csgraph")

#: :func:`exchange_flow`'s outcomes.
CERTIFIED, MOVED, EXHAUSTED, BUDGET = 0, 1, 2, 3


def exchange_flow(
    starts, ends, cost, group, k, sizes, lower, upper, slack, used, max_steps, duals, row_costs
):  # pragma: no cover - also compiled (the branches are the tests' of either path)
    """Moves over exchange lists toward an optimal capped assignment; the outcome.

    Parameters
    ----------
    starts, ends : ndarray (k * k,), int64
        Pair ``(a, b)``'s moves are ``starts[a k + b]:ends[a k + b]`` of ``cost`` and ``group``,
        cheapest first (then by row).
    cost : ndarray, float64
        The moves' extra integer costs.
    group : ndarray, int64
        Each move's row, numbered ``0 ..`` (a row has one move per pair of its cluster).
    k : int
    sizes : ndarray (k,), float64
        The clusters' rows (changed in place by the moves).
    lower, upper, slack : float
        The caps and the tolerance of a size against them.
    used : ndarray, int64
        Per row (group): -1, or the cluster it moved to (set here).
    max_steps : int
        Cycles and paths at most.
    duals : ndarray (k,), float64
        Where :data:`CERTIFIED`: optimal prices (the shortest distances, negated).
    row_costs : ndarray (rows, k), float64
        Per row (group), its listed moves' extra costs by target cluster (0 at its own, infinite
        where not listed): a row that moved on a path keeps moving from where it went, at the
        differences of these (its onward moves are no list's, as it was not in that cluster).

    Returns
    -------
    int
        :data:`CERTIFIED` (within the caps, no move made, no negative cycle: the lists' heads
        were the exact cheapest moves, the assignment is optimal), :data:`MOVED` (within the
        caps and no negative cycle left among the lists after moves), :data:`EXHAUSTED` (a
        needed path or list ran out: another pass, with the moves made, goes on) or
        :data:`BUDGET`.
    """

    def _head(a, b, k, ptr, ends, group, used):
        """The position of pair ``(a, b)``'s cheapest move whose row has not moved, or -1."""
        i = a * k + b
        while ptr[i] < ends[i] and used[group[ptr[i]]] >= 0:
            ptr[i] += 1
        return ptr[i] if ptr[i] < ends[i] else -1

    def _relax(W, dist, pred, nodes):
        """Bellman-Ford rounds over the first ``nodes`` nodes of ``W`` from ``dist`` (changed in place,
        with ``pred``): the last node relaxed in round ``nodes`` (on or after a negative cycle), or -1
        where the distances settled."""
        for rnd in range(nodes + 1):
            changed = -1
            for a in range(nodes):
                da = dist[a]
                if da == np.inf:
                    continue
                for b in range(nodes):
                    w = W[a, b]
                    if w != np.inf and da + w < dist[b]:
                        dist[b] = da + w
                        pred[b] = a
                        changed = b
            if changed < 0:
                return -1
            if rnd == nodes:
                return changed
        return -1

    def _cycle_from(pred, node, nodes, out):
        """The cycle of the predecessor graph reached from ``node`` (into ``out`` in edge order): its
        length."""
        for _ in range(nodes):
            node = pred[node]
            if node < 0:
                return 0
        start = node
        n = 0
        out[n] = start
        n += 1
        back = pred[start]
        while back != start:
            out[n] = back
            n += 1
            back = pred[back]
        for i in range(
            n // 2
        ):  # walked back along the predecessors: reversed, the edges run forward
            out[i], out[n - 1 - i] = out[n - 1 - i], out[i]
        return n

    def _edge(a, b, k, ptr, ends, group, used, cost, row_costs, moved_rows, n_moved, W, at):
        """Pair ``(a, b)``'s cheapest move: its list's head, or a row that moved into ``a`` (coded
        ``-2 - row``) where cheaper (the list's head first on equal costs)."""
        h = _head(a, b, k, ptr, ends, group, used)
        best = cost[h] if h >= 0 else np.inf
        pick = h
        for t in range(n_moved):
            g = moved_rows[t]
            if used[g] == a:
                v = row_costs[g, b] - row_costs[g, a]
                if v < best:
                    best = v
                    pick = -2 - g
        W[a, b] = best
        at[a, b] = pick

    V = k + 1
    ptr = starts.copy()
    W = np.full((V, V), np.inf)
    at = np.full((V, V), -1, np.int64)
    moved_rows = np.empty(used.shape[0], np.int64)
    n_moved = 0
    for a in range(k):
        for b in range(k):
            if a != b:
                _edge(a, b, k, ptr, ends, group, used, cost, row_costs, moved_rows, 0, W, at)
    dist = np.zeros(V)
    pred = np.full(V, -1, np.int64)
    path = np.empty(V + 1, np.int64)
    moved = False
    for _ in range(max_steps):
        for j in range(k):
            W[k, j] = 0.0 if sizes[j] - 1.0 >= lower - slack else np.inf
            W[j, k] = 0.0 if sizes[j] + 1.0 <= upper + slack else np.inf
        dist[:] = 0.0
        pred[:] = -1
        last = _relax(W, dist, pred, V)
        n = 0
        if last >= 0:  # a negative cycle: its moves keep every size, and lower the cost
            n = _cycle_from(pred, last, V, path)
            if n == 0:
                return EXHAUSTED
            path[n] = path[0]
        else:
            over, under = -1, -1
            for j in range(k):
                if over < 0 and sizes[j] - upper > slack:
                    over = j
                if under < 0 and lower - sizes[j] > slack:
                    under = j
            if over < 0 and under < 0:
                if not moved:
                    for j in range(k):
                        duals[j] = -dist[j]
                    return CERTIFIED
                return MOVED
            # the cheapest path from the over-full cluster to one with room (or from a donor
            # to the under-floor one), over the clusters (no negative cycle: shortest paths)
            dist[:] = np.inf
            pred[:] = -1
            if over >= 0:
                dist[over] = 0.0
            else:
                for j in range(k):
                    if j != under and sizes[j] - 1.0 >= lower - slack:
                        dist[j] = 0.0
            _relax(W, dist, pred, k)
            end = -1
            if over >= 0:
                for j in range(k):
                    if j != over and sizes[j] + 1.0 <= upper + slack and dist[j] < np.inf:
                        if end < 0 or dist[j] < dist[end]:
                            end = j
            elif dist[under] < np.inf:
                end = under
            if end < 0:
                return EXHAUSTED
            node = end  # back along the predecessors to a source (a tree: no negative cycle)
            while node >= 0 and n <= V:
                path[n] = node
                n += 1
                node = pred[node]
            if node >= 0 or n < 2:
                return EXHAUSTED
            for i in range(n // 2):  # reversed: path[0] -> path[1] -> ... -> path[n - 1]
                path[i], path[n - 1 - i] = path[n - 1 - i], path[i]
            n -= 1  # edges
        for e in range(n):
            a, b = path[e], path[e + 1]
            if a < k and b < k:  # a row of a moves to b (the room node's edges move none)
                pick = at[a, b]
                g = group[pick] if pick >= 0 else -2 - pick
                if used[g] < 0:
                    moved_rows[n_moved] = g
                    n_moved += 1
                used[g] = b
                sizes[a] -= 1.0
                sizes[b] += 1.0
        moved = True
        for e in range(n + 1):
            a = path[e]
            if a < k:  # the cluster lost or took a row: its pairs' cheapest moves
                for b in range(k):
                    if b != a:
                        _edge(
                            a,
                            b,
                            k,
                            ptr,
                            ends,
                            group,
                            used,
                            cost,
                            row_costs,
                            moved_rows,
                            n_moved,
                            W,
                            at,
                        )
    return BUDGET


def list_certificate(
    starts, ends, cost, group, origin, k, sizes, lower, upper, slack, used, row_costs, full
):
    """Optimal prices for the assignment :func:`exchange_flow` left (``MOVED``), proved from the
    same lists without another pass; None where they cannot prove it.

    The exchange graph of the new assignment is bounded from below: a pair ``(a, b)``'s cheapest
    move is its list's cheapest unmoved row, or where every listed row moved, at least the list's
    last cost (a ``full`` list holds the pair's cheapest moves: the rows it left out cost at
    least that; a list not full holds every row of ``a``); a row that moved into ``a`` from
    ``c`` moves on to ``b`` at its listed cost differences, or where ``(c, b)`` did not list it,
    at least ``(c, b)``'s last cost less its move into ``a``. Where this lower graph (with the
    caps' room node) holds no negative cycle and the sizes are within the caps, neither does the
    exact one: the assignment is optimal and the lower graph's shortest distances, negated, are
    optimal prices (every move's reduced cost at least its bound's, which is non-negative).

    Parameters are :func:`exchange_flow`'s after it ran (``sizes`` and ``used`` as it left them),
    with ``origin`` (rows,) each row's cluster when the lists were made and ``full`` (k * k,)
    whether each pair's list holds as many moves as were asked for. NumPy and scipy (a graph of
    ``k + 1`` nodes: milliseconds).
    """
    if np.any(sizes - upper > slack) or np.any(lower - sizes > slack):
        return None
    pairs = k * k
    counts = ends - starts
    moved_entry = used[group] >= 0
    open_cost = np.where(moved_entry, np.inf, cost)
    pair_of = np.repeat(np.arange(pairs), counts)
    unmoved = np.full(pairs, np.inf)
    np.minimum.at(unmoved, pair_of, open_cost)
    last = np.full(pairs, np.inf)
    has = counts > 0
    last[has] = cost[ends[has] - 1]
    tail = np.where(full, last, np.inf)  # the rows a full list left out cost at least this
    W = np.full((k + 1, k + 1), np.inf)
    W[:k, :k] = np.minimum(unmoved, tail).reshape(k, k)
    rows = np.flatnonzero(used >= 0)
    if rows.shape[0]:
        now, came = used[rows], origin[rows]
        listed = row_costs[rows]  # (moved rows, k): from the origin, infinite where not listed
        into = listed[np.arange(rows.shape[0]), now]  # each row's move to where it is
        if not np.all(np.isfinite(into)):
            return None  # a move the lists do not price: nothing to bound its onward moves by
        bound = np.where(np.isfinite(listed), listed, tail.reshape(k, k)[came])
        onward = bound - into[:, None]
        onward[np.arange(rows.shape[0]), now] = np.inf
        best = np.full((k, k), np.inf)
        np.minimum.at(
            best, (np.repeat(now, k), np.tile(np.arange(k), rows.shape[0])), onward.ravel()
        )
        W[:k, :k] = np.minimum(W[:k, :k], best)
    np.fill_diagonal(W, np.inf)
    W[k, :k] = np.where(sizes - 1.0 >= lower - slack, 0.0, np.inf)
    W[:k, k] = np.where(sizes + 1.0 <= upper + slack, 0.0, np.inf)
    # shortest distances from a source one zero edge away from every node (scipy's Bellman-Ford)
    G = np.full((k + 2, k + 2), np.inf)
    G[: k + 1, : k + 1] = W
    G[k + 1, : k + 1] = 0.0
    try:
        dist = _csgraph.bellman_ford(
            _csgraph.csgraph_from_dense(G, null_value=np.inf), indices=k + 1
        )
    except _csgraph.NegativeCycleError:
        return None  # a negative cycle in the lower graph: no proof
    return -dist[:k]


__all__ = ["BUDGET", "CERTIFIED", "EXHAUSTED", "MOVED", "exchange_flow", "list_certificate"]
