"""The Dask client dkmeans runs on: the user's, or an embedded local cluster.

:func:`get_client` returns the current ``distributed`` client when there is one (a
``Client(...)`` the user created, or the client of a worker task). Otherwise it starts a
:class:`distributed.LocalCluster` once per process (worker processes, one per core, one
thread each), with the scheduler and dashboard bound to 127.0.0.1 only, and closes it
when the process exits.

The embedded cluster's client becomes Dask's default scheduler, as ``distributed.Client()``
does: ``.compute()`` on any Dask collection then runs on it, the user's own work included.
An :class:`EmbeddedClusterWarning` says so once, with the dashboard's address, when the
cluster starts. The Dask config key ``dkmeans.embedded-cluster.set-as-default`` (environment
``DASK_DKMEANS__EMBEDDED_CLUSTER__SET_AS_DEFAULT``; default true) set to false keeps the
user's scheduler as it was: fits still run on the embedded cluster, and nothing else does.
"""

from __future__ import annotations

import atexit
import functools
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import warnings
from contextlib import contextmanager
from multiprocessing import resource_tracker

import dask
import distributed

from dkmeans import config
from dkmeans.engine import worker_session
from dkmeans.engine.health import note_interrupt
from dkmeans.errors import DKMeansError

logger = logging.getLogger("dkmeans")

#: Dask config key (:mod:`dkmeans.config`): whether the embedded cluster's client becomes Dask's
#: default scheduler (true, as ``distributed.Client()`` does), or only runs dkmeans' own work
#: (false: the user's scheduler stays as it was).
SET_AS_DEFAULT_KEY = config.name("embedded-cluster.set-as-default")

#: The module each worker process of the embedded cluster imports first (a preload): it leaves the
#: caller's process group there. Named, not imported: it acts on the process that imports it.
WORKER_SESSION = "dkmeans.engine.worker_session"

_lock = threading.Lock()
_embedded: dict = {}
_exit_handler: list = []  # registered once, when the first embedded cluster starts


class EmbeddedClusterWarning(UserWarning):
    """dkmeans started its own local Dask cluster and made it Dask's default scheduler.

    Issued once, when the cluster starts (set the Dask config
    ``dkmeans.embedded-cluster.set-as-default`` to False to keep the user's scheduler
    instead). Silence it with ``warnings.filterwarnings("ignore",
    category=dkmeans.engine.client.EmbeddedClusterWarning)``.
    """


def embedded_set_as_default() -> bool:
    """``dkmeans.embedded-cluster.set-as-default`` as a bool (environment strings such as "false" too)."""
    return config.get("embedded-cluster.set-as-default")


def cpu_count() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
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


def local_worker_threads(client) -> int | None:
    """The threads of ``client``'s workers when every one of them runs on this machine, else None.

    A worker counts as local when its address is in-process (``inproc://``), on a loopback
    address, or on one of this host's own addresses. None as well where the cluster has no
    workers yet, or its scheduler cannot be asked (nothing is then assumed).
    """
    if getattr(client, "asynchronous", False):  # its calls return awaitables: assume nothing
        return None
    try:
        nthreads = client.nthreads()
    except Exception:  # noqa: BLE001 - a closed or unreachable scheduler: assume nothing
        return None
    if (
        not isinstance(nthreads, dict)
        or not nthreads
        or not all(_is_this_host(address) for address in nthreads)
    ):
        return None
    return sum(nthreads.values())


def _is_this_host(address: str) -> bool:
    if address.startswith("inproc://"):
        return True
    try:
        host = distributed.comm.get_address_host(address)
    except ValueError:
        return False
    if host in ("localhost", "::1") or host.startswith("127."):
        return True
    return host in _own_addresses()


@functools.cache
def _own_addresses() -> frozenset:
    name = socket.gethostname()
    try:
        addresses = socket.gethostbyname_ex(name)[2]
    except OSError:  # an unresolvable host name: the loopback test above alone
        addresses = []
    return frozenset([name, socket.getfqdn(), *addresses])


def in_daemon_process() -> bool:
    """Whether this process may not start child processes (a joblib/loky or multiprocessing worker)."""
    return bool(multiprocessing.current_process().daemon)


def in_worker_task() -> bool:
    """Whether this code runs inside a task of a Dask worker."""
    try:
        distributed.get_worker()
    except ValueError:
        return False
    return True


