"""Receiving into buffers you own (`into=`) on every path: an ask's reply and an endpoint's
request, blocking and asyncio — writable, your own arrays, one copy; sizes and dtypes
checked with a clear error that writes nothing and loses nothing."""

from __future__ import annotations

import asyncio
import json
import select
import time
from collections.abc import Awaitable, Callable, Iterator

import numpy as np
import pytest

import tensorwire as tw
from tensorwire._aio import _pump

PATHS = ["local", "shm", "raw", "http2"]


@pytest.fixture
def pair() -> Iterator[tuple[tw.Node, tw.Node]]:
    with tw.Node() as server, tw.Node() as client:
        server.serve("echo", lambda m: m, threads=2)
        yield server, client


def _asker(pair: tuple[tw.Node, tw.Node], path: str) -> tw.Ref:
    server, client = pair
    return (server if path == "local" else client).ref(server.address, "echo", transport=path)


@pytest.mark.parametrize("path", PATHS)
def test_an_asks_reply_lands_in_the_callers_arrays(
    pair: tuple[tw.Node, tw.Node], path: str
) -> None:
    x = np.arange(1 << 18, dtype=np.float32)
    y = np.arange(100, dtype=np.int64)
    out_x, out_y = np.zeros_like(x), np.zeros_like(y)
    reply = _asker(pair, path).ask(tw.TensorMessage(b"meta", [x, y]), into=[out_x, out_y])
    assert reply.route == path
    assert reply.metadata == b"meta"
    assert reply.buffers[0] is out_x and reply.buffers[1] is out_y, "your arrays, no new ones"
    assert np.array_equal(out_x, x) and np.array_equal(out_y, y)
    assert not np.shares_memory(out_x, x)
    out_x += 1  # writable on every path
    again = _asker(pair, path).ask(tw.TensorMessage(b"", [x, y]), into=[out_x, out_y])
    assert again.buffers[0] is out_x and np.array_equal(out_x, x), "the same arrays, reused"


