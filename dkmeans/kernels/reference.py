"""The gap statistic's reference data: uniform rows in the data's principal box, made by each chunk.

A reference draw is never stored: its row ``i`` (for ``i < m``) is a pure function of
``(seed, stream, i)`` (:func:`~dkmeans.kernels.sampling.uniform_by_index`, one key per
entry ``i * d + j``), so any chunk makes the reference rows of its own global row indices,
whatever the chunking, and a pass over the data is a pass over every reference draw too.
The box is Tibshirani, Walther and Hastie's (2001) second reference: uniform over the range
of the data along its principal axes, rotated back (:class:`Frame`).

* :func:`frame_partials` / :func:`combine_frame` (first pass): weighted count, mean and
  scatter matrix (Chan's update, float64), whose eigenvectors are the principal axes;
* :func:`extent_partials` / :func:`combine_extent` (second pass): the range of the rows of
  positive weight along those axes;
* :func:`reference_rows`: rows ``[offset, offset + n) ∩ [0, m)`` of one draw;
* :func:`reference_partials` / :func:`combine_reference` (each Lloyd pass): per draw and per
  set of centroids, the sums, counts and objective of the reference rows' nearest centroids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from dkmeans.kernels.namespace import to_host
from dkmeans.kernels.nearest import assign, cluster_sums
from dkmeans.kernels.sampling import uniform_by_index


class FrameStats(NamedTuple):
    """Weighted count, mean (d,) and scatter matrix (d, d) of rows, float64."""

    count: float
    mean: np.ndarray
    scatter: np.ndarray


class Frame(NamedTuple):
    """The reference box: ``mean + (lo + (hi - lo) * u) @ axes.T`` for ``u`` uniform in [0, 1)^d."""

    mean: np.ndarray
    axes: np.ndarray
    lo: np.ndarray
    hi: np.ndarray


def _positive(X, w):
    return X if w is None else X[np.asarray(to_host(w)).reshape(-1) > 0]


def frame_partials(X, w=None) -> FrameStats:
    """:class:`FrameStats` of a chunk (weights as multiplicities; device rows read on the host)."""
    X64 = np.asarray(to_host(X), dtype=np.float64)
    w64 = (
        np.ones(X64.shape[0]) if w is None else np.asarray(to_host(w), dtype=np.float64).reshape(-1)
    )
    count = float(w64.sum())
    d = X64.shape[1]
    if count <= 0:
        return FrameStats(0.0, np.zeros(d), np.zeros((d, d)))
    mean = w64 @ X64 / count
    dev = X64 - mean
    return FrameStats(count, mean, (dev * w64[:, None]).T @ dev)


def combine_frame(parts: Sequence[FrameStats]) -> FrameStats:
    """Combine :class:`FrameStats` (Chan et al.'s update of the scatter matrix)."""
    count, mean, scatter = parts[0]
    for p in parts[1:]:
        total = count + p.count
        if total <= 0:
            continue
        delta = p.mean - mean
        scatter = scatter + p.scatter + np.outer(delta, delta) * (count * p.count / total)
        mean = mean + delta * (p.count / total)
        count = total
    return FrameStats(count, mean, scatter)


def principal_axes(stats: FrameStats) -> np.ndarray:
    """The eigenvectors of the scatter matrix (columns), largest variance first."""
    values, vectors = np.linalg.eigh(stats.scatter)
    return np.ascontiguousarray(vectors[:, ::-1])


def extent_partials(X, w, mean, axes):
    """``(lo, hi)`` of the chunk's rows of positive weight on ``axes`` (none: ``(inf, -inf)``)."""
    rows = _positive(np.asarray(to_host(X), dtype=np.float64), w)
    d = axes.shape[1]
    if rows.shape[0] == 0:
        return np.full(d, np.inf), np.full(d, -np.inf)
    projected = (rows - mean) @ axes
    return projected.min(axis=0), projected.max(axis=0)


def combine_extent(parts):
    """The union of ranges."""
    lo = np.min([p[0] for p in parts], axis=0)
    hi = np.max([p[1] for p in parts], axis=0)
    return lo, hi


def reference_rows(frame: Frame, offset: int, n: int, m: int, seed: int, stream: int) -> np.ndarray:
    """Rows ``[offset, min(offset + n, m))`` of the draw of ``(seed, stream)``, float64."""
    stop = min(offset + n, m)
    d = frame.mean.shape[0]
    if stop <= offset:
        return np.empty((0, d))
    index = np.arange(offset * d, stop * d, dtype=np.int64)
    u = uniform_by_index(index, seed, stream).reshape(-1, d)
    return frame.mean + (frame.lo + (frame.hi - frame.lo) * u) @ frame.axes.T


def reference_partials(
    offset: int,
    n: int,
    m: int,
    frame: Frame,
    seed: int,
    streams: Sequence[int],
    centroids: Sequence[Sequence[np.ndarray]],
):
    """Lloyd's partials of every draw's reference rows of one chunk, for every set of centroids.

    Parameters
    ----------
    offset, n : int
        The chunk's first global row index and its rows.
    m : int
        Reference rows per draw (rows with a global index below ``m``).
    frame : Frame
    seed : int
    streams : sequence of int
        One stream per draw.
    centroids : sequence (per draw) of sequences of arrays (k, d)

    Returns
    -------
    list (per draw) of lists of ``(sums (k, d), counts (k,), objective)``, float64.
    """
    out = []
    for stream, sets in zip(streams, centroids):
        if not len(sets):
            out.append([])
            continue
        R = reference_rows(frame, offset, n, m, seed, stream)
        per_set = []
        for C in sets:
            k, d = C.shape
            if R.shape[0] == 0:
                per_set.append((np.zeros((k, d)), np.zeros(k), 0.0))
                continue
            labels, min_sq = assign(R, C)
            per_set.append((*cluster_sums(R, labels, k), float(np.sum(min_sq, dtype=np.float64))))
        out.append(per_set)
    return out


def combine_reference(parts):
    """Sum :func:`reference_partials` results entry by entry."""
    total = parts[0]
    for p in parts[1:]:
        total = [
            [(a[0] + b[0], a[1] + b[1], a[2] + b[2]) for a, b in zip(da, db)]
            for da, db in zip(total, p)
        ]
    return total


__all__ = [
    "Frame",
    "FrameStats",
    "combine_extent",
    "combine_frame",
    "combine_reference",
    "extent_partials",
    "frame_partials",
    "principal_axes",
    "reference_partials",
    "reference_rows",
]
