"""The scheduler's view of the workers, read so that no other reader of the client can blank it."""

from __future__ import annotations


def worker_info(client) -> dict:
    """The scheduler's information on every worker of ``client``'s cluster, fetched now.

    ``Client.scheduler_info(n_workers=-1)`` stores the scheduler's answer on the client and then
    returns what is stored; the client's own periodic update stores an answer without per-worker
    entries (``n_workers=0``), and where it lands in between (two fits in two tasks sharing a
    worker's client, a loaded machine) the caller reads no workers at all. So this asks the
    scheduler's ``identity`` itself, as distributed's docstring of ``scheduler_info`` advises.
    """
    return dict(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


__all__ = ["worker_info"]
