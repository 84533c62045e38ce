"""Bisecting k-means on one chunk: the tree's descent, and the partials of many 2-means at once.

A bisecting tree is held as arrays (:class:`TreeArrays`), in coordinates centred on the
data's mean (as scikit-learn's ``BisectingKMeans`` centres its rows, for accurate
distances). A row finds its leaf by descending the tree: at each internal node it goes to
the nearer of the two children's centres (the left one on a tie), which is how
scikit-learn's ``predict`` descends and what its bisections' labels are (each 2-means
ends with an assignment to its final centres). The comparison is a hyperplane test,
``x . (c_r - c_l) > (|c_r|^2 - |c_l|^2) / 2``, one dot product per row and level.

The 2-means of several clusters, and of several starts (``n_init``) of each, share a
pass: a *pair* is one start of one cluster's 2-means, ``slots[t, node]`` the pair of
start ``t`` of the cluster at ``node`` (-1: none). Every result is small (per pair),
never per row. Rows are made dense float64 where they are read (SciPy CSR chunks too).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dkmeans.kernels.namespace import get_namespace, is_sparse, to_host
from dkmeans.kernels.sampling import uniform_by_index, weighted_sample_keys


@dataclass(frozen=True)
class TreeArrays:
    """A bisecting tree as arrays (picklable, sent to the chunks)."""

    mean: np.ndarray  # (d,) float64: the centre of the coordinates
    left: (
        np.ndarray
    )  # (n_nodes,) int64: a node's left child (its right one is left + 1), -1 at a leaf
    normal: np.ndarray  # (n_nodes, d) float64: c_right - c_left of an internal node's children
    offset: np.ndarray  # (n_nodes,) float64: (|c_right|^2 - |c_left|^2) / 2
    centres: np.ndarray  # (n_nodes, d) float64: every node's centre (centred coordinates)
    leaf_label: (
        np.ndarray
    )  # (n_nodes,) int64: a leaf's label (-1 for internal nodes and unlabelled trees)

    @classmethod
    def build(cls, mean, centres, left, leaf_label=None) -> TreeArrays:
        centres = np.asarray(centres, dtype=np.float64).reshape(len(left), -1)
        left = np.asarray(left, dtype=np.int64)
        normal = np.zeros_like(centres)
        offset = np.zeros(len(left))
        inner = np.flatnonzero(left >= 0)
        if len(inner):
            cl, cr = centres[left[inner]], centres[left[inner] + 1]
            normal[inner] = cr - cl
            offset[inner] = (np.einsum("ij,ij->i", cr, cr) - np.einsum("ij,ij->i", cl, cl)) / 2
        labels = (
            np.full(len(left), -1, np.int64)
            if leaf_label is None
            else np.asarray(leaf_label, np.int64)
        )
        return cls(np.asarray(mean, np.float64), left, normal, offset, centres, labels)


def host_rows(X):
    """The chunk's rows as a dense host array (SciPy CSR chunks made dense here)."""
    if is_sparse(X):
        X = X.toarray()
    return np.asarray(to_host(X))


def centred_rows(X, mean: np.ndarray, rows=None) -> np.ndarray:
    """Rows ``rows`` (default all) of host rows ``X`` as float64, minus ``mean``."""
    return np.subtract(
        X if rows is None else X[rows], mean, dtype=np.float64
    )  # one pass: no float64 copy first


def descend(X, tree: TreeArrays, node: np.ndarray | None = None) -> np.ndarray:
    """Each row's leaf (int64 node ids), descending from ``node`` (default: the root, node 0).

    ``X`` the chunk's host rows. ``node`` may hold any ancestor of each row's leaf (the leaves
    of an earlier, smaller tree): the descent continues from there, and only rows below an
    internal node are read.
    """
    node = np.zeros(len(X), np.int64) if node is None else np.array(node, dtype=np.int64)
    idx = np.flatnonzero(tree.left[node] >= 0)
    Xi = centred_rows(X, tree.mean, idx)
    while len(idx):
        at = node[idx]
        side = np.einsum("ij,ij->i", Xi, tree.normal[at]) > tree.offset[at]
        node[idx] = tree.left[at] + side
        deeper = tree.left[node[idx]] >= 0
        idx, Xi = idx[deeper], Xi[deeper]
    return node


def leaf_values(X, tree: TreeArrays, w=None) -> np.ndarray:
    """``(n, 3)`` float64 per row: its leaf's label, ``w`` times its squared distance to the
    leaf's centre, and ``w``."""
    X = host_rows(X)
    node = descend(X, tree)
    diff = centred_rows(X, tree.mean) - tree.centres[node]
    w = _weights(w, len(X))
    return np.column_stack([tree.leaf_label[node], w * np.einsum("ij,ij->i", diff, diff), w])


def leaf_labels(X, tree: TreeArrays):
    """Each row's leaf label (int32): scikit-learn's ``BisectingKMeans.predict``; descended in
    host memory, the labels in ``X``'s namespace (CuPy rows, CuPy labels)."""
    labels = tree.leaf_label[descend(host_rows(X), tree)].astype(np.int32)
    return get_namespace(X).asarray(labels)


