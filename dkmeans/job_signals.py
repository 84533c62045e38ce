"""How a command-line job stops on SIGTERM or SIGINT: stop the work, save, close, exit 143 or 130.

Batch systems end a job with SIGTERM and a grace period before SIGKILL: SLURM's ``scancel``
and time limit (``KillWait``, 30 s by default), Kubernetes' pod termination
(``terminationGracePeriodSeconds``, 30 s by default). A terminal sends SIGINT (Ctrl-C).
While a command runs, :class:`JobSignals` turns the first of either signal into a
:class:`~dkmeans.errors.JobInterrupted` in the main thread: the fit stops where it is and,
on its way out, writes its checkpoint (the last finished iteration), and the command closes
its cluster and exits with ``128 + signal`` (143, 130).

The cleanup has :data:`GRACE_SECONDS` in all: if it is not done by then, or when a second
SIGINT comes (Ctrl-C again; a second SIGTERM is ignored, as a batch system and a job script may
both send one), the command kills its worker processes and exits at once with the same status
(a checkpoint being written is either whole or absent: it is written under a temporary name and
renamed).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading

from dkmeans.errors import JobInterrupted

#: Seconds from the first signal to the latest exit: well inside SLURM's default KillWait (30 s).
GRACE_SECONDS = 20.0

#: The signals a job stops on.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def signal_name(signum: int) -> str:
    """``"SIGTERM"`` for 15, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class JobSignals:
    """While entered (in the main thread), SIGTERM and SIGINT stop the command (see the module).

    Parameters
    ----------
    grace : float
        Seconds the cleanup may take after the first signal before the process exits anyway.
    quiet : tuple of str
        Loggers silenced (but for critical records) from the first signal on: a batch system
        stops the job's Dask scheduler and workers at the same moment, and distributed's client
        then logs, with tracebacks, every connection it loses on the way out.

    Attributes
    ----------
    received : int or None
        The first signal received.
    """

    def __init__(self, grace: float = GRACE_SECONDS, quiet: tuple = ("distributed",)):
        self.grace = float(grace)
        self.quiet = tuple(quiet)
        self._levels: dict = {}
        self.received: int | None = None
        self._previous: dict = {}
        self._deadline: threading.Timer | None = None
        self._deferring = False

    @property
    def exit_status(self) -> int:
        """The shell's convention for a process ended by a signal: ``128 + signal``."""
        return 128 + int(self.received or signal.SIGINT)

    def __enter__(self) -> JobSignals:
        if threading.current_thread() is threading.main_thread():  # signal handlers live there only
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if self._deadline is not None:
            self._deadline.cancel()
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)

    @contextlib.contextmanager
    def deferred(self):
        """A first signal here is noted (its grace period starts); the enclosed cleanup goes on."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum
            self._silence()
            self._deadline = threading.Timer(
                self.grace,
                self._exit_now,
                args=(f"not done {self.grace:g} s after {signal_name(signum)}",),
            )
            self._deadline.daemon = True
            self._deadline.start()
            if not self._deferring:
                raise JobInterrupted(signum)
            return
        if signum == signal.SIGINT:  # Ctrl-C again: the user does not want to wait
            self._exit_now("SIGINT again")
        # another SIGTERM: a batch system signals every process of the job, and a job script may
        # forward its own SIGTERM too; the cleanup goes on (the grace period still holds)

    def _silence(self) -> None:
        """Raise the loggers of :attr:`quiet` (and their children, which have levels of their own:
        ``distributed.client``) to CRITICAL; ``__exit__`` restores them."""
        names = [
            name
            for name in list(logging.root.manager.loggerDict)
            if any(name == q or name.startswith(q + ".") for q in self.quiet)
        ]
        for name in {*names, *self.quiet}:
            self._levels[name] = logging.getLogger(name).level
            logging.getLogger(name).setLevel(logging.CRITICAL)

    def _exit_now(self, why: str) -> None:
        """Kill the worker processes this process started and exit (the cleanup took too long)."""
        try:
            sys.stderr.write(
                f"dkmeans: interrupted ({signal_name(self.received)}); cleanup {why}: "
                "stopping now\n"
            )
            sys.stderr.flush()
        except (OSError, ValueError):  # a closed stream: exit all the same
            pass
        for child in multiprocessing.active_children():
            child.kill()
        os._exit(self.exit_status)


__all__ = ["GRACE_SECONDS", "JobSignals", "STOP_SIGNALS", "signal_name"]
