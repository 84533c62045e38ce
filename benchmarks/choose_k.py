"""Choosing k: how often each rule of ``dkmeans.sweep`` finds the true k of data with a known k.

Sets (``--families``), each generated from its seed (a set's k and d are drawn from the family's
lists by the seed, so seeds cover different k and d):

* **separated**: equal Gaussian clusters, k in 2..16, d in 2..16, centres at least 7 standard
  deviations apart;
* **overlapping**: the same with centres 3.5 standard deviations apart;
* **unequal**: sizes from 1 to 10 (the largest cluster 10 times the smallest), 6 sd apart;
* **anisotropic**: each cluster stretched along random axes (scales 0.4 to 2.5), 8 sd apart;
* **noise**: separated clusters plus 5% of rows uniform over their bounding box;
* **high-d**: d in 32..128, k in 4..20;
* **many-k**: k in 20..40, d in 2..8;
* **uniform**: no clusters (the answer is "no clear k"), d in 2..16;
* **sipu**: the public sets with reference labels in ``../shared/data/sipu`` (a1, a2, a3, s1-s4,
  unbalance), when present (skipped with a message otherwise).

Centres are drawn one by one, uniform in a box, and kept when at least the family's distance from
the others (in units of the clusters' standard deviation, 1). Each set is swept once with
``dkmeans.sweep(X, 2..max(12, 1.5 k), random_state=seed)`` (defaults otherwise: k-means||, the
gap's 5 reference draws, a silhouette sample of 2,000 rows) and every rule is applied to the
scores of two grids: the **fine** grid (every k) and a **coarse** grid as users write it
(2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, up to the fine grid's end); each k's fit does
not depend on the grid, so the coarse grid's scores are the fine grid's at its values.

For each rule and family: the share of sets where the rule gives the true k (for uniform data: no
k), and within one step of the grid (the true k's neighbours in the grid, or the nearest grid
values when the true k is not in the grid). The default suggestion was chosen on seeds 0..23
(``--tune-seeds``: its first form on 0..11, the gap and BIC override and the tie rule on 0..23,
the diffuse-split step's threshold on 0..23 after a look at the noise sets it missed among
24..35); the script runs held-out seeds from 24 (``--first-seed``; ``--seeds``: 4 per family by
default, a few minutes; 12 for the table in ``benchmarks/README.md``, about 30 minutes on a
loaded 2-core machine; ``--first-seed 36`` for seeds no rule was looked at on) and reports only
seeds from ``--tune-seeds`` on (``--all-seeds``: every seed run). ``--misses`` lists each set
the default misses, with every rule's k and the default's reason.

``--methods refit bisecting`` sweeps each set both ways, one after the other
(``dkmeans.sweep(..., method="bisecting")``: every k from one bisecting fit), and adds a table of
how often the two suggest the same k, each one's hits, and their seconds and passes.

Sizes: ``--rows-per-cluster`` 150 (``--full``: 1,000), uniform sets 20 x 150 rows (``--full``:
20,000), in-process NumPy data. The raw per-k scores go to ``benchmarks/results/choose_k.json``;
``--from-json`` re-applies the rules to them without fitting again.

Run:  .venv/bin/python benchmarks/choose_k.py [--seeds 12] [--full] [--families separated uniform]
      .venv/bin/python benchmarks/choose_k.py --from-json benchmarks/results/choose_k.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load_sipu, machine, sipu_dir, write_json  # noqa: E402

FAMILIES = (
    "separated",
    "overlapping",
    "unequal",
    "anisotropic",
    "noise",
    "high-d",
    "many-k",
    "uniform",
    "sipu",
)
COARSE = (2, 3, 4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)
#: per family: k values, d values, separation in standard deviations
SHAPES = {
    "separated": ((2, 3, 4, 6, 8, 10, 12, 16, 5, 7), (2, 4, 8, 16, 3), 7.0),
    "overlapping": ((3, 4, 6, 8, 10, 5, 12, 2), (2, 4, 8, 16, 3), 3.5),
    "unequal": ((3, 4, 6, 8, 10, 5, 12), (2, 4, 8, 16, 3), 6.0),
    "anisotropic": ((3, 4, 6, 8, 10, 5, 12), (2, 4, 8, 3), 8.0),
    "noise": ((3, 4, 6, 8, 10, 5, 12), (2, 4, 8, 16, 3), 7.0),
    "high-d": ((4, 8, 12, 16, 20, 6), (32, 64, 128), 7.0),
    "many-k": ((20, 24, 32, 40, 30), (2, 4, 8, 3), 7.0),
    "uniform": ((0,), (2, 3, 4, 8, 16), 0.0),
}


def centres(rng, k: int, d: int, separation: float) -> np.ndarray:
    """k centres at least ``separation`` apart, uniform in a box grown until they fit."""
    side = separation * max(2.0, (k ** (1.0 / d)) * 2.0)
    while True:
        out = []
        for _ in range(200 * k):
            c = rng.uniform(0, side, d)
            if all(np.linalg.norm(c - o) >= separation for o in out):
                out.append(c)
                if len(out) == k:
                    return np.array(out)
        side *= 1.3


def generate(family: str, seed: int, per_cluster: int, uniform_rows: int):
    """``(X, true k or 0 for none, description)`` of one generated set."""
    ks, ds, separation = SHAPES[family]
    k, d = ks[seed % len(ks)], ds[(3 * seed + seed // len(ks)) % len(ds)]
    rng = np.random.default_rng(1000 * FAMILIES.index(family) + seed)
    if family == "uniform":
        return rng.uniform(0, 1, (uniform_rows, d)), 0, f"uniform n={uniform_rows} d={d}"
    C = centres(rng, k, d, separation)
    sizes = np.full(k, per_cluster)
    if family == "unequal":
        sizes = np.round(per_cluster * 2 * np.geomspace(1, 10, k)[rng.permutation(k)] / 5.5).astype(
            int
        )
    parts = []
    for j in range(k):
        Z = rng.standard_normal((sizes[j], d))
        if family == "anisotropic":
            Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
            Z = (Z * rng.uniform(0.4, 2.5, d)) @ Q.T
        parts.append(C[j] + Z)
    X = np.concatenate(parts)
    if family == "noise":
        lo, hi = X.min(axis=0), X.max(axis=0)
        X = np.concatenate([X, rng.uniform(lo, hi, (int(round(0.05 * len(X) / 0.95)), d))])
    X = X[rng.permutation(len(X))]
    return X, k, f"k={k} d={d} n={len(X)}"


def fine_grid(k: int) -> list:
    return list(range(2, max(12, math.ceil(1.5 * k)) + 1))


def coarse_grid(fine: list) -> list:
    return [k for k in COARSE if k <= fine[-1]]


def sweep_scores(X, k_true: int, seed: int, reference_draws: int, method: str = "refit") -> dict:
    """One sweep over the fine grid; its per-k scores as JSON-ready lists."""
    import dkmeans

    ks = fine_grid(k_true if k_true else 8)
    t0 = time.perf_counter()
    result = dkmeans.sweep(X, ks, random_state=seed, reference_draws=reference_draws, method=method)
    scores = result.scores
    raw = {
        name: list(getattr(scores, name))
        for name in (
            "ks",
            "objective",
            "calinski_harabasz",
            "davies_bouldin",
            "silhouette",
            "bic",
            "gap",
            "gap_sd",
        )
    }
    raw.update(
        gap_at_1=scores.gap_at_1,
        gap_sd_at_1=scores.gap_sd_at_1,
        seconds=time.perf_counter() - t0,
        n_passes=result.n_passes,
        suggested_k=result.suggested_k,
    )
    return raw


def restrict(raw: dict, grid: list):
    """The :class:`~dkmeans.fit.krules.Scores` of ``raw`` at the values of ``grid``."""
    from dkmeans.fit.krules import Scores

    at = [raw["ks"].index(k) for k in grid]
    pick = {
        name: [raw[name][i] for i in at]
        for name in (
            "objective",
            "calinski_harabasz",
            "davies_bouldin",
            "silhouette",
            "bic",
            "gap",
            "gap_sd",
        )
    }
    return Scores(ks=list(grid), **pick, gap_at_1=raw["gap_at_1"], gap_sd_at_1=raw["gap_sd_at_1"])


def near(grid: list, k_true: int) -> set:
    """The grid values within one step of the true k (its neighbours, or the values around it)."""
    if k_true in grid:
        i = grid.index(k_true)
        return set(grid[max(0, i - 1) : i + 2])
    below = [k for k in grid if k < k_true]
    above = [k for k in grid if k > k_true]
    return set(below[-1:] + above[:1])


def choices(scores) -> dict:
    """Every rule's answer, and the default suggestion's."""
    from dkmeans.fit.krules import answers, suggest

    out = dict(answers(scores))
    out["default"] = suggest(scores)[0]
    return out


def evaluate(records: list, tune_seeds: int, all_seeds: bool, method: str = "refit"):
    """Per grid, family and rule: (exact hits, within one step, sets)."""
    table = defaultdict(lambda: [0, 0, 0])
    for rec in records:
        if rec.get("method", "refit") != method:
            continue
        if not all_seeds and rec["family"] != "sipu" and rec["seed"] < tune_seeds:
            continue
        fine = rec["raw"]["ks"]
        for grid_name, grid in (("fine", fine), ("coarse", coarse_grid(fine))):
            found = choices(restrict(rec["raw"], grid))
            k_true = rec["k"]
            for rule, k in found.items():
                cell = table[(grid_name, rec["family"], rule)]
                if k_true == 0:
                    hit = close = k is None
                else:
                    hit, close = k == k_true, k is not None and k in near(grid, k_true)
                cell[0] += hit
                cell[1] += close
                cell[2] += 1
    return table


def print_misses(records: list, tune_seeds: int, all_seeds: bool, method: str = "refit") -> None:
    """Each reported set and grid where the default misses the true k, with every rule's k."""
    rules = ["elbow", "calinski_harabasz", "davies_bouldin", "silhouette", "gap", "bic"]
    print("\nsets where the default misses (every rule's k; the default's reason)\n")
    for rec in records:
        if rec.get("method", "refit") != method:
            continue
        if not all_seeds and rec["family"] != "sipu" and rec["seed"] < tune_seeds:
            continue
        fine = rec["raw"]["ks"]
        for grid_name, grid in (("fine", fine), ("coarse", coarse_grid(fine))):
            from dkmeans.fit.krules import answers, suggest

            scores = restrict(rec["raw"], grid)
            k, why = suggest(scores)
            if k == (rec["k"] or None):
                continue
            found = answers(scores)
            rule_ks = " ".join(f"{r}={found[r]}" for r in rules)
            print(
                f"{rec['family']} seed {rec['seed']} ({rec['what']}) {grid_name}: "
                f"true {rec['k'] or None}, default {k}; {rule_ks}; {why}"
            )


