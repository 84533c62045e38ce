"""Seconds per Lloyd iteration on one GPU: the fused CuPy kernels against the cuBLAS floor and the CPU path.

Method
------
Data: float32 Gaussian blobs (``--n`` rows, ``--d`` features, ``--k`` centres in
``[-10, 10]^d``, unit spread; default 10,000,000 x 128, k = 1,000) generated on the GPU in
chunks of ``--chunk-rows`` rows, each chunk from its own seed, so that the Dask part below
gets the same rows. The initial centroids ``C0`` are ``k`` distinct rows (fixed seed).

(a) **Floor**: the cuBLAS product ``X @ C0.T`` (float32, CuPy's ``dot``; TF32 only if
    ``CUPY_TF32=1``, recorded), timed with CUDA events, best of ``--repeats``: the whole
    ``n x k`` product when it fits in free GPU memory (``--no-whole``: skip), and in row
    tiles into one reused buffer, exactly the tiles and centroid blocks the kernels use for
    each scratch size. The floor is the fastest of these.
(b) **Fused kernels, one process**: per Lloyd iteration, ``partials_cuda(X, C)`` (product,
    running argmin, exact distances and float64 partials), the ``k x d`` partials copied to
    the host, new centroids ``sums / counts`` on the host (an empty cluster keeps its
    centre) and sent back with the next call: the path of one dkmeans worker, without Dask.
    Wall-clock seconds of ``--iters`` iterations after one warm-up, median (and best), for
    each ``--scratch-mib`` (the scratch bound that sets the tiles). ``nearest_cuda`` (the
    labels only) is timed too, to split the iteration into product + argmin and the rest,
    and so is the host time to issue one call's work (``enqueue``): when it is close to the
    iteration time, Python's launch overhead, not the GPU, sets the pace (larger tiles
    help). The ratio to the floor is the goal (under 1.5).
(c) **dkmeans on a LocalCUDACluster** (when dask, distributed and dask_cuda import, unless
    ``--no-dask``): the same rows generated on the one worker (``map_blocks``, CuPy chunks),
    persisted, then ``dkmeans.KMeans(init=C0, n_init=1, tol=0, max_iter=iters + 1)``; the
    median of ``history_[i]["seconds"]`` per iteration. Any failure is recorded, not raised.
(d) **CPU path**: the NumPy kernels (``dkmeans.kernels.nearest.assign_partials``: BLAS plus
    numba) on ``--cpu-rows`` rows of the same shape, split into one chunk per core and run
    on one thread per core with one BLAS thread each (the layout of dkmeans' CPU workers),
    best of ``--repeats``; reported per row and scaled to ``n`` rows for the speed-up.

A correctness check runs first: on the first ``--check-rows`` rows, the fused objective
and labels against a float64 CuPy computation (relative objective difference; fraction of
labels equal, the rest near ties).

Run (on the GPU machine, from the repository root)::

    python benchmarks/gpu_lloyd.py                        # defaults above
    python benchmarks/gpu_lloyd.py --n 1000000 --iters 5  # a quick run
    python benchmarks/gpu_lloyd.py --scratch-mib 32 128 512 --no-dask

The table goes to stdout, everything to ``$OUT/gpu_lloyd.json`` when ``OUT`` is set,
else ``benchmarks/results/gpu_lloyd.json`` (``--output``). Only CuPy and NumPy are needed
for (a) and (b): without dkmeans' own dependencies the kernel module is loaded by path.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def load_cuda_kernels():
    """``dkmeans.kernels.backends.cuda``, imported, or loaded by path if dkmeans does not import."""
    sys.path.insert(0, str(ROOT))
    try:
        from dkmeans.kernels.backends import cuda as _cuda

        return _cuda, "dkmeans.kernels.backends.cuda"
    except ImportError as exc:
        # the module needs only NumPy of dkmeans' two plain kernel modules: load them by path
        # under their names (an import finds a module in sys.modules without its packages)
        kernels = ROOT / "dkmeans" / "kernels"
        for name, path in (
            ("dkmeans.kernels.common", kernels / "common.py"),
            ("dkmeans.kernels.namespace", kernels / "namespace.py"),
            ("dkmeans_cuda_standalone", kernels / "backends" / "cuda.py"),
        ):
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        return module, f"{path} (by path: {exc})"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--n", type=int, default=10_000_000)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--k", type=int, default=1000)
    p.add_argument(
        "--iters", type=int, default=10, help="timed Lloyd iterations (after one warm-up)"
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="repeats of the floor and CPU timings (best)"
    )
    p.add_argument("--scratch-mib", type=float, nargs="+", default=[32, 64, 128, 256])
    p.add_argument(
        "--chunk-rows", type=int, default=1_000_000, help="rows per generated chunk / Dask chunk"
    )
    p.add_argument("--check-rows", type=int, default=200_000)
    p.add_argument("--cpu-rows", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-whole", action="store_true", help="skip the whole n x k product of the floor"
    )
    p.add_argument("--no-dask", action="store_true", help="skip dkmeans on a LocalCUDACluster")
    p.add_argument("--no-cpu", action="store_true", help="skip the CPU path")
    p.add_argument("--output", type=Path, default=None)
    return p.parse_args(argv)


# -- data -------------------------------------------------------------------------------------
def blob_centers(k, d, seed):
    return np.random.default_rng(seed).uniform(-10, 10, size=(k, d)).astype(np.float32)


def gen_chunk(xp, centers, m, chunk_index, seed):
    """``m`` rows of blobs around ``centers`` (float32), on ``xp`` (CuPy or NumPy); the same
    chunk index and seed give the same rows on the same ``xp``."""
    chunk_seed = seed * 1_000_003 + chunk_index + 1
    if xp is np:
        rng = np.random.default_rng(chunk_seed)
        labels = rng.integers(0, centers.shape[0], size=m)
        return centers[labels] + rng.standard_normal((m, centers.shape[1]), dtype=np.float32)
    rs = xp.random.RandomState(chunk_seed)
    labels = rs.randint(0, centers.shape[0], size=m)
    noise = rs.standard_normal((m, centers.shape[1]), dtype=np.float32)
    return xp.asarray(centers)[labels] + noise


def chunk_sizes(n, rows):
    return [min(rows, n - i) for i in range(0, n, rows)]


def make_data(cp, n, d, k, rows, seed):
    centers = blob_centers(k, d, seed)
    X = cp.empty((n, d), dtype=cp.float32)
    i0 = 0
    for c, m in enumerate(chunk_sizes(n, rows)):
        X[i0 : i0 + m] = gen_chunk(cp, centers, m, c, seed)
        i0 += m
    idx = np.sort(np.random.default_rng(seed + 1).choice(n, size=k, replace=False))
    C0 = cp.asnumpy(X[cp.asarray(idx)])
    return X, C0, centers


# -- timing helpers ------------------------------------------------------------------------------
def gpu_seconds(cp, fn, repeats):
    """Best time of ``fn()`` over ``repeats`` runs, by CUDA events on the current stream."""
    best = math.inf
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end) / 1e3)
    return best


def tiled_product(cp, X, C, tile, block, buf):
    """``X @ C.T`` tile by tile into ``buf`` (what the kernels' products do, nothing else)."""
    n, k = X.shape[0], C.shape[0]
    blocks = [C[j0 : j0 + block].T for j0 in range(0, k, block)]
    for i0 in range(0, n, tile):
        Xt = X[i0 : i0 + tile]
        m = Xt.shape[0]
        for CT in blocks:
            cp.dot(Xt, CT, out=buf[: m * CT.shape[1]].reshape(m, CT.shape[1]))


def lloyd_iterations(cp, kernels, X, C0, iters, scratch_bytes):
    """Seconds and objectives of 1 + ``iters`` Lloyd iterations (the first is the warm-up)."""
    C = C0.copy()
    seconds, enqueue, objectives = [], [], []
    for _ in range(iters + 1):
        t0 = time.perf_counter()
        sums, counts, objective = kernels.partials_cuda(X, C, scratch_bytes=scratch_bytes)
        enqueue.append(
            time.perf_counter() - t0
        )  # host time to issue the work: ~ seconds if host-bound
        sums, counts, objective = sums.get(), counts.get(), float(objective.get())
        nonempty = counts > 0
        C = C.copy()
        C[nonempty] = (sums[nonempty] / counts[nonempty, None]).astype(np.float32)
        seconds.append(time.perf_counter() - t0)
        objectives.append(objective)
    return seconds[1:], enqueue[1:], objectives


def check_against_float64(cp, kernels, X, C, rows):
    """Fused objective and labels on ``rows`` rows against a float64 CuPy computation."""
    Xs = X[:rows]
    labels = cp.asnumpy(kernels.nearest_cuda(Xs, C))
    _, _, objective = kernels.partials_cuda(Xs, C)
    C64 = cp.asarray(C, dtype=cp.float64)
    c2 = (C64 * C64).sum(axis=1)
    ref_obj, ref_labels, gaps = 0.0, [], []
    step = max(1, 2**27 // (8 * C.shape[0]))  # 128 MiB of float64 distances at a time
    for i0 in range(0, Xs.shape[0], step):
        X64 = Xs[i0 : i0 + step].astype(cp.float64)
        D = (X64 * X64).sum(axis=1)[:, None] - 2.0 * cp.dot(X64, C64.T) + c2[None, :]
        best = D.argmin(axis=1)
        lab = cp.asarray(labels[i0 : i0 + X64.shape[0]])
        rows_ = cp.arange(X64.shape[0])
        ref_obj += float(cp.asnumpy(cp.maximum(D[rows_, best], 0).sum()))
        ref_labels.append(cp.asnumpy(best))
        gaps.append(cp.asnumpy(D[rows_, lab] - D[rows_, best]))
    ref_labels = np.concatenate(ref_labels)
    gaps = np.concatenate(gaps)
    got = float(cp.asnumpy(objective))
    return {
        "rows": int(Xs.shape[0]),
        "objective": got,
        "objective_float64": ref_obj,
        "objective_rel_diff": abs(got - ref_obj) / max(ref_obj, 1e-300),
        "labels_equal_fraction": float(np.mean(labels == ref_labels)),
        "largest_gap_where_labels_differ": float(gaps.max()) if gaps.size else 0.0,
    }


# -- (c) dkmeans on a LocalCUDACluster ------------------------------------------------------------
def _dask_chunk(block_id=None, centers=None, sizes=None, seed=0):
    import cupy

    c = block_id[0]
    return gen_chunk(cupy, centers, sizes[c], c, seed)


def run_dask(args, C0):
    try:
        import cupy
        import dask.array as da
        import distributed
        from dask_cuda import LocalCUDACluster

        import dkmeans
    except ImportError as exc:
        return {"skipped": f"not importable: {exc}"}
    result = {}
    try:
        with (
            LocalCUDACluster(
                n_workers=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            sizes = chunk_sizes(args.n, args.chunk_rows)
            centers = blob_centers(args.k, args.d, args.seed)
            X = da.map_blocks(
                _dask_chunk,
                dtype=np.float32,
                chunks=(tuple(sizes), (args.d,)),
                meta=cupy.empty((0, 0), dtype=cupy.float32),
                centers=centers,
                sizes=sizes,
                seed=args.seed,
            ).persist()
            distributed.wait(X)
            t0 = time.perf_counter()
            km = dkmeans.KMeans(
                n_clusters=args.k,
                init=C0,
                n_init=1,
                max_iter=args.iters + 1,
                tol=0.0,
                random_state=0,
            ).fit(X)
            result["fit_seconds"] = time.perf_counter() - t0
            secs = [h["seconds"] for h in km.history_]
            result["iterations"] = len(secs)
            result["seconds_per_iteration_median"] = statistics.median(secs[1:] or secs)
            result["seconds_per_iteration_min"] = min(secs[1:] or secs)
            result["objective_last"] = float(km.history_[-1]["objective"])
            result["workers"] = len(client.scheduler_info()["workers"])
    except Exception as exc:  # recorded: the GPU driver path may not be ready
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


# -- (d) CPU path -----------------------------------------------------------------------------------
def run_cpu(args, C0):
    try:
        from dkmeans.kernels.nearest import assign_partials
    except ImportError as exc:
        return {"skipped": f"dkmeans does not import: {exc}"}
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        threadpool_limits = None
    workers = os.cpu_count() or 1
    centers = blob_centers(args.k, args.d, args.seed)
    sizes = chunk_sizes(args.cpu_rows, -(-args.cpu_rows // workers))
    chunks = [gen_chunk(np, centers, m, c, args.seed) for c, m in enumerate(sizes)]

    def one_pass():
        with ThreadPoolExecutor(len(chunks)) as ex:
            list(ex.map(lambda x: assign_partials(x, C0), chunks))

    def timed():
        one_pass()  # warm-up (numba compilation, thread start)
        best = math.inf
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            one_pass()
            best = min(best, time.perf_counter() - t0)
        return best

    if threadpool_limits is not None:
        with threadpool_limits(1):
            best = timed()
    else:
        best = timed()
    per_row = best / args.cpu_rows
    return {
        "rows": args.cpu_rows,
        "threads": len(chunks),
        "seconds": best,
        "seconds_per_row": per_row,
        "seconds_for_n_rows": per_row * args.n,
    }


# -- main --------------------------------------------------------------------------------------------
def device_info(cp):
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props.get("name", b"?")
    name = name.decode() if isinstance(name, bytes) else str(name)
    free, total = cp.cuda.runtime.memGetInfo()
    return {
        "name": name,
        "memory_gib": total / 2**30,
        "cupy": cp.__version__,
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "CUPY_TF32": os.environ.get("CUPY_TF32", "0"),
    }


def measure_gpu(cp, kernels, args, out):
    """(a) and (b), and the correctness check, on data generated here; returns
    ``(C0, floor, rows)`` (the data is freed on return)."""
    n, d, k = args.n, args.d, args.k
    t0 = time.perf_counter()
    X, C0, _ = make_data(cp, n, d, k, args.chunk_rows, args.seed)
    cp.cuda.Device().synchronize()
    out["generate_seconds"] = time.perf_counter() - t0
    C0_dev = cp.asarray(C0)

    out["check"] = check_against_float64(cp, kernels, X, C0, min(args.check_rows, n))
    print(
        "check against float64 on {rows:,} rows: objective rel diff {objective_rel_diff:.2e}, "
        "labels equal {labels_equal_fraction:.6f}".format(**out["check"]),
        flush=True,
    )

    # (a) floor: the whole product, if it fits
    floor = {}
    pool = cp.get_default_memory_pool()
    if not args.no_whole:
        pool.free_all_blocks()
        free, _ = cp.cuda.runtime.memGetInfo()
        if free > 1.1 * n * k * 4 + 2**30:
            whole = cp.empty((n, k), dtype=cp.float32)
            floor["whole"] = gpu_seconds(cp, lambda: cp.dot(X, C0_dev.T, out=whole), args.repeats)
            whole = None
            pool.free_all_blocks()
        else:
            floor["whole"] = None
            floor["whole_skipped"] = (
                f"needs {n * k * 4 / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
            )
    # (a) the tiled product and (b) the fused kernels, per scratch size
    rows = []
    flop = 2.0 * n * k * d  # one pass of the matrix-product form
    for mib in args.scratch_mib:
        scratch = int(mib * 2**20)
        tile, block = kernels.plan_tiles(n, k, d, 4, scratch)
        buf = cp.empty(tile * block, dtype=cp.float32)
        t_tiled = gpu_seconds(
            cp, lambda: tiled_product(cp, X, C0_dev, tile, block, buf), args.repeats
        )
        buf = None
        t_near = gpu_seconds(
            cp, lambda: kernels.nearest_cuda(X, C0_dev, scratch_bytes=scratch), args.repeats
        )
        # peak memory of the Lloyd iterations: the pool (cached, so its high-water mark since
        # the blocks were freed) and the device (the pool plus cuBLAS' and the context's own)
        pool.free_all_blocks()
        pool_before = pool.total_bytes()
        secs, enqueue, objectives = lloyd_iterations(cp, kernels, X, C0, args.iters, scratch)
        free, total = cp.cuda.runtime.memGetInfo()
        monotone = all(b <= a * (1 + 1e-6) for a, b in zip(objectives, objectives[1:]))
        med = statistics.median(secs)
        rows.append(
            {
                "scratch_mib": mib,
                "row_tile": tile,
                "centroid_block": block,
                "tiled_product": t_tiled,
                "nearest": t_near,
                "iteration_median": med,
                "iteration_min": min(secs),
                "tflops_equivalent": flop / med / 1e12,
                "tiled_product_tflops": flop / t_tiled / 1e12,
                "nearest_tflops_equivalent": flop / t_near / 1e12,
                "pool_peak_bytes": pool.total_bytes(),
                "pool_bytes_before": pool_before,
                "device_used_bytes_after": total - free,
                "enqueue_median": statistics.median(enqueue),
                "iteration_seconds": secs,
                "objectives": objectives,
                "objective_non_increasing": monotone,
            }
        )
        print(
            f"  scratch {mib:g} MiB: tile {tile} x block {block}: tiled product {t_tiled:.4f} s, "
            f"labels {t_near:.4f} s, iteration {med:.4f} s = {flop / med / 1e12:.1f} "
            f"TFLOP/s-equivalent "
            f"(host issues it in {statistics.median(enqueue):.4f} s); pool peak "
            f"{pool.total_bytes() / 2**30:.2f} GiB (data {pool_before / 2**30:.2f}), device used "
            f"{(total - free) / 2**30:.2f} GiB",
            flush=True,
        )
    floor["tiled_best"] = min(r["tiled_product"] for r in rows)
    floor["seconds"] = min(v for v in (floor.get("whole"), floor["tiled_best"]) if v is not None)
    floor["tflops"] = 2.0 * n * k * d / floor["seconds"] / 1e12
    out["floor"] = floor
    out["fused"] = rows
    return C0, floor, rows


def main(argv=None):
    args = parse_args(argv)
    import cupy as cp

    kernels, kernels_from = load_cuda_kernels()
    n, d, k = args.n, args.d, args.k
    out = {
        "when": datetime.datetime.now().isoformat(timespec="seconds"),
        "args": vars(args) | {"output": None},
        "device": device_info(cp),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "kernels": kernels_from,
    }
    print(
        f"device: {out['device']['name']}  n={n:,} d={d} k={k} float32  kernels: {kernels_from}",
        flush=True,
    )

    C0, floor, rows = measure_gpu(cp, kernels, args, out)
    flop = 2.0 * n * k * d
    best = min(rows, key=lambda r: r["iteration_median"])
    out["fused_best"] = {
        "scratch_mib": best["scratch_mib"],
        "seconds_per_iteration": best["iteration_median"],
        "tflops_equivalent": best["tflops_equivalent"],
        "pool_peak_bytes": best["pool_peak_bytes"],
        "ratio_to_floor": best["iteration_median"] / floor["seconds"],
        "goal": 1.5,
    }

    # (c), (d): the GPU copy of the data is gone with measure_gpu (the Dask worker makes its own)
    cp.get_default_memory_pool().free_all_blocks()
    out["dask"] = {"skipped": "--no-dask"} if args.no_dask else run_dask(args, C0)
    out["cpu"] = {"skipped": "--no-cpu"} if args.no_cpu else run_cpu(args, C0)
    if "seconds_for_n_rows" in out["cpu"]:
        out["speedup_over_cpu"] = out["cpu"]["seconds_for_n_rows"] / best["iteration_median"]

    # table
    print()
    tf = "TF32" if out["device"]["CUPY_TF32"] == "1" else "float32"
    print(
        f"| {out['device']['name']}, n={n:,}, d={d}, k={k}, {tf} | seconds "
        f"| TFLOP/s-equivalent | x floor |"
    )
    print("|---|---:|---:|---:|")
    whole = floor.get("whole")
    print(
        f"| cuBLAS X @ C.T, whole n x k | {_fmt(whole)} | {_tflops(flop, whole)} "
        f"| {_ratio(whole, floor['seconds'])} |"
    )
    for r in rows:
        print(
            f"| cuBLAS X @ C.T, tiles of {r['row_tile']} x {r['centroid_block']} ({r['scratch_mib']:g} MiB) "
            f"| {r['tiled_product']:.4f} | {_tflops(flop, r['tiled_product'])} "
            f"| {_ratio(r['tiled_product'], floor['seconds'])} |"
        )
    for r in rows:
        print(
            f"| fused labels pass, {r['scratch_mib']:g} MiB scratch | {r['nearest']:.4f} "
            f"| {_tflops(flop, r['nearest'])} | {_ratio(r['nearest'], floor['seconds'])} |"
        )
    for r in rows:
        print(
            f"| fused Lloyd iteration, {r['scratch_mib']:g} MiB scratch (pool peak "
            f"{r['pool_peak_bytes'] / 2**30:.2f} GiB) | {r['iteration_median']:.4f} "
            f"| {_tflops(flop, r['iteration_median'])} "
            f"| {_ratio(r['iteration_median'], floor['seconds'])} |"
        )
    dk = out["dask"]
    if "seconds_per_iteration_median" in dk:
        s_dk = dk["seconds_per_iteration_median"]
        print(
            f"| dkmeans.KMeans on a LocalCUDACluster, per iteration | {s_dk:.4f} "
            f"| {_tflops(flop, s_dk)} "
            f"| {_ratio(s_dk, floor['seconds'])} |"
        )
    else:
        why = dk.get("error") or dk.get("skipped")
        print(f"| dkmeans.KMeans on a LocalCUDACluster | {why} | | |")
    cpu = out["cpu"]
    if "seconds_for_n_rows" in cpu:
        s_cpu = cpu["seconds_for_n_rows"]
        print(
            f"| CPU NumPy kernels, {cpu['threads']} threads ({cpu['rows']:,} rows, scaled to n) "
            f"| {s_cpu:.3f} | {_tflops(flop, s_cpu)} | {_ratio(s_cpu, floor['seconds'])} |"
        )
    print()
    print(
        f"floor {floor['seconds']:.4f} s ({floor['tflops']:.1f} TFLOP/s); fused best "
        f"{best['iteration_median']:.4f} s/iteration "
        f"({best['tflops_equivalent']:.1f} TFLOP/s-equivalent) = "
        f"{out['fused_best']['ratio_to_floor']:.2f} x floor "
        f"(goal < 1.5)"
        + (f"; {out['speedup_over_cpu']:.1f} x the CPU path" if "speedup_over_cpu" in out else "")
    )

    path = args.output
    if path is None:
        path = (
            Path(os.environ["OUT"]) / "gpu_lloyd.json"
            if os.environ.get("OUT")
            else ROOT / "benchmarks" / "results" / "gpu_lloyd.json"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, default=float))
    print(f"wrote {path}")
    return out


def _fmt(v):
    return "-" if v is None else f"{v:.4f}"


def _tflops(flop, seconds):
    return "-" if seconds is None else f"{flop / seconds / 1e12:.1f}"


def _ratio(v, floor):
    return "-" if v is None else f"{v / floor:.2f}"


if __name__ == "__main__":
    main()
