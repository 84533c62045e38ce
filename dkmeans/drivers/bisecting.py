"""Bisecting k-means over the data protocol (scikit-learn's and Spark's ``BisectingKMeans``).

Starting from one cluster (the data's unweighted mean, as scikit-learn's root), the leaf of
largest score (``"biggest_inertia"``: its weighted SSE; ``"largest_cluster"``: its row count;
the first leaf in tree order on a tie) is split in two by a 2-means (``n_init`` starts, the
best kept), until there are ``n_clusters`` leaves. The rows are never copied: a row finds
its cluster by descending the tree (:mod:`dkmeans.kernels.bisecting`), and a pass restricted
to the rows of the leaves being split runs every pending 2-means at once.

Which leaves to split together: a split's result depends only on its leaf's rows and on
random draws keyed by global row index and the leaf's depth, never on when it is computed.
So the sequential rule is replayed on cached splits; when it needs a split not computed
yet, every leaf among the ``n_clusters - leaves`` of highest score is split in one round of
shared passes (a child never scores more than its parent, so most of them are needed; a
split not used stays cached). The tree, labels and centres are those of the sequential
algorithm, in a number of rounds close to ``log2(n_clusters)``.

Each 2-means is scikit-learn's Lloyd: ``init`` ``"k-means++"`` (two candidates for the second
centre, the one of lower potential kept) or ``"random"`` (two distinct rows drawn by
weight); an iteration assigns rows to the nearer centre and moves the centres to their
weighted means (an empty side takes the row farthest from its centre, with scikit-learn's
arithmetic); it stops when no centre moved, when the squared shift is ``<= tol`` (absolute,
as scikit-learn passes it) or after ``max_iter`` iterations, the last two followed by one
assignment to the final centres. The split's scores are then its sides' weighted SSE and row
counts from that assignment.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field

import numpy as np

from dkmeans.drivers.streams import derive_seed, stream
from dkmeans.kernels.bisecting import (
    Pairs,
    TreeArrays,
    combine_split_partials,
    combine_top_keys,
    descend,
    host_rows,
    potentials,
    root_objective,
    split_partials,
    top_keys,
)

logger = logging.getLogger("dkmeans")

STRATEGIES = ("biggest_inertia", "largest_cluster")
INITS = ("k-means++", "random")
#: relative margin by which a start's objective must beat the best so far (scikit-learn's)
BETTER = 1e-6


@dataclass
class Split:
    """A leaf's 2-means: the kept start's final centres and, per side, SSE, weight and row count."""

    centres: np.ndarray  # (2, d) centred
    inertia: np.ndarray  # (2,)
    weight: np.ndarray  # (2,)
    count: np.ndarray  # (2,)
    n_iter: int
    start: np.ndarray  # (2, d) the kept start's initial centres (centred)


@dataclass
class Node:
    centre: np.ndarray  # centred coordinates
    depth: int
    score: float = 0.0
    inertia: float = 0.0  # weighted SSE of its rows about ``centre``
    weight: float = 0.0
    count: int = 0
    left: int = -1  # node id of its left child (right: left + 1)
    split: Split | None = None  # the 2-means that made its children


@dataclass
class BisectingFit:
    """The fitted tree and what the faces report."""

    mean: np.ndarray
    nodes: list
    leaves: list  # node ids in tree order (left to right): label i is leaves[i]
    objectives: np.ndarray  # (n_clusters,) the objective with 1, 2, ..., n_clusters leaves
    n_iter: int
    rounds: int
    splits_computed: int
    split_order: list = field(default_factory=list)  # node ids in the order they were split
    history: list = field(default_factory=list)

    def arrays(self) -> TreeArrays:
        labels = np.full(len(self.nodes), -1, np.int64)
        labels[self.leaves] = np.arange(len(self.leaves))
        return TreeArrays.build(
            self.mean, [n.centre for n in self.nodes], [n.left for n in self.nodes], labels
        )

    @property
    def centres(self) -> np.ndarray:
        """Leaf centres in tree order, in the data's coordinates (float64)."""
        return (
            np.array([self.nodes[i].centre for i in self.leaves]).reshape(len(self.leaves), -1)
            + self.mean
        )


