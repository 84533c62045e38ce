"""The scheduler's view of the workers, read without the client's stored answer."""

from __future__ import annotations

from dkmeans.engine.workers import worker_info


def test_worker_info_is_the_schedulers_answer_whatever_the_client_stored(client):
    """The client's periodic update stores an answer without per-worker entries (``n_workers=0``); a
    ``scheduler_info(n_workers=-1)`` read right after it saw no workers (a fit inside a task failed on an
    empty memory budget). ``worker_info`` asks the scheduler itself."""
    expected = set(client.scheduler_info(n_workers=-1)["workers"])
    assert len(expected) >= 2
    client.sync(
        client._update_scheduler_info, n_workers=0
    )  # (private: the periodic update, reproduced)
    assert not client._scheduler_identity["workers"]  # what scheduler_info returned in the race
    info = worker_info(client)
    assert set(info) == expected
    assert all(w["memory_limit"] > 0 and "metrics" in w for w in info.values())
