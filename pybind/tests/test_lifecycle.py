"""A node's life: a fork (every start method, and a torch DataLoader with workers), a graceful
close that finishes what is in flight (PTR1 on io_uring and on the tokio fallback, HTTP/2,
shared memory, in process; `close()`, the `with` block, the interpreter's exit), and misuse
that gets a clear error."""

from __future__ import annotations

import asyncio
import multiprocessing
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import forked
import tensorwire as tw

BIG = 64 << 20


@pytest.fixture
def parent() -> Iterator[tw.Node]:
    with tw.Node() as node:
        node.serve("echo", lambda m: m, threads=2)
        forked.INHERITED.update(
            node=node, ref=node.ref(node.address, "echo"), endpoint=node.endpoint("mailbox")
        )
        node.ref(node.address, "echo").ask(
            tw.TensorMessage(b"warm", [])
        )  # threads and timers exist
        # An ask in flight at the fork, over shared memory to another node (nobody receives
        # from its mailbox).
        with tw.Node() as other:
            mailbox = other.endpoint("mailbox")  # kept: an endpoint dropped is removed
            pending = node.ref(other.address, "mailbox", transport="shm").ask_nowait(
                tw.TensorMessage(b"", []), timeout=60
            )
            forked.INHERITED["pending"] = pending
            # Shared memory a child does not inherit: views of `other`'s segment (a reply it
            # made: an echo would come back in the asker's own slot) — one looked at here, one
            # whose buffers and 32 KiB of metadata nobody looked at before the fork — and an
            # open loan's window.
            other.serve(
                "fresh",
                lambda m: tw.TensorMessage(b"m" * (32 << 10), [np.full(1 << 20, 7, np.uint8)]),
            )
            fresh = node.ref(other.address, "fresh", transport="shm")
            reply = fresh.ask(tw.TensorMessage(b"", []))
            assert reply.route == "shm"
            forked.INHERITED.update(
                shm_buffer=reply.buffers[0],
                shm_message=fresh.ask(tw.TensorMessage(b"", [])),
                loan=node.loan(1 << 20),
                shm=node.shm,
            )
            yield node
            assert pending.cancel() is True, "the child left the parent's ask alone"
            del mailbox
            forked.INHERITED.clear()


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_a_child_process_fails_at_once_on_inherited_nodes_and_makes_its_own(
    parent: tw.Node, method: str
) -> None:
    ctx = multiprocessing.get_context(method)
    results = ctx.Queue()
    child = ctx.Process(target=forked.child, args=(parent.address, results))
    child.start()
    try:
        report = results.get(timeout=60)
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    assert "failed" not in report, report
    assert child.exitcode == 0
    assert report["own_in_process"] and report["own_to_parent"], report
    assert report["own_route_to_parent"] in ("shm", "raw"), report
    assert report["own_deadline"] == "DeadlineExceeded", "the child's deadlines fire"
    if method == "fork":
        for call in (
            "ask",
            "tell",
            "ref",
            "endpoint",
            "recv",
            "stats",
            "ask_nowait",
            "pending",
            "pending_cancel",
        ):
            assert report[call] == "ShutDown: fork", (call, report[call])
        # Every call failed at once, well within the 3 s timeouts given.
        assert report["inherited_seconds"] < 2.0, report
        # Shared memory of the parent's is refused with a clear error, not a crash, and
        # dropping it in the child neither crashes nor hangs (the child got this far).
        for read in (
            "shm_bytes",
            "shm_numpy",
            "shm_memoryview",
            "shm_dlpack",
            "loan_view",
            "loan_freeze",
            "message_buffer",
            "message_metadata",
            "message_copy",
            "message_sent_on",
        ):
            assert report[read] == "BufferError: fork", (read, report[read])
        assert report["shm_stats"] == "ShutDown: fork", report["shm_stats"]
        # The parent's view is untouched.
        assert bytes(forked.INHERITED["shm_buffer"])[:4] == b"\x07" * 4
    else:
        assert "ask" not in report, "nothing is inherited by spawn or forkserver"
    # The parent's node is untouched.
    assert (
        parent.ref(parent.address, "echo").ask(tw.TensorMessage(b"after", [])).metadata == b"after"
    )


