"""Waiting on Dask futures, and naming the cluster failures that stop a computation.

Every pass of every execution mode waits through :func:`gather`, so a fit never hangs on
a cluster without workers and never reports a restart or lost input as a bare
``CancelledError``.
"""

from __future__ import annotations

import time
from concurrent.futures import CancelledError

import dask
from dask.utils import parse_timedelta
from distributed import wait

from dkmeans.errors import ClusterError, ClusterRestartedError, InputLostError, NoWorkersError, WorkersPausedError

#: Dask config key (env ``DASK_DKMEANS__WORKER_TIMEOUT``): how long a pass may wait with no worker.
WORKER_TIMEOUT_KEY = "dkmeans.worker-timeout"
DEFAULT_WORKER_TIMEOUT = "120s"


def worker_timeout() -> float:
    """Seconds a pass waits while the cluster has no worker at all (Dask config ``dkmeans.worker-timeout``)."""
    return float(parse_timedelta(dask.config.get(WORKER_TIMEOUT_KEY, DEFAULT_WORKER_TIMEOUT)))


def gather(client, futures, inputs=(), generation=None):
    """Wait for ``futures`` (a future or a list) and return their results, failing clearly instead of hanging.

    * Every worker gone for longer than :func:`worker_timeout`: the futures are
      cancelled and :class:`~dkmeans.errors.NoWorkersError` is raised; every worker
      paused by distributed's memory monitor that long:
      :class:`~dkmeans.errors.WorkersPausedError` (a paused worker whose process memory
      is its own, not Dask's data, never resumes). While at least
      one worker is alive, lost chunks are being recomputed and the wait goes on.
    * A cancelled task: :class:`~dkmeans.errors.ClusterRestartedError` after
      ``client.restart()``, :class:`~dkmeans.errors.InputLostError` when input chunks
      (``inputs``: their futures) were lost and cannot be recomputed. ``generation``:
      the client's restart count when the inputs were persisted (a restart since then
      also cancelled them).
    """
    timeout = worker_timeout()
    poll = min(1.0, max(0.05, timeout / 4))
    single = not isinstance(futures, (list, tuple))
    futures = [futures] if single else list(futures)
    no_workers_since = None
    try:
        while True:
            try:
                with client.as_current():  # wait() uses the current client
                    wait(futures, timeout=poll)
                break
            except TimeoutError:
                pass
            paused = _paused_workers(client)
            if client.nthreads() and paused is None:  # workers running: lost chunks are recomputed, keep waiting
                no_workers_since = None
                continue
            no_workers_since = no_workers_since or time.monotonic()
            if time.monotonic() - no_workers_since > timeout:
                client.cancel(futures)
                if paused:
                    raise WorkersPausedError(
                        f"Every worker of the Dask cluster has been paused by distributed's memory monitor for "
                        f"{timeout:g} s ({'; '.join(paused)}), so the computation was stopped: their processes "
                        f"keep that memory (imports, compiled kernels, the data source's own allocations), so "
                        f"they would stay paused. Give the workers more memory (dkmeans' workers use about 300 MiB "
                        f"of their own), read smaller chunks, or use fewer worker processes with more memory "
                        f"each; the wait is set by the Dask config {WORKER_TIMEOUT_KEY!r}."
                    )
                raise NoWorkersError(
                    f"The Dask cluster has had no workers for {timeout:g} s, so the computation was stopped. "
                    f"Start workers (or find out why they died: memory limits, preemption) and run again; "
                    f"the wait is set by the Dask config {WORKER_TIMEOUT_KEY!r}."
                )
        results = client.gather(futures)
    except CancelledError as exc:
        restarted = generation is not None and getattr(client, "generation", generation) != generation
        raise _cancelled_error(exc, inputs, restarted) from exc
    return results[0] if single else results


def _paused_workers(client):
    """``None`` while some worker runs tasks, else a description of each (paused) worker's memory."""
    try:
        workers = client.scheduler_info(n_workers=-1)["workers"]
    except Exception:  # noqa: BLE001 - no answer: judge by the thread count alone
        return None
    if not workers or any(w.get("status", "running") != "paused" for w in workers.values()):
        return None
    return [f"{addr}: {int(w.get('metrics', {}).get('memory', 0)) / 2**20:.0f} MiB of "
            f"{int(w.get('memory_limit') or 0) / 2**20:.0f} MiB" for addr, w in workers.items()]


def _cancelled_error(exc, inputs, restarted=False):
    groups = getattr(exc, "error_groups", None)  # FuturesCancelledError: one reason per group
    reason = " ".join(g.reason or "" for g in groups) if groups else (getattr(exc, "reason", None) or str(exc))
    if restarted or "restart" in reason:
        return ClusterRestartedError(
            "The Dask cluster was restarted (client.restart()) while dkmeans was using it, which dropped the "
            "data persisted for this job. Nothing was fitted; run it again once the cluster is up."
        )
    lost = [f for f in inputs if f.status in ("cancelled", "lost")]
    if lost or "forgotten" in reason or "lost" in reason:
        return InputLostError(
            "Input data was lost with a worker and cannot be recomputed: it lived only in worker memory "
            "(for example put there with client.scatter). Build the Dask array from a recomputable source "
            "(dask.array.from_array, from_zarr, dask.dataframe.read_parquet, ...) so that lost chunks are "
            "recomputed, or replicate scattered data (client.scatter(..., broadcast=True))."
        )
    return ClusterError(f"The Dask cluster cancelled this computation (reason: {reason}); run it again.")
