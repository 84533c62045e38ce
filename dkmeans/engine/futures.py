"""Waiting on Dask futures, and naming the cluster failures that stop a computation.

Every pass of every execution mode waits through :func:`gather`, so a fit never hangs on
a cluster without workers and never reports a restart or lost input as a bare
``CancelledError``.

A wait can also stall with workers alive: our tasks queued on a worker that distributed's
memory monitor paused (its process holds the memory: a previous computation's
allocations, not Dask's data, so it never resumes by itself) while the other workers are
idle. :func:`gather` then asks the paused workers to release what their allocators keep;
if nothing runs for ``dkmeans.stall-timeout`` it stops with an error naming the tasks
waited for, where they are and the state and memory of their workers (or, where the
caller can move the tasks, :class:`WorkersStalledError` naming the workers to avoid).
"""

from __future__ import annotations

import time
from concurrent.futures import CancelledError

from distributed import wait

from dkmeans import config
from dkmeans.engine.health import lost_worker_grace, lost_workers, note_interrupt
from dkmeans.engine.workers import worker_info
from dkmeans.errors import (
    ClusterError,
    ClusterRestartedError,
    InputLostError,
    NoWorkersError,
    WorkersPausedError,
)

#: Paused workers are asked to release their allocators' memory at most this often (s).
RELEASE_EVERY = 5.0
#: A watched wait (``gather(on_poll=...)``) looks at its progress this often (s).
WATCH_POLL_S = 0.5


class WorkersStalledError(ClusterError):
    """Our tasks wait on workers that stay paused while no other worker runs anything (``workers``: them)."""

    def __init__(self, message: str, workers=()):
        super().__init__(message)
        self.workers = tuple(workers)


def worker_timeout() -> float:
    """Seconds a pass waits while the cluster has no worker at all (Dask config ``dkmeans.worker-timeout``)."""
    return config.get("worker-timeout")


def stall_timeout() -> float:
    """Seconds a wait may make no progress on running workers (Dask config ``dkmeans.stall-timeout``)."""
    return config.get("stall-timeout")


