"""Resources: no leak over 10,000 messages, the GIL released during a large transfer, views
that keep received memory alive."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Callable
from typing import TypeVar

import numpy as np

import tensorwire as tw
from helpers import open_fds, rss_bytes

T = TypeVar("T")


def test_ten_thousand_create_and_drop_cycles_leak_nothing(node: tw.Node, server: tw.Node) -> None:
    ref = node.ref(server.address, "echo", transport="raw")
    payload = np.ones(4096, np.uint8)

    def cycle(n: int) -> None:
        for _ in range(n):
            reply = ref.ask(tw.TensorMessage(b"m", [payload]))
            view = np.frombuffer(reply.buffers[0], np.uint8)
            assert view[0] == 1
            del reply, view

    cycle(500)  # warm: pools, connections
    gc.collect()
    fds, rss = open_fds(), rss_bytes()
    probe = bytearray(b"p" * 4096)
    probe_msg = tw.TensorMessage(b"", [probe])
    probe_reply = ref.ask(probe_msg)
    dead = (weakref.ref(probe_msg), weakref.ref(probe_reply), weakref.ref(probe_reply.buffers[0]))
    del probe_msg, probe_reply
    cycle(10_000)
    gc.collect()
    tw.tensor_transport_stats()  # drains released exports
    assert all(d() is None for d in dead)
    probe.extend(b"q")  # its export was released: it can be resized again
    assert open_fds() <= fds + 2
    grown = rss_bytes() - rss
    assert grown < 32 << 20, f"RSS grew {grown >> 20} MiB over 10,000 asks"


def ticks_while(action: Callable[[], T]) -> tuple[T, int, float]:
    """Runs ``action`` while another thread counts a tick per millisecond it gets to run: the
    action's result, the ticks and the seconds it took."""
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=count)
    t.start()
    start = time.monotonic()
    try:
        result = action()
    finally:
        elapsed = time.monotonic() - start
        stop.set()
        t.join()
    return result, ticks, elapsed


def test_the_gil_is_released_during_a_256_mib_transfer(node: tw.Node, server: tw.Node) -> None:
    big = np.ones(256 << 20, np.uint8)
    reply, ticks, elapsed = ticks_while(
        lambda: node.ref(server.address, "echo", transport="raw").ask(
            tw.TensorMessage(b"", [big]), timeout=60
        )
    )
    assert reply.total_bytes == 256 << 20
    assert np.frombuffer(reply.buffers[0], np.uint8)[::4096].min() == 1
    # The other thread kept running: at least a tick per 10 ms of the transfer.
    assert ticks >= elapsed * 100 * 0.5 or ticks >= 10, (ticks, elapsed)


def test_the_gil_is_released_while_a_large_loan_is_mapped(node: tw.Node) -> None:
    def three_loans() -> None:
        for _ in range(3):  # each maps 256 MiB of pages: tens of ms
            loan = node.loan(256 << 20)
            del loan

    _, ticks, elapsed = ticks_while(three_loans)
    # The other thread kept running: at least a tick per 20 ms of the loans.
    assert ticks >= elapsed * 50, (ticks, elapsed)


def test_received_memory_lives_while_a_view_does(node: tw.Node, server: tw.Node) -> None:
    reply = node.ref(server.address, "echo", transport="raw").ask(
        tw.TensorMessage(b"", [np.arange(1 << 20, dtype=np.uint32)])
    )
    view = np.frombuffer(reply.buffers[0], np.uint32)
    del reply
    gc.collect()
    for _ in range(20):  # reuse of freed receive memory would overwrite it
        node.ref(server.address, "echo", transport="raw").ask(
            tw.TensorMessage(b"", [np.zeros(1 << 20, np.uint32)])
        )
    assert np.array_equal(view, np.arange(1 << 20, dtype=np.uint32))


def test_a_node_left_open_with_handler_threads_does_not_hang_the_interpreters_exit() -> None:
    # At exit, a handler thread that wakes cannot take the GIL any more (CPython parks it for
    # good): the node dropped during finalization must not wait for it.
    import subprocess
    import sys

    script = (
        "import tensorwire as tw\n"
        "n = tw.Node()\n"
        "n.serve('echo', lambda m: m, threads=2)\n"
        "r = n.ref(n.address, 'echo')\n"
        "assert r.ask(tw.TensorMessage(b'', [b'abc'])).route == 'local'\n"
        "print('asked')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "asked"
