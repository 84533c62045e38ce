"""Memory budgets: how much of a worker's memory one task, and the persisted data, may take.

Each worker's memory limit and the memory its process already uses beyond Dask's data
(imports, compiled kernels: about 300 MiB for a worker that has run a fit) are read from
the scheduler; a worker without a limit counts with its host's memory, as distributed
does. Two fractions of the limit, both Dask config keys (documented in the README):

* ``dkmeans.memory.task-fraction`` (default 0.25): a task's input chunks plus the kernel
  scratch may take at most this share of its worker's limit, and at most what is left
  below distributed's pause threshold once the process's own memory is counted (that
  memory includes what a reader's allocator keeps for its next read, such as pyarrow's
  pool after a Parquet pass, which the next read reuses). A pass over persisted data
  takes a worker's chunks in groups of that size (one task per group, run one after the
  other), so chunks that Dask spilled to disk come back one group at a time; a streamed
  pass reads one chunk per task. distributed starts spilling at 60% of the limit
  (``distributed.worker.memory.target``), pauses at 80% and restarts at 95%: a quarter
  leaves room for a second task's inputs while the first one's are released, and for
  the worker's own memory.
* ``dkmeans.memory.persist-fraction`` (default 0.5): data is persisted when its bytes are
  at most this share of the workers' memory limits less their processes' own memory,
  summed over the workers (below distributed's spill target of 60%); larger data is read
  from its source in every pass (out-of-core), except what fits, which stays persisted.

A fit's compiled kernels take memory of the worker process too (numba and LLVM, the loaded
machine code: about 260 MiB on a fresh worker, measured with the process's resident memory
before and after). The budget is read in one round trip (``kernels``: the fit's kernel plan, the
dtype and the width): each worker releases what its allocators keep, measures itself, and where
the compiled kernels are not loaded yet and fit below its pause threshold, starts loading them
(:func:`prepare_worker`, the engine's one worker-preparation hook: compiled, or from numba's
cache) in a thread of its own, counting :data:`KERNELS_BYTES` for them as the worker's own memory.
The load thus overlaps the fit's placement of its data (a blocking load took 1-3 s of a first fit
on 2 cores) instead of preceding it; the first pass's tasks wait for what is not loaded yet.
Workers without room for them take the plan's NumPy code (:attr:`MemoryBudget.plan`).

When a worker's own memory leaves it less than its nominal task budget, the workers are first
asked to give freed memory back to the operating system (``gc.collect()`` and glibc's
``malloc_trim(0)``, as distributed's documentation advises for unmanaged memory that stays
high after a computation), and the budget is read again once they have reported.

A chunk that alone exceeds its task budget cannot be processed without overloading a
worker: :func:`check_chunks_fit` raises :class:`~dkmeans.errors.ChunkTooLargeError` before
any work is submitted.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import dask
from distributed.system import MEMORY_LIMIT as HOST_MEMORY

from dkmeans import config
from dkmeans.engine.futures import worker_timeout
from dkmeans.engine.health import raise_if_lost
from dkmeans.engine.probe import (  # noqa: F401 - run on workers by the budget
    KERNELS_BYTES,
    _loading,
    _prepared,
    _probe_worker,
    _release_and_measure,
    load_here_in_background,
    prepare_worker,
)
from dkmeans.engine.release import release_memory  # noqa: F401 - run on workers by the budget
from dkmeans.engine.workers import worker_info
from dkmeans.errors import ChunkTooLargeError, NoWorkersError, WorkersPausedError
from dkmeans.kernels.plans import KernelPlan

#: Seconds the budget waits before measuring a worker again when its own memory cut into its task budget.
RELEASE_SETTLE_S = 1.0


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


@dataclass(frozen=True)
class MemoryBudget:
    """Memory limits of a cluster's workers and the budgets dkmeans plans with.

    Parameters
    ----------
    limits : dict of str to int
        Memory limit in bytes per worker address.
    scratch_bytes : int
        Memory a kernel call may use besides its inputs (subtracted from each task budget).
    unmanaged : dict of str to int, optional
        Memory each worker process uses beyond Dask's data (0 where not known).
    centroid_bytes : int, optional
        Memory a worker holds for the centroids during a pass (the centroids, their
        float64 sums and the partials being combined:
        :func:`dkmeans.kernels.common.centroid_bytes`); subtracted from each task's budget
        and from each worker's share of the persist budget. Large at large k (552 MiB for
        k = 262,144 x 16 features), negligible at small k.
    """

    limits: dict
    scratch_bytes: int = 0
    unmanaged: dict = field(default_factory=dict)
    centroid_bytes: int = 0
    #: the kernel plan the fit can afford on these workers: the caller's, or its NumPy code where loading
    #: the compiled kernels (numba and LLVM: about KERNELS_BYTES) would take a worker past its pause threshold
    plan: KernelPlan | None = None

    @classmethod
    def of(
        cls, client, scratch_bytes: int = 0, centroid_bytes: int = 0, kernels: tuple | None = None
    ) -> MemoryBudget:
        """The budget of ``client``'s cluster as the scheduler reports it now.

        ``kernels``: ``(plan, dtype, n_features)``, the fit's kernel plan
        (:class:`~dkmeans.kernels.plans.KernelPlan`) and its rows: every worker with room starts
        loading its kernels (:func:`prepare_worker`, in a thread), and their memory is counted. Where a
        worker's own memory cuts into its task budget, the
        workers first release the memory their allocators keep (see the module docstring).
        """
        for attempt in range(MEASURE_ATTEMPTS):
            info = worker_info(client)
            if not info:  # no worker yet (starting, or restarting): plan once one is there
                info = _wait_for_workers(client)
            try:
                budget = cls._measured(client, info, scratch_bytes, centroid_bytes, kernels)
            except OSError:  # a worker's connection closed while measured: it died, look again
                if attempt == MEASURE_ATTEMPTS - 1:
                    raise
                time.sleep(WAIT_POLL_S)
                continue
            if budget.limits:
                return budget
            # every worker left while they were measured: wait for one (or say that they died)
        _wait_for_workers(client)
        return cls._measured(client, worker_info(client), scratch_bytes, centroid_bytes, kernels)

    @classmethod
    def _measured(
        cls, client, info: dict, scratch_bytes: int, centroid_bytes: int, kernels: tuple | None
    ) -> MemoryBudget:
        """The budget of the workers in ``info`` (see :meth:`of`), measured now."""
        plan = None
        if kernels is not None:
            plan, dtype, n_features = kernels
            # one round trip: each worker releases, measures itself and starts loading the kernels in a
            # thread of its own where they fit, while this process places the data (the first pass's
            # tasks wait for the load where it has not ended)
            state = client.run(_probe_worker, tuple(plan), dtype, n_features)
            if plan.path == "compiled" and not _room_for_kernels(
                client, info, dtype, n_features, state
            ):
                plan = plan.numpy()  # the NumPy kernels need no compiler in the workers
            # and this process loads those of the fit's steps that run here (the seeding's)
            load_here_in_background(tuple(plan), dtype, n_features)
            rss = _counted_rss(state)
            info = _next_reports(client, info) if _paused(info) else worker_info(client)
            budget = cls._from_info(info, scratch_bytes, centroid_bytes, rss)
            if any(budget._one_task(a) < budget._nominal_task(a) for a in budget.limits):
                # a computation that just ended may still be releasing its data: look once more
                time.sleep(RELEASE_SETTLE_S)
                rss = _counted_rss(client.run(_probe_worker, tuple(plan), dtype, n_features))
                info = _next_reports(client, info)
                budget = cls._from_info(info, scratch_bytes, centroid_bytes, rss)
        else:
            budget = cls._from_info(info, scratch_bytes, centroid_bytes)
            if any(budget._one_task(a) < budget._nominal_task(a) for a in budget.limits) or _paused(
                info
            ):
                client.run(release_memory)
                info = _next_reports(client, info)
                budget = cls._from_info(info, scratch_bytes, centroid_bytes)
        paused = _paused(info)
        if paused and len(paused) == len(info):
            raise WorkersPausedError(
                "Every worker of the Dask cluster is paused by distributed's memory monitor, even after releasing "
                f"what the allocators keep ({_describe(info)}), so nothing was planned: their processes hold that "
                "memory themselves (imports, a previous computation's allocations). Restart the workers "
                "(client.restart()) before the fit, give them more memory, or use fewer worker processes with more "
                "memory each."
            )
        if paused:  # plan with the workers that run tasks; the paused ones get none of ours
            budget = dataclasses.replace(
                budget, limits={a: v for a, v in budget.limits.items() if a not in paused}
            )
        budget = dataclasses.replace(budget, plan=plan)
        return budget

    @classmethod
    def _from_info(
        cls, info: dict, scratch_bytes: int, centroid_bytes: int = 0, rss: dict | None = None
    ) -> MemoryBudget:
        """The budget from the scheduler's worker info; ``rss``: process memory measured on the workers just now."""
        limits = {addr: int(w.get("memory_limit") or 0) or HOST_MEMORY for addr, w in info.items()}
        unmanaged = {}
        for addr, w in info.items():
            metrics = w.get("metrics", {})
            memory = int((rss or {}).get(addr) or metrics.get("memory", 0))
            unmanaged[addr] = max(0, memory - int(metrics.get("managed_bytes", 0)))
        return cls(limits, int(scratch_bytes), unmanaged, int(centroid_bytes))

    def _nominal_task(self, address: str) -> float:
        return max(
            0.0,
            config.get("memory.task-fraction") * self.limits[address]
            - self.scratch_bytes
            - self.centroid_bytes,
        )

    def _one_task(self, address: str) -> float:
        limit = self.limits[address]
        pause = dask.config.get("distributed.worker.memory.pause", 0.8) or 1.0
        below_pause = float(pause) * limit - self.unmanaged.get(address, 0)
        return max(
            0.0,
            min(config.get("memory.task-fraction") * limit, below_pause)
            - self.scratch_bytes
            - self.centroid_bytes,
        )

    def remeasured(self, client) -> MemoryBudget:
        """This budget's workers measured again now, after releasing what their allocators keep."""
        rss = client.run(_release_and_measure, workers=list(self.limits))
        info = {a: w for a, w in worker_info(client).items() if a in self.limits}
        return self._from_info(info, self.scratch_bytes, self.centroid_bytes, rss) if info else self

    def task_bytes(self, address: str | None = None) -> float:
        """Bytes of input one task may take on this worker (the smallest budget of all without an address)."""
        if address in self.limits:
            return self._one_task(address)
        return min((self._one_task(a) for a in self.limits), default=0.0)

    def persist_bytes(self) -> float:
        """Bytes of data the cluster keeps persisted at most."""
        fraction = config.get("memory.persist-fraction")
        return float(
            sum(
                max(0.0, fraction * limit - self.unmanaged.get(addr, 0) - self.centroid_bytes)
                for addr, limit in self.limits.items()
            )
        )

    def per_worker(self) -> dict:
        """:meth:`task_bytes` of every worker, by address."""
        return {addr: self.task_bytes(addr) for addr in self.limits}


