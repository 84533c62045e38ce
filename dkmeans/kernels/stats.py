"""Per-column moments of a chunk, combined exactly (Chan et al.'s parallel variance)."""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from dkmeans.backend import get_namespace


class Moments(NamedTuple):
    """Row count, per-column mean and sum of squared deviations (float64)."""

    count: Any  # () float64
    mean: Any  # (d,) float64
    m2: Any  # (d,) float64


def column_moments(X) -> Moments:
    """Moments of one chunk (unweighted), accumulated in float64."""
    xp = get_namespace(X)
    n = X.shape[0]
    if n == 0:
        zeros = xp.zeros(X.shape[1], dtype=xp.float64)
        return Moments(xp.zeros((), dtype=xp.float64), zeros, zeros.copy())
    X64 = X.astype(xp.float64)
    mean = X64.mean(axis=0)
    dev = X64 - mean
    return Moments(xp.asarray(float(n)), mean, xp.sum(dev * dev, axis=0))


def combine_moments(parts: Sequence[Moments]) -> Moments:
    """Combine chunk moments; order-independent up to rounding."""
    count, mean, m2 = parts[0]
    for p in parts[1:]:
        total = count + p.count
        if float(total) == 0.0:
            continue
        delta = p.mean - mean
        mean = mean + delta * (p.count / total)
        m2 = m2 + p.m2 + delta * delta * (count * p.count / total)
        count = total
    return Moments(count, mean, m2)
