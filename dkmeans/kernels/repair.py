"""The size caps' greedy repair: candidate moves of single rows taken in order while they help.

:func:`take_moves` is written in plain loops so that the compiled variant
(:mod:`dkmeans.kernels.backends.compiled_capacitated`) is this same function compiled: both take
the same moves. A repair pass lists each row of an over-full cluster with its few cheapest
clusters with room: on the IVF-style build of ``benchmarks/balanced.py``, with the interpreted
loop the fit took 12 to 27 s longer (two runs; benchmarks/README.md, twelfth pass).
"""

from __future__ import annotations


def take_moves(
    source, target, weight, group, shed, sizes, lower, upper, slack, taken, kept
):  # pragma: no cover - also compiled (the branches are the tests' of either path)
    """Take candidate moves greedily, in their order (cheapest first); the number taken.

    A move of row ``group[m]`` from ``source[m]`` to ``target[m]`` (weight ``weight[m]``) is taken
    while its row has not moved in this call and, ``shed``, its source is over its cap and its
    target has room for it; otherwise, its target is under its floor and its source stays at or
    above its floor with it gone. ``sizes`` (k,) change in place; ``taken`` (rows,) flags the rows
    moved (all False on entry); ``kept`` (moves,) is set True at the moves taken.
    """
    count = 0
    for m in range(source.shape[0]):
        r = group[m]
        if taken[r]:
            continue
        s, t, w = source[m], target[m], weight[m]
        if shed:
            ok = sizes[s] - upper > slack and sizes[t] + w <= upper + slack
        else:
            ok = lower - sizes[t] > slack and sizes[s] - w >= lower - slack
        if ok:
            sizes[s] -= w
            sizes[t] += w
            taken[r] = True
            kept[m] = True
            count += 1
    return count