def _leaves(nodes, at: int = 0):
    """Leaf ids in tree order (scikit-learn's ``iter_leaves``: left subtree first)."""
    stack, out = [at], []
    while stack:
        i = stack.pop()
        if nodes[i].left < 0:
            out.append(i)
        else:
            stack.extend((nodes[i].left + 1, nodes[i].left))
    return out


# -- chunk functions ----------------------------------------------------------------------
def _descended(X, state, tree):
    """The chunk's host rows and each row's leaf, from the leaves kept from the last pass."""
    X = host_rows(X)
    return X, descend(X, tree, state)


def _split_chunk(X, w, offset, state, tree, pairs):
    X, node = _descended(X, state, tree)
    return node, split_partials(X, tree.mean, w, offset, node, pairs)


def _keys_chunk(X, w, offset, state, tree, slots_t, depth, seed, first_stream, m, centre):
    X, node = _descended(X, state, tree)
    return node, top_keys(
        X,
        tree.mean,
        w,
        offset,
        node,
        slots_t,
        depth,
        seed,
        lambda level: first_stream + 4 * level,
        m,
        centre,
    )


def _potentials_chunk(X, w, offset, state, tree, slots_t, first, candidates):
    X, node = _descended(X, state, tree)
    return node, potentials(X, tree.mean, w, node, slots_t, first, candidates)


def _root_chunk(X, w, offset, mean):
    return root_objective(X, mean, w)


def _sum(parts):
    return functools.reduce(np.add, parts)


class _Passes:
    """The passes of one fit: with rows kept in memory, each chunk keeps its rows' leaves between
    passes (a descent then starts from there); rows read from their source descend from the root."""

    def __init__(self, data):
        self.data = data
        self.keep = data.in_memory and data.row_state_bytes() >= 8
        self.state = None

    def run(self, chunk_fn, combine_fn, args):
        if self.keep:
            result, self.state = self.data.map_reduce_stateful(
                chunk_fn, combine_fn, args, self.state
            )
            return result
        return self.data.map_reduce(functools.partial(_stateless, chunk_fn), combine_fn, args)


def _stateless(chunk_fn, X, w, offset, *args):
    return chunk_fn(X, w, offset, None, *args)[1]