def test_a_dataloader_whose_workers_send_with_tensorwire(parent: tw.Node) -> None:
    torch = pytest.importorskip(
        "torch", reason="torch is not installed: the DataLoader case is skipped"
    )
    sink = parent.endpoint("sink", capacity=64)
    loader = torch.utils.data.DataLoader(
        forked.Samples(parent.address, 16), batch_size=4, num_workers=2
    )
    batches = [batch for batch in loader]  # the workers fork from this process (Linux default)
    assert sum(len(b) for b in batches) == 16
    seen = set()
    for _ in range(16):
        request = sink.recv(timeout=30)
        assert request is not None
        got = tw.tensors.unpack(request.message)
        index = int(got["index"])
        assert torch.equal(got["sample"], torch.full((256,), float(index)))
        seen.add(index)
    assert seen == set(range(16))


# ---- close ----


def _big_server(node: tw.Node, hold: float = 0.3) -> threading.Event:
    started = threading.Event()
    payload = np.arange(BIG, dtype=np.uint8)

    def big(message: tw.TensorMessage) -> tw.TensorMessage:
        started.set()
        time.sleep(hold)
        return tw.TensorMessage(b"big", [payload])

    node.serve("big", big)
    return started


def _ask_in_background(ref: tw.Ref, out: dict[str, Any]) -> threading.Thread:
    def ask() -> None:
        try:
            out["reply"] = ref.ask(tw.TensorMessage(b"", []), timeout=30)
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["error"] = e

    thread = threading.Thread(target=ask)
    thread.start()
    return thread


def _check_big(out: dict[str, Any]) -> None:
    assert "error" not in out, out.get("error")
    reply = out["reply"]
    data = np.frombuffer(reply.buffers[0], np.uint8)
    assert data.size == BIG and np.array_equal(
        data[:: 1 << 16], np.arange(BIG, dtype=np.uint8)[:: 1 << 16]
    )
    assert np.array_equal(data[-4096:], np.arange(BIG, dtype=np.uint8)[-4096:])


