"""Cases a review of the binding found: each failed (or hung) before its fix."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import numpy as np
import pytest

import tensorwire as tw


def test_a_node_dropped_without_close_while_a_handler_runs_does_not_deadlock(node: tw.Node) -> None:
    server = tw.Node()
    server.serve("slow", lambda m: time.sleep(0.3) or b"done")
    address = server.address
    results: list[object] = []

    def ask() -> None:
        try:
            results.append(
                node.ref(address, "slow", transport="raw").ask(tw.TensorMessage(b"", []))
            )
        except tw.Error as e:
            results.append(e)

    t = threading.Thread(target=ask)
    t.start()
    time.sleep(0.1)
    start = time.monotonic()
    del server
    gc.collect()
    assert time.monotonic() - start < 10, "dropping the node waited for the GIL-bound handler"
    t.join(timeout=10)
    assert not t.is_alive() and len(results) == 1


def test_close_on_the_loop_coroutine_handlers_run_on_returns_at_once() -> None:
    async def main() -> None:
        async def handler(m: tw.TensorMessage) -> bytes:
            await asyncio.sleep(0)
            return b"ok"

        async with tw.Node() as server:
            server.serve("co", handler)
            with tw.Node() as client:
                reply = await client.ref(server.address, "co", transport="raw").ask_async(
                    tw.TensorMessage(b"", [])
                )
                assert reply == b"ok"
            # Coroutine handlers run as tasks of this loop: nothing waits for it to close.
            started = asyncio.get_running_loop().time()
            server.close()
            assert asyncio.get_running_loop().time() - started < 5

    asyncio.run(asyncio.wait_for(main(), 30))


def test_cancelled_async_receives_never_lose_a_request(node: tw.Node) -> None:
    inbox = node.endpoint("inbox")

    async def main() -> list[bytes]:
        with tw.Node() as sender:
            ref = sender.ref(node.address, "inbox", transport="raw")
            for i in range(50):
                await ref.tell_async(tw.TensorMessage(str(i).encode(), []))
                task = asyncio.ensure_future(inbox.recv_async())
                await asyncio.sleep(0)
                task.cancel()
                try:
                    await task
                    inbox._stash.insert(0, task.result())  # it won the race: put it back
                except asyncio.CancelledError:
                    pass
        got = []
        while len(got) < 50:
            req = await asyncio.wait_for(inbox.recv_async(), 5)
            got.append(req.message.metadata)
        return got

    got = asyncio.run(asyncio.wait_for(main(), 60))
    assert sorted(int(m) for m in got) == list(range(50))


def test_bad_arguments_are_invalid_argument_errors() -> None:
    with pytest.raises(tw.InvalidArgument, match="per-send"):
        tw.Node(transport="local")
    with pytest.raises(tw.InvalidArgument, match="cert="):
        tw.Node(require_client_cert=True)
    with tw.Node() as n:
        with pytest.raises(tw.InvalidArgument, match="threads"):
            n.serve("x", lambda m: None, threads=0)
        with pytest.raises(tw.InvalidArgument, match="timeout"):
            n.endpoint("y").recv(timeout=-1)
        with pytest.raises(tw.InvalidArgument, match="timeout"):
            n.ref(n.address, "x").ask(tw.TensorMessage(b"", []), timeout=float("nan"))
        with pytest.raises(tw.InvalidArgument, match="not C-contiguous"):
            tw.TensorMessage(b"", [np.zeros((2, 2)).T])


def test_a_port_in_use_is_an_os_error(node: tw.Node) -> None:
    with pytest.raises(OSError) as info:
        tw.Node(node.address)
    assert isinstance(info.value, tw.Error)


def test_an_unknown_endpoint_over_http2_is_a_lookup_error_too(
    node: tw.Node, server: tw.Node
) -> None:
    with pytest.raises(tw.UnknownEndpoint):
        node.ref(server.address, "nobody", transport="http2").ask(tw.TensorMessage(b"", []))


def test_a_bytes_like_reply_is_sent_as_bytes_even_with_pickle(node: tw.Node) -> None:
    node.serve("ba", lambda m: bytearray(b"raw"), pickle=True)
    assert node.ref(node.address, "ba", pickle=True).ask(tw.TensorMessage(b"", [])) == b"raw"


def test_a_failing_tell_handler_is_logged(node: tw.Node, caplog: pytest.LogCaptureFixture) -> None:
    node.serve("boom", lambda m: 1 / 0)
    with tw.Node() as sender, caplog.at_level("ERROR", logger="tensorwire"):
        sender.ref(node.address, "boom", transport="raw").tell(tw.TensorMessage(b"", []))
        deadline = time.monotonic() + 5
        while "boom" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.02)
    assert "the handler serving 'boom' raised" in caplog.text
    assert "ZeroDivisionError" in caplog.text