def _counted_rss(state: dict) -> dict:
    """Each worker's own memory from :func:`_probe_worker`'s answers, with the kernels it is loading."""
    return {a: rss + (KERNELS_BYTES if loading else 0) for a, (_, rss, loading) in state.items()}


def _room_for_kernels(client, info: dict, dtype, n_features: int, state: dict) -> bool:
    """Whether every worker can load the compiled kernels and stay below its pause threshold.

    ``state``: the workers' answers of :func:`_probe_worker` (loaded, memory after a release). A
    worker that already ran a plain Dask read pass holds its imports and allocators' memory
    (about 410 MiB of 768 MiB, measured after a release); the kernels' :data:`KERNELS_BYTES`
    on top would pause it before the fit's first task.
    """
    pause = float(dask.config.get("distributed.worker.memory.pause", 0.8) or 1.0)
    for address, (loaded, rss, _) in state.items():
        limit = int(info.get(address, {}).get("memory_limit") or 0) or HOST_MEMORY
        if not loaded and rss + KERNELS_BYTES > pause * limit:
            return False
    return True


def _paused(info: dict) -> list:
    return [a for a, w in info.items() if w.get("status", "running") == "paused"]


def _describe(info: dict) -> str:
    return "; ".join(
        f"{a}: {int(w.get('metrics', {}).get('memory', 0)) / 2**20:.0f} MiB of "
        f"{int(w.get('memory_limit') or 0) / 2**20:.0f} MiB, {w.get('status', 'running')}"
        for a, w in info.items()
    )