def print_table(table) -> None:
    rules = ["elbow", "calinski_harabasz", "davies_bouldin", "silhouette", "gap", "bic", "default"]
    short = {
        "calinski_harabasz": "CH max",
        "davies_bouldin": "DB min",
        "silhouette": "silhouette",
        "gap": "gap",
        "bic": "BIC",
        "elbow": "elbow",
        "default": "**default**",
    }
    for grid in ("fine", "coarse"):
        families = [f for f in FAMILIES if (grid, f, "default") in table]
        print(f"\n{grid} grid: share of sets with the true k (within one grid step)\n")
        print("| family | sets | " + " | ".join(short[r] for r in rules) + " |")
        print("|---|---:|" + "---:|" * len(rules))
        totals = defaultdict(lambda: [0, 0, 0])
        for family in families:
            n = table[(grid, family, rules[0])][2]
            cells = []
            for rule in rules:
                hit, close, sets = table[(grid, family, rule)]
                cells.append(f"{hit / sets:.0%} ({close / sets:.0%})")
                for i, v in enumerate((hit, close, sets)):
                    totals[rule][i] += v
            print(f"| {family} | {n} | " + " | ".join(cells) + " |")
        print(
            "| **all** | "
            + str(totals[rules[0]][2])
            + " | "
            + " | ".join(
                f"{totals[r][0] / totals[r][2]:.0%} ({totals[r][1] / totals[r][2]:.0%})"
                for r in rules
            )
            + " |"
        )