def _weights(w, n: int) -> np.ndarray:
    return np.ones(n) if w is None else np.asarray(to_host(w), np.float64).reshape(-1)


# -- the 2-means of many pairs ------------------------------------------------------------
@dataclass(frozen=True)
class Pairs:
    """A pass's pairs: ``slots[t, node]`` the pair of start ``t`` at ``node``; their centres."""

    slots: np.ndarray  # (n_init, n_nodes) int64, -1 where none
    centres: np.ndarray  # (P, 2, d) float64, centred coordinates


def _pair_rows(node, slots_t):
    """Rows whose leaf has a pair in this start, and the pair of each."""
    pair = slots_t[node]
    rows = np.flatnonzero(pair >= 0)
    return rows, pair[rows]


def _sq(Xc, C):
    diff = Xc - C
    return np.einsum("ij,ij->i", diff, diff)


def sides(Xc, centres, p):
    """Side (0 or 1) of each centred row between its pair's two centres: the nearer one, the
    first on a tie, by the hyperplane test the tree's descent makes (:class:`TreeArrays`)."""
    c0, c1 = centres[:, 0], centres[:, 1]
    normal = c1 - c0
    offset = (np.einsum("ij,ij->i", c1, c1) - np.einsum("ij,ij->i", c0, c0)) / 2
    return (np.einsum("ij,ij->i", Xc, normal[p]) > offset[p]).astype(np.int64)


def split_partials(X, mean, w, first_row: int, node, pairs: Pairs) -> dict:
    """Per pair and side: weighted sums, weights, weighted squared distances and row counts of
    the rows nearest that side's centre (the left one on a tie), and the row farthest from its
    centre (the lowest global row index on a tie), for an empty side's relocation."""
    from scipy import sparse  # the per-side sums as one sparse product, without copies of the rows

    P, _, d = pairs.centres.shape
    out = empty_split_partials(P, d)
    w = _weights(w, len(X))
    for t in range(pairs.slots.shape[0]):
        rows, p = _pair_rows(node, pairs.slots[t])
        if not len(rows):
            continue
        Xc, wr = centred_rows(X, mean, rows), w[rows]
        side = sides(Xc, pairs.centres, p)
        diff = Xc - pairs.centres[p, side]
        dist = np.einsum("ij,ij->i", diff, diff)
        g = 2 * p + side
        out["weight"] += np.bincount(g, wr, minlength=2 * P).reshape(P, 2)
        out["inertia"] += np.bincount(g, wr * dist, minlength=2 * P).reshape(P, 2)
        out["count"] += np.bincount(g, minlength=2 * P).reshape(P, 2)
        member = sparse.csr_matrix((wr, (g, np.arange(len(rows)))), shape=(2 * P, len(rows)))
        out["sums"] += np.asarray(member @ Xc).reshape(P, 2, d)
        index = rows + first_row
        far = np.full(P, -np.inf)
        np.maximum.at(far, p, dist)
        tied = np.flatnonzero(dist == far[p])
        first = np.full(P, np.iinfo(np.int64).max)
        np.minimum.at(first, p[tied], index[tied])
        present = np.unique(p)
        at = first[present] - first_row  # chunk rows
        where = np.searchsorted(rows, at)
        _merge_far(
            out,
            dict(
                far_dist=far[present],
                far_index=first[present],
                far_row=Xc[where],
                far_weight=wr[where],
                far_side=side[where],
            ),
            present,
        )
    return out


def empty_split_partials(P: int, d: int) -> dict:
    return dict(
        sums=np.zeros((P, 2, d)),
        weight=np.zeros((P, 2)),
        inertia=np.zeros((P, 2)),
        count=np.zeros((P, 2), np.int64),
        far_dist=np.full(P, -np.inf),
        far_index=np.full(P, np.iinfo(np.int64).max),
        far_row=np.zeros((P, d)),
        far_weight=np.zeros(P),
        far_side=np.zeros(P, np.int64),
    )


_FAR = ("far_dist", "far_index", "far_row", "far_weight", "far_side")


def _merge_far(out: dict, far: dict, at: np.ndarray) -> None:
    """Keep, per pair ``at``, the farther of ``out``'s and ``far``'s rows (lower index on a tie)."""
    better = (far["far_dist"] > out["far_dist"][at]) | (
        (far["far_dist"] == out["far_dist"][at]) & (far["far_index"] < out["far_index"][at])
    )
    for key in _FAR:
        out[key][at[better]] = far[key][better]


def combine_split_partials(parts: list) -> dict:
    """Associative combination of :func:`split_partials` results."""
    out = {key: value.copy() for key, value in parts[0].items()}
    for part in parts[1:]:
        for key in ("sums", "weight", "inertia", "count"):
            out[key] += part[key]
        _merge_far(out, part, np.arange(len(out["far_dist"])))
    return out


