"""A loop run SPMD: one long task per worker thread, partials exchanged worker to worker.

A pass spread as one graph (:meth:`dkmeans.engine.persisted.PersistedData.map_reduce`) costs a
full cluster round trip: client to scheduler to workers and back, about 10 ms with
distributed, much of it batching delays. oneDAL's SPMD mode avoids that: every rank runs
the same loop on its own rows and only the small partials travel, once per pass (an
allreduce). :func:`run_spmd` does the same on Dask: one task per worker thread (pinned
to the worker that holds its chunks) runs the driver function on a :class:`RankChunks`,
whose ``map_reduce`` combines its chunks' results and then the ranks' results: every
rank sends its result straight to every other rank's worker (:mod:`dkmeans.engine.mailbox`,
a worker handler reached over Dask's comms) and combines all of them in rank order.
Every rank therefore runs the same driver code on the same combined values and takes
the same decisions; rank 0's return value is the result, sent to the client through a
:class:`distributed.Queue`. About 0.45 ms per allreduce on two local workers, against
1.5 ms through queues (the scheduler relays every message).

Anything that stops the ranks from meeting (a worker already busy with other tasks when
the block starts, a rank that cannot start because its worker became busy, a worker that
dies, a peer that stops answering for longer than ``dkmeans.spmd-wait``) raises
:class:`SpmdUnavailable` on the client after the other ranks were told to stop; the
caller then runs the same block one graph per pass, which Dask makes fault tolerant.
Errors raised by the driver itself (bad data) are raised as they are.
"""

from __future__ import annotations

import pickle
import queue
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.task_spec import Task
from distributed import Event, Queue, wait

from dkmeans import config
from dkmeans.engine import mailbox
from dkmeans.engine.futures import gather
from dkmeans.engine.health import note_interrupt
from dkmeans.engine.local import ChunkList, reraise_warnings, split_blocks
from dkmeans.engine.passes import submitting_own_graph, task_args
from dkmeans.kernels.namespace import to_host

#: How often the client looks for progress, a failed rank or a lost worker (seconds).
POLL_S = 0.25
#: Rank 0 sends its progress records at most this often (seconds), the first at once: a
#: queue put is a round trip to the scheduler that would delay every iteration (~1 ms).
REPORT_EVERY_S = 0.2


class SpmdUnavailable(RuntimeError):
    """The ranks of an SPMD block could not run together; the caller falls back to one graph per pass."""


def spmd_enabled(n_ranks: int) -> bool:
    """Whether a loop over ``n_ranks`` worker threads runs SPMD (Dask config ``dkmeans.spmd``)."""
    return config.get("spmd") and 1 <= n_ranks <= config.get("spmd-max-ranks")


def _spmd_wait_s() -> float:
    return config.get("spmd-wait")


def _progress_name(token: str) -> str:
    return f"{token}-progress"


def _stop_name(token: str) -> str:
    return f"{token}-stop"


