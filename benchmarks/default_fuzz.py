"""Default fits the way a first-hour user calls them, counted: how many end in an exception or a dead process.

``KMeans(n_clusters=k, random_state=s).fit(X)`` (and ``MiniBatchKMeans`` with ``--minibatch``) for X
of n 60-800 rows and d 2-60 features drawn per seed, as random normal rows, blobs, CSR (20% non-zero)
and 40 rows of 2 distinct points, k in ``--k``, on one kernel code path (``--path numpy``: the path
a first fit of a process may take; ``compiled``). Each code path runs in its own process, so a
segmentation fault is counted as such (the cases after it are not run).

Run:  .venv/bin/python benchmarks/default_fuzz.py [--seeds 10] [--k 1 2 3 5] [--minibatch]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

ONE_PATH = """
import sys, warnings, numpy as np, dask, scipy.sparse as sp
from sklearn.datasets import make_blobs
import dkmeans
warnings.filterwarnings("ignore")
Estimator = dkmeans.MiniBatchKMeans if {minibatch} else dkmeans.KMeans
failed = total = 0
with dask.config.set({{"dkmeans.compile": {mode!r}}}):
    for kind in ("normal", "blobs", "csr", "duplicated"):
        for k in {ks}:
            for s in range({seeds}):
                rng = np.random.default_rng(s)
                n, d = int(rng.integers(60, 800)), int(rng.integers(2, 60))
                if kind == "normal":
                    X = rng.normal(size=(n, d))
                elif kind == "blobs":
                    X = make_blobs(n, d, centers=3, random_state=s)[0]
                elif kind == "csr":
                    X = sp.random(n, d, density=0.2, random_state=s, format="csr")
                else:
                    X = np.repeat(rng.normal(size=(2, d)), 20, axis=0)
                total += 1
                print("CASE", kind, k, s, flush=True)
                try:
                    Estimator(n_clusters=k, random_state=s).fit(X)
                except Exception as exc:
                    failed += 1
                    print("FAILED", kind, k, s, type(exc).__name__, str(exc)[:120], flush=True)
print("DONE", failed, total)
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 3, 5])
    parser.add_argument(
        "--minibatch", action="store_true", help="MiniBatchKMeans instead of KMeans"
    )
    args = parser.parse_args(argv)
    for path, mode in (("numpy", "off"), ("compiled", "eager")):
        code = ONE_PATH.format(
            mode=mode, ks=tuple(args.k), seeds=args.seeds, minibatch=args.minibatch
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        lines = out.stdout.splitlines()
        for line in lines:
            if line.startswith("FAILED"):
                print(path, line)
        done = [x for x in lines if x.startswith("DONE")]
        if done:
            _, failed, total = done[0].split()
            print(f"{path}: {failed} of {total} default fits raised")
        else:
            last = [x for x in lines if x.startswith("CASE")][-1:]
            print(f"{path}: the process died (exit status {out.returncode}) at {last}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
