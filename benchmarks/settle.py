"""Does the default fit's start settled on a sample pay, by the sample's share of the rows?

The default fit (``KMeans(k, random_state=seed)``, local search on) may settle its seeding on a
sample of ``coreset_size(n, k)`` rows before Lloyd on the data
(:func:`dkmeans.drivers.coreset.coreset_start`). This runs every default fit twice, with
the settle forced on (``dkmeans.fit.runs.SETTLE_MAX_SHARE = 1``: at any share, as before issue
51) and off (``0``), the two taking turns per seed in one process, on the float32 blobs of
``benchmarks/lloyd.py`` (d = 16, k = 32) at each size given and on the SIPU sets where present.
Reported per size: the sample's share of the rows, mean CPU seconds of the fit (this process,
all its threads: the small fits run in it) on / off, mean objective on / off, mean passes
(``n_passes_``: the sample's own Lloyd steps are not passes) and Lloyd iterations on the data.

With ``--max-iter-check N`` it instead fits N random cases (overlapping blobs of 8,199, 12,288
or 20,000 rows, k = 6, either seeding) at each cap of :data:`CAPS` and lists every pair of
consecutive caps where the larger one ended with a higher objective.

Run:  .venv/bin/python benchmarks/settle.py [--seeds 8] [--sizes 4096 8192 ...] [--no-sipu]
      .venv/bin/python benchmarks/settle.py --max-iter-check 30
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_sipu, sipu_dir  # noqa: E402
from lloyd import make_data  # noqa: E402

import dkmeans  # noqa: E402
import dkmeans.fit.runs as runs  # noqa: E402
from dkmeans.drivers.coreset import coreset_size  # noqa: E402


def objective(X, C) -> float:
    X, C = X.astype(np.float64), C.astype(np.float64)
    d = (X**2).sum(1)[:, None] - 2 * X @ C.T + (C**2).sum(1)[None]
    return float(np.maximum(d.min(1), 0).sum())


def one_fit(X, k: int, seed: int, settle: bool) -> tuple:
    runs.SETTLE_MAX_SHARE = 1.0 if settle else 0.0
    t = time.process_time()
    km = dkmeans.KMeans(k, random_state=seed).fit(X)
    return time.process_time() - t, objective(X, km.cluster_centers_), km.n_passes_, km.n_iter_


#: caps of ``--max-iter-check``: below the settle's, at it (299 -> 300: it begins) and above
CAPS = [4, 5, 6, 7, 9, 12, 20, 299, 300, 400]


def max_iter_check(n_cases: int) -> None:
    """Consecutive caps where the larger ended higher, over ``n_cases`` random cases."""
    rng = np.random.default_rng(1)
    worse, pairs = [], 0
    for case in range(n_cases):
        n, seed = int(rng.choice([8199, 12288, 20000])), int(rng.integers(0, 2**16))
        init = ("k-means||", "k-means++")[case % 2]
        data = np.random.default_rng(seed)
        centres = data.uniform(-4, 4, size=(6, 4))
        X = centres[data.integers(0, 6, n)] + data.normal(size=(n, 4))
        scores = []
        for cap in CAPS:
            km = dkmeans.KMeans(6, init=init, n_init=1, max_iter=cap, random_state=seed)
            scores.append(km.fit(X).score(X))
        for (a, sa), (b, sb) in zip(zip(CAPS, scores), zip(CAPS[1:], scores[1:])):
            pairs += 1
            if sb < sa - 1e-9 * abs(sa):
                worse.append((a, b, (sa - sb) / abs(sa)))
                print(
                    f"n={n} seed={seed} {init}: max_iter {a} -> {b} ended higher by "
                    f"{(sa - sb) / abs(sa):.1e}",
                    flush=True,
                )
    print(
        f"{len(worse)} of {pairs} consecutive pairs ended higher at the larger cap; at the caps "
        f"{sorted({(a, b) for a, b, _ in worse})}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument(
        "--sizes", type=int, nargs="*", default=[3000, 4096, 6000, 8192, 16384, 49152, 131072]
    )
    parser.add_argument("--no-sipu", action="store_true")
    parser.add_argument("--max-iter-check", type=int, default=0, metavar="N")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    if args.max_iter_check:
        max_iter_check(args.max_iter_check)
        return 0
    cases = []
    if not args.no_sipu and sipu_dir() is not None:
        for f in sorted(sipu_dir().glob("*.npz")):
            X, _, k = load_sipu(f)
            cases.append((f.stem, X, k))
    for n in args.sizes:
        cases.append((f"blobs{n}", make_data(n, 16, 32)[0], 32))
    default = runs.SETTLE_MAX_SHARE
    one_fit(cases[0][1], cases[0][2], 0, True)  # imports and first-fit costs out of the figures
    print(
        f"{'case':12s} {'n':>7s} {'k':>4s} {'share':>6s} {'cpu on/off':>16s} {'ratio':>6s} "
        f"{'obj on/off':>10s} {'passes on/off':>14s} {'iters on/off':>13s}"
    )
    try:
        for name, X, k in cases:
            on, off = [], []
            for seed in range(args.seeds):
                on.append(one_fit(X, k, seed, True))
                off.append(one_fit(X, k, seed, False))
            mean = lambda rs, i: statistics.mean(r[i] for r in rs)  # noqa: E731
            share = coreset_size(len(X), k) / len(X)
            cpu, obj = mean(on, 0) / mean(off, 0), mean(on, 1) / mean(off, 1)
            print(
                f"{name:12s} {len(X):7d} {k:4d} {share:6.2f} "
                f"{mean(on, 0):7.3f}/{mean(off, 0):<7.3f} {cpu:6.2f} {obj:10.5f} "
                f"{mean(on, 2):6.1f}/{mean(off, 2):<6.1f} "
                f"{mean(on, 3):6.1f}/{mean(off, 3):<6.1f}",
                flush=True,
            )
    finally:
        runs.SETTLE_MAX_SHARE = default
    return 0


if __name__ == "__main__":
    sys.exit(main())
