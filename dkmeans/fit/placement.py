"""The fit service's one placement entry: a fit's, a sweep's and the scores' data where it runs.

:func:`placed` puts validated rows where their passes run, under one kernel plan chosen here:
in this process (a :class:`~dkmeans.engine.local.ChunkList`) when
:func:`~dkmeans.engine.place.in_process_threads` says so (a small Dask array computed here
first, :func:`~dkmeans.engine.place.in_caller_rows`: no cluster is started for it), else on the cluster
(:func:`~dkmeans.engine.place.place_data`: persisted on the workers, read from the source in
every pass, or both). Every fit (:func:`~dkmeans.fit.service.run_fit`, the mini-batch and
bisecting fits), the k sweep (:mod:`dkmeans.fit.sweep`) and the cluster-quality scores
(:mod:`dkmeans.fit.scoring`) place their data through it; :func:`fit_placement` reads a fit's
spec into its arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

from threadpoolctl import ThreadpoolController, threadpool_limits

from dkmeans.engine.client import fit_client
from dkmeans.engine.local import ChunkList
from dkmeans.engine.place import (
    in_caller_reader,
    in_caller_rows,
    in_process_threads,
    place_data,
    watch_passes,
)
from dkmeans.engine.protocol import ChunkedData
from dkmeans.engine.rowwise import weights_beside
from dkmeans.engine.sparse_rows import is_sparse_array
from dkmeans.fit.inputs import Dataset, as_dataset
from dkmeans.fit.spec import FitSpec, resolve_out_of_core
from dkmeans.kernels.plans import NUMPY_FIT_WORK, KernelPlan
from dkmeans.kernels.plans import plan as kernel_plan

logger = logging.getLogger("dkmeans")


@contextlib.contextmanager
def placed(
    dataset: Dataset,
    weights,
    *,
    out_of_core: Any = "auto",
    n_clusters: int,
    n_init: int = 1,
    allow_hybrid: bool = True,
    on_pass: Callable[[dict], None] | None = None,
    fit: bool = True,
) -> Iterator[tuple[ChunkedData, Any]]:
    """The data protocol over ``dataset`` for the block's duration: yields ``(data, client)``.

    Parameters
    ----------
    dataset : Dataset
        Validated rows (:func:`dkmeans.fit.inputs.as_dataset`).
    weights : ndarray, Dask array or None
        Checked weights (:func:`~dkmeans.fit.inputs.check_sample_weight`).
    out_of_core : {"auto", True, False}
        Where the data lives (resolved through the Dask config ``dkmeans.out-of-core``); True
        sends even small in-memory data to a cluster.
    n_clusters : int
        Centroids a pass carries (the memory budget counts them on every worker; a sweep's
        combined passes carry every k's). 0: none (scores of given labels).
    n_init : int
        Runs of the fit: the kernel plan's size rule counts ``n_clusters * n_init`` centroids.
    allow_hybrid : bool
        Whether data over the persist budget may keep its head persisted (not for mini-batch).
    on_pass : callable, optional
        Progress within each pass over data read from its source
        (:func:`~dkmeans.engine.place.watch_passes`).
    fit : bool
        A fit's passes: a small fit on the NumPy code in this process's one thread runs under one
        BLAS thread (:func:`_one_blas_thread`). False (scores): BLAS keeps its threads.

    Yields
    ------
    (ChunkedData, distributed.Client or None)
        ``client`` None for data in this process: in-memory rows, or a small Dask array's
        (within ``dkmeans.in-process-bytes``) computed once into it, whose labels the caller
        makes a Dask array chunked like its rows (:func:`dkmeans.engine.place.labels_like`). The kernel plan
        (:func:`dkmeans.kernels.plans.plan`), chosen here once, is in force in this process
        and, carried by the placed data, in every task. The data is released when the block
        ends, if its user did not release it before (a fit releases it as soon as its passes
        end, before its labels are computed).
    """
    mode = resolve_out_of_core(out_of_core)
    # out_of_core True, not "auto", sends the data to a cluster
    threads = None
    if mode is not True:
        rows = in_caller_rows(dataset, weights)  # a small Dask array or Parquet frame: read here
        if rows is not None:  # (the kernel plan's facts stay the cluster's: its results)
            dataset, weights = dataclasses.replace(dataset, local=rows[0]), rows[1]
        threads = in_process_threads(dataset, weights)
    centroids = max(1, n_clusters) * max(1, n_init)  # of all its runs
    plan = fit_plan(dataset, centroids, in_process=threads is not None)
    if threads is not None:
        data = ChunkList.from_array(dataset.local, weights, n_chunks=threads, threads=threads)
        # one BLAS thread per chunk thread, as on the workers
        small = fit and plan.path == "numpy" and _small(dataset, centroids)
        try:
            with (
                plan.applied(),
                threadpool_limits(limits=1) if threads > 1 else _one_blas_thread(small),
            ):
                yield data, None
        finally:
            data.release()
        return
    with fit_client() as client:
        data = place_data(
            client,
            dataset,
            weights_beside(weights, dataset.array),
            mode,
            n_clusters,
            allow_hybrid=allow_hybrid,
            plan=plan,
        )
        try:
            watch_passes(data, on_pass)  # out of core: progress within each pass
            # workers without room for the compiled kernels (full of a previous computation):
            # NumPy kernels
            if fit and data.plan != plan:
                logger.info(
                    "the workers have no room below their pause threshold for the compiled "
                    "kernels: the fit runs the NumPy kernels"
                )
            with data.plan.applied():
                yield data, client
        finally:
            data.release()


def fits_in_caller(X, *, missing: str = "error", out_of_core: Any = "auto") -> bool:
    """Whether :func:`placed` puts a fit of ``X`` (no weights) in this process, with no cluster.

    Decided as :func:`placed` decides, from metadata only (a Parquet frame's footers): a command
    starts or joins its cluster only when the fit needs one (``dkmeans fit`` on small files).
    """
    if resolve_out_of_core(out_of_core) is True:
        return False
    dataset = as_dataset(X, missing=missing)
    return in_caller_reader(dataset, None) is not None or (
        in_process_threads(dataset, None) is not None
    )


def fit_placement(spec: FitSpec, n_clusters: int | None = None) -> dict:
    """:func:`placed`'s arguments for a fit of ``spec`` (``n_clusters``: centroids a pass carries,
    default ``spec.n_clusters``)."""
    return dict(
        out_of_core=spec.out_of_core,
        n_clusters=spec.n_clusters if n_clusters is None else n_clusters,
        n_init=spec.n_init,
        allow_hybrid=spec.algorithm != "minibatch",
        on_pass=spec.on_pass,
    )


def fit_plan(dataset: Dataset, n_clusters: int | None, in_process: bool = True) -> KernelPlan:
    """The kernel plan of a fit over ``dataset`` (:func:`dkmeans.kernels.plans.plan`) computing
    ``n_clusters`` centroids in all (times its runs; None: no size rule), here or on a cluster."""
    return kernel_plan(
        dataset.array.dtype,
        dataset.n_features,
        n_rows=dataset.n_rows,
        n_clusters=n_clusters,
        sparse=is_sparse_array(dataset.array),
        in_process=in_process,
    )


def _small(dataset: Dataset, n_clusters: int) -> bool:
    """Whether an in-process fit is small enough for one BLAS thread (:func:`_one_blas_thread`)."""
    n_rows = dataset.n_rows if dataset.n_rows is not None else 2**22
    return n_rows * max(1, dataset.n_features) * max(1, n_clusters) < NUMPY_FIT_WORK


def _one_blas_thread(small: bool):
    """A small fit on the NumPy code in this process's one thread: under one BLAS thread.

    Its BLAS products are small (k x d by d x rows); BLAS threads that wake and spin for each
    cost more than they share, the more so on a busy machine. Measured, a first default fit
    of 100,000 x 8 float32, k = 10, on 2 cores with other work running: 0.075-0.084 s under
    one OpenBLAS thread, 0.21-0.25 s under two. The thread pools are found once per process
    (:func:`_blas_pools`).
    """
    return _blas_pools().limit(limits=1, user_api="blas") if small else contextlib.nullcontext()


@functools.lru_cache(maxsize=1)
def _blas_pools() -> ThreadpoolController:
    """This process's thread pools (threadpoolctl scans the loaded libraries: 10-20 ms, once)."""
    return ThreadpoolController()


__all__ = ["fit_placement", "fit_plan", "fits_in_caller", "placed"]