# -- the starts --------------------------------------------------------------------------
def top_keys(
    X,
    mean,
    w,
    first_row: int,
    node,
    slots_t: np.ndarray,
    depth: np.ndarray,
    seed: int,
    stream_of,
    m: int,
    centre=None,
) -> dict:
    """Per pair of one start: the ``m`` rows of largest keys ``log(u) / weight`` (a weighted draw
    without replacement; ties to the lowest row index), with ``weight`` ``w`` or, given ``centre``
    (P, d), ``w`` times the squared distance to it (k-means++). ``u`` is keyed by the global row
    index, with the stream ``stream_of(depth)`` of the pair's node depth. Also each pair's first
    row, a fallback when no row has a positive weight."""
    P = len(depth)
    d = X.shape[1]
    out = dict(
        key=np.full((P, m), -np.inf),
        index=np.full((P, m), np.iinfo(np.int64).max),
        rows=np.zeros((P, m, d)),
        first_index=np.full(P, np.iinfo(np.int64).max),
        first_row=np.zeros((P, d)),
    )
    rows, p = _pair_rows(node, slots_t)
    if not len(rows):
        return out
    Xc = centred_rows(X, mean, rows)
    w = _weights(w, len(X))
    weight = w[rows] if centre is None else w[rows] * _sq(Xc, centre[p])
    index = rows + first_row
    u = np.empty(len(rows))
    for level in np.unique(depth[p]):
        at = depth[p] == level
        u[at] = uniform_by_index(index[at], seed, stream_of(int(level)))
    key, eligible = weighted_sample_keys(np, weight, u)
    order = np.lexsort((index, -key, p))
    ps = p[order]
    start = np.r_[True, ps[1:] != ps[:-1]]
    heads = order[start]
    present = p[heads]
    np.minimum.at(out["first_index"], p, index)
    out["first_row"][present] = Xc[np.searchsorted(rows, out["first_index"][present] - first_row)]
    rank = np.arange(len(order)) - np.flatnonzero(start).repeat(
        np.diff(np.r_[np.flatnonzero(start), len(order)])
    )
    keep = (rank < m) & eligible[order]
    sel = order[keep]
    out["key"][p[sel], rank[keep]] = key[sel]
    out["index"][p[sel], rank[keep]] = index[sel]
    out["rows"][p[sel], rank[keep]] = Xc[sel]
    return out


def combine_top_keys(parts: list) -> dict:
    """Associative combination of :func:`top_keys` results: the ``m`` largest keys per pair."""
    out = {key: value.copy() for key, value in parts[0].items()}
    m = out["key"].shape[1]
    for part in parts[1:]:
        key = np.concatenate([out["key"], part["key"]], axis=1)
        index = np.concatenate([out["index"], part["index"]], axis=1)
        rows = np.concatenate([out["rows"], part["rows"]], axis=1)
        order = np.lexsort((index, -key), axis=1)  # by decreasing key, then increasing row index
        take = order[:, :m]
        out["key"] = np.take_along_axis(key, take, 1)
        out["index"] = np.take_along_axis(index, take, 1)
        out["rows"] = np.take_along_axis(rows, take[:, :, None], 1)
        lower = part["first_index"] < out["first_index"]
        out["first_index"][lower] = part["first_index"][lower]
        out["first_row"][lower] = part["first_row"][lower]
    return out


def potentials(
    X, mean, w, node, slots_t: np.ndarray, first: np.ndarray, candidates: np.ndarray
) -> np.ndarray:
    """k-means++'s choice among candidates: per pair ``(P, c)``, the weighted sum over its rows of
    the smaller squared distance to ``first`` (P, d) or to each candidate (P, c, d)."""
    P, c = candidates.shape[:2]
    out = np.zeros((P, c))
    rows, p = _pair_rows(node, slots_t)
    if not len(rows):
        return out
    Xc, wr = centred_rows(X, mean, rows), _weights(w, len(X))[rows]
    d_first = _sq(Xc, first[p])
    for j in range(c):
        out[:, j] = np.bincount(p, wr * np.minimum(d_first, _sq(Xc, candidates[p, j])), minlength=P)
    return out


def root_objective(X, mean, w) -> np.ndarray:
    """``[sum w |x - mean|^2, sum w]`` over the chunk: the objective of one cluster at ``mean``."""
    X = host_rows(X)
    Xc = centred_rows(X, mean)
    return np.array(
        [
            float(_weights(w, len(X)) @ np.einsum("ij,ij->i", Xc, Xc)),
            float(_weights(w, len(X)).sum()),
        ]
    )


__all__ = [
    "Pairs",
    "TreeArrays",
    "centred_rows",
    "host_rows",
    "sides",
    "combine_split_partials",
    "combine_top_keys",
    "descend",
    "empty_split_partials",
    "leaf_labels",
    "leaf_values",
    "potentials",
    "root_objective",
    "split_partials",
    "top_keys",
]