# -- the fit -------------------------------------------------------------------------------
def bisecting(
    data,
    n_clusters: int,
    *,
    mean,
    init: str = "random",
    n_init: int = 1,
    max_iter: int = 300,
    tol: float = 1e-4,
    strategy: str = "biggest_inertia",
    seed: int = 0,
) -> BisectingFit:
    """Bisect until ``n_clusters`` leaves (see the module docstring).

    Parameters
    ----------
    data : ChunkedData
    n_clusters : int
    mean : ndarray of shape (n_features,)
        The rows' unweighted mean: the root's centre and the centre of the coordinates.
    init : {"k-means++", "random"}
    n_init : int
        Starts of each 2-means; the one of lowest objective is kept.
    max_iter, tol : int, float
        Each 2-means' limits (``tol`` bounds the squared centre shift, absolute).
    strategy : {"biggest_inertia", "largest_cluster"}
    seed : int
        The resolved ``random_state``.
    """
    mean = np.asarray(mean, np.float64)
    passes = _Passes(data)
    root_sse, root_weight = data.map_reduce(_root_chunk, _sum, (mean,))
    nodes = [
        Node(np.zeros_like(mean), 0, 0.0, float(root_sse), float(root_weight), int(data.n_rows))
    ]
    objectives = [float(root_sse)]
    cache: dict[int, Split] = {}
    order = []
    rounds = computed = 0
    while len(objectives) < n_clusters:
        leaves = _leaves(nodes)
        # scikit-learn's choice: the largest score, the first leaf in tree order on a tie
        ranked = sorted(range(len(leaves)), key=lambda at: (-nodes[leaves[at]].score, at))
        chosen = leaves[ranked[0]]
        if chosen not in cache:
            wanted = n_clusters - len(leaves)
            batch = [leaves[at] for at in ranked[:wanted] if leaves[at] not in cache]
            tree = TreeArrays.build(mean, [n.centre for n in nodes], [n.left for n in nodes])
            cache.update(
                zip(
                    batch,
                    _split_round(passes, tree, nodes, batch, init, n_init, max_iter, tol, seed),
                )
            )
            rounds += 1
            computed += len(batch)
            logger.info(
                "bisecting: round %d split %d clusters (%d leaves)", rounds, len(batch), len(leaves)
            )
        split = cache.pop(chosen)
        order.append(chosen)
        parent = nodes[chosen]
        parent.left, parent.split = len(nodes), split
        for side in (0, 1):
            score = (
                split.inertia[side] if strategy == "biggest_inertia" else float(split.count[side])
            )
            nodes.append(
                Node(
                    split.centres[side],
                    parent.depth + 1,
                    float(score),
                    float(split.inertia[side]),
                    float(split.weight[side]),
                    int(split.count[side]),
                )
            )
        objectives.append(objectives[-1] - parent.inertia + float(split.inertia.sum()))
    passes.state = None  # frees the chunks' leaves
    leaves = _leaves(nodes)
    n_iter = sum(n.split.n_iter for n in nodes if n.split is not None)
    return BisectingFit(mean, nodes, leaves, np.array(objectives), n_iter, rounds, computed, order)


def _split_round(passes, tree, nodes, batch, init, n_init, max_iter, tol, seed) -> list:
    """The 2-means of every leaf of ``batch``, all starts at once: their kept :class:`Split`."""
    n_nodes, d = len(nodes), len(tree.mean)
    B = len(batch)
    slots = np.full((n_init, n_nodes), -1, np.int64)
    for t in range(n_init):
        slots[t, batch] = np.arange(B) + t * B  # pair p: start p // B of leaf batch[p % B]
    depth = np.array([nodes[i].depth for i in batch], np.int64)
    fallback = np.array([nodes[i].centre for i in batch]).reshape(B, d)
    local = np.where(slots[0] >= 0, slots[0], -1)  # start t's pairs numbered 0 .. B-1 for its draws
    starts = np.concatenate(
        [
            _starts(passes, tree, local, depth, derive_seed(seed, t), init, fallback)
            for t in range(n_init)
        ]
    )
    centres, n_iter, final = _lloyd_pairs(passes, tree, slots, starts, max_iter, tol)
    splits = []
    for b in range(B):
        best, best_objective = b, final["inertia"][b].sum()  # start 0's pair, kept unless beaten
        for t in range(1, n_init):
            p = t * B + b
            objective = final["inertia"][p].sum()
            if objective < best_objective * (1 - BETTER):
                best, best_objective = p, objective
        splits.append(
            Split(
                centres[best],
                final["inertia"][best].copy(),
                final["weight"][best].copy(),
                final["count"][best].copy(),
                int(n_iter[best]),
                starts[best],
            )
        )
    return splits


