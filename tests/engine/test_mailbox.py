"""The worker-to-worker messages of SPMD loops (dkmeans.engine.mailbox) and the allreduce on them."""

from __future__ import annotations

import pickle
import threading
import uuid
from types import SimpleNamespace

import numpy as np
import pytest

from dkmeans.engine import mailbox
from dkmeans.engine.spmd import RankComm, SpmdUnavailable


def _token() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_a_message_for_a_rank_that_has_not_started_waits_in_its_mailbox():
    token = _token()
    mailbox.deliver(token, 1, ["pass", 0, 0, 0.5, b"x"])  # msgpack delivers tuples as lists
    box = mailbox.open_box(token, 1)
    assert box.get_nowait() == ("pass", 0, 0, 0.5, b"x")
    assert box.empty()
    mailbox.close_box(token, 1)


def test_messages_to_a_finished_rank_are_dropped():
    token = _token()
    box = mailbox.open_box(token, 0)
    mailbox.close_box(token, 0)
    mailbox.deliver(token, 0, ("pass", 3, 1, 0.0, b""))
    assert box.empty()
    assert (token, 0) not in mailbox._boxes
    with pytest.raises(RuntimeError, match="already ran"):
        mailbox.open_box(token, 0)


def test_stop_reaches_running_and_later_ranks_of_that_loop_only():
    token, other = _token(), _token()
    running = mailbox.open_box(token, 0)
    bystander = mailbox.open_box(other, 0)
    mailbox.stop_token(token)
    assert running.get_nowait() == (mailbox.STOP,)
    assert mailbox.open_box(token, 1).get_nowait() == (mailbox.STOP,)  # started after the stop
    assert bystander.empty()
    for key in [(token, 0), (token, 1), (other, 0)]:
        mailbox.close_box(*key)


def _in_process(token, size, rank, wait_s=10.0):
    """A rank whose peers are all on this (fake) worker: messages go straight to their mailboxes."""
    worker = SimpleNamespace(address="inproc://here")
    return RankComm(token, rank, ["inproc://here"] * size, wait_s, worker=worker)


def _stack(parts):
    return np.stack(parts)


def test_every_rank_gets_the_same_combination_in_rank_order():
    token, size = _token(), 3
    results = {}

    def run(rank):
        comm = _in_process(token, size, rank)
        try:
            results[rank] = [
                comm.allreduce(np.array([rank, step], float), _stack) for step in range(4)
            ]
        finally:
            comm.close()

    threads = [
        threading.Thread(target=run, args=(rank,)) for rank in (2, 1, 0)
    ]  # start order does not matter
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results) == [0, 1, 2]
    for step in range(4):
        expected = np.array([[0, step], [1, step], [2, step]], float)
        for rank in range(size):
            np.testing.assert_array_equal(results[rank][step], expected)


def _pass_message(seq, rank, value, seconds=0.0, stop=False):
    return (mailbox.PASS, seq, rank, seconds, pickle.dumps(value), stop)


def test_a_stop_request_reaches_every_rank_after_the_same_exchange():
    """Rank 0 learns of the client's stop request between two exchanges; it travels with its next
    message, so every rank's ``stop_agreed`` turns True after that same exchange (and every rank
    then stops at the same iteration)."""
    token, size = _token(), 3
    seen = {}

    def run(rank):
        comm = _in_process(token, size, rank)
        try:
            seen[rank] = []
            for step in range(4):
                comm.allreduce(np.array([rank, step], float), _stack)
                seen[rank].append(comm.stop_agreed)
                if rank == 0 and step == 1:  # as a report would find the client's request
                    comm.stop_asked = True
        finally:
            comm.close()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert seen == {rank: [False, False, True, True] for rank in range(size)}


def test_a_pass_that_overtakes_the_one_before_is_kept_for_its_turn():
    token = _token()
    comm = _in_process(token, 2, 0)  # rank 1 is played by hand
    try:
        mailbox.deliver(token, 0, _pass_message(1, 1, "b1", seconds=0.25))
        mailbox.deliver(token, 0, _pass_message(0, 1, "b0", seconds=0.5))
        assert comm.allreduce("a0", list) == ["a0", "b0"]
        assert comm.slowest_pass_s == 0.5
        assert comm.allreduce("a1", list) == ["a1", "b1"]
        sent = mailbox.open_box(token, 1)
        assert [sent.get_nowait()[1:3] for _ in range(2)] == [
            (0, 0),
            (1, 0),
        ]  # (pass, rank) sent to rank 1
        mailbox.close_box(token, 1)
    finally:
        comm.close()


@pytest.mark.parametrize(
    "message, match",
    [
        (_pass_message(0, 1, "old"), "got pass 0 while in pass 1"),
        ((mailbox.STOP,), "told to stop"),
        ((mailbox.FAILED, "OSError: no route"), "could not reach a peer: OSError: no route"),
    ],
)
def test_a_rank_gives_up_on_a_stop_a_failure_or_a_stale_pass(message, match):
    token = _token()
    comm = _in_process(token, 2, 1)
    try:
        mailbox.deliver(token, 1, _pass_message(0, 0, "first"))
        assert comm.allreduce("mine", list) == ["first", "mine"]
        mailbox.deliver(token, 1, message)
        with pytest.raises(SpmdUnavailable, match=match):
            comm.allreduce("mine", list)
    finally:
        comm.close()
        mailbox.close_box(token, 0)


def test_a_rank_gives_up_after_its_patience():
    comm = _in_process(_token(), 2, 1, wait_s=0.05)
    try:
        with pytest.raises(SpmdUnavailable, match="waited 0.1 s"):
            comm.allreduce("alone", list)
    finally:
        comm.close()
        mailbox.close_box(comm.token, 0)
