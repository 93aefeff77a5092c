"""Across a socket: PTR1 (raw TCP) and HTTP/2, replies of every kind, errors with their text."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tensorwire as tw
from helpers import floats


@pytest.mark.parametrize("transport", ["raw", "http2"])
def test_a_remote_round_trip_is_writable_and_not_aliased(
    node: tw.Node, server: tw.Node, transport: str
) -> None:
    ref = node.ref(server.address, "echo", transport=transport)
    assert ref.route().path == transport
    x = floats(1 << 16, seed=3)
    reply = ref.ask(tw.TensorMessage(b"meta", [x, b"tail"], version=9), timeout=10)
    assert isinstance(reply, tw.TensorMessage)
    assert (reply.version, reply.metadata) == (9, b"meta")
    y = np.frombuffer(reply.buffers[0], dtype=np.float32)
    assert y.flags.writeable
    assert np.array_equal(y, x)
    y[0] = -1.0  # our own receive memory
    assert x[0] == 3.0
    assert bytes(reply.buffers[1]) == b"tail"


def test_single_replies_bytes_ack_and_pickled_objects(node: tw.Node, server: tw.Node) -> None:
    msg = tw.TensorMessage(b"", [b"12345", floats(10)])
    assert node.ref(server.address, "sum", transport="raw").ask(msg) == b"45"
    server.serve("ack", lambda m: None)
    assert node.ref(server.address, "ack", transport="raw").ask(msg) is None
    server.serve("dict", lambda m: {"n": len(m.buffers), "meta": bytes(m.metadata)}, pickle=True)
    ref = node.ref(server.address, "dict", transport="raw", pickle=True)
    assert ref.ask(tw.TensorMessage(b"hi", [b"a"])) == {"n": 1, "meta": b"hi"}
    # Without opting in, the caller sees the type and the bytes, never unpickles.
    kind, data = node.ref(server.address, "dict", transport="raw").ask(msg)
    assert kind == "pickle" and isinstance(data, bytes)


def test_a_tell_is_acknowledged_once_it_is_in_the_mailbox(node: tw.Node) -> None:
    with tw.Node() as other:
        inbox = other.endpoint("inbox")
        node.ref(other.address, "inbox", transport="raw").tell(tw.TensorMessage(b"t", [b"x" * 100]))
        req = inbox.recv(timeout=5)
        assert req is not None and req.kind == "tell" and req.peer is not None
        assert bytes(req.message.buffers[0]) == b"x" * 100


def test_a_handler_that_raises_sends_its_text(node: tw.Node, server: tw.Node) -> None:
    with pytest.raises(tw.RemoteError) as info:
        node.ref(server.address, "fail", transport="raw").ask(tw.TensorMessage(b"because", []))
    assert "RuntimeError: the handler refused: because" in info.value.text
    assert server.address in str(info.value) and "fail" in str(info.value)


def test_an_unknown_endpoint_is_a_lookup_error(node: tw.Node, server: tw.Node) -> None:
    with pytest.raises(LookupError):
        node.ref(server.address, "nobody", transport="raw").ask(tw.TensorMessage(b"", []))
    with pytest.raises(LookupError):
        node.ref(node.address, "nobody").ask(tw.TensorMessage(b"", []))


def test_an_ask_times_out_as_a_timeout_error(node: tw.Node, server: tw.Node) -> None:
    counted = tw.tensor_transport_stats()["errors"].get("DeadlineExceeded", 0)
    start = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        node.ref(server.address, "slow", transport="raw").ask(
            tw.TensorMessage(b"2", []), timeout=0.3
        )
    assert isinstance(info.value, tw.DeadlineExceeded)
    assert time.monotonic() - start < 1.5
    assert tw.tensor_transport_stats()["errors"]["DeadlineExceeded"] == counted + 1


def test_a_mailbox_receive_times_out_with_none(node: tw.Node) -> None:
    inbox = node.endpoint("empty")
    start = time.monotonic()
    assert inbox.recv(timeout=0.2) is None
    assert 0.15 < time.monotonic() - start < 2


def test_a_forced_path_the_router_cannot_take_is_refused_not_replaced(
    node: tw.Node, server: tw.Node
) -> None:
    with tw.Node(shared_memory=False) as plain:
        plain.serve("echo", lambda m: m)
        ref = node.ref(plain.address, "echo", transport="shm")
        assert ref.route().path == "raw"
        with pytest.raises(tw.TransportUnavailable, match="router picks raw"):
            ref.ask(tw.TensorMessage(b"", []))
    with pytest.raises(ValueError, match="unknown transport"):
        node.ref(server.address, "echo", transport="carrier-pigeon").route()


def test_the_client_reconnects_after_the_server_closed(node: tw.Node) -> None:
    first = tw.Node()
    port = first.address.rsplit(":", 1)[1]
    first.serve("echo", lambda m: m)
    ref = node.ref(first.address, "echo", transport="raw")
    assert ref.ask(tw.TensorMessage(b"1", [])).metadata == b"1"
    first.close()
    with pytest.raises(tw.ConnectionFailed):
        ref.ask(tw.TensorMessage(b"2", []), timeout=5)
    with tw.Node(f"127.0.0.1:{port}") as second:
        second.serve("echo", lambda m: m)
        assert ref.ask(tw.TensorMessage(b"3", []), timeout=5).metadata == b"3"


def test_answering_a_request_twice_is_refused(node: tw.Node) -> None:
    import threading

    inbox = node.endpoint("twice")
    errors: list[BaseException] = []

    def serve_once() -> None:
        req = inbox.recv(timeout=5)
        assert req is not None
        req.reply(b"first")
        try:
            req.reply(b"second")
        except tw.InvalidArgument as e:
            errors.append(e)

    t = threading.Thread(target=serve_once)
    t.start()
    assert node.ref(node.address, "twice").ask(tw.TensorMessage(b"", [])) == b"first"
    t.join()
    assert errors and "already answered" in str(errors[0])


def test_stats_count_ptr1_traffic(node: tw.Node, server: tw.Node) -> None:
    before = tw.tensor_transport_stats()["raw_bytes_sent"]
    node.ref(server.address, "echo", transport="raw").ask(tw.TensorMessage(b"", [b"x" * 10000]))
    # The server counts its reply when the kernel reports the send done, which may come just
    # after the asker already has the reply: both directions show up within a moment.
    deadline = time.monotonic() + 5
    while (
        tw.tensor_transport_stats()["raw_bytes_sent"] < before + 20000
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    assert tw.tensor_transport_stats()["raw_bytes_sent"] >= before + 20000
    assert node.stats()["driver"] in ("io_uring", "tokio")


def test_a_full_mailbox_holds_the_sender_back(node: tw.Node) -> None:
    import threading

    with tw.Node() as other:
        inbox = other.endpoint("small", capacity=1)
        ref = node.ref(other.address, "small", transport="raw")
        ref.tell(tw.TensorMessage(b"1", []))
        done = threading.Event()

        def second() -> None:
            ref.tell(tw.TensorMessage(b"2", []), timeout=10)
            done.set()

        t = threading.Thread(target=second)
        t.start()
        assert not done.wait(0.3), "the second tell waits while the mailbox is full"
        first = inbox.recv(timeout=5)
        assert first is not None and first.message.metadata == b"1"
        assert done.wait(5)
        t.join()
        got = inbox.recv(timeout=5)
        assert got is not None and got.message.metadata == b"2"