@pytest.mark.parametrize(
    "transport, driver",
    [
        ("raw", "io_uring"),
        ("raw", "tokio"),
        ("http2", "io_uring"),
        ("shm", "io_uring"),
        ("local", "io_uring"),
    ],
)
def test_close_finishes_a_64_mib_reply_in_flight(
    transport: str, driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if driver == "tokio":
        monkeypatch.setenv("TENSORWIRE_FORCE_FALLBACK", "1")
    server = tw.Node()
    monkeypatch.delenv("TENSORWIRE_FORCE_FALLBACK", raising=False)
    assert server.stats()["driver"] == driver
    started = _big_server(server)
    with tw.Node() as client:
        asker = server if transport == "local" else client
        out: dict[str, Any] = {}
        thread = _ask_in_background(asker.ref(server.address, "big", transport=transport), out)
        assert started.wait(30)
        began = time.monotonic()
        server.close(timeout=20)
        took = time.monotonic() - began
        thread.join(30)
        _check_big(out)
        assert out["reply"].route == transport
        assert took < 15, f"the close returned once the reply was out ({took:.1f} s)"
        assert server.closed


def test_leaving_the_with_block_finishes_a_reply_in_flight() -> None:
    out: dict[str, Any] = {}
    with tw.Node() as client:
        with tw.Node() as server:
            started = _big_server(server)
            thread = _ask_in_background(client.ref(server.address, "big", transport="raw"), out)
            assert started.wait(30)
        thread.join(30)
    _check_big(out)


EXITING_SERVER = textwrap.dedent(
    """
    import sys, threading, time, numpy as np, tensorwire as tw
    node = tw.Node()
    started = threading.Event()
    payload = np.arange(64 << 20, dtype=np.uint8)
    def big(message):
        started.set()
        time.sleep(0.3)
        return tw.TensorMessage(b"big", [payload])
    node.serve("big", big)
    print(node.address, flush=True)
    started.wait(60)
    print("exiting", flush=True)
    # The script ends here with the node open: the interpreter's exit closes it.
    """
)


def test_the_interpreters_exit_finishes_a_reply_in_flight() -> None:
    with (
        subprocess.Popen(
            [sys.executable, "-c", EXITING_SERVER], stdout=subprocess.PIPE, text=True
        ) as server,
        tw.Node() as client,
    ):
        assert server.stdout is not None
        address = server.stdout.readline().strip()
        out: dict[str, Any] = {}
        thread = _ask_in_background(client.ref(address, "big", transport="raw"), out)
        assert server.stdout.readline().strip() == "exiting"
        thread.join(30)
        assert server.wait(30) == 0
    _check_big(out)


def test_a_request_that_comes_while_the_node_closes_is_refused_saying_so() -> None:
    server = tw.Node()
    started = _big_server(server, hold=1.0)
    with tw.Node() as client:
        out: dict[str, Any] = {}
        thread = _ask_in_background(client.ref(server.address, "big", transport="raw"), out)
        assert started.wait(30)
        closer = threading.Thread(target=server.close, kwargs={"timeout": 20})
        closer.start()
        time.sleep(0.2)
        with pytest.raises(tw.RemoteError, match="the node is closing"):
            server.ref(server.address, "big", transport="local").ask(tw.TensorMessage(b"", []))
        closer.join(30)
        thread.join(30)
        _check_big(out)


def test_close_gives_up_at_its_timeout() -> None:
    server = tw.Node()
    started = _big_server(server, hold=3.0)
    with tw.Node() as client:
        out: dict[str, Any] = {}
        thread = _ask_in_background(client.ref(server.address, "big", transport="raw"), out)
        assert started.wait(30)
        began = time.monotonic()
        server.close(timeout=0.2)
        assert time.monotonic() - began < 2.5, "bounded by its timeout, not by the handler"
        thread.join(30)
        assert isinstance(out.get("error"), tw.ConnectionFailed), out


def test_aclose_lets_coroutine_handlers_finish_their_requests() -> None:
    async def main() -> dict[str, Any]:
        server = tw.Node()
        started = asyncio.Event()

        async def slow(message: tw.TensorMessage) -> bytes:
            started.set()
            await asyncio.sleep(0.3)
            return b"finished"

        server.serve("slow", slow)
        async with tw.Node() as client:
            ask = asyncio.ensure_future(
                client.ref(server.address, "slow", transport="raw").ask_async(
                    tw.TensorMessage(b"", [])
                )
            )
            await started.wait()
            await server.aclose(timeout=10)
            return {"reply": await ask}

    assert asyncio.run(main())["reply"] == b"finished"


# ---- misuse ----


def test_ref_loan_endpoint_and_serve_after_close_say_the_node_is_closed() -> None:
    node = tw.Node()
    node.close()
    node.close()  # idempotent
    calls = {
        "ref": lambda: node.ref(node.address, "echo"),
        "loan": lambda: node.loan(4096),
        "endpoint": lambda: node.endpoint("late"),
        "serve": lambda: node.serve("late", lambda m: m),
    }
    for name, call in calls.items():
        with pytest.raises(tw.ShutDown, match="shut down"):
            call()
        assert name


def test_a_coroutine_handler_served_outside_an_event_loop_gets_a_clear_error(node: tw.Node) -> None:
    async def handler(message: tw.TensorMessage) -> None:
        return None

    with pytest.raises(tw.InvalidArgument, match="no event loop is running here") as raised:
        node.serve("async", handler)
    assert "coroutine function" in str(raised.value)
