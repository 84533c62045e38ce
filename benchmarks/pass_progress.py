"""What watching an out-of-core fit's passes costs (issue 43): the same fit with and without
progress within its passes (``on_pass``: each pass's piece tasks watched from the client).

    .venv/bin/python benchmarks/pass_progress.py [--rows 200000] [--chunk 2000] [--repeats 2]

A local cluster of two workers; the data is a Dask array read out of core (``out_of_core=True``),
``rows / chunk`` pieces a pass; ten Lloyd iterations from a random start.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import dask.array as da
import numpy as np

import dkmeans
from dkmeans.fit.progress import Progress
from dkmeans.testing import local_cluster


def fit_seconds(Xd, watched: bool) -> tuple[float, int]:
    km = dkmeans.KMeans(
        16,
        random_state=0,
        out_of_core=True,
        local_search=False,
        max_iter=10,
        tol=0,
        init="random",
        n_init=1,
    )
    hooks = Progress(0).hooks()
    if not watched:
        hooks.pop("on_pass")
    t0 = time.perf_counter()
    km._fit(Xd, None, dataclasses.replace(km._fit_spec(), **hooks))
    return time.perf_counter() - t0, int(km.n_passes_)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with local_cluster(2, set_as_default=True) as client, client.as_current():
        X = np.random.default_rng(0).random((args.rows, 8)).astype(np.float32)
        Xd = da.from_array(X, chunks=args.chunk)
        for _ in range(args.repeats):
            for watched in (False, True):
                seconds, passes = fit_seconds(Xd, watched)
                print(
                    f"{'watched' if watched else 'plain':8s} {seconds:7.2f} s  {passes} passes of "
                    f"{Xd.numblocks[0]} pieces"
                )


if __name__ == "__main__":
    main()