def gather(
    client,
    futures,
    inputs=(),
    generation=None,
    stalled_workers: bool = False,
    on_poll=None,
    results: bool = True,
):
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
    * Some workers paused while the running ones process nothing and our futures are
      pending: the paused workers are asked to release their allocators' memory (every
      few seconds); after :func:`stall_timeout` the futures are cancelled and a
      :class:`~dkmeans.errors.ClusterError` names the tasks, their workers and those
      workers' state and memory, or, with ``stalled_workers``, a
      :class:`WorkersStalledError` names the paused workers (the caller submits the work
      again without them).

    ``on_poll()``, where given, is called about every :data:`WATCH_POLL_S` while the wait goes
    on (a pass's progress display, :mod:`dkmeans.engine.streamed`). ``results=False`` waits the
    same way and returns None, the results left on the workers (persisted chunks); a failed or
    cancelled task still raises.
    """
    timeout = worker_timeout()
    stall_limit = stall_timeout()
    stalled_since = None
    last_release = 0.0
    poll = min(1.0, max(0.05, timeout / 4))
    if on_poll is not None:
        poll = min(poll, WATCH_POLL_S)
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
            if on_poll is not None:
                on_poll()
            paused = _paused_workers(client)
            if (
                client.nthreads() and paused is None
            ):  # workers running: lost chunks are recomputed, keep waiting
                no_workers_since = None
                stalled = _stalled(client, futures)
                if stalled is None:
                    stalled_since = None
                    continue
                now = time.monotonic()
                stalled_since = stalled_since or now
                if now - last_release > RELEASE_EVERY:
                    _release_paused(client, stalled["paused"])
                    last_release = now
                if now - stalled_since > stall_limit:
                    client.cancel(futures)
                    if stalled_workers and stalled["paused"]:
                        raise WorkersStalledError(stalled["message"], stalled["paused"])
                    raise ClusterError(
                        f"Waited {stall_limit:g} s on tasks that no worker runs: {stalled['message']} The running "
                        f"workers were idle all that time, so the computation was stopped. Paused workers keep "
                        f"memory of their own (a previous computation's): restart them (client.restart()) or give "
                        f"them more memory; the wait is set by the Dask config {config.name('stall-timeout')!r}."
                    )
                continue
            no_workers_since = no_workers_since or time.monotonic()
            if not paused:
                lost = lost_workers(client)  # every worker died: say so now, not after the timeout
                grace = min(lost_worker_grace(), timeout)
                if lost is not None and time.time() - lost.since >= grace:
                    client.cancel(futures)
                    raise NoWorkersError(lost.message())
            if time.monotonic() - no_workers_since > timeout:
                client.cancel(futures)
                if paused:
                    raise WorkersPausedError(
                        f"Every worker of the Dask cluster has been paused by distributed's memory monitor for "
                        f"{timeout:g} s ({'; '.join(paused)}), so the computation was stopped: their processes "
                        f"keep that memory (imports, compiled kernels, the data source's own allocations), so "
                        f"they would stay paused. Give the workers more memory (dkmeans' workers use about 300 MiB "
                        f"of their own), read smaller chunks, or use fewer worker processes with more memory "
                        f"each; the wait is set by the Dask config {config.name('worker-timeout')!r}."
                    )
                raise NoWorkersError(
                    f"The Dask cluster has had no workers for {timeout:g} s, so the computation was stopped. "
                    f"Start workers (or find out why they died: memory limits, preemption) and run again; "
                    f"the wait is set by the Dask config {config.name('worker-timeout')!r}."
                )
        if not results:  # only the failures travel, to raise as a gather would
            failed = [f for f in futures if f.status != "finished"]
            if failed:
                client.gather(failed)
            return None
        results = client.gather(futures)
    except KeyboardInterrupt:
        note_interrupt()
        cancel_quietly(client, futures)  # the caller was interrupted: its tasks stop being run
        raise
    except CancelledError as exc:
        restarted = (
            generation is not None and getattr(client, "generation", generation) != generation
        )
        raise _cancelled_error(exc, inputs, restarted) from exc
    return results[0] if single else results


def cancel_quietly(client, futures) -> None:
    """Cancel ``futures`` (an interrupted caller's tasks) without raising: the caller re-raises.

    Explicitly, not by dropping the futures: an interactive shell keeps the interrupted frames
    (and so the futures) alive with its last traceback, which would keep the tasks and their
    data on the cluster.
    """
    try:
        client.cancel(list(futures))
    except Exception:  # noqa: BLE001 - the scheduler is gone: nothing runs there any more
        pass


def _paused_workers(client):
    """``None`` while some worker runs tasks, else a description of each (paused) worker's memory."""
    try:
        workers = worker_info(client)
    except Exception:  # noqa: BLE001 - no answer: judge by the thread count alone
        return None
    if not workers or any(w.get("status", "running") != "paused" for w in workers.values()):
        return None
    return [
        f"{addr}: {int(w.get('metrics', {}).get('memory', 0)) / 2**20:.0f} MiB of "
        f"{int(w.get('memory_limit') or 0) / 2**20:.0f} MiB"
        for addr, w in workers.items()
    ]


def _stalled(client, futures):
    """None while the wait can progress (a running worker processes something), else what it waits on.

    Returns ``{"paused": [addresses], "message": str}``: the paused workers and a
    description of up to three pending futures (their task, the worker processing it
    and that worker's state and memory, or that no worker has it).
    """
    try:
        workers = worker_info(client)
        processing = client.processing()
    except Exception:  # noqa: BLE001 - no answer: assume progress
        return None
    paused = [a for a, w in workers.items() if w.get("status", "running") == "paused"]
    if not paused:
        return None
    if any(keys for a, keys in processing.items() if a not in paused):
        return None
    where = {key: addr for addr, keys in processing.items() for key in keys}
    pending = [f for f in futures if f.status == "pending"]
    if not pending:
        return None
    notes = []
    for f in pending[:3]:
        addr = where.get(f.key)
        if addr is None:
            notes.append(
                f"task {f.key!r} (pending, on no worker: it waits for its inputs or a free worker)"
            )
        else:
            w = workers.get(addr, {})
            notes.append(
                f"task {f.key!r} (processing on {addr}, which is {w.get('status', 'gone')} at "
                f"{int(w.get('metrics', {}).get('memory', 0)) / 2**20:.0f} MiB of "
                f"{int(w.get('memory_limit') or 0) / 2**20:.0f} MiB)"
            )
    held = [a for a in paused if processing.get(a)]  # the paused workers holding tasks
    more = f" and {len(pending) - 3} more" if len(pending) > 3 else ""

    def queued(a):
        keys = [str(k) for k in processing.get(a, ())]
        if not keys:
            return "no task queued"
        return (
            f"{len(keys)} task(s) queued on it: "
            + ", ".join(repr(k) for k in keys[:3])
            + (", ..." if len(keys) > 3 else "")
        )

    message = (
        f"{'; '.join(notes)}{more}; paused workers: "
        + ", ".join(
            f"{a} ({int(workers[a].get('metrics', {}).get('memory', 0)) / 2**20:.0f} MiB of "
            f"{int(workers[a].get('memory_limit') or 0) / 2**20:.0f} MiB, {queued(a)})"
            for a in paused
        )
        + "."
    )
    return {"paused": held or paused, "message": message}


def _release_paused(client, addresses) -> None:
    """Ask paused workers to give back what their allocators keep (they may then resume)."""
    from dkmeans.engine.release import release_memory

    try:
        client.run(release_memory, workers=list(addresses))
    except Exception:  # noqa: BLE001 - a worker gone meanwhile: the wait goes on
        pass


def _cancelled_error(exc, inputs, restarted=False):
    groups = getattr(exc, "error_groups", None)  # FuturesCancelledError: one reason per group
    reason = (
        " ".join(g.reason or "" for g in groups)
        if groups
        else (getattr(exc, "reason", None) or str(exc))
    )
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
    return ClusterError(
        f"The Dask cluster cancelled this computation (reason: {reason}); run it again."
    )
