"""`Ref.ask_nowait`: several asks in flight from one thread, each waited for with
`Pending.result()` on that thread — replies, errors, timeouts of the wait, cancellation."""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np
import pytest

import tensorwire as tw


@pytest.mark.parametrize("transport", ["auto", "shm", "raw"])
def test_a_window_of_asks_gets_every_reply_in_order(
    node: tw.Node, server: tw.Node, transport: str
) -> None:
    ref = node.ref(server.address, "echo", transport=transport)
    payloads = [np.full(1000 + i, i, dtype=np.uint8) for i in range(200)]
    window: deque[tuple[int, tw.Pending[tw.Answer]]] = deque()
    answered = 0

    def take_oldest() -> None:
        nonlocal answered
        j, pending = window.popleft()
        reply = pending.result()
        assert isinstance(reply, tw.TensorMessage) and reply.metadata == str(j).encode()
        assert bytes(reply.buffers[0]) == payloads[j].tobytes()
        answered += 1

    for i, payload in enumerate(payloads):
        window.append((i, ref.ask_nowait(tw.TensorMessage(str(i).encode(), [payload]))))
        if len(window) == 8:
            take_oldest()
    while window:
        take_oldest()
    assert answered == len(payloads)


def test_results_can_be_taken_in_any_order_and_again(node: tw.Node, server: tw.Node) -> None:
    ref = node.ref(server.address, "sum", transport="shm")
    pendings = [ref.ask_nowait(tw.TensorMessage(b"", [b"x" * n])) for n in (10, 20, 30)]
    assert [p.result(timeout=10) for p in reversed(pendings)] == [b"30", b"20", b"10"]
    assert all(p.done() for p in pendings)
    first = pendings[0].result()
    assert first == b"10" and pendings[0].result() is first
    assert pendings[0].cancel() is False  # finished: nothing to cancel


def test_the_asks_error_is_raised_by_result_every_time(node: tw.Node, server: tw.Node) -> None:
    fail = node.ref(server.address, "fail", transport="shm")
    pending = fail.ask_nowait(tw.TensorMessage(b"", []))
    for _ in range(2):
        with pytest.raises(tw.RemoteError, match="refused"):
            pending.result(timeout=10)
    missing = node.ref(server.address, "nobody", transport="raw").ask_nowait(
        tw.TensorMessage(b"", [])
    )
    with pytest.raises(tw.UnknownEndpoint):
        missing.result(timeout=10)


@pytest.mark.parametrize("transport", ["shm", "raw"])
def test_a_wait_that_times_out_leaves_the_ask_going(
    node: tw.Node, server: tw.Node, transport: str
) -> None:
    pending = node.ref(server.address, "slow", transport=transport).ask_nowait(
        tw.TensorMessage(b"0.5", []), timeout=10
    )
    # The handler answers after 0.5 s: a wait that honours its 0.05 s limit raises first.
    with pytest.raises(tw.DeadlineExceeded, match="goes on"):
        pending.result(timeout=0.05)
    assert not pending.done()
    assert pending.result(timeout=10) is None  # the slow handler's ack arrives later


def test_the_asks_own_timeout_ends_a_wait_without_a_limit(node: tw.Node, server: tw.Node) -> None:
    pending = node.ref(server.address, "slow", transport="shm").ask_nowait(
        tw.TensorMessage(b"2", []), timeout=0.2
    )
    start = time.monotonic()
    with pytest.raises(tw.DeadlineExceeded):
        pending.result()
    assert time.monotonic() - start < 1.5


@pytest.mark.parametrize("transport", ["shm", "raw"])
def test_cancel_ends_an_ask_in_flight(server: tw.Node, transport: str) -> None:
    sender = tw.Node()
    pending = sender.ref(server.address, "slow", transport=transport).ask_nowait(
        tw.TensorMessage(b"3", []), timeout=10
    )
    time.sleep(0.1)  # sent: the slow handler has it
    assert pending.cancel() is True
    assert pending.done()
    with pytest.raises(tw.Cancelled):
        pending.result(timeout=1)
    assert pending.cancel() is False
    # A graceful close waits for the asks in flight: one not cancelled in the engine would
    # hold it for the slow handler's 3 s.
    start = time.monotonic()
    sender.close(timeout=10)
    assert time.monotonic() - start < 1.5


def test_only_one_thread_waits_for_an_ask(node: tw.Node, server: tw.Node) -> None:
    pending = node.ref(server.address, "slow", transport="shm").ask_nowait(
        tw.TensorMessage(b"1", []), timeout=10
    )
    results: list[object] = []
    waiter = threading.Thread(target=lambda: results.append(pending.result(timeout=10)))
    waiter.start()
    time.sleep(0.3)  # the waiter is in its wait (the handler sleeps 1 s)
    with pytest.raises(tw.InvalidArgument, match="another thread"):
        pending.result(timeout=5)
    assert pending.cancel() is False  # a thread waits for it
    waiter.join(10)
    assert results == [None]
    assert pending.result() is None  # once done, any thread gets it


def test_replies_land_in_the_callers_arrays(node: tw.Node, server: tw.Node) -> None:
    ref = node.ref(server.address, "echo", transport="shm")
    sent = [np.arange(4096, dtype=np.float32) + i for i in range(4)]
    intos = [np.zeros(4096, dtype=np.float32) for _ in range(4)]
    pendings = [
        ref.ask_nowait(tw.TensorMessage(b"", [s]), into=[into])
        for s, into in zip(sent, intos, strict=True)
    ]
    for pending, s, into in zip(pendings, sent, intos, strict=True):
        reply = pending.result(timeout=10)
        assert isinstance(reply, tw.TensorMessage)
        assert np.array_equal(into, s)
    with pytest.raises(tw.InvalidArgument):
        ref.ask_nowait(tw.TensorMessage(b"", [sent[0]]), into=[np.zeros(3)]).result(timeout=10)


def test_an_unwaited_pending_dropped_cancels_its_ask(server: tw.Node) -> None:
    # A node's graceful close waits for the asks in flight: one still going would hold it
    # for the slow handler's 3 s.
    sender = tw.Node()
    pending = sender.ref(server.address, "slow", transport="raw").ask_nowait(
        tw.TensorMessage(b"3", []), timeout=10
    )
    time.sleep(0.1)
    del pending
    start = time.monotonic()
    sender.close(timeout=10)
    assert time.monotonic() - start < 1.5