def _starts(passes, tree, slots_t, depth, seed, init, fallback) -> np.ndarray:
    """The initial centres ``(B, 2, d)`` of one start of every leaf of the round."""
    B = len(depth)
    first = stream("bisecting.draws", 0)
    if init == "random":  # two distinct rows, drawn by weight
        got = passes.run(
            _keys_chunk, combine_top_keys, (tree, slots_t, depth, seed, first, 2, None)
        )
        rows = got["rows"].copy()
        for b in range(B):
            found = np.isfinite(got["key"][b])
            if not found[
                0
            ]:  # no row of positive weight: the leaf's first row (its centre if it has none)
                rows[b, 0] = (
                    got["first_row"][b]
                    if got["first_index"][b] < np.iinfo(np.int64).max
                    else fallback[b]
                )
            if not found[1]:  # a single eligible row: both centres on it
                rows[b, 1] = rows[b, 0]
        return rows
    got = passes.run(_keys_chunk, combine_top_keys, (tree, slots_t, depth, seed, first, 1, None))
    none = got["first_index"] == np.iinfo(np.int64).max  # a leaf without rows
    # no row of positive weight: the leaf's first row; no row at all: the leaf's centre
    c1 = np.where(
        np.isfinite(got["key"][:, :1]),
        got["rows"][:, 0],
        np.where(none[:, None], fallback, got["first_row"]),
    )
    candidates = np.empty((B, 2, c1.shape[1]))
    for j in (
        1,
        2,
    ):  # scikit-learn's 2 + int(log(2)) = 2 candidates, drawn by w * D^2, with replacement
        drawn = passes.run(
            _keys_chunk, combine_top_keys, (tree, slots_t, depth, seed, first + j, 1, c1)
        )
        ok = np.isfinite(drawn["key"][:, 0])
        # no row of positive w * D^2: scikit-learn's search lands on the leaf's first row
        candidates[:, j - 1] = np.where(
            ok[:, None], drawn["rows"][:, 0], np.where(none[:, None], c1, drawn["first_row"])
        )
    pots = passes.run(_potentials_chunk, _sum, (tree, slots_t, c1, candidates))
    best = np.argmin(pots, axis=1)
    return np.stack([c1, candidates[np.arange(B), best]], axis=1)


def _lloyd_pairs(passes, tree, slots, starts, max_iter, tol):
    """Lloyd on every pair at once: final centres, iterations, the final assignment's partials."""
    P = len(starts)
    C = starts.copy()
    n_iter = np.zeros(P, np.int64)
    status = np.zeros(P, np.int8)  # 0 running, 1 final assignment pending, 2 done
    final = {}
    while (status < 2).any():
        live = status < 2
        live_slots = np.where(live[np.maximum(slots, 0)] & (slots >= 0), slots, -1)
        partials = passes.run(_split_chunk, combine_split_partials, (tree, Pairs(live_slots, C)))
        for p in np.flatnonzero(live):
            if status[p] == 1:
                status[p] = 2
                _keep(final, partials, p, P)
                continue
            new = _update(C[p], partials, p)
            n_iter[p] += 1
            shift = float(((new - C[p]) ** 2).sum())
            if shift == 0.0:  # no centre moved: this pass's assignment is the final one
                status[p] = 2
                _keep(final, partials, p, P)
            elif shift <= tol or n_iter[p] >= max_iter:
                C[p], status[p] = new, 1
            else:
                C[p] = new
    return C, n_iter, final


def _keep(final: dict, partials: dict, p: int, P: int) -> None:
    for key in ("inertia", "weight", "count"):
        final.setdefault(key, np.zeros((P, 2), partials[key].dtype))[p] = partials[key][p]


def _update(C, partials, p) -> np.ndarray:
    """The new centres of pair ``p`` (scikit-learn's update: weighted means; an empty side takes
    the farthest row, whose weight leaves its side; a side left without weight keeps its sum)."""
    sums, weight = partials["sums"][p].copy(), partials["weight"][p].copy()
    empty = np.flatnonzero(weight == 0)
    if len(empty) == 2:  # no row of positive weight: nothing moves
        return C.copy()
    if len(empty) == 1 and np.isfinite(partials["far_dist"][p]):
        new, old = int(empty[0]), int(partials["far_side"][p])
        x, w = partials["far_row"][p], partials["far_weight"][p]
        sums[old] -= x * w
        sums[new] = x * w
        weight[new] = w
        weight[old] -= w
    out = sums.copy()
    live = weight > 0
    out[live] = sums[live] / weight[live, None]
    return out


__all__ = ["BisectingFit", "INITS", "Node", "STRATEGIES", "Split", "bisecting"]