class RankComm:
    """Rank ``rank`` of the ranks on ``addresses``: an allreduce by direct messages (runs in a task).

    Every rank sends its value to every other rank (:mod:`dkmeans.engine.mailbox`) and combines
    all of them in rank order, so all ranks get the same combined value without a second
    hop through a root rank. Rank 0 also reports progress and the result to the client
    through :class:`distributed.Queue` (the scheduler keeps them if rank 0's worker dies).
    ``worker`` is the worker the rank runs on (default: the task's own), which sends its
    messages; a message to a rank on the same worker goes straight to that rank's mailbox.
    """

    def __init__(self, token: str, rank: int, addresses: Sequence[str], wait_s: float, worker=None):
        from distributed import get_worker

        self.token, self.rank, self.addresses, self.wait_s = token, rank, list(addresses), wait_s
        self.size = len(self.addresses)
        self.worker = worker if worker is not None else get_worker()
        self.box = mailbox.open_box(token, rank)
        self._progress: Queue | None = None  # rank 0's, made at its first report
        self.seq = 0
        self._early: dict[tuple[int, int], tuple] = {}  # messages of later passes, by (pass, rank)
        self._pending: list[dict] = []
        self._last_sent = -float("inf")
        #: seconds of this rank's last local pass, and the longest of any rank's last passes
        self.last_pass_s = 0.0
        self.slowest_pass_s = 0.0
        #: rank 0: the client asked the loop to stop (seen with a report); every rank: the
        #: request reached every rank, with rank 0's message of one same exchange
        self.stop_asked = False
        self.stop_agreed = False

    def _send_failed(self, exc: BaseException) -> None:
        self.box.put((mailbox.FAILED, f"{type(exc).__name__}: {exc}"))

    def _receive(self, seq: int) -> dict[int, tuple]:
        """The other ranks' messages of pass ``seq``, by rank.

        Peers are given ``dkmeans.spmd-wait`` plus four times the longest pass seen so far
        (this rank's own, or any rank's in the previous exchange) before this rank gives
        up. A message of a later pass (possible when sends overtake each other) is kept
        for that pass.
        """
        patience = self.wait_s + 4 * max(self.last_pass_s, self.slowest_pass_s)
        deadline = time.monotonic() + patience
        got = {
            rank: self._early.pop((seq, rank))
            for rank in range(self.size)
            if (seq, rank) in self._early
        }
        while len(got) < self.size - 1:
            try:
                message = self.box.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise SpmdUnavailable(
                    f"rank {self.rank} waited {patience:.1f} s for its peers (Dask config {config.name('spmd-wait')!r})"
                ) from None
            kind = message[0]
            if kind == mailbox.STOP:
                raise SpmdUnavailable(f"rank {self.rank} was told to stop")
            if kind == mailbox.FAILED:
                raise SpmdUnavailable(f"rank {self.rank} could not reach a peer: {message[1]}")
            their_seq, rank = message[1], message[2]
            if their_seq == seq:
                got[rank] = message
            elif their_seq > seq:
                self._early[their_seq, rank] = message
            else:
                raise SpmdUnavailable(f"rank {self.rank} got pass {their_seq} while in pass {seq}")
        return got

    def allreduce(self, value, combine_fn: Callable):
        """``combine_fn`` of every rank's ``value`` (in rank order), returned on every rank.

        Values travel pickled (bytes), so they arrive as they were sent (lists stay lists,
        NamedTuples stay NamedTuples). Every rank combines the same host values in the same
        order with the same function, so every rank gets the same bits.
        """
        seq, self.seq = self.seq, self.seq + 1
        if self.size == 1:
            self.stop_agreed = self.stop_agreed or self.stop_asked
            return value
        message = (
            mailbox.PASS,
            seq,
            self.rank,
            self.last_pass_s,
            pickle.dumps(value, protocol=5),
            self.stop_asked,
        )
        for rank, address in enumerate(self.addresses):
            if rank != self.rank:
                mailbox.send(self.worker, address, self.token, rank, message, self._send_failed)
        got = self._receive(seq)
        parts = [
            value if rank == self.rank else pickle.loads(got[rank][4]) for rank in range(self.size)
        ]
        self.slowest_pass_s = max([self.last_pass_s] + [got[rank][3] for rank in got])
        # a stop request travels with rank 0's message: every rank sees it after the same exchange
        asked = self.stop_asked if self.rank == 0 else got[0][5]
        self.stop_agreed = self.stop_agreed or bool(asked)
        return to_host(combine_fn(parts))

    def report(self, record: dict) -> None:
        """Send a progress record to the client (rank 0 only).

        Records go in batches, at most every :data:`REPORT_EVERY_S` (the first at once),
        in order; :meth:`send_result` sends what is left first.
        """
        if self.rank != 0:
            return
        self._pending.append(record)
        if time.monotonic() - self._last_sent >= REPORT_EVERY_S:
            self._send_pending()

    def _progress_queue(self) -> Queue:
        if self._progress is None:
            self._progress = Queue(_progress_name(self.token))
        return self._progress

    def _send_pending(self) -> None:
        if self._pending:
            self._progress_queue().put(("records", self._pending))
            self._pending = []
            # as often as records are sent: has the client asked the loop to stop?
            self.stop_asked = self.stop_asked or Event(_stop_name(self.token)).is_set()
        self._last_sent = time.monotonic()

    def send_result(self, result) -> None:
        """Send the program's result to the client (rank 0 only), through the scheduler.

        Not as the task's result: a worker dying after the task ended would lose it, and
        Dask would run the task again on that (pinned, gone) worker.
        """
        if self.rank == 0:
            self._send_pending()
            self._progress_queue().put(("result", pickle.dumps(result, protocol=5)))

    def close(self) -> None:
        mailbox.close_box(self.token, self.rank)
        if self._progress is not None:
            self._progress.close()


