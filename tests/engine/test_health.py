"""Workers that died are named at once; workers that left as planned, or never came, are waited
for."""

from __future__ import annotations

import time

import dask
import pytest

from dkmeans.engine import health
from dkmeans.engine.memory import _wait_for_workers
from dkmeans.errors import NoWorkersError


class _Scheduler:
    address = "tcp://127.0.0.1:8786"


class _Client:
    """The scheduler's answers a health check reads: worker threads and the event log."""

    scheduler = _Scheduler()

    def __init__(self, events, workers=None):
        self.events, self.workers = events, dict(workers or {})

    def nthreads(self):
        return self.workers

    def get_events(self, topic):
        assert topic == "all"
        return self.events

    def wait_for_workers(self, n, timeout=None):
        time.sleep(min(timeout or 0, 0.05))
        raise TimeoutError


def _add(t, w):
    return (t, {"action": "add-worker", "worker": w})


def _remove(t, w, stimulus, expected=False):
    return (
        t,
        {
            "action": "remove-worker",
            "worker": w,
            "stimulus_id": f"{stimulus}-{t}",
            "expected": expected,
        },
    )


def test_workers_that_all_died_are_named_with_why():
    now = time.time()
    client = _Client(
        [
            _add(now - 50, "tcp://a:1"),
            _add(now - 50, "tcp://b:2"),
            (now - 40, {"action": "gather"}),
            _remove(now - 30, "tcp://a:1", "handle-worker-cleanup"),
            _remove(now - 29, "tcp://b:2", "check-worker-ttl"),
        ]
    )
    lost = health.lost_workers(client)
    assert lost is not None and lost.known == 2 and lost.since == pytest.approx(now - 29)
    message = lost.message()
    assert "\n" not in message
    assert "2 of the 2 workers it had died" in message and "tcp://127.0.0.1:8786" in message
    assert "tcp://a:1: its connection closed" in message
    assert "tcp://b:2: it sent no heartbeat" in message
    with pytest.raises(NoWorkersError, match="no workers left"):
        health.raise_if_lost(client)


def test_the_interrupt_is_named_when_the_workers_died_with_it():
    now = time.time()
    health.note_interrupt()
    client = _Client(
        [_add(now - 5, "tcp://a:1"), _remove(now, "tcp://a:1", "handle-worker-cleanup")]
    )
    assert "died as this process was interrupted" in health.lost_workers(client).message()
    health._last_interrupt.clear()
    assert "interrupted" not in health.lost_workers(client).message()


def test_the_interrupt_is_named_when_a_later_clean_up_noted_it_again():
    """A wait noted the interrupt as the workers died; the fit's clean-up, ending 40 s later,
    noted it again: the first noting still names the cause."""
    now = time.time()
    health._last_interrupt.clear()
    health._last_interrupt.extend([now, now + 40.0])
    client = _Client(
        [_add(now - 5, "tcp://a:1"), _remove(now, "tcp://a:1", "handle-worker-cleanup")]
    )
    try:
        assert "died as this process was interrupted" in health.lost_workers(client).message()
        health._last_interrupt.popleft()  # only the clean-up's, 40 s after the death
        assert "interrupted" not in health.lost_workers(client).message()
    finally:
        health._last_interrupt.clear()


@pytest.mark.parametrize(
    "events, workers",
    [
        ([], {}),  # never had workers: starting (a batch system's queue): wait
        ([_add(1.0, "tcp://a:1")], {"tcp://a:1": 1}),  # has workers
        # closed as planned (scaled down)
        ([_add(1.0, "tcp://a:1"), _remove(2.0, "tcp://a:1", "nanny-close")], {}),
        ([_add(1.0, "tcp://a:1"), _remove(2.0, "tcp://a:1", "retire-workers", expected=True)], {}),
        # one died, then the last one was retired: the cluster is being scaled, not dead
        (
            [
                _add(1.0, "tcp://a:1"),
                _add(1.0, "tcp://b:2"),
                _remove(2.0, "tcp://a:1", "handle-worker-cleanup"),
                _remove(3.0, "tcp://b:2", "nanny-close"),
            ],
            {},
        ),
        # a worker died and its nanny brought a new one
        (
            [
                _add(1.0, "tcp://a:1"),
                _remove(2.0, "tcp://a:1", "handle-worker-cleanup"),
                _add(3.0, "tcp://a:3"),
            ],
            {"tcp://a:3": 1},
        ),
    ],
)
def test_no_verdict_where_workers_are_there_or_may_come(events, workers):
    assert health.lost_workers(_Client(events, workers)) is None


def test_a_cluster_scaled_to_zero_is_waited_for():
    """Closed workers drop their connections as dead ones do: the cluster object (in this process)
    tells a scale-down (it asks for no workers) from a death (it still asks for them)."""
    now = time.time()
    events = [_add(now - 9, "tcp://a:1"), _remove(now - 5, "tcp://a:1", "handle-worker-cleanup")]

    class Cluster:
        def __init__(self, spec):
            self.worker_spec = spec

    scaled, dead = _Client(events), _Client(events)
    scaled.cluster, dead.cluster = Cluster({}), Cluster({0: {"cls": object}})
    assert health.lost_workers(scaled) is None
    assert health.lost_workers(dead) is not None


def test_an_unreadable_scheduler_gives_no_verdict():
    assert health.lost_workers(object()) is None


def test_waiting_for_workers_stops_once_the_grace_has_passed():
    now = time.time()
    client = _Client(
        [_add(now - 10, "tcp://a:1"), _remove(now - 0.2, "tcp://a:1", "handle-worker-cleanup")]
    )
    with dask.config.set({"dkmeans.worker-timeout": "60s", "dkmeans.lost-worker-grace": "1s"}):
        started = time.monotonic()
        with pytest.raises(NoWorkersError, match="1 of the 1 workers it had died"):
            _wait_for_workers(client)
        assert 0.5 < time.monotonic() - started < 10  # the grace, not worker-timeout
    never = _Client([])
    with dask.config.set({"dkmeans.worker-timeout": "1s"}):
        with pytest.raises(NoWorkersError, match="no workers for 1 s"):
            _wait_for_workers(never)