@pytest.mark.parametrize("path", ["local", "shm"])
def test_a_large_reply_split_over_the_cpus_lands_whole_in_the_callers_arrays(
    pair: tuple[tw.Node, tw.Node], path: str
) -> None:
    # 24 MiB in all: copied around the caches, in parts on several threads.
    x = np.random.default_rng(7).integers(0, 1 << 62, size=(20 << 20) // 8, dtype=np.int64)
    y = np.arange((4 << 20) // 4, dtype=np.float32)
    out_x, out_y = np.zeros_like(x), np.zeros_like(y)
    reply = _asker(pair, path).ask(tw.TensorMessage(b"", [x, y]), into=[out_x, out_y], timeout=30)
    assert reply.route == path and reply.buffers[0] is out_x
    assert np.array_equal(out_x, x) and np.array_equal(out_y, y)


def test_targets_that_share_memory_are_refused_before_anything_is_sent(
    pair: tuple[tw.Node, tw.Node],
) -> None:
    server, _ = pair
    seen = []
    server.serve("count", lambda m: seen.append(m) or m)
    ref = pair[1].ref(server.address, "count", transport="shm")
    x = np.arange(64, dtype=np.uint8)
    whole = np.zeros(128, dtype=np.uint8)
    cases = [
        [whole, whole],  # the same array twice
        [whole[:64], whole[32:96]],  # two views that overlap
        [whole, bytearray(64), memoryview(whole)[127:]],  # the last byte, later in the list
    ]
    for into in cases:
        with pytest.raises(tw.InvalidArgument, match=r"into\[\d\] and into\[\d\] share memory"):
            ref.ask(tw.TensorMessage(b"", [x] * len(into)), into=into)
    assert seen == [] and not whole.any(), "refused before anything was sent or written"
    # Views of one array that do not overlap are separate buffers.
    reply = ref.ask(tw.TensorMessage(b"", [x, x[::-1].copy()]), into=[whole[:64], whole[64:]])
    assert reply.buffers[0].base is whole
    assert np.array_equal(whole[:64], x) and np.array_equal(whole[64:], x[::-1])


@pytest.mark.parametrize("path", PATHS)
def test_an_endpoints_request_lands_in_the_callers_arrays(
    pair: tuple[tw.Node, tw.Node], path: str
) -> None:
    server, client = pair
    inbox = server.endpoint("inbox")
    sender = (server if path == "local" else client).ref(server.address, "inbox", transport=path)
    x = np.arange(1 << 16, dtype=np.float64)
    out = np.empty_like(x)
    sender.tell(tw.TensorMessage(b"t", [x]))
    request = inbox.recv(timeout=10, into=[out])
    assert request is not None and request.message.buffers[0] is out
    assert np.array_equal(out, x) and out.flags.writeable


@pytest.mark.parametrize("path", PATHS)
def test_the_asyncio_forms_receive_into_the_callers_arrays(
    pair: tuple[tw.Node, tw.Node], path: str
) -> None:
    server, client = pair
    inbox = server.endpoint("inbox")
    sender = (server if path == "local" else client).ref(server.address, "inbox", transport=path)
    x = np.arange(1 << 16, dtype=np.int32)

    async def main() -> None:
        out_reply, out_request = np.empty_like(x), np.empty_like(x)
        reply = await _asker(pair, path).ask_async(tw.TensorMessage(b"", [x]), into=[out_reply])
        assert reply.buffers[0] is out_reply and np.array_equal(out_reply, x)
        await sender.tell_async(tw.TensorMessage(b"", [x]))
        request = await inbox.recv_async(into=[out_request])
        assert request.message.buffers[0] is out_request and np.array_equal(out_request, x)

    asyncio.run(main())


async def _cancelled_after_arrival(start: Callable[[], Awaitable[object]], drained: bool) -> None:
    """Starts an operation and blocks the event loop while its message arrives, then cancels
    the task: before the loop drained the completion (`Pump.cancel` finds it), or after (the
    awaiting coroutine is cancelled holding a result); then lets everything be drained."""
    pump = _pump()
    task = asyncio.ensure_future(start())
    await asyncio.sleep(0)  # started: its message is on the way
    time.sleep(0.5)  # the loop is blocked: the message arrives, nothing is drained yet
    assert select.select([pump.pump.fileno()], [], [], 0)[0], "the message never arrived"
    if drained:
        await asyncio.sleep(0)  # the loop drains the completion: the result is set...
        await asyncio.sleep(0)
        assert len(pump.pump) == 0 and not task.done()  # ...the task has not resumed yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(5):
        await asyncio.sleep(0.01)


def _untouched_and_let_go(out: bytearray, size: int) -> None:
    assert out == bytearray(size), "a cancelled receive wrote into the caller's buffer"
    out.extend(b"\0")  # BufferError if an export of it were still held
    del out[size:]


@pytest.mark.parametrize("drained", [False, True], ids=["cancelled-before-drain", "after"])
@pytest.mark.parametrize("path", ["local", "shm", "raw"])
def test_a_cancelled_ask_async_leaves_the_callers_buffers_untouched(
    pair: tuple[tw.Node, tw.Node], path: str, drained: bool
) -> None:
    x = np.arange(1, (1 << 16) + 1, dtype=np.int32)
    out = bytearray(x.nbytes)
    ref = _asker(pair, path)

    async def main() -> None:
        await _cancelled_after_arrival(
            lambda: ref.ask_async(tw.TensorMessage(b"", [x]), into=[out]), drained
        )
        _untouched_and_let_go(out, x.nbytes)

    asyncio.run(main())


@pytest.mark.parametrize("drained", [False, True], ids=["cancelled-before-drain", "after"])
@pytest.mark.parametrize("path", ["local", "shm", "raw"])
def test_a_cancelled_recv_async_leaves_the_callers_buffers_untouched_and_keeps_the_request(
    pair: tuple[tw.Node, tw.Node], path: str, drained: bool
) -> None:
    server, client = pair
    inbox = server.endpoint("inbox")
    sender = (server if path == "local" else client).ref(server.address, "inbox", transport=path)
    x = np.arange(1, (1 << 16) + 1, dtype=np.int32)
    out = bytearray(x.nbytes)

    async def main() -> None:
        await sender.tell_async(tw.TensorMessage(b"kept", [x]))
        await _cancelled_after_arrival(lambda: inbox.recv_async(into=[out]), drained)
        _untouched_and_let_go(out, x.nbytes)
        kept = await inbox.recv_async()  # the request it had taken, with its own buffers
        assert kept.message.metadata == b"kept"
        assert np.array_equal(np.frombuffer(kept.message.buffers[0], np.int32), x)
        assert len(inbox) == 0, "kept once"

    asyncio.run(main())


@pytest.mark.parametrize("path", ["local", "raw"])
def test_a_reply_of_another_size_raises_writes_nothing_and_keeps_the_reply(
    pair: tuple[tw.Node, tw.Node], path: str
) -> None:
    x = np.arange(1000, dtype=np.float32)
    out = np.full(999, -1.0, dtype=np.float32)
    with pytest.raises(
        tw.InvalidArgument,
        match=r"into\[0\] \(ndarray\) has 3996 bytes but buffer 0 that arrived has 4000",
    ) as raised:
        _asker(pair, path).ask(tw.TensorMessage(b"", [x]), into=[out])
    assert np.all(out == -1.0), "nothing was written"
    received = raised.value.received  # type: ignore[attr-defined]
    assert np.array_equal(np.frombuffer(received.buffers[0], np.float32), x), "nothing is lost"
    with pytest.raises(tw.InvalidArgument, match="received 1 buffers into 2 given"):
        _asker(pair, path).ask(tw.TensorMessage(b"", [x]), into=[out, np.empty_like(out)])


def test_a_packed_tensor_of_another_dtype_raises_before_anything_is_written(
    pair: tuple[tw.Node, tw.Node],
) -> None:
    weights = np.arange(1024, dtype=np.float32)
    out = np.full(1024, 7, dtype=np.int32)  # the same bytes, another dtype
    with pytest.raises(
        tw.InvalidArgument,
        match=r"into\[0\] has dtype int32, but tensor 'w' arrived as <f4\[1024\]",
    ):
        _asker(pair, "raw").ask(tw.tensors.pack({"w": weights}), into=[out])
    assert np.all(out == 7)
    good = np.empty(1024, dtype=np.float32)
    reply = _asker(pair, "raw").ask(tw.tensors.pack({"w": weights}), into=[good])
    assert np.array_equal(tw.tensors.unpack(reply)["w"], weights)
    assert np.shares_memory(tw.tensors.unpack(reply)["w"], good), "unpack views your array"


def test_targets_that_cannot_take_the_bytes_are_refused_before_anything_is_sent(
    pair: tuple[tw.Node, tw.Node],
) -> None:
    ref = _asker(pair, "raw")
    readonly = np.zeros(10, np.uint8)
    readonly.setflags(write=False)
    with pytest.raises(tw.InvalidArgument, match="read-only"):
        ref.ask(tw.TensorMessage(b"", [np.zeros(10, np.uint8)]), into=[readonly])
    with pytest.raises(tw.InvalidArgument, match="not C-contiguous"):
        ref.ask(
            tw.TensorMessage(b"", [np.zeros(10, np.uint8)]),
            into=[np.zeros((10, 2), np.uint8)[:, 0]],
        )
    with pytest.raises(tw.InvalidArgument, match="not a TensorMessage"):
        pair[0].serve("bytes", lambda m: b"plain")
        pair[1].ref(pair[0].address, "bytes").ask(tw.TensorMessage(b"", []), into=[bytearray(5)])


def test_a_request_that_does_not_fit_is_kept_for_the_next_receive(node: tw.Node) -> None:
    inbox = node.endpoint("inbox")
    node.ref(node.address, "inbox").tell(tw.TensorMessage(b"kept", [np.arange(64, dtype=np.uint8)]))
    small = bytearray(10)
    with pytest.raises(tw.InvalidArgument, match="has 10 bytes but buffer 0 that arrived has 64"):
        inbox.recv(timeout=10, into=[small])
    assert small == bytearray(10)
    fits = bytearray(64)
    request = inbox.recv(timeout=10, into=[fits])
    assert request is not None and request.message.metadata == b"kept"
    assert fits == bytearray(range(64))


def test_a_torch_tensor_receives_in_place() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch case is skipped")
    with tw.Node() as server, tw.Node() as client:
        server.serve("echo", lambda m: m)
        x = torch.arange(4096, dtype=torch.float32)
        out = torch.zeros(4096, dtype=torch.float32)
        reply = client.ref(server.address, "echo").ask(tw.tensors.pack({"x": x}), into=[out])
        assert torch.equal(out, x)
        got = tw.tensors.unpack(reply)["x"]
        assert isinstance(got, torch.Tensor) and got.data_ptr() == out.data_ptr()
        wrong = torch.zeros(4096, dtype=torch.int32)
        with pytest.raises(tw.InvalidArgument, match="dtype int32"):
            client.ref(server.address, "echo").ask(tw.tensors.pack({"x": x}), into=[wrong])


def test_copy_into_an_answered_request_writes_nothing(node: tw.Node) -> None:
    inbox = node.endpoint("inbox")
    pending = node.ref(node.address, "inbox").ask_nowait(
        tw.TensorMessage(b"", [np.arange(64, dtype=np.uint8)])
    )
    request = inbox.recv(timeout=10)
    assert request is not None
    request.reply(None)
    pending.result(timeout=10)
    out = bytearray(64)
    with pytest.raises(tw.InvalidArgument, match="already answered"):
        request.copy_into([out])
    assert out == bytearray(64), "an answered request wrote into the caller's buffer"
    # One that does not fit stays answerable.
    pending = node.ref(node.address, "inbox").ask_nowait(
        tw.TensorMessage(b"", [np.arange(64, dtype=np.uint8)])
    )
    request = inbox.recv(timeout=10)
    assert request is not None
    with pytest.raises(tw.InvalidArgument, match="has 10 bytes") as raised:
        request.copy_into([bytearray(10)])
    assert raised.value.received is request  # type: ignore[attr-defined]
    request.copy_into([out]).reply(None)
    assert out == bytearray(range(64))
    pending.result(timeout=10)


def test_a_request_whose_packed_metadata_is_malformed_is_kept(node: tw.Node) -> None:
    inbox = node.endpoint("inbox")
    metadata = json.dumps({"schema": tw.tensors.SCHEMA, "tensors": [5]}).encode()
    node.ref(node.address, "inbox").tell(tw.TensorMessage(metadata, [bytearray(8)]))
    out = np.zeros(8, np.uint8)
    with pytest.raises(tw.InvalidArgument, match="not an object"):
        inbox.recv(timeout=10, into=[out])
    kept = inbox.recv(timeout=10)
    assert kept is not None and kept.message.metadata == metadata