class RankChunks(ChunkList):
    """One rank's chunks; every pass ends in an allreduce with the other ranks (see :class:`RankComm`).

    ``n_rows`` is the rows of all ranks. The chunks are not copied: a pass runs the chunk
    function on each of them. Only rank 0's reports reach the client.
    """

    def __init__(self, blocks, weights, offsets, dtype, n_features, n_rows, comm: RankComm):
        super().__init__(blocks, weights, offsets, dtype, n_features, n_rows)
        self.comm = comm

    @property
    def rank(self) -> int:
        return self.comm.rank

    def _local(self, chunk_fn, combine_fn, args):
        t0 = time.perf_counter()
        value = super()._local(chunk_fn, combine_fn, args)
        self.comm.last_pass_s = time.perf_counter() - t0
        return value

    def _combine(self, value, combine_fn):
        return self.comm.allreduce(value, combine_fn)

    def report(self, record: dict) -> bool:
        """Rank 0's records go to the client; True on every rank once a stop request reached all."""
        if self.comm.rank == 0:
            self.comm.report(record)
        return self.comm.stop_agreed


def _run_rank(
    fn, args, token, rank, addresses, wait_s, offsets, has_weights, dtype, n_features, n_rows, *refs
):
    """``fn(RankChunks, *args)`` as rank ``rank``; rank 0 sends ``(result, passes, warnings)`` to the client."""
    blocks, weights = split_blocks(refs, has_weights)
    comm = RankComm(token, rank, addresses, wait_s)
    try:
        chunks = RankChunks(blocks, weights, offsets, dtype, n_features, n_rows, comm)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = fn(chunks, *args)
        comm.send_result((result, chunks.passes, [(str(w.message), w.category) for w in caught]))
    finally:
        comm.close()


