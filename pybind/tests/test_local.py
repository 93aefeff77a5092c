"""Same-process delivery: a lent buffer is aliased read-only; what outlives what."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import tensorwire as tw
from helpers import floats


def test_a_lent_message_is_aliased_read_only_by_a_local_receiver(node: tw.Node) -> None:
    """`lend=True`: the receiver in this process gets the sender's memory as it is, read-only
    (the sender promised to keep it unchanged while it is received)."""
    inbox = node.endpoint("inbox")
    x = floats(1024)
    ref = node.ref(node.address, "inbox")
    assert ref.route().path == "local"
    import threading

    got: list[tw.Request] = []

    def receive() -> None:
        req = inbox.recv(timeout=10)
        assert req is not None
        got.append(req)
        view = np.frombuffer(req.message.buffers[0], dtype=np.float32)
        assert not view.flags.writeable
        # The same memory as the sender's array: a write there shows here.
        x[0] = 42.0
        assert view[0] == 42.0
        req.reply(req.message)

    t = threading.Thread(target=receive)
    t.start()
    reply = ref.ask(tw.TensorMessage(b"m", [x], lend=True), timeout=10)
    t.join()
    assert got and got[0].kind == "ask" and got[0].peer is None
    assert memoryview(reply.buffers[0]).readonly
    with pytest.raises(TypeError, match="read-only"):
        memoryview(reply.buffers[0]).cast("B")[0:1] = b"\x00"
    with pytest.raises(ValueError, match="WRITEABLE"):
        np.frombuffer(reply.buffers[0], dtype=np.uint8).setflags(write=True)


def test_a_view_outlives_its_message_and_the_senders_array(node: tw.Node) -> None:
    node.serve("echo", lambda m: m)
    x = floats(256, seed=5)
    reply = node.ref(node.address, "echo").ask(tw.TensorMessage(b"", [x]))
    view = np.frombuffer(reply.buffers[0], dtype=np.float32)
    del reply, x
    gc.collect()
    assert view.tolist() == floats(256, seed=5).tolist()
