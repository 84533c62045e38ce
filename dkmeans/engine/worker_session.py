"""Imported first thing by each worker process of the embedded cluster (a ``distributed`` preload).

Jupyter's stop button, and Ctrl-C in a terminal, send SIGINT to the kernel's (or the shell
job's) whole process group. The embedded cluster's worker processes are children of the
caller, so they are in that group: without this module the signal meant for the caller's
cell also raises ``KeyboardInterrupt`` in every worker, which then dies, and the cluster is
left without workers. Importing this module moves the worker process into a session of its
own (:func:`os.setsid`), out of the caller's process group: an interrupt reaches the caller
only, which cancels its tasks (:mod:`dkmeans.engine.futures`). The workers still end with the
cluster (the nanny closes them), and on their own when the scheduler goes away.

When the caller closes the embedded cluster it first tells each worker so
(:func:`prepare_to_exit`): from then on the worker process logs only critical records. A worker
that closes while a task still runs (the caller was interrupted) logs a warning per running task
("Async instruction ... ended with CancelledError", a case distributed's code names as expected);
a heartbeat in flight while the worker closes its connections logs a traceback ("Failed to
communicate with scheduler during heartbeat"). Neither says anything to a user whose command has
ended: on the caller's terminal they would follow the one line that says it was interrupted.

The move happens only in a worker process a nanny started (its multiprocessing name is
:data:`WORKER_PROCESS`): importing the module anywhere else (documentation tools, tests) changes
nothing. (Not an environment variable: a nanny copies the environment it gives its workers into
its own process, whose other children would inherit it.) Where process sessions do not exist
(Windows), nothing changes either.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
import threading

#: The name distributed's nanny gives the worker processes it starts (``multiprocessing``).
WORKER_PROCESS = "Dask Worker process (from Nanny)"


def detach() -> bool:
    """Move this process into a new session, out of its parent's process group; True if it moved.

    The embedded cluster spawns its workers from threads that block SIGINT
    (:func:`dkmeans.engine.client.start_local_cluster`), so a worker starts with SIGINT blocked:
    an interrupt of the caller's group while the worker was starting (importing, before this
    module) is held pending, not raised. Once out of the group, that pending signal is dropped
    and SIGINT unblocked: from then on only a SIGINT sent to the worker itself reaches it.
    """
    setsid = getattr(os, "setsid", None)
    if setsid is None or multiprocessing.current_process().name != WORKER_PROCESS:
        return False  # not POSIX, or not a worker process
    try:
        setsid()
    except OSError:  # already a session leader (started with a session of its own)
        return False
    _drop_pending_interrupt()
    return True


def _drop_pending_interrupt() -> None:
    """Drop a SIGINT held pending while the process started, then unblock SIGINT (main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGINT)
    if handler is None:  # installed outside Python: leave the signal as it is
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # drops a pending SIGINT, blocked or not (POSIX)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    finally:
        signal.signal(signal.SIGINT, handler)


def prepare_to_exit() -> None:
    """Run in each worker process just before the caller closes the embedded cluster.

    The worker logs only critical records from now on (its shutdown's warnings and tracebacks
    are not the user's business, see the module), and the objects it holds are frozen
    (:func:`gc.freeze`) so that its interpreter's exit skips collecting them: about 1.9 s of
    a worker's exit down to 0.2 s (measured with numba, pandas and pyarrow loaded).
    """
    logging.disable(logging.ERROR)
    gc.freeze()


#: Whether importing this module moved the worker into its own session.
DETACHED = detach()


def dask_setup(worker) -> None:  # noqa: ARG001 - distributed's preload hook; work done at import
    """Nothing more: the process left the caller's process group when this module was imported."""
