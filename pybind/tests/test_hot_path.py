"""The package at the engine's speed, and what users expect of it: references shared by
threads, concurrent coroutine handlers with a bound, nodes collected with their cycles, the
seed's stats values, fire-and-forget tells (DLPack: test_dlpack.py)."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import threading
import time
import weakref

import numpy as np
import pytest

import tensorwire as tw


def test_a_ref_is_shared_by_threads_and_reused(server: tw.Node, node: tw.Node) -> None:
    ref = node.ref(server.address, "echo", transport="raw")
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(50):
                payload = np.full(1000, seed * 1000 + i, np.int64)
                reply = ref.ask(tw.TensorMessage(b"m", [payload]))
                assert np.array_equal(np.frombuffer(reply.buffers[0], np.int64), payload)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_coroutine_handlers_run_concurrently_within_their_bound() -> None:
    async def main() -> None:
        running = 0
        peak = 0
        release = asyncio.Event()

        async def handler(m: tw.TensorMessage) -> bytes:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            if bytes(m.metadata) == b"slow":
                await release.wait()
            running -= 1
            return bytes(m.metadata)

        async with tw.Node() as server, tw.Node() as client:
            server.serve("co", handler, concurrency=3)
            ref = client.ref(server.address, "co", transport="raw")
            slow = [
                asyncio.ensure_future(ref.ask_async(tw.TensorMessage(b"slow", [])))
                for _ in range(2)
            ]
            # Two slow handlers wait; fast ones still get through the third place.
            fast = await asyncio.gather(
                *(ref.ask_async(tw.TensorMessage(b"fast", [])) for _ in range(20))
            )
            assert fast == [b"fast"] * 20
            assert not any(t.done() for t in slow), "the slow ones still wait"
            assert peak == 3, f"at most `concurrency` at once, and all of it used: {peak}"
            release.set()
            assert await asyncio.gather(*slow) == [b"slow", b"slow"]

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_coroutine_handler_that_raises_answers_with_its_error() -> None:
    async def main() -> None:
        async def handler(m: tw.TensorMessage) -> bytes:
            raise KeyError("no such tensor")

        async with tw.Node() as server, tw.Node() as client:
            server.serve("co", handler)
            with pytest.raises(tw.RemoteError, match="KeyError"):
                await client.ref(server.address, "co", transport="raw").ask_async(
                    tw.TensorMessage(b"", [])
                )

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_node_whose_handler_refers_to_it_is_collected() -> None:
    gc.collect()
    node = tw.Node()
    # A cycle through the native node (the name is deleted below: that is the point).
    node.serve("me", lambda m: node.address.encode())  # noqa: F821
    address = node.address
    host, port = address.rsplit(":", 1)
    alive = weakref.ref(node)
    del node
    gc.collect()
    assert alive() is None, "the node was collected"
    # …and shut down: its port is closed.
    deadline = time.monotonic() + 5
    while True:
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) != 0:
                break
        assert time.monotonic() < deadline, "the collected node still listens"
        time.sleep(0.05)


def test_stats_carry_the_seeds_values_and_structured_gauges(server: tw.Node, node: tw.Node) -> None:
    assert tw.tensor_transport_stats()["active_copy_model"] in {
        "unused",
        "direct_tcp",
        "packed_http2_compatibility",
        "shared_memory",
    }
    node.ref(server.address, "echo", transport="raw").ask(tw.TensorMessage(b"", [b"x" * 100]))
    assert tw.tensor_transport_stats()["active_copy_model"] == "direct_tcp"
    node.ref(server.address, "echo", transport="shm").ask(tw.TensorMessage(b"", [b"x" * 100]))
    assert tw.tensor_transport_stats()["active_copy_model"] == "shared_memory"
    stats = node.stats()
    assert isinstance(stats["pool"], dict) and all(
        isinstance(v, int) for v in stats["pool"].values()
    )
    assert isinstance(stats["gauges"]["connections"], int)
    assert stats["gauges"]["failed_cores"] == 0 and stats["gauges"]["core_restarts"] == 0
    assert stats["shm"]["connections"] >= 1 and isinstance(stats["shm"]["segment_bytes"], int)


def test_tell_nowait_delivers_and_counts_and_logs_its_failures(
    node: tw.Node, caplog: pytest.LogCaptureFixture
) -> None:
    with tw.Node() as other:
        inbox = other.endpoint("inbox")
        node.ref(other.address, "inbox", transport="raw").tell_nowait(tw.TensorMessage(b"hi", []))
        request = inbox.recv(timeout=5)
        assert request is not None and request.message.metadata == b"hi"
        before = tw.tensor_transport_stats()["tells_failed"]
        node.ref(other.address, "nobody", transport="raw").tell_nowait(tw.TensorMessage(b"", []))
        deadline = time.monotonic() + 5
        with caplog.at_level(logging.WARNING, logger="tensorwire"):
            while tw.tensor_transport_stats()["tells_failed"] == before:
                assert time.monotonic() < deadline, "the failure was counted"
                time.sleep(0.01)
            tw.tensor_transport_stats()  # the next call into tensorwire logs it
        assert any("tell_nowait failed" in r.getMessage() for r in caplog.records), caplog.text