#: How often a wait for workers looks whether the cluster's workers died (s).
WAIT_POLL_S = 0.5
#: How many times a budget is measured again when workers leave while they are measured.
MEASURE_ATTEMPTS = 4


def _wait_for_workers(client) -> dict:
    """The scheduler's worker info once a worker is there, waiting at most ``worker-timeout``.

    Workers that all died (:mod:`dkmeans.engine.health`) are said at once instead, after the short
    grace a nanny gets to restart them.
    """
    timeout = worker_timeout()
    deadline = time.monotonic() + timeout
    while True:
        raise_if_lost(client)
        try:
            left = max(0.01, deadline - time.monotonic())
            client.wait_for_workers(1, timeout=min(WAIT_POLL_S, left))
            break
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise NoWorkersError(
                    f"The Dask cluster has had no workers for {timeout:g} s, so nothing was "
                    f"planned. Start workers and run again; the wait is set by the Dask config "
                    f"{config.name('worker-timeout')!r}."
                ) from None
    return worker_info(client)


def _next_reports(client, before: dict, reports: int = 2, timeout: float = 5.0) -> dict:
    """The scheduler's worker info once every worker has sent ``reports`` heartbeats since ``before``.

    Two: the first may carry a memory sample taken before the release.
    """
    deadline = time.monotonic() + timeout
    seen = {a: [w.get("last_seen", 0)] for a, w in before.items()}
    while True:
        info = worker_info(client)
        for a, w in info.items():
            times = seen.setdefault(a, [0])
            if w.get("last_seen", 0) > times[-1]:
                times.append(w.get("last_seen", 0))
        if all(len(seen[a]) > reports for a in info) or time.monotonic() > deadline:
            return info
        time.sleep(0.05)


