"""Where a balanced fit's time goes: passes by kind, the model's gaps, the start's samples.

One ``KMeans(k, random_state=0, n_init=1, balanced=True)`` fit of ``balanced.py``'s tall data
(``--rows`` x 16, k = 32), after a warm-up fit, with the size caps' driver instrumented (wrapped
methods; the fit itself is unchanged): per kind of pass (model passes with their histograms,
passes of exact moves with their exchange lists, others) and data size (the start's samples,
the data) the passes and their seconds; the seconds of the caller's linear programs; each
sample's iterations and seconds; and per assignment of the data the rows off the caps after
each model pass.

The chunk kernels of the passes (kept-cost builds, priced passes with their lists or
histograms) by kind and chunk size, in seconds of chunk work summed over the threads.

Also the fit's top-level phases (the capped start, the Lloyd blocks, the runs with the seeding,
the final assignment, the result), and ``--blobs equal`` for ``balanced.py``'s equal-share blobs.

Run:  .venv/bin/python benchmarks/balanced_phases.py [--rows 2000000] [--blobs zipf|equal]
      [--start-growth G --start-share S]   (the capped start's samples: an experiment's knobs)
"""

from __future__ import annotations

import argparse
import collections
import time

from balanced import equal_data, make_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--blobs", choices=("zipf", "equal"), default="zipf")
    parser.add_argument(
        "--start-growth", type=int, default=None, help="CAPPED_START_GROWTH (an experiment)"
    )
    parser.add_argument(
        "--start-share", type=float, default=None, help="CAPPED_START_MAX_SHARE (an experiment)"
    )
    args = parser.parse_args()

    import dkmeans.drivers.capacitated as capacitated
    import dkmeans.drivers.capped_start as capped_start
    from dkmeans import KMeans

    if args.start_growth is not None:  # the capped start's samples, read where they are drawn
        capped_start.CAPPED_START_GROWTH = args.start_growth
    if args.start_share is not None:
        capped_start.CAPPED_START_MAX_SHARE = args.start_share
    X = make_data(args.rows, 16, 32) if args.blobs == "zipf" else equal_data(args.rows, 16, 32)
    KMeans(32, random_state=0, n_init=1, balanced=True).fit(X[:20_000])  # kernels loaded

    passes = collections.defaultdict(lambda: [0, 0.0])
    gaps = []  # per assignment of the data: rows off the caps after each model pass
    samples = []
    seen = set()  # the assignments whose first pass was timed
    real_pass = capacitated.CapacitatedPasses._pass
    real_lp = capacitated.model_price_changes
    real_lloyd = capped_start.lloyd

    def timed_pass(self, data, combine, pass_args):
        t0 = time.perf_counter()
        out = real_pass(self, data, combine, pass_args)
        histogram = len(pass_args) > 12 and pass_args[12]
        kind = (
            "model"
            if histogram
            else ("exact" if len(pass_args) > 11 and pass_args[11] else "other")
        )
        assignment = (id(self), len(self.passes_per_solve))
        if assignment not in seen:  # its first pass also computes the chunks' costs
            seen.add(assignment)
            kind += ", an assignment's first"
        entry = passes[(data.n_rows, kind)]
        entry[0] += 1
        entry[1] += time.perf_counter() - t0
        if histogram and data.n_rows == args.rows:
            sizes = out.partials.counts
            lower, upper = self.capacity.lower, self.capacity.upper
            gap = int((sizes - upper).clip(0).sum() + (lower - sizes).clip(0).sum())
            if len(gaps) < len(self.passes_per_solve) + 1:
                gaps.append([])
            gaps[len(self.passes_per_solve)].append(gap)
        return out

    def timed_lp(*lp_args, **kwargs):
        t0 = time.perf_counter()
        out = real_lp(*lp_args, **kwargs)
        entry = passes[(0, "linear program")]
        entry[0] += 1
        entry[1] += time.perf_counter() - t0
        return out

    def timed_lloyd(core, *lloyd_args, **kwargs):
        t0 = time.perf_counter()
        out = real_lloyd(core, *lloyd_args, **kwargs)
        samples.append((core.n_rows, out.n_iter, round(time.perf_counter() - t0, 2)))
        return out

    import dkmeans.fit.runs as runs
    import dkmeans.fit.service as service

    phases = collections.defaultdict(float)

    def phase(module, name: str, label: str) -> None:
        real = getattr(module, name)

        def timed(*phase_args, **kwargs):
            t0 = time.perf_counter()
            try:
                return real(*phase_args, **kwargs)
            finally:
                phases[label] += time.perf_counter() - t0

        setattr(module, name, timed)

    phase(runs, "capped_start", "capped start")
    phase(runs, "lloyd", "Lloyd blocks")
    phase(service, "fit_runs", "runs (the seeding, the start, Lloyd)")
    phase(service, "capacitated_assignment", "final assignment")
    phase(service, "fit_result", "result")
    # the chunk kernels, in the threads that run them: seconds of chunk work (summed over the
    # threads, so up to the threads times the wall time) by kind and chunk size
    import threading

    kernels = collections.defaultdict(lambda: [0, 0.0])
    lock = threading.Lock()
    real_costs, real_partials = capacitated.cost_cache, capacitated.price_partials

    def timed_costs(*cost_args, **kwargs):
        t0 = time.perf_counter()
        out = real_costs(*cost_args, **kwargs)
        into = "into kept arrays" if kwargs.get("reuse") is not None else "fresh arrays"
        with lock:
            entry = kernels[(cost_args[0].shape[0], f"cost build, {into}")]
            entry[0] += 1
            entry[1] += time.perf_counter() - t0
        return out

    def timed_partials(*partial_args, **kwargs):
        t0 = time.perf_counter()
        out = real_partials(*partial_args, **kwargs)
        if kwargs.get("histogram"):
            reach = "every margin" if kwargs.get("margin_limit") == float("inf") else "a limit"
            kind = f"priced pass + histogram to {reach}"
        else:
            kind = "priced pass + exchange lists" if kwargs.get("exchange") else "priced pass"
        with lock:
            entry = kernels[(partial_args[0].shape[0], kind)]
            entry[0] += 1
            entry[1] += time.perf_counter() - t0
        return out

    capacitated.cost_cache, capacitated.price_partials = timed_costs, timed_partials
    capacitated.CapacitatedPasses._pass = timed_pass
    capacitated.model_price_changes = timed_lp
    capped_start.lloyd = timed_lloyd
    t0 = time.perf_counter()
    km = KMeans(32, random_state=0, n_init=1, balanced=True).fit(X)
    wall = time.perf_counter() - t0
    print(
        f"fit: {wall:.2f} s, {km.n_iter_} iterations, {km.n_passes_} passes, "
        f"objective {km.inertia_:.6e}; samples {capped_start.capped_start_sizes(len(X), 32)}"
    )
    print("centroid shifts: " + ", ".join(f"{h['centroid_shift']:.4g}" for h in km.history_))
    print("phases: " + ", ".join(f"{label} {seconds:.2f} s" for label, seconds in phases.items()))
    for rows, iterations, seconds in samples:
        print(f"sample of {rows} rows: {iterations} iterations, {seconds} s")
    for (rows, kind), (count, seconds) in sorted(passes.items()):
        where = "caller" if rows == 0 else f"{rows} rows"
        print(f"{kind} ({where}): {count}, {seconds:.2f} s, {seconds / count:.4f} s each")
    for (rows, kind), (count, seconds) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
        print(
            f"chunk kernel, {kind} ({rows}-row chunks): {count}, {seconds:.2f} s of chunk work, "
            f"{1000 * seconds / count:.1f} ms each"
        )
    for i, sequence in enumerate(gaps):
        print(f"assignment {i}: rows off the caps after each model pass {sequence}")


if __name__ == "__main__":
    main()
