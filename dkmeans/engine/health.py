"""Workers that died: told at once, in one line, instead of waiting out ``dkmeans.worker-timeout``.

A cluster without workers may be starting (a batch system's workers still queued, an adaptive
cluster scaling up): a call then waits up to ``dkmeans.worker-timeout`` for one. A cluster whose
workers all *died* is another case: the scheduler saw each of them leave without closing (its
connection dropped, its heartbeats stopped) and none came back. Nothing will come back then
unless someone starts workers, so waiting two minutes only delays the news. :func:`lost_workers`
reads the scheduler's event log (``Client.get_events``) for that case, and, after a short grace
(``dkmeans.lost-worker-grace``, time for a nanny to restart a worker it lost), the call raises
:class:`~dkmeans.errors.NoWorkersError` saying how many workers the cluster had, which left and
why, as far as the scheduler knows.

Relies on the scheduler's event log (``Client.get_events("all")``: its ``add-worker`` and
``remove-worker`` events and the latter's ``stimulus_id`` and ``expected``); without them (an
older or changed scheduler) nothing is said here and the wait for workers is as before.

A worker process started from an interactive process (``Client(n_workers=2)`` in a notebook)
shares that process's group, so Jupyter's interrupt (SIGINT to the kernel's group) stops it
too; dkmeans' embedded cluster starts its workers in sessions of their own
(:mod:`dkmeans.engine.worker_session`). When workers died just after such an interrupt of this
process, the message says so.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass

from dkmeans import config
from dkmeans.errors import NoWorkersError

#: How the scheduler's stimulus of a worker's removal reads, for those that mean it died.
_DIED = {
    "handle-worker-cleanup": (
        "its connection closed without the worker closing: the process died or was killed"
    ),
    "check-worker-ttl": "it sent no heartbeat for distributed.scheduler.worker-ttl",
    "worker-send-comm-fail": "the scheduler could not reach it",
    "send-all-comm-fail": "the scheduler could not reach it",
}
#: An interrupt of this process at most this long from the workers' death is named as its likely
#: cause (s).
INTERRUPT_WINDOW_S = 30.0

#: time.time() of the recent interrupted waits on the cluster (an interrupt is noted where a wait
#: catches it and again where the fit's client block ends, after its clean-up: any of them near
#: the workers' death names the cause)
_last_interrupt: collections.deque = collections.deque(maxlen=8)


def note_interrupt() -> None:
    """Record that a wait on the cluster was interrupted now (KeyboardInterrupt in this process)."""
    _last_interrupt.append(time.time())


def lost_worker_grace() -> float:
    """Seconds a nanny gets to bring back workers that died (``dkmeans.lost-worker-grace``)."""
    return config.get("lost-worker-grace")


@dataclass(frozen=True)
class LostWorkers:
    """Every worker of a cluster died and none came back (:func:`lost_workers`).

    ``known``: how many workers the scheduler's log has seen; ``dead``: ``(address, why)`` of those
    that died; ``since``: when the last of them died (the scheduler's clock, seconds).
    """

    scheduler: str
    known: int
    dead: tuple
    since: float

    def message(self) -> str:
        """The one line that says so."""
        reasons: dict[str, list[str]] = {}
        for address, why in self.dead:
            reasons.setdefault(why, []).append(address)
        detail = "; ".join(f"{', '.join(addresses)}: {why}" for why, addresses in reasons.items())
        interrupt = ""
        if any(abs(self.since - t) <= INTERRUPT_WINDOW_S for t in _last_interrupt):
            interrupt = (
                " They died as this process was interrupted: worker processes "
                "started from it (Client(n_workers=...), LocalCluster) share its "
                "process group and stop with Jupyter's interrupt or Ctrl-C (dkmeans' "
                "own cluster, started by dkmeans.get_client(), keeps its workers out "
                "of it)."
            )
        return (
            f"The Dask cluster at {self.scheduler} has no workers left: {len(self.dead)} of "
            f"the {self.known} workers it had died and none came back ({detail}).{interrupt} "
            f"Start workers again (a LocalCluster: close it and create a new one) and run "
            f"again."
        )


def lost_workers(client) -> LostWorkers | None:
    """The cluster's workers all died and none came back, or None (workers are there, or never
    were, or left as planned: retired, scaled down, restarted, which a wait for workers covers).

    Read from the scheduler's event log of worker arrivals and removals; None when it cannot be
    read.
    """
    try:
        if client.nthreads():
            return None
        events = client.get_events("all")
    except Exception:  # noqa: BLE001 - no answer from the scheduler: nothing can be said here
        return None
    present: dict[str, bool] = {}
    dead: dict[str, tuple[str, float]] = {}
    last_died = False  # whether the last worker to leave died (else it left as planned)
    for timestamp, event in events:
        if not isinstance(event, dict):
            continue
        address = event.get("worker")
        if event.get("action") == "add-worker" and address:
            present[address] = True
            dead.pop(address, None)
        elif event.get("action") == "remove-worker" and address:
            present[address] = False
            stimulus = str(event.get("stimulus_id") or "")
            why = next(
                (text for prefix, text in _DIED.items() if stimulus.startswith(prefix)), None
            )
            last_died = why is not None and not event.get("expected")
            if last_died:
                dead[address] = (why, float(timestamp))
    if not present or any(present.values()) or not last_died:
        return None  # never had workers, has some, or the last left as planned: wait for workers
    spec = getattr(getattr(client, "cluster", None), "worker_spec", None)
    if isinstance(spec, dict) and not spec:
        # a cluster object in this process asks for no workers (scaled to zero): they were closed,
        # which the scheduler cannot tell from a death (the closed worker's connection drops)
        return None
    return LostWorkers(
        scheduler=str(client.scheduler.address),
        known=len(present),
        dead=tuple((address, why) for address, (why, _) in sorted(dead.items())),
        since=max(t for _, t in dead.values()),
    )


def raise_if_lost(client) -> None:
    """Raise :class:`NoWorkersError` when every worker died and their grace to come back passed."""
    lost = lost_workers(client)
    if lost is not None and time.time() - lost.since >= lost_worker_grace():
        raise NoWorkersError(lost.message())


__all__ = ["LostWorkers", "lost_worker_grace", "lost_workers", "note_interrupt", "raise_if_lost"]
