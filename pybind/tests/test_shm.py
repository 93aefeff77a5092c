"""Shared memory from Python: the router picks it for a same-host peer, loaned slots travel
without a copy, received views are read-only."""

from __future__ import annotations

import numpy as np
import pytest

import tensorwire as tw


def test_a_same_host_peer_is_reached_over_shared_memory_with_read_only_views(node: tw.Node) -> None:
    with tw.Node() as other:
        inbox = other.endpoint("inbox")
        ref = node.ref(other.address, "inbox", transport="shm")
        assert ref.route().path == "shm"
        before = tw.tensor_transport_stats()["shm_messages_sent"]
        ref.tell(tw.TensorMessage(b"m", [np.arange(1 << 18, dtype=np.float32)]))
        req = inbox.recv(timeout=5)
        assert req is not None
        view = np.frombuffer(req.message.buffers[0], np.float32)
        assert np.array_equal(view, np.arange(1 << 18, dtype=np.float32))
        assert not view.flags.writeable
        assert tw.tensor_transport_stats()["shm_messages_sent"] > before


def test_a_loaned_slot_travels_without_a_copy(node: tw.Node) -> None:
    with tw.Node() as other:
        inbox = other.endpoint("inbox")
        loan = node.loan(1 << 20)
        fill = np.frombuffer(loan, np.uint8)
        fill[:] = np.arange(1 << 20) % 251
        with pytest.raises(BufferError, match="still alive"):
            loan.freeze()
        del fill
        buffer = loan.freeze()
        assert not buffer.writable
        with pytest.raises(BufferError, match="frozen"):
            memoryview(loan)
        before = tw.tensor_transport_stats()
        node.ref(other.address, "inbox", transport="shm").tell(tw.TensorMessage(b"", [buffer]))
        after = tw.tensor_transport_stats()
        assert after["shm_zero_copy_buffers"] == before["shm_zero_copy_buffers"] + 1
        assert after["shm_bytes_copied"] == before["shm_bytes_copied"]
        req = inbox.recv(timeout=5)
        assert req is not None
        got = np.frombuffer(req.message.buffers[0], np.uint8)
        assert np.array_equal(got, np.arange(1 << 20) % 251)
