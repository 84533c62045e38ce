"""What a size-capped pass costs a chunk, against an uncapped one, and what fresh cost arrays cost.

Part 1: one chunk of ``--rows`` x 16 float32 Gaussian blobs (default 250,000), k = 32, compiled
kernels, best of 5 in milliseconds: the uncapped assignment (``assign_partials``); a chunk's
integer costs (``cost_cache``, into the previous array); over those kept costs the priced labels
and partials of a plain pass, of a pass with exchange lists (64 a pair) and of a pass with every
margin's histogram; the final labels with per-cluster sums (``priced_label_objective``).

Part 2: two threads at once each allocate and write a ``--alloc-rows`` x 32 float64 array
(default 1,000,000, 256 MB), four rounds with every array kept (fresh memory each round): on
NumPy's heap (which advises transparent huge pages for large arrays) and as the cost arrays are
allocated (``kernels.capacitated._cost_array``: plain pages), then one read of each kind.

Run:  .venv/bin/python benchmarks/balanced_costs.py [--rows 250000] [--alloc-rows 1000000]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def best_ms(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(min(times) * 1e3, 1)


def chunk_kernels(rows: int) -> None:
    from dkmeans.kernels import assign_partials
    from dkmeans.kernels.capacitated import cost_cache, price_partials, priced_label_objective
    from dkmeans.kernels.plans import KernelPlan
    from dkmeans.testing import make_blobs

    k = 32
    X = make_blobs(rows, 16, k, seed=0, dtype=np.float32)[0]
    C = X[:k].astype(np.float64) + 0.1
    q, P, Q, none = 2.0**-20, np.zeros(k), np.zeros(k), np.zeros(k, np.int64)
    with KernelPlan("compiled", "auto").applied():
        cache = cost_cache(X, C, q, 0, b"x")
        figures = {
            "uncapped assignment": lambda: assign_partials(X, C.astype(np.float32)),
            "costs, into the previous array": lambda: cost_cache(X, C, q, 0, b"x", reuse=cache),
            "plain pass on kept costs": lambda: price_partials(
                X, None, 0, C, P, Q, q, none, none, cache=cache
            ),
            "exchange lists, 64 a pair": lambda: price_partials(
                X, None, 0, C, P, Q, q, none, none, cache=cache, exchange=64
            ),
            "histogram of every margin": lambda: price_partials(
                X, None, 0, C, P, Q, q, none, none, cache=cache, histogram=1
            ),
            "final labels and sums": lambda: priced_label_objective(X, None, 0, C, P, Q, q),
        }
        for name, fn in figures.items():
            fn()  # compiled at first use
            print(f"{rows} x 16, k = {k}: {name}: {best_ms(fn)} ms")


def fresh_arrays(rows: int) -> None:
    from dkmeans.kernels.capacitated import _cost_array

    k = 32
    kinds = {"NumPy heap": lambda: np.empty((rows, k)), "plain pages": lambda: _cost_array(rows, k)}
    pool = ThreadPoolExecutor(2)
    for name, alloc in kinds.items():
        held = []

        def one(_, alloc=alloc):
            t0 = time.perf_counter()
            a = alloc()
            a[:] = 1.0
            return time.perf_counter() - t0, a

        rounds = []
        for _ in range(4):
            t0 = time.perf_counter()
            held.append(list(pool.map(one, range(2))))
            rounds.append(round((time.perf_counter() - t0) * 1e3))
        a = held[-1][0][1]
        print(
            f"two {rows} x {k} arrays at once, {name}: {rounds} ms a round; "
            f"a read {best_ms(a.sum)} ms"
        )
        del held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--alloc-rows", type=int, default=1_000_000)
    args = parser.parse_args()
    chunk_kernels(args.rows)
    fresh_arrays(args.alloc_rows)


if __name__ == "__main__":
    main()
