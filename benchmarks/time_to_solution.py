"""Time to solution: whole default fits, each in a fresh process, beside scikit-learn.

What a user waits for when they call ``KMeans(n_clusters=k).fit(X)``: every fit runs in its
own fresh Python process (imports and data generation not timed; dkmeans' embedded cluster
start, kernel compilation and every pass are), on the float32 blobs of ``benchmarks/lloyd.py``,
and every result's centroids are re-scored with one float64 pass. Objectives are reported
relative to scikit-learn's default fit of the same run.

Configurations: scikit-learn's default (``n_init="auto"``: 1 with k-means++) and
``n_init=10``; dkmeans' default and ``local_search=False``. All with ``random_state=0``.

Goals (the time-to-solution issue), on tall, wide and manyk: the dkmeans default's objective
at most scikit-learn ``n_init=10``'s x 1.001, in at most 1.25x the time of
``local_search=False`` and at most 0.5x scikit-learn's default fit; small: at most 2x
scikit-learn's default fit.

With ``--repeats r`` each fit runs ``r`` times, the configurations taking turns (so that load
from other processes falls on all of them alike), and the median time is reported. Each fit's
CPU time (all its threads) is recorded too: on a loaded machine it varies less than the wall
time.

Run:  .venv/bin/python benchmarks/time_to_solution.py [--quick] [--shapes tall wide] [--configs ...] [--repeats 3]
JSON goes to ``benchmarks/results/time_to_solution.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_json  # noqa: E402
from lloyd import QUICK_SHAPES, SHAPES  # noqa: E402 - the shapes of the per-iteration benchmark

CONFIGS = {
    "sklearn": "sklearn.cluster.KMeans(n_clusters=k, random_state=0)",
    "sklearn-n_init10": "sklearn.cluster.KMeans(n_clusters=k, n_init=10, random_state=0)",
    "dkmeans": "dkmeans.KMeans(n_clusters=k, random_state=0)",
    "dkmeans-no-search": "dkmeans.KMeans(n_clusters=k, random_state=0, local_search=False)",
}

ONE_FIT = """
import json, os, sys, time
os.environ.setdefault("OMP_NUM_THREADS", "2")
import numpy as np
sys.path[:0] = [{root!r}, {bench!r}]  # this checkout's dkmeans, whatever is installed
from lloyd import make_data, objective
import sklearn.cluster, dkmeans
n, d, k = {shape}
X, _ = make_data(n, d, k)
est = {config}
t0, c0 = time.perf_counter(), time.process_time()
est.fit(X)
seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
C = np.asarray(est.cluster_centers_)
print("RESULT " + json.dumps(dict(seconds=seconds, cpu_seconds=cpu_seconds, objective=objective(X, C),
                                  n_iter=int(np.max(est.n_iter_)), n_passes=getattr(est, "n_passes_", None),
                                  dkmeans=os.path.dirname(dkmeans.__file__))))
"""


def one_fit(shape, config: str, timeout: float) -> dict:
    bench = Path(__file__).resolve().parent
    code = ONE_FIT.format(
        root=str(bench.parent), bench=str(bench), shape=tuple(shape), config=CONFIGS[config]
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return {"error": (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]}


def format_table(results: dict) -> str:
    configs = list(CONFIGS)
    lines = ["| shape | " + " | ".join(configs) + " |", "|---" * (len(configs) + 1) + "|"]
    for name, row in results.items():
        ref = row.get("sklearn", {}).get("objective")
        cells = []
        for c in configs:
            r = row.get(c)
            if r is None:
                cells.append("-")
            elif "error" in r:
                cells.append(f"error: {r['error']}")
            else:
                rel = f", {r['objective'] / ref:.3f}" if ref else ""
                cells.append(f"{r['seconds']:.2f} s{rel}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals(results: dict) -> list[str]:
    out = []
    for name, row in results.items():
        try:
            ours, plain, sk, sk10 = (
                row[c] for c in ("dkmeans", "dkmeans-no-search", "sklearn", "sklearn-n_init10")
            )
        except KeyError:
            continue
        if any("error" in r for r in (ours, plain, sk, sk10)):
            continue
        if name == "small":
            out.append(
                f"small: time vs scikit-learn default {ours['seconds'] / sk['seconds']:.2f}x (goal <= 2)"
            )
            continue
        out.append(
            f"{name}: objective vs n_init=10 {ours['objective'] / sk10['objective']:.4f} (goal <= 1.001); "
            f"time vs local_search=False {ours['seconds'] / plain['seconds']:.2f}x (goal <= 1.25); "
            f"time vs scikit-learn default {ours['seconds'] / sk['seconds']:.2f}x (goal <= 0.5)"
        )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the shapes with fewer rows")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one fit may take")
    parser.add_argument(
        "--repeats", type=int, default=1, help="fits per configuration (median time reported)"
    )
    args = parser.parse_args(argv)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    results = {}
    for name in args.shapes:
        runs = {config: [] for config in args.configs}
        for repeat in range(args.repeats):
            for config in args.configs:
                r = one_fit(shapes[name], config, args.timeout)
                runs[config].append(r)
                print(
                    name,
                    config,
                    f"repeat {repeat + 1}",
                    r,
                    f"load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        results[name] = {}
        for config, rs in runs.items():
            ok = [r for r in rs if "error" not in r]
            if not ok:
                results[name][config] = rs[-1]
                continue
            results[name][config] = dict(
                ok[-1],
                seconds=statistics.median(r["seconds"] for r in ok),
                all_seconds=[r["seconds"] for r in ok],
                cpu_seconds=statistics.median(r["cpu_seconds"] for r in ok),
            )
    table = format_table(results)
    print(table)
    for line in goals(results):
        print(line)
    write_json(
        "time_to_solution.json",
        {
            "machine": machine(),
            "quick": args.quick,
            "repeats": args.repeats,
            "shapes": {n: shapes[n] for n in args.shapes},
            "results": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
