"""The cluster a command runs on: a scheduler it connects to, or the embedded local cluster.

The command line's cluster options become one call here; the engine (:mod:`dkmeans.engine.client`)
starts, connects and closes clusters.
"""

from __future__ import annotations

import warnings

from dkmeans.engine.client import (
    EmbeddedClusterWarning,
    close_embedded_cluster,
    connect_scheduler,
    get_client,
    shield_workers_from_signals,
)
from dkmeans.engine.workers import worker_info


def connect_command(
    scheduler: str | None = None,
    *,
    timeout="30s",
    tls_ca_file=None,
    tls_cert=None,
    tls_key=None,
    gpu: bool = False,
    n_workers: int | None = None,
):
    """``(client, opened)``: the client a command runs on, and whether the command must close it.

    With ``scheduler``: a client of that scheduler (``opened`` is True). Otherwise the embedded
    cluster (``gpu``: one worker per GPU; else ``n_workers`` processes, default one per core),
    which :func:`close_command_cluster` closes. A command has no later work of the user's that
    it could run on, so the library's warning that the cluster became the default scheduler is
    not shown; its address is logged. A batch system signals every process of the job, a
    terminal its whole foreground group: the embedded cluster's workers ignore SIGTERM and
    SIGINT, and the command closes them.
    """
    if scheduler:
        client = connect_scheduler(
            scheduler, timeout=timeout, tls_ca_file=tls_ca_file, tls_cert=tls_cert, tls_key=tls_key
        )
        return client, True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmbeddedClusterWarning)
        client = get_client(gpu=True) if gpu else get_client(n_workers=n_workers)
    shield_workers_from_signals(client)
    return client, False


def close_command_cluster() -> None:
    """Close the embedded cluster (if one runs) before the interpreter shuts down: quietly."""
    close_embedded_cluster()


def cluster_size(client) -> tuple[int, int]:
    """``(workers, threads)`` of ``client``'s cluster, asked of the scheduler now."""
    workers = worker_info(client)
    return len(workers), sum(w["nthreads"] for w in workers.values())


__all__ = ["close_command_cluster", "cluster_size", "connect_command"]
