"""Direct messages between the ranks of an SPMD loop, from worker to worker.

The ranks of :mod:`dkmeans.engine.spmd` exchange their partials once per pass, so the
exchange's latency is paid every iteration. A :class:`distributed.Queue` goes through
the scheduler: two hops and the scheduler's event loop, about 1.5 ms per exchange on
two local workers. Here each worker has a handler, installed by :class:`MailboxPlugin`
(a ``WorkerPlugin``, as Dask's own P2P shuffle installs its handlers), and a rank sends
straight to its peer's worker over that worker's connection pool (``Worker.rpc``):
one hop over Dask's comms, about 0.45 ms per exchange between two local workers.
No transport of our own.

Every worker process keeps one registry of mailboxes, keyed by ``(token, rank)``: a
message for a rank whose task has not started yet waits in its mailbox; one for a rank
that has finished is dropped; :func:`stop_token` tells every rank of a loop on this
worker, running or still to start, to stop.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

#: The worker handler's name (an ``op`` of Dask's comm protocol).
HANDLER = "dkmeans_spmd_deliver"
#: The name the plugin is registered under.
PLUGIN_NAME = "dkmeans-spmd-mailbox"
#: Message kinds; a pass message is ``(PASS, seq, rank, seconds, payload, stop)`` (``stop``:
#: rank 0 tells every rank that the client asked the loop to stop, see
#: :mod:`dkmeans.engine.spmd`).
PASS, STOP, FAILED = "pass", "stop", "failed"
#: How many finished ranks and stopped loops a worker remembers (late messages are dropped).
REMEMBER = 1024

_lock = threading.Lock()
_boxes: dict[tuple[str, int], queue.SimpleQueue] = {}
_closed: deque = deque(maxlen=REMEMBER)
_stopped: deque = deque(maxlen=REMEMBER)


def _box(key: tuple[str, int]) -> queue.SimpleQueue | None:
    """The mailbox of ``key``, created on first use; None once its rank has finished (lock held)."""
    box = _boxes.get(key)
    if box is None and key not in _closed:
        box = _boxes[key] = queue.SimpleQueue()
        if key[0] in _stopped:
            box.put((STOP,))
    return box


def open_box(token: str, rank: int) -> queue.SimpleQueue:
    """The mailbox of rank ``rank`` of loop ``token`` on this worker (with what already arrived)."""
    with _lock:
        box = _box((token, rank))
    if box is None:
        raise RuntimeError(f"rank {rank} of {token} already ran on this worker")
    return box


def close_box(token: str, rank: int) -> None:
    """Drop the mailbox; later messages to it are ignored."""
    with _lock:
        _boxes.pop((token, rank), None)
        _closed.append((token, rank))


def deliver(token: str, rank: int, message: Any) -> None:
    """Put ``message`` in the mailbox of rank ``rank`` of loop ``token`` (the worker handler)."""
    with _lock:
        box = _box((token, int(rank)))
    if box is not None:
        box.put(tuple(message))  # msgpack turns tuples into lists


def stop_token(token: str) -> None:
    """Tell every rank of loop ``token`` on this worker to stop, including ranks yet to start."""
    with _lock:
        _stopped.append(token)
        boxes = [box for (name, _), box in _boxes.items() if name == token]
    for box in boxes:
        box.put((STOP,))


class MailboxPlugin(WorkerPlugin):
    """Installs :func:`deliver` as the worker handler :data:`HANDLER`."""

    idempotent = True

    def setup(self, worker) -> None:
        worker.handlers[HANDLER] = deliver

    def teardown(self, worker) -> None:
        # A peer's message may still come while this worker closes (a loop stopped by an interrupt,
        # or the cluster closing): dropped quietly, not refused with a traceback in the log.
        worker.handlers[HANDLER] = _drop


def _drop(**message) -> None:  # noqa: ARG001 - the handler of a worker whose plugin was removed
    """Ignore a message to a worker whose mailboxes are gone."""


def install(client) -> None:
    """Make sure every worker of ``client``'s cluster, present or future, has the handler."""
    client.register_plugin(MailboxPlugin(), name=PLUGIN_NAME)


async def _post(worker, address: str, token: str, rank: int, message: tuple) -> None:
    await getattr(worker.rpc(address), HANDLER)(
        token=token, rank=rank, message=message, reply=False
    )


def send(
    worker,
    address: str,
    token: str,
    rank: int,
    message: tuple,
    on_error: Callable[[BaseException], None],
) -> None:
    """Send ``message`` to rank ``rank`` of ``token`` on the worker at ``address`` (from a task thread).

    Does not wait: the message goes out from the worker's event loop. A failure to send
    (the peer's worker is gone) is passed to ``on_error``, in the event loop's thread.
    """
    if address == worker.address:
        deliver(token, rank, message)
        return
    future = asyncio.run_coroutine_threadsafe(
        _post(worker, address, token, rank, message), worker.loop.asyncio_loop
    )

    def sent(done):
        if not done.cancelled() and done.exception() is not None:
            on_error(done.exception())

    future.add_done_callback(sent)


__all__ = ["MailboxPlugin", "close_box", "deliver", "install", "open_box", "send", "stop_token"]