def embedded_client():
    """The embedded cluster's client while it runs (also where it is not Dask's default), or None."""
    client = _embedded.get("client")
    return client if client is not None and client.status == "running" else None


@contextmanager
def fit_client():
    """The client a fit runs on, for the duration of the fit.

    Inside a task of a Dask worker (``joblib.parallel_backend("dask")``, or a user's own
    task) this is :func:`distributed.worker_client`: the task leaves its worker thread
    (secedes) while the fit waits on the cluster, so the tasks it waits for can run on
    that thread, and takes it back (rejoins) afterwards. Elsewhere it is :func:`get_client`.
    """
    if in_worker_task():
        with distributed.worker_client() as client:
            yield client
        return
    client = get_client()
    try:
        with _scheduler_for_fit(client):
            yield client
    except KeyboardInterrupt:
        note_interrupt()  # workers dying right now likely died of it: the next call says so
        raise


@contextmanager
def _scheduler_for_fit(client):
    """An embedded client that is not Dask's default is the scheduler for the fit's duration.

    The fit computes some of its own collections with ``.compute()`` (results it persisted on
    the cluster, which no other scheduler can compute); the user's scheduler is back afterwards.
    """
    if _embedded.get("client") is not client or _embedded.get("set_as_default", True):
        yield
        return
    with dask.config.set(scheduler=client), client.as_current():  # undone in the reverse order
        yield


