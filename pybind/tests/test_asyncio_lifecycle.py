"""The asyncio bridge across a loop's end and a fork: a loop closed with operations waiting is
released with its completion queue; one failed delivery does not strand the others; closing a
node whose coroutine handlers' loop is gone does not raise; a child made by fork() inside a
running loop neither takes the parent's wake-ups nor uses its queue."""

from __future__ import annotations

import asyncio
import gc
import os
import select
import signal
import threading
import time
import weakref
from typing import Any

import pytest

import tensorwire as tw
from tensorwire import _aio


def test_a_loop_closed_with_a_receive_waiting_is_released(node: tw.Node) -> None:
    inbox = node.endpoint("waiting")
    loop = asyncio.new_event_loop()

    async def start() -> None:
        asyncio.ensure_future(inbox.recv_async())  # never awaited, never cancelled
        await asyncio.sleep(0)  # waiting in the engine

    loop.run_until_complete(start())
    loop.close()
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None, "the closed loop and its completion queue leaked"
    node.ref(node.address, "waiting").tell(tw.TensorMessage(b"after", []))
    got = inbox.recv(timeout=10)
    assert got is not None and got.message.metadata == b"after", "nothing was taken meanwhile"


def test_one_failed_delivery_does_not_strand_the_rest_of_the_batch(node: tw.Node) -> None:
    first, second = node.endpoint("first"), node.endpoint("second")
    for path in ("first", "second"):
        node.ref(node.address, path).tell(tw.TensorMessage(path.encode(), []))
    raised: list[dict[str, Any]] = []

    def broken(_: object) -> None:
        raise RuntimeError("a hook that fails")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: raised.append(context))
        pump = _aio._pump()
        # Both receives are ready at once: drained together, the first (lower token) first.
        one = first._native.recv_start(pump.pump)
        two = second._native.recv_start(pump.pump)
        cancelled = loop.create_future()
        cancelled.cancel()
        pump.futures[one], pump.orphans[one] = cancelled, broken
        waiting = pump.futures[two] = loop.create_future()
        request = (await asyncio.wait_for(waiting, 10)).fill()
        assert request.message.metadata == b"second"

    asyncio.run(main())
    assert [str(c.get("exception")) for c in raised] == ["a hook that fails"]


def test_closing_a_node_whose_coroutine_handlers_loop_is_closed_does_not_raise() -> None:
    node = tw.Node()
    loop = asyncio.new_event_loop()

    async def echo(message: tw.TensorMessage) -> tw.TensorMessage:
        return message

    async def start() -> None:
        node.serve("echo", echo)

    loop.run_until_complete(start())
    loop.close()
    node.close(timeout=5)  # its serving task's loop is closed: nothing to cancel there
    assert node.closed


@pytest.mark.parametrize("drained", [False, True], ids=["cancelled-before-drain", "after"])
def test_a_request_a_cancelled_receive_took_goes_to_a_receive_already_waiting(
    node: tw.Node, drained: bool
) -> None:
    inbox = node.endpoint("inbox")

    async def main() -> None:
        pump = _aio._pump()
        first = asyncio.ensure_future(inbox.recv_async())
        await asyncio.sleep(0)
        second = asyncio.ensure_future(inbox.recv_async())
        await asyncio.sleep(0)  # both waiting in the engine
        node.ref(node.address, "inbox").tell(tw.TensorMessage(b"one", []))
        assert select.select([pump.pump.fileno()], [], [], 5)[0], "no completion"
        if drained:
            await asyncio.sleep(0)  # drained: the first receive took it...
            await asyncio.sleep(0)
            assert len(pump.pump) == 1 and not first.done()  # ...and has not resumed yet
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        # No new request arrives: the one the cancelled receive took reaches the other.
        request = await asyncio.wait_for(second, 10)
        assert request.message.metadata == b"one"
        assert len(inbox) == 0

    asyncio.run(main())


def test_a_tell_a_cancelled_receive_took_is_waited_for_by_a_graceful_close() -> None:
    node = tw.Node()
    inbox = node.endpoint("inbox")

    async def main() -> None:
        pump = _aio._pump()
        receive = asyncio.ensure_future(inbox.recv_async())
        await asyncio.sleep(0)
        node.ref(node.address, "inbox").tell(tw.TensorMessage(b"told", []))
        assert select.select([pump.pump.fileno()], [], [], 5)[0], "no completion"
        receive.cancel()  # it took the tell: put back
        with pytest.raises(asyncio.CancelledError):
            await receive
        assert len(inbox) == 1

    asyncio.run(main())
    closer = threading.Thread(target=node.close, args=(20,))
    closer.start()
    time.sleep(0.5)
    assert closer.is_alive(), "the close did not wait for the tell in the mailbox"
    kept = inbox.recv(timeout=10)
    assert kept is not None and kept.message.metadata == b"told"
    closer.join(10)
    assert not closer.is_alive(), "the close did not end once the tell was taken"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() of a process with threads
def test_a_child_forked_inside_a_running_loop_leaves_the_parents_queue_alone(
    node: tw.Node,
) -> None:
    inbox = node.endpoint("inbox")
    sender = node.ref(node.address, "inbox")

    async def main() -> None:
        pump = _aio._pump()
        task = asyncio.ensure_future(inbox.recv_async())
        await asyncio.sleep(0)  # waiting in the engine
        sender.tell(tw.TensorMessage(b"at the fork", []))
        # Its completion is queued and the loop's eventfd written; the loop has not drained it
        # (this coroutine has not yielded since). Fork now.
        assert select.select([pump.pump.fileno()], [], [], 5)[0], "no completion"
        child = os.fork()
        if child == 0:
            code = 0
            try:
                if pump.pump.drain() != []:
                    code = 3  # the child took the parent's completion and its wake-up
                try:
                    sender._native.tell_start(pump.pump, tw.TensorMessage(b"", []))
                    code = code or 4  # started an operation on the parent's queue
                except tw.ShutDown:
                    pass
            except BaseException:
                code = 5
            os._exit(code)
        status = await asyncio.get_running_loop().run_in_executor(None, _exit_code, child)
        assert status == 0, f"the child failed with {status}"
        request = await asyncio.wait_for(task, 10)  # the parent's loop was still woken
        assert request.message.metadata == b"at the fork"

    asyncio.run(main())


def _exit_code(pid: int) -> int:
    """The child's exit code; it is killed after 10 s."""
    for _ in range(200):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -9
