"""The gap statistic's reference rows and their Lloyd partials, against NumPy computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dkmeans.kernels.reference import (
    Frame,
    combine_extent,
    combine_frame,
    combine_reference,
    extent_partials,
    frame_partials,
    principal_axes,
    reference_partials,
    reference_rows,
)


def _frame(X):
    stats = combine_frame([frame_partials(X[:7]), frame_partials(X[7:40]), frame_partials(X[40:])])
    axes = principal_axes(stats)
    lo, hi = combine_extent(
        [
            extent_partials(X[:20], None, stats.mean, axes),
            extent_partials(X[20:], None, stats.mean, axes),
        ]
    )
    return stats, Frame(stats.mean, axes, lo, hi)


def test_the_frame_is_the_data_s_principal_box():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(100, 3)) @ np.array([[3.0, 0, 0], [1.0, 1.0, 0], [0, 0, 0.2]])
    stats, frame = _frame(X)
    assert stats.count == 100
    np.testing.assert_allclose(stats.mean, X.mean(axis=0))
    np.testing.assert_allclose(stats.scatter, (X - X.mean(0)).T @ (X - X.mean(0)), rtol=1e-12)
    # the axes: orthonormal eigenvectors of the covariance, largest variance first
    np.testing.assert_allclose(frame.axes.T @ frame.axes, np.eye(3), atol=1e-12)
    variances = np.var((X - X.mean(0)) @ frame.axes, axis=0)
    assert variances[0] > variances[1] > variances[2]
    projected = (X - X.mean(0)) @ frame.axes
    np.testing.assert_allclose(frame.lo, projected.min(0))
    np.testing.assert_allclose(frame.hi, projected.max(0))


def test_weights_are_multiplicities_and_zero_weights_leave_the_box():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(30, 2))
    w = rng.integers(0, 3, 30).astype(float)
    got = frame_partials(X, w)
    repeated = np.repeat(X, w.astype(int), axis=0)
    assert got.count == len(repeated)
    np.testing.assert_allclose(got.mean, repeated.mean(0))
    np.testing.assert_allclose(
        got.scatter, (repeated - repeated.mean(0)).T @ (repeated - repeated.mean(0))
    )
    lo, hi = extent_partials(X, w, np.zeros(2), np.eye(2))
    np.testing.assert_array_equal(lo, X[w > 0].min(0))
    np.testing.assert_array_equal(hi, X[w > 0].max(0))


def test_reference_rows_depend_on_the_row_index_only():
    X = np.random.default_rng(2).normal(size=(50, 4))
    _, frame = _frame(X)
    whole = reference_rows(frame, 0, 200, 150, seed=7, stream=3)
    assert whole.shape == (150, 4)  # rows at or beyond m = 150 are not drawn
    parts = [
        reference_rows(frame, a, b - a, 150, seed=7, stream=3)
        for a, b in ((0, 13), (13, 90), (90, 200))
    ]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    assert reference_rows(frame, 150, 10, 150, seed=7, stream=3).shape == (0, 4)
    other = reference_rows(frame, 0, 150, 150, seed=7, stream=4)
    assert not np.allclose(other, whole)
    # inside the box, and filling it: projected rows uniform over [lo, hi] on each axis
    u = ((whole - frame.mean) @ frame.axes - frame.lo) / (frame.hi - frame.lo)
    assert u.min() >= 0 and u.max() <= 1
    big = reference_rows(frame, 0, 20_000, 20_000, seed=1, stream=0)
    u = ((big - frame.mean) @ frame.axes - frame.lo) / (frame.hi - frame.lo)
    np.testing.assert_allclose(u.mean(0), 0.5, atol=0.01)
    np.testing.assert_allclose(u.var(0), 1 / 12, atol=0.003)


def test_partials_are_lloyd_s_sums_of_the_reference_rows():
    X = np.random.default_rng(3).normal(size=(80, 3))
    _, frame = _frame(X)
    C2, C3 = X[:2].copy(), X[5:8].copy()
    chunks = [(0, 25), (25, 60), (60, 100)]
    parts = [
        reference_partials(a, b - a, 70, frame, 9, [0, 1], [[C2, C3], [C3]]) for a, b in chunks
    ]
    got = combine_reference(parts)
    for draw, sets in ((0, [C2, C3]), (1, [C3])):
        R = reference_rows(frame, 0, 70, 70, 9, draw)
        for (sums, count, objective), C in zip(got[draw], sets):
            d2 = ((R[:, None, :] - C[None]) ** 2).sum(-1)
            labels = d2.argmin(1)
            want_sums = np.array([R[labels == j].sum(0) for j in range(len(C))])
            np.testing.assert_allclose(sums, want_sums, atol=1e-10)
            np.testing.assert_array_equal(count, np.bincount(labels, minlength=len(C)))
            assert objective == pytest.approx(d2.min(1).sum(), rel=1e-10)
