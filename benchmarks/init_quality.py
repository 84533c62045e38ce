"""Solution quality of each initialisation on real benchmark sets with ground truth.

For every set in ``../shared/data/sipu`` (A1-A3, S1-S4, Unbalance; skipped with a message
when absent) and every seed, fit ``dkmeans.KMeans(init=..., n_init=1)`` for each strategy
and scikit-learn's ``KMeans(n_init=1)`` (greedy k-means++), all followed by Lloyd with
tol=1e-4, and report per set and strategy: mean Centroid Index against the ground-truth
centroids (CI), success rate (share of runs with CI = 0), objective / ground-truth
objective, Hungarian accuracy and ARI. The goal: k-means|| has a mean CI no worse than
scikit-learn's and a mean objective within 2% of it.

Run:  .venv/bin/python benchmarks/init_quality.py [--seeds 10] [--sets a1 s1 ...]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from sklearn.cluster import KMeans as SKKMeans

import dkmeans
from dkmeans import metrics
from dkmeans.engine.client import start_local_cluster

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _common import load_sipu, machine, sipu_dir, write_json  # noqa: E402

STRATEGIES = ["k-means||", "k-means++", "random", "random-partition"]


def evaluate(X, truth, gt_centroids, gt_objective, centroids, labels):
    return {
        "ci": metrics.centroid_index(centroids, gt_centroids),
        "objective_ratio": metrics.objective(X, centroids) / gt_objective,
        "accuracy": metrics.accuracy(truth, labels),
        "ari": metrics.adjusted_rand_index(truth, labels),
    }


def summarise(runs):
    ci = np.array([r["ci"] for r in runs])
    return {
        "mean_ci": float(ci.mean()),
        "success": float((ci == 0).mean()),
        "objective_ratio": float(np.mean([r["objective_ratio"] for r in runs])),
        "accuracy": float(np.mean([r["accuracy"] for r in runs])),
        "ari": float(np.mean([r["ari"] for r in runs])),
        "seconds": float(np.mean([r["seconds"] for r in runs])),
    }


def run_set(name, X, truth, k, seeds):
    gt_centroids = metrics.class_means(X, truth)
    gt_objective = metrics.objective(X, gt_centroids)
    rows = {}
    for strategy in STRATEGIES:
        runs = []
        for seed in seeds:
            t = time.perf_counter()
            km = dkmeans.KMeans(k, init=strategy, n_init=1, random_state=seed).fit(X)
            r = evaluate(X, truth, gt_centroids, gt_objective, km.cluster_centers_, km.labels_)
            r["seconds"] = time.perf_counter() - t
            runs.append(r)
        rows[f"dkmeans {strategy}"] = summarise(runs)
    runs = []
    for seed in seeds:
        t = time.perf_counter()
        sk = SKKMeans(k, n_init=1, random_state=seed).fit(X)
        r = evaluate(X, truth, gt_centroids, gt_objective, sk.cluster_centers_, sk.labels_)
        r["seconds"] = time.perf_counter() - t
        runs.append(r)
    rows["scikit-learn k-means++"] = summarise(runs)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--sets", nargs="*", default=None)
    args = parser.parse_args(argv)
    data_dir = sipu_dir()
    if data_dir is None:
        print("skipped: benchmark data not found (../shared/data/sipu or $DKMEANS_BENCH_DATA)")
        return 0
    client = start_local_cluster(n_workers=2)
    seeds = list(range(args.seeds))
    files = sorted(data_dir.glob("*.npz"))
    if args.sets:
        files = [f for f in files if f.stem in args.sets]
    results, verdicts = {}, []
    header = (
        f"{'set':10s} {'method':28s} {'mean CI':>8s} {'CI=0':>6s} {'obj/gt':>8s} "
        f"{'acc':>6s} {'ARI':>6s} {'s/run':>6s}"
    )
    print(f"{len(seeds)} seeds per method; objective / ground-truth objective; 2 worker processes")
    print(header)
    for f in files:
        X, truth, k = load_sipu(f)
        rows = run_set(f.stem, X, truth, k, seeds)
        results[f.stem] = rows
        for method, r in rows.items():
            print(
                f"{f.stem:10s} {method:28s} {r['mean_ci']:8.2f} {r['success']:6.0%} {r['objective_ratio']:8.4f} "
                f"{r['accuracy']:6.3f} {r['ari']:6.3f} {r['seconds']:6.2f}"
            )
        ours, ref = rows["dkmeans k-means||"], rows["scikit-learn k-means++"]
        ok = (
            ours["mean_ci"] <= ref["mean_ci"]
            and ours["objective_ratio"] <= ref["objective_ratio"] * 1.02
        )
        verdicts.append((f.stem, ok))
        print(
            f"{f.stem:10s} goal (k-means|| CI <= scikit-learn's, objective within 2%): {'met' if ok else 'NOT met'}"
        )
    out = write_json(
        "init_quality.json", {"machine": machine(), "seeds": seeds, "results": results}
    )
    print(f"goal met on {sum(ok for _, ok in verdicts)} of {len(verdicts)} sets; results in {out}")
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