def collect(args) -> list:
    per_cluster = 1000 if args.full else args.rows_per_cluster
    uniform_rows = 20_000 if args.full else 20 * args.rows_per_cluster
    records = []
    for family in args.families:
        if family == "sipu":
            folder = sipu_dir()
            if folder is None:
                print("sipu: ../shared/data/sipu not found; skipped", flush=True)
                continue
            sets = [(p.stem, *load_sipu(p)) for p in sorted(folder.glob("*.npz"))]
            for name, X, _, k in sets:
                for method in args.methods:
                    raw = sweep_scores(X, k, 0, args.reference_draws, method)
                    records.append(
                        {
                            "family": family,
                            "seed": 0,
                            "k": k,
                            "what": name,
                            "raw": raw,
                            "method": method,
                        }
                    )
                    print(
                        f"{family:12s} {name:10s} k={k:<3d} {method:9s} {raw['seconds']:6.1f} s",
                        flush=True,
                    )
            continue
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            X, k, what = generate(family, seed, per_cluster, uniform_rows)
            for method in args.methods:  # one after the other on the same set: alike conditions
                raw = sweep_scores(X, k, seed, args.reference_draws, method)
                records.append(
                    {
                        "family": family,
                        "seed": seed,
                        "k": k,
                        "what": what,
                        "raw": raw,
                        "method": method,
                    }
                )
                print(
                    f"{family:12s} seed {seed} {what:24s} {method:9s} {raw['seconds']:6.1f} s",
                    flush=True,
                )
    return records