def start_local_cluster(
    n_workers: int | None = None,
    threads_per_worker: int = 1,
    *,
    set_as_default: bool = True,
    **kwargs,
):
    """Start a loopback-only :class:`distributed.LocalCluster` and a client for it.

    Parameters
    ----------
    n_workers : int, optional
        Worker processes (default: one per available core).
    threads_per_worker : int
        Threads per worker; each kernel uses one BLAS thread per worker thread.
    set_as_default : bool
        Make the client Dask's default scheduler, so ``.compute()`` on the lazy
        results runs on this cluster (as ``distributed.Client()`` does). :func:`get_client`
        passes the Dask config ``dkmeans.embedded-cluster.set-as-default`` (default true).
    **kwargs
        Passed to :class:`distributed.LocalCluster`.

    Returns
    -------
    distributed.Client
    """
    options = dict(
        n_workers=n_workers or cpu_count(),
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
    environ = {
        name: threads for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
    }
    if options["processes"]:
        # Each worker process leaves the caller's process group as it starts (a preload, see
        # dkmeans.engine.worker_session): the SIGINT of Jupyter's stop button or of Ctrl-C, sent to
        # the whole group, then interrupts the caller's wait only, and the workers live on.
        preload = options.get("preload")
        if preload is None:
            preload = dask.config.get("distributed.worker.preload", None) or []
        preload = [preload] if isinstance(preload, str) else list(preload)
        options["preload"] = preload + [WORKER_SESSION]
        options.setdefault("worker_class", _DetachedNanny)
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        cluster = distributed.LocalCluster(**options)
    return distributed.Client(cluster, set_as_default=set_as_default)


class _DetachedNanny(distributed.Nanny):
    """A nanny whose worker processes start with SIGINT blocked (:mod:`.worker_session`).

    A thread's signal mask is inherited by the threads it starts and kept across ``exec``: the
    nanny's coroutines run in the cluster's event-loop thread, which starts the threads that spawn
    the worker processes, so blocking SIGINT in that thread before a worker is spawned makes the
    worker start with it blocked. An interrupt of the caller's process group while the worker
    starts (imports, before the preload takes it out of the group) then stays pending, and the
    preload drops it. The event-loop thread never runs Python's signal handlers (only the main
    thread does), so blocking the signal there changes nothing else.

    Relies on: ``Nanny.instantiate`` running in the event-loop thread and creating the threads
    that spawn the worker (distributed's ``AsyncProcess``), and ``multiprocessing``'s resource
    tracker (``resource_tracker.ensure_running``). Should either change, a worker could again be
    stopped by an interrupt while it starts (the preload still detaches it once started), and
    the tests of ``tests/system/test_notebook.py`` say so.
    """

    async def instantiate(self):
        block = getattr(signal, "pthread_sigmask", None)
        if block is not None:  # POSIX
            # multiprocessing starts its resource tracker at the first spawn, and then unblocks
            # SIGINT in the spawning thread; started first, the tracker leaves the mask alone
            resource_tracker.ensure_running()
            block(signal.SIG_BLOCK, {signal.SIGINT})
        return await super().instantiate()


def start_local_cuda_cluster(*, set_as_default: bool = True, **kwargs):
    """Start a loopback-only ``dask_cuda.LocalCUDACluster`` (one worker per GPU) and a client.

    ``set_as_default`` as for ``start_local_cluster``.

    Raises
    ------
    DKMeansError
        dask-cuda (and CuPy) are not installed.
    """
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        raise DKMeansError(
            "a GPU cluster needs dask-cuda and CuPy: pip install 'dkmeans[gpu]'"
        ) from None
    options = dict(host="127.0.0.1", dashboard_address="127.0.0.1:0")
    options.update(kwargs)
    return distributed.Client(LocalCUDACluster(**options), set_as_default=set_as_default)


def connect_scheduler(
    address: str, *, timeout="30s", tls_ca_file=None, tls_cert=None, tls_key=None
):
    """A client of the scheduler at ``address`` (TLS when any of the files is given).

    Raises :class:`~dkmeans.errors.DKMeansError` naming the address when it cannot be reached.
    """
    security = None
    if tls_ca_file or tls_cert or tls_key:
        from distributed.security import Security

        security = Security(
            tls_ca_file=tls_ca_file,
            tls_client_cert=tls_cert,
            tls_client_key=tls_key,
            require_encryption=True,
        )
    try:
        return distributed.Client(address, timeout=timeout, security=security)
    except (OSError, TimeoutError) as exc:
        raise DKMeansError(f"cannot reach the scheduler at {address}: {exc}") from None


def get_client(*, gpu: bool = False, **kwargs):
    """The client to run on: the current one, else the embedded local cluster's.

    Read more in the :ref:`User Guide <guide-cluster>`.

    Parameters
    ----------
    gpu : bool
        Start a ``LocalCUDACluster`` (dask-cuda, one worker per GPU) instead of a CPU
        cluster when no client exists.
    **kwargs
        Options for ``start_local_cluster`` (or ``LocalCUDACluster``), used only when
        the embedded cluster is started by this call. ``set_as_default`` defaults to the
        Dask config ``dkmeans.embedded-cluster.set-as-default`` (true).

    Returns
    -------
    distributed.Client

    Warns
    -----
    EmbeddedClusterWarning
        Once, when this call starts the embedded cluster and makes it Dask's default
        scheduler (``.compute()`` of any Dask collection then runs there). With
        ``dask.config.set({"dkmeans.embedded-cluster.set-as-default": False})`` the user's
        scheduler stays as it was (dkmeans' fits still use the embedded cluster; compute
        results it keeps there, such as ``labels_`` of a Dask array, with
        ``km.labels_.compute(scheduler=dkmeans.get_client())``), and nothing is issued.
    """
    client = current_client()
    if client is not None:
        return client
    with _lock:
        client = _embedded.get("client")
        if client is None or client.status in ("closed", "closing"):
            if in_daemon_process() and not gpu:
                # a daemonic process (a joblib/loky worker) cannot start worker processes: threads instead
                kwargs = {
                    "processes": False,
                    "n_workers": 1,
                    "threads_per_worker": cpu_count(),
                    **kwargs,
                }
            kwargs.setdefault("set_as_default", embedded_set_as_default())
            start = start_local_cuda_cluster if gpu else start_local_cluster
            with _interrupt_after():  # an interrupted start would leave a cluster nothing closes
                client = start(**kwargs)
                _embedded.update(client=client, set_as_default=bool(kwargs["set_as_default"]))
            if not _exit_handler:
                # Registered now, not at import: atexit runs handlers last-registered first, so
                # this closes the client, then the cluster, before anything registered earlier
                # (logging's shutdown, distributed's own exit handlers) has run.
                atexit.register(close_embedded_cluster)
                _exit_handler.append(close_embedded_cluster)
            logger.info("started a local Dask cluster: %s", client.dashboard_link)
            if kwargs["set_as_default"]:
                warnings.warn(
                    f"dkmeans started a local Dask cluster (dashboard {client.dashboard_link}) and made it "
                    "Dask's default scheduler: .compute() of any Dask collection now runs there. To keep "
                    "your scheduler, set dask.config.set({'dkmeans.embedded-cluster.set-as-default': False}) "
                    "before the first fit, or create a distributed.Client yourself.",
                    EmbeddedClusterWarning,
                    stacklevel=_user_stacklevel(),
                )
    return client


@contextmanager
def _interrupt_after():
    """An interrupt (SIGINT) of the block is raised when the block has finished, not inside it.

    For the start of the embedded cluster (a few seconds): interrupted halfway, it would leave
    worker processes and a scheduler that no reference reaches, so nothing would close them. In
    the main thread only (where Python runs signal handlers); elsewhere the block runs as is.
    """
    in_main = threading.current_thread() is threading.main_thread()
    if not in_main or signal.getsignal(signal.SIGINT) is None:
        yield  # not the main thread, or a handler set outside Python (which could not be put back)
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):
            previous(signal.SIGINT, caught[0])  # Python's handler raises KeyboardInterrupt
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt


