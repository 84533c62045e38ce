"""What a k sweep costs beside fitting each k alone (issue 48): its fits, and its scores.

    .venv/bin/python benchmarks/sweep_cost.py [--rows 20000] [--features 32] [--blobs 8] [--k-max 16]

In one process, on blobs fitted in the caller: ``dkmeans.sweep`` over k = 2..k_max with the
gap's reference fits off (``reference_draws=0``) and on (the default 5 draws), and the same k
fitted one by one with ``KMeans``; wall and CPU seconds of each, after one warm-up fit.
"""

from __future__ import annotations

import argparse
import resource
import time

import dkmeans
from dkmeans.testing import make_blobs


def cpu_seconds() -> float:
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(fn):
    c0, t0 = cpu_seconds(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, cpu_seconds() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--blobs", type=int, default=8)
    parser.add_argument("--k-max", type=int, default=16)
    args = parser.parse_args()
    X, _, _ = make_blobs(args.rows, args.features, args.blobs, seed=0)
    ks = list(range(2, args.k_max + 1))
    dkmeans.KMeans(4, random_state=0).fit(X)  # imports and kernels loaded before any timing
    print(f"{args.rows} x {args.features}, {args.blobs} blobs, k = 2..{args.k_max}")
    for draws in (0, 5):
        result, wall, cpu = timed(
            lambda: dkmeans.sweep(X, ks, random_state=0, reference_draws=draws)
        )
        print(
            f"sweep, reference_draws={draws}: {wall:6.2f} s wall {cpu:6.2f} s CPU, "
            f"suggests {result.suggested_k}, {result.n_passes} passes"
        )
    _, wall, cpu = timed(lambda: [dkmeans.KMeans(k, random_state=0).fit(X) for k in ks])
    print(f"each k alone:              {wall:6.2f} s wall {cpu:6.2f} s CPU")


if __name__ == "__main__":
    main()
