"""The asyncio forms: parity with the blocking ones, many in flight, cancellation."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import tensorwire as tw
from helpers import floats


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 30))


@pytest.mark.parametrize("transport", ["auto", "raw", "http2"])
def test_ask_async_gives_what_ask_gives(node: tw.Node, server: tw.Node, transport: str) -> None:
    ref = node.ref(server.address, "echo", transport=transport)
    msg = tw.TensorMessage(b"m", [floats(1000), b"b"])
    blocking = ref.ask(msg)

    async def main() -> tw.TensorMessage:
        return await ref.ask_async(msg)

    reply = run(main())
    assert reply.metadata == blocking.metadata
    assert [bytes(b) for b in reply.buffers] == [bytes(b) for b in blocking.buffers]


def test_a_thousand_asks_in_flight_all_arrive(node: tw.Node, server: tw.Node) -> None:
    ref = node.ref(server.address, "sum", transport="raw")

    async def main() -> list[bytes]:
        return await asyncio.gather(
            *(ref.ask_async(tw.TensorMessage(b"", [b"x" * i])) for i in range(1000))
        )

    assert run(main()) == [str(i).encode() for i in range(1000)]


def test_errors_arrive_as_the_same_exceptions(node: tw.Node, server: tw.Node) -> None:
    async def main() -> None:
        with pytest.raises(tw.RemoteError, match="refused"):
            await node.ref(server.address, "fail", transport="raw").ask_async(
                tw.TensorMessage(b"x", [])
            )
        with pytest.raises(TimeoutError):
            await node.ref(server.address, "slow", transport="raw").ask_async(
                tw.TensorMessage(b"1", []), timeout=0.2
            )

    run(main())


def test_cancelling_the_task_cancels_the_ask(node: tw.Node, server: tw.Node) -> None:
    ref = node.ref(server.address, "slow", transport="raw")

    async def main() -> None:
        task = asyncio.ensure_future(ref.ask_async(tw.TensorMessage(b"5", []), timeout=30))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Nothing left in the loop's completion queue.
        from tensorwire._aio import _pumps

        pump = _pumps[asyncio.get_running_loop()]()
        assert pump is not None
        assert len(pump.pump) == 0 and not pump.futures

    run(main())


def test_tell_async_and_async_iteration_over_a_mailbox(node: tw.Node) -> None:
    inbox = node.endpoint("inbox")

    async def main() -> list[bytes]:
        with tw.Node() as sender:
            ref = sender.ref(node.address, "inbox", transport="raw")
            for i in range(5):
                await ref.tell_async(tw.TensorMessage(str(i).encode(), [b"x"]))
        seen = []
        async for req in inbox:
            seen.append(req.message.metadata)
            if len(seen) == 5:
                break
        return seen

    assert run(main()) == [b"0", b"1", b"2", b"3", b"4"]


def test_a_coroutine_handler_runs_on_the_loop_it_was_registered_from(node: tw.Node) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen_loops = []

        async def handler(m: tw.TensorMessage) -> tw.TensorMessage:
            seen_loops.append(asyncio.get_running_loop())
            await asyncio.sleep(0.01)
            return tw.TensorMessage(b"async " + m.metadata, [np.ones(4, np.float32)])

        async with tw.Node() as server:
            server.serve("co", handler)
            reply = await node.ref(server.address, "co", transport="raw").ask_async(
                tw.TensorMessage(b"hi", [])
            )
        assert reply.metadata == b"async hi"
        assert seen_loops == [loop]

    run(main())


def test_an_object_with_receive_tensor_serves(node: tw.Node) -> None:
    class Actor:
        def receive_tensor(self, msg: tw.TensorMessage) -> bytes:
            return b"got " + msg.metadata

    node.serve("actor", Actor())
    assert node.ref(node.address, "actor").ask(tw.TensorMessage(b"it", [])) == b"got it"


def test_a_late_completion_wakes_a_sleeping_loop(node: tw.Node, server: tw.Node) -> None:
    """A completion that comes long after a burst of fast ones, while the loop sleeps, still
    wakes it (its eventfd), and asks go on after it."""
    echo = node.ref(server.address, "echo", transport="raw")
    slow = node.ref(server.address, "slow", transport="raw")
    msg = tw.TensorMessage(b"", [b"x" * 4096])

    async def main() -> int:
        late = asyncio.ensure_future(slow.ask_async(tw.TensorMessage(b"0.2", [])))
        fast = 0
        while not late.done():
            reply = await echo.ask_async(msg)
            assert reply.total_bytes == 4096
            fast += 1
            if fast >= 50:
                break
        await late  # comes ~0.2 s later, long after the polling window of the fast ones
        await asyncio.sleep(0.05)
        again = await asyncio.gather(*(echo.ask_async(msg) for _ in range(8)))
        assert all(r.total_bytes == 4096 for r in again)
        return fast

    assert run(main()) == 50
