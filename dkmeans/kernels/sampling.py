"""Random draws keyed by global row index: the same rows whatever the chunking.

:func:`uniform_by_index` is a counter-based generator (SplitMix64 finaliser over the row
index and a seed), so a row's random number depends only on ``(seed, stream, index)``.
"""

from __future__ import annotations

from dkmeans.kernels.backends.sparse import take_rows
from dkmeans.kernels.namespace import get_namespace
from dkmeans.kernels.nearest import TopRows, select_top

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _splitmix64(xp, z):
    z = z + xp.uint64(_GOLDEN)
    z = (z ^ (z >> xp.uint64(30))) * xp.uint64(_MIX1)
    z = (z ^ (z >> xp.uint64(27))) * xp.uint64(_MIX2)
    return z ^ (z >> xp.uint64(31))


def uniform_by_index(index, seed: int, stream: int = 0):
    """Uniform numbers in (0, 1), one per entry of ``index`` (int64 global row indices).

    Parameters
    ----------
    index : array of int64
    seed : int
        Resolved ``random_state`` (0 <= seed < 2**64).
    stream : int
        Separates independent uses of the same seed (one stream per draw purpose).
    """
    xp = get_namespace(index)
    key = _splitmix64(xp, xp.asarray([seed ^ (stream * _GOLDEN % 2**64)], dtype=xp.uint64))[0]
    z = _splitmix64(xp, index.astype(xp.uint64) ^ key)
    z = _splitmix64(xp, z + key)
    # 53 high bits -> (0, 1): add half an ulp so 0 is never returned
    return ((z >> xp.uint64(11)).astype(xp.float64) + 0.5) * (1.0 / 2**53)


def weighted_sample_keys(xp, w, u):
    """Keys whose top ``m`` is a sample without replacement with probability ~ ``w``.

    ``log(u) / w``: Efraimidis and Spirakis's ``u ** (1 / w)`` in log space, so tiny
    weights do not underflow; rows with ``w == 0`` are ineligible. Dividing by 1 is
    exact and by a power of two too, so unit weights give exactly the keys ``log(u)``
    and weights all equal to 2 the same order.
    """
    positive = w > 0
    return xp.where(positive, xp.log(u) / xp.where(positive, w, 1.0), -xp.inf), positive


def random_top_rows(X, weights, row_offset: int, k: int, seed: int, stream: int = 0) -> TopRows:
    """The chunk's ``k`` rows with the largest keys ``log(u) / w`` (weighted sampling without replacement).

    Taking the global top ``k`` of these keys draws ``k`` distinct rows with
    probabilities proportional to their weights (Efraimidis and Spirakis, 2006);
    zero-weight rows are never drawn. Without weights every row weighs 1: one code
    path, so ``weights=ones`` draws exactly the rows ``weights=None`` draws.
    """
    xp = get_namespace(X)
    index = xp.arange(row_offset, row_offset + X.shape[0], dtype=xp.int64)
    u = uniform_by_index(index, seed, stream)
    w = (
        xp.ones(X.shape[0], dtype=xp.float64)
        if weights is None
        else xp.asarray(weights, dtype=xp.float64)
    )
    score, eligible = weighted_sample_keys(xp, w, u)
    keep = select_top(xp, score, index, k, eligible=eligible)
    return TopRows(score[keep], index[keep], take_rows(X, keep))