def run_spmd(
    data, fn: Callable, args: Sequence[Any] = (), on_progress: Callable[[dict], None] | None = None
):
    """``fn(chunks, *args)`` on every worker thread of ``data``'s cluster at once; ``(rank 0's result, its passes)``.

    ``data`` is a :class:`~dkmeans.engine.persisted.PersistedData`; ``chunks`` is a
    :class:`RankChunks`. ``on_progress`` receives, on the client and while the ranks run,
    each record rank 0 passed to ``chunks.comm.report`` (they travel in batches, see
    :meth:`RankComm.report`); where it returns True (a stop request) a
    :class:`distributed.Event` tells rank 0, whose next exchange tells every rank (their
    ``report`` then returns True after one same iteration). Warnings raised on rank 0 are raised
    again here. Rank 0's
    result comes back through the scheduler (see :meth:`RankComm.send_result`); the other
    ranks' return values are dropped.

    Raises
    ------
    SpmdUnavailable
        The ranks could not run together (see the module docstring); nothing was returned.
    """
    client = data.client
    groups = data.placement()
    workers = {addr for addr, _ in groups}
    busy = {addr: tasks for addr, tasks in client.processing(sorted(workers)).items() if tasks}
    if busy:  # ranks queued behind other work would hold their peers' threads while they wait
        raise SpmdUnavailable(f"workers are busy with other tasks: {sorted(busy)}")
    addresses = [addr for addr, _ in groups]
    if not all(addresses):
        raise SpmdUnavailable("some chunks are not held by any worker")
    mailbox.install(client)
    token = f"dkmeans-spmd-{uuid.uuid4().hex[:12]}"
    progress = Queue(_progress_name(token), client=client)  # the client holds it until the end
    stop_asked = False
    layers, deps, keys = {}, {}, []
    shared, needs = task_args(args, token, layers, deps)
    for rank, (addr, chunk_ids) in enumerate(groups):
        refs = data.chunk_refs(chunk_ids)
        key = f"{token}-rank{rank}"
        offsets = tuple(data.offsets[i] for i in chunk_ids)
        task = Task(
            key,
            _run_rank,
            fn,
            shared,
            token,
            rank,
            addresses,
            _spmd_wait_s(),
            offsets,
            data.has_weights,
            data.dtype,
            data.n_features,
            data.n_rows,
            *refs,
        )
        # pinned: two ranks sharing one thread would wait for each other
        annotations = {"workers": [addr], "allow_other_workers": False}
        layers[key] = MaterializedLayer({key: task}, annotations=annotations)
        deps[key] = set(needs)
        keys.append(key)
    with submitting_own_graph():
        futures = client.get(HighLevelGraph(layers, deps), keys, sync=False)

    def stop_ranks():  # waiting ranks stop at once, running ones at their next exchange
        # only workers still in the cluster: a broadcast to a dead one waits out the connect timeout
        live = sorted(workers & set(client.nthreads()))
        if live:
            client.run(mailbox.stop_token, token, workers=live, on_error="ignore")

    outcome = None
    try:
        while outcome is None:
            try:
                with client.as_current():  # wake on each rank's end (an error is looked at at once)
                    wait(
                        [f for f in futures if not f.done()],
                        timeout=POLL_S,
                        return_when="FIRST_COMPLETED",
                    )
            except TimeoutError:
                pass
            for kind, value in progress.get(batch=True):
                if kind == "result":
                    outcome = pickle.loads(value)
                elif on_progress is not None:
                    for record in value:
                        if on_progress(record) and not stop_asked:
                            stop_asked = True
                            Event(_stop_name(token), client=client).set()
            if (
                outcome is not None
                and getattr(client, "generation", data.generation) != data.generation
            ):
                # the cluster restarted as the result came (its placed rows are gone): say so now
                gather(client, futures, data._futures, data.generation)
            if outcome is not None:
                # the other ranks end a moment later; what they do after their last exchange (keep a
                # driver's state in their worker's registry) must be done before the caller goes on
                # (and, say, drops that state everywhere): wait for them, within the ranks' own wait
                try:
                    with client.as_current():
                        wait(futures, timeout=_spmd_wait_s())
                except TimeoutError:
                    pass
                break
            failed = [f.exception() for f in futures if f.status == "error"]
            if failed:
                own = [exc for exc in failed if not isinstance(exc, SpmdUnavailable)]
                if (
                    own
                ):  # an error of the driver itself (bad data): the same one every rank would raise
                    raise own[0]
                raise SpmdUnavailable(str(failed[0]))
            if any(f.status == "cancelled" for f in futures):
                gather(
                    client, futures, data._futures, data.generation
                )  # names the cause (restart, lost input)
                raise SpmdUnavailable("the ranks' tasks were cancelled")
            if not workers <= set(client.nthreads()):  # a rank's worker died: its task cannot run
                raise SpmdUnavailable("a worker running a rank left the cluster")
    except KeyboardInterrupt:
        note_interrupt()  # the ranks are told to stop and their tasks cancelled below
        raise
    finally:
        if (
            outcome is None
        ):  # an error here, or in on_progress: the ranks stop at their next exchange
            try:
                stop_ranks()
            except Exception:  # pragma: no cover - the scheduler is gone; the ranks time out
                pass
        client.cancel(futures)
        progress.close()
        if stop_asked:
            Event(_stop_name(token), client=client).clear()  # the scheduler forgets a cleared event
    result, passes, caught = outcome
    reraise_warnings(caught)
    return result, passes


__all__ = ["RankChunks", "RankComm", "SpmdUnavailable", "run_spmd", "spmd_enabled"]
