"""Price changes for a size-capped assignment from one pass's margin histogram.

A pass at prices ``P`` reports, for every pair of clusters ``(a, b)``, how many rows of ``a``
would move to ``b`` at each margin, in bins a quarter of an octave wide
(:func:`~dkmeans.kernels.capacitated.margin_histogram`). Raising cluster ``a``'s price by
``pi_a`` and ``b``'s by ``pi_b`` moves the rows of ``a`` whose margin to ``b`` is below
``pi_a - pi_b``: with the bins as rows at their bins' middle margins, finding the ``pi`` that
brings every size within its caps is a small linear program (a transport of the bins under the
caps), whose duals are the price changes. The model counts a row in every pair it belongs to
(it may move it twice) and places it at its bin's middle, so its prices are near, not at, the
right ones: the next pass measures the sizes they give and the model moves them again, each
pass closing most of the gap at a finer scale (the bins are relative). The exact solve
(:meth:`~dkmeans.drivers.capacitated.CapacitatedPasses._certify`) takes the last rows.

The program is solved by scipy's HiGHS (:func:`scipy.optimize.linprog`): a cluster may lack
rows that could move in at any listed margin, so each size may also break its cap at a cost
above any move's, which keeps the program feasible and its duals bounded.
"""

from __future__ import annotations

import numpy as np

from dkmeans._lazy import lazy_module

_optimize = lazy_module("scipy.optimize")
_sparse = lazy_module("scipy.sparse")

#: The cost of a size's unit beyond its cap, in multiples of the largest bin's margin.
BREACH_COST = 4.0


def bin_margins(edges: np.ndarray) -> np.ndarray:
    """Each bin's margin in the model: 0 for bin 0 (exact ties), the geometric middle of its
    edges for the others (the last one, unbounded, at its lower edge)."""
    middle = np.sqrt(edges[:-1] * edges[1:])
    return np.concatenate([[0.0], middle, [edges[-1]]])


def model_price_changes(
    index: np.ndarray,
    count: np.ndarray,
    sizes: np.ndarray,
    lower: float,
    upper: float,
    edges: np.ndarray,
    step_limit: float = np.inf,
) -> np.ndarray | None:
    """Price changes ``pi`` (k,) that bring the sizes within ``[lower, upper]`` under the model
    of a margin histogram (``index``, ``count``: :class:`~dkmeans.kernels.capacitated.MarginHistogram`
    of ``len(sizes)`` clusters over ``edges``), or None where HiGHS found no solution.

    The program: flows ``f_e`` in ``[0, count_e]`` of the bins ``e = (a, b, bin)``, each unit
    costing the bin's margin; per cluster ``j``, ``lower <= sizes_j - out_j + in_j <= upper``
    (``out_j <= sizes_j`` too), each bound breakable at :data:`BREACH_COST`. With ``u_j``,
    ``v_j`` the duals of the upper and lower bounds, a unit of ``a -> b`` flows only where its
    margin is at most ``(u_a - v_a) - (u_b - v_b)``: ``pi = u - v`` raises over-full clusters'
    prices and cuts under-full ones'.

    ``step_limit``: the largest price change wanted (the histogram then need hold only margins up
    to twice it): a size's unit beyond its cap costs at most that much, so no dual exceeds it.
    """
    k = sizes.shape[0]
    nbins = edges.shape[0] + 1
    pair, bins = np.divmod(index, nbins)
    src, dst = np.divmod(pair, k)
    margin = bin_margins(edges)[bins]
    scale = max(float(margin.max()) if margin.size else 1.0, 1.0)
    nv = index.shape[0]
    sp = _sparse
    cols = np.arange(nv)
    # rows 0..k-1: in - out (<= upper - size); k..2k-1: out - in (<= size - lower);
    # 2k..3k-1: out (<= size)
    net = sp.csr_matrix(
        (np.r_[np.ones(nv), -np.ones(nv)], (np.r_[dst, src], np.r_[cols, cols])), shape=(k, nv)
    )
    out = sp.csr_matrix((np.ones(nv), (src, cols)), shape=(k, nv))
    eye, zero = sp.identity(k, format="csr"), sp.csr_matrix((k, k))
    A = sp.vstack(
        [
            sp.hstack([net, -eye, zero]),
            sp.hstack([-net, zero, -eye]),
            sp.hstack([out, zero, zero]),
        ]
    ).tocsr()
    sizes = np.asarray(sizes, dtype=np.float64)
    room = np.where(np.isfinite(upper), upper - sizes, 1.0 + sizes.sum())
    b = np.r_[room, sizes - lower, sizes]
    breach = min(BREACH_COST, step_limit / scale)
    c = np.r_[margin / scale, np.full(2 * k, breach)]
    bounds = np.r_[np.c_[np.zeros(nv), count], np.tile([0.0, np.inf], (2 * k, 1))]
    # without presolve: HiGHS' presolve costs more than it saves on these programs (the Zipf
    # fit of benchmarks/balanced_phases.py: 81 programs of 3,700-13,800 flows, 1.62 -> 0.91 s)
    res = _optimize.linprog(
        c, A_ub=A, b_ub=b, bounds=bounds, method="highs", options={"presolve": False}
    )
    if res.status != 0 or res.ineqlin is None:
        return None
    dual = np.asarray(res.ineqlin.marginals, dtype=np.float64)
    return (dual[k : 2 * k] - dual[:k]) * scale


__all__ = ["BREACH_COST", "bin_margins", "model_price_changes"]
