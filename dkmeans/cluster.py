"""The Dask client dkmeans runs on: the user's, or an embedded local cluster.

:func:`get_client` returns the current ``distributed`` client when there is one (a
``Client(...)`` the user created, or the client of a worker task). Otherwise it starts a
:class:`distributed.LocalCluster` once per process (worker processes, one per core, one
thread each), with the scheduler and dashboard bound to 127.0.0.1 only, and closes it
when the process exits.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import threading
from contextlib import contextmanager

import dask
import distributed

from dkmeans.errors import DKMeansError

logger = logging.getLogger("dkmeans")

_lock = threading.Lock()
_embedded: dict = {}


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def current_client():
    """The current ``distributed`` client, or None (nothing is started)."""
    try:
        return distributed.get_client()
    except ValueError:
        return None


def in_daemon_process() -> bool:
    """Whether this process may not start child processes (a joblib/loky or multiprocessing worker)."""
    return bool(multiprocessing.current_process().daemon)


def _in_worker_task() -> bool:
    try:
        distributed.get_worker()
    except ValueError:
        return False
    return True


@contextmanager
def fit_client():
    """The client a fit runs on, for the duration of the fit.

    Inside a task of a Dask worker (``joblib.parallel_backend("dask")``, or a user's own
    task) this is :func:`distributed.worker_client`: the task leaves its worker thread
    (secedes) while the fit waits on the cluster, so the tasks it waits for can run on
    that thread, and takes it back (rejoins) afterwards. Elsewhere it is :func:`get_client`.
    """
    if _in_worker_task():
        with distributed.worker_client() as client:
            yield client
    else:
        yield get_client()


def start_local_cluster(n_workers: int | None = None, threads_per_worker: int = 1, *,
                        set_as_default: bool = True, **kwargs):
    """Start a loopback-only :class:`distributed.LocalCluster` and a client for it.

    Parameters
    ----------
    n_workers : int, optional
        Worker processes (default: one per available core).
    threads_per_worker : int
        Threads per worker; each kernel uses one BLAS thread per worker thread.
    set_as_default : bool
        Make the client Dask's default scheduler, so ``.compute()`` on the lazy
        results runs on this cluster (as ``distributed.Client()`` does).
    **kwargs
        Passed to :class:`distributed.LocalCluster`.

    Returns
    -------
    distributed.Client
    """
    options = dict(
        n_workers=n_workers or _cpu_count(),
        threads_per_worker=threads_per_worker,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",
    )
    options.update(kwargs)
    # Worker processes start with one BLAS/OpenMP thread per worker thread (no
    # oversubscription); the nanny exports these before the worker imports NumPy.
    # This replaces distributed's default, which also sets MALLOC_TRIM_THRESHOLD_=65536:
    # that turns every large NumPy temporary into an mmap/munmap pair (several times
    # slower kernels, see the performance notes), so the embedded cluster leaves it out.
    threads = str(options["threads_per_worker"])
    environ = {name: threads for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        cluster = distributed.LocalCluster(**options)
    return distributed.Client(cluster, set_as_default=set_as_default)


def start_local_cuda_cluster(**kwargs):
    """Start a loopback-only ``dask_cuda.LocalCUDACluster`` (one worker per GPU) and a client.

    Raises
    ------
    DKMeansError
        dask-cuda (and CuPy) are not installed.
    """
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        raise DKMeansError("a GPU cluster needs dask-cuda and CuPy: pip install 'dkmeans[gpu]'") from None
    options = dict(host="127.0.0.1", dashboard_address="127.0.0.1:0")
    options.update(kwargs)
    return distributed.Client(LocalCUDACluster(**options))


def get_client(*, gpu: bool = False, **kwargs):
    """The client to run on: the current one, else the embedded local cluster's.

    Parameters
    ----------
    gpu : bool
        Start a ``LocalCUDACluster`` (dask-cuda, one worker per GPU) instead of a CPU
        cluster when no client exists.
    **kwargs
        Options for :func:`start_local_cluster` (or ``LocalCUDACluster``), used only when
        the embedded cluster is started by this call.

    Returns
    -------
    distributed.Client
    """
    client = current_client()
    if client is not None:
        return client
    with _lock:
        client = _embedded.get("client")
        if client is None or client.status in ("closed", "closing"):
            if in_daemon_process() and not gpu:
                # a daemonic process (a joblib/loky worker) cannot start worker processes: threads instead
                kwargs = {"processes": False, "n_workers": 1, "threads_per_worker": _cpu_count(), **kwargs}
            client = start_local_cuda_cluster(**kwargs) if gpu else start_local_cluster(**kwargs)
            _embedded["client"] = client
            logger.info("started a local Dask cluster: %s", client.dashboard_link)
    return client


def close_embedded_cluster() -> None:
    """Close the embedded cluster if this process started one (also runs at exit)."""
    with _lock:
        client = _embedded.pop("client", None)
    if client is not None:
        cluster = client.cluster
        client.close()
        if cluster is not None:
            cluster.close()


atexit.register(close_embedded_cluster)