def compare_methods(records: list) -> None:
    """Per family: how often the bisecting sweep suggests the refit sweep's k, and their cost."""
    by_set = defaultdict(dict)
    for rec in records:
        by_set[(rec["family"], rec["seed"], rec["what"])][rec.get("method", "refit")] = rec
    rows = defaultdict(lambda: defaultdict(list))
    for (family, _, _), pair in by_set.items():
        if set(pair) != {"refit", "bisecting"}:
            continue
        refit, bis = pair["refit"]["raw"], pair["bisecting"]["raw"]
        k_true = pair["refit"]["k"] or None
        row = rows[family]
        for grid_name in ("fine", "coarse"):
            grid = refit["ks"] if grid_name == "fine" else coarse_grid(refit["ks"])
            a = choices(restrict(refit, grid))["default"]
            b = choices(restrict(bis, grid))["default"]
            row[f"same {grid_name}"].append(a == b)
            row[f"refit true {grid_name}"].append(a == k_true)
            row[f"bisecting true {grid_name}"].append(b == k_true)
        for key, raw in (("refit", refit), ("bisecting", bis)):
            row[f"{key} s"].append(raw["seconds"])
            row[f"{key} passes"].append(raw["n_passes"])
    if not rows:
        return
    print("\nmethod='bisecting' against method='refit' (the default suggestion, the same sets)\n")
    print(
        "| family | sets | same k, fine (coarse) | true k refit, fine (coarse) "
        "| true k bisecting, fine (coarse) | seconds refit | seconds bisecting "
        "| passes refit | passes bisecting |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    every = defaultdict(list)
    for family in FAMILIES:
        if family not in rows:
            continue
        row = rows[family]
        for key, values in row.items():
            every[key].extend(values)
        print(_compare_line(family, row))
    print(_compare_line("**all**", every))


def _compare_line(name, row) -> str:
    n = len(row["same fine"])

    def pair(key):
        return f"{sum(row[key + ' fine'])}/{n} ({sum(row[key + ' coarse'])}/{n})"

    return (
        f"| {name} | {n} | {pair('same')} | {pair('refit true')} | {pair('bisecting true')} "
        f"| {sum(row['refit s']):.1f} | {sum(row['bisecting s']):.1f} "
        f"| {sum(row['refit passes'])} | {sum(row['bisecting passes'])} |"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--seeds", type=int, default=4, help="seeds per generated family")
    parser.add_argument(
        "--first-seed", type=int, default=24, help="the first seed (0..23 tuned the default)"
    )
    parser.add_argument(
        "--tune-seeds", type=int, default=24, help="seeds below this tuned the default"
    )
    parser.add_argument("--all-seeds", action="store_true", help="report the tuning seeds too")
    parser.add_argument("--rows-per-cluster", type=int, default=150)
    parser.add_argument("--reference-draws", type=int, default=5)
    parser.add_argument(
        "--full", action="store_true", help="1,000 rows per cluster, 20,000 uniform rows"
    )
    parser.add_argument(
        "--from-json", type=Path, nargs="+", help="re-apply the rules to previous runs' scores"
    )
    parser.add_argument("--out", default="choose_k.json")
    parser.add_argument(
        "--misses", action="store_true", help="list the sets where the default misses the true k"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["refit"],
        choices=["refit", "bisecting"],
        help="sweep methods run on each set (the table is refit's; two: their comparison)",
    )
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    if args.from_json:
        records = [
            r
            for path in args.from_json
            for r in json.loads(path.read_text())["records"]
            if r["family"] in args.families
        ]
    else:
        records = collect(args)
        path = write_json(
            args.out,
            {
                "machine": machine(),
                "args": {k: str(v) for k, v in vars(args).items()},
                "records": records,
            },
        )
        print(f"scores written to {path} ({time.perf_counter() - t0:.0f} s)")
    methods = {rec.get("method", "refit") for rec in records}
    for method in ("refit", "bisecting"):
        if method in methods:
            print(f"\n## method={method!r}")
            print_table(evaluate(records, args.tune_seeds, args.all_seeds, method))
            if args.misses:
                print_misses(records, args.tune_seeds, args.all_seeds, method)
    compare_methods(records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