def group_by_bytes(chunk_ids, chunk_bytes, budget: float) -> list[list[int]]:
    """Consecutive groups of ``chunk_ids`` whose bytes add up to at most ``budget`` (at least one chunk each)."""
    groups: list[list[int]] = []
    size = 0.0
    for i in chunk_ids:
        if groups and size + chunk_bytes[i] <= budget:
            groups[-1].append(i)
            size += chunk_bytes[i]
        else:
            groups.append([i])
            size = chunk_bytes[i]
    return groups


def check_chunks_fit(chunk_bytes, budget: MemoryBudget, what: str = "input") -> None:
    """Raise :class:`ChunkTooLargeError` when one chunk alone exceeds the smallest worker's task budget."""
    if not len(chunk_bytes):
        return
    largest = max(chunk_bytes)
    allowed = budget.task_bytes()
    if largest > allowed:
        smallest_limit = min(budget.limits.values())
        raise ChunkTooLargeError(
            f"One chunk of the {what} takes {_mib(largest)} in memory, more than a worker's budget for one task: "
            f"{_mib(allowed)} (at most {config.get('memory.task-fraction'):g} of the smallest "
            f"worker's memory limit {_mib(smallest_limit)} and of its room below the pause threshold, less "
            f"{_mib(budget.scratch_bytes)} of kernel scratch and {_mib(budget.centroid_bytes)} "
            "for the centroids). Nothing was run. Use smaller chunks (a Dask array: "
            "X.rechunk({0: rows}); a Dask DataFrame: "
            f"df.repartition(partition_size='{max(1, int(allowed / 2 / 2**20))}MiB'); "
            "Parquet: smaller row groups or files), give the workers more memory, or raise the "
            f"Dask config {config.name('memory.task-fraction')!r}."
        )


__all__ = [
    "MemoryBudget",
    "check_chunks_fit",
    "group_by_bytes",
    "prepare_worker",
]