#: Modules whose frames a warning skips to reach the user's line (dkmeans, and the wrappers
#: between a user's call and dkmeans: scikit-learn's ``fit`` context, ``contextlib``).
_INTERNAL_MODULES = ("dkmeans", "sklearn", "contextlib")


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by the caller point at the user's code."""
    frame, level = sys._getframe(1), 1
    while (
        frame.f_back is not None
        and frame.f_globals.get("__name__", "").split(".")[0] in _INTERNAL_MODULES
    ):
        frame, level = frame.f_back, level + 1
    return level


def _ignore_stop_signals() -> None:
    import signal

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)


def shield_workers_from_signals(client) -> None:
    """Make the embedded cluster's worker processes ignore SIGTERM and SIGINT.

    A batch system signals every process of a job (SLURM's ``scancel``), a terminal every
    process of its foreground group (Ctrl-C): a worker that died of it would be restarted by
    its nanny while the command that owns the cluster is saving its state and closing it. The
    command closes the workers itself; a worker whose parent dies exits by itself. Only the
    embedded cluster's workers: those of a ``--scheduler`` are not this process's to change.
    """
    if _embedded.get("client") is client:
        client.run(_ignore_stop_signals, on_error="ignore")


#: Seconds a worker process of the embedded cluster is given to exit by itself when the cluster
#: closes (distributed's own close gives it 4 s, then kills it with a warning).
WORKER_EXIT_SECONDS = 10.0


def close_embedded_cluster() -> None:
    """Close the embedded cluster if this process started one (also runs at exit).

    Each worker process is asked to close and given ``WORKER_EXIT_SECONDS`` to exit by
    itself: the interpreter's teardown of a worker that loaded numba, pandas and pyarrow takes
    2-3 s on an idle 2-core machine, more when the machine is busy (two fits at once), longer
    than the 4 s distributed's ``LocalCluster.close`` waits before it kills the process.
    Before that each worker is told the cluster closes
    (``worker_session.prepare_to_exit``): it logs only critical records from
    then on, and its exit skips the collection of the objects it holds, most of those seconds.
    """
    with _lock:
        client = _embedded.pop("client", None)
        _embedded.pop("set_as_default", None)
    if client is not None:
        cluster = client.cluster
        if cluster is not None and client.status == "running":
            try:
                # quiet shutdown logs, and an exit that skips collecting what the worker holds
                client.run(worker_session.prepare_to_exit, on_error="ignore")
            except Exception as exc:  # a worker gone already: its nanny's close below handles it
                logger.debug("preparing the workers to exit: %r", exc)
        client.close()
        if cluster is not None:
            _close_worker_processes(cluster, WORKER_EXIT_SECONDS)
            cluster.close()


def _close_worker_processes(cluster, seconds: float) -> None:
    """Close the nannies of ``cluster``; each waits ``seconds`` at most for its worker to exit."""
    import asyncio

    workers = getattr(cluster, "workers", {}).values()
    nannies = [w for w in workers if isinstance(w, distributed.Nanny)]
    if not nannies:
        return

    async def close_all():
        # the nanny's own close waits 0.8 x timeout for the process, then kills it
        closing = (n.close(timeout=seconds / 0.8) for n in nannies)
        await asyncio.gather(*closing, return_exceptions=True)

    try:
        done = asyncio.run_coroutine_threadsafe(close_all(), cluster.loop.asyncio_loop)
        done.result(timeout=2 * seconds + 5)
    except Exception as exc:  # the cluster's own close below still stops what is left
        logger.debug("closing the worker processes: %r", exc)
