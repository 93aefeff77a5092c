"""Shared memory from Python: the router picks it for a same-host peer, loaned slots travel
without a copy, received views are read-only."""

from __future__ import annotations

import time

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
        with pytest.raises(BufferError, match="still"):
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


def test_the_manager_offers_publishes_maps_and_releases(node: tw.Node) -> None:
    shm = node.shm
    base = shm.stats()
    assert base["backend"] == "memfd"
    d = shm.offer(np.arange(1000, dtype=np.int32), ttl=30)
    assert isinstance(d, tw.Descriptor) and d.len == 4000
    view = np.frombuffer(shm.map(d), np.int32)
    assert np.array_equal(view, np.arange(1000, dtype=np.int32)) and not view.flags.writeable
    assert shm.release(d) is True
    assert shm.release(d) is False  # idempotent
    with pytest.raises(tw.LeaseInvalid):
        shm.map(d)
    with pytest.raises(LookupError):
        shm.map(tw.Descriptor(d.region_id, d.generation + 1, 0, 4, d.lease_id))

    shm.publish("weights", b"w" * 4096)
    with pytest.raises(tw.InvalidArgument, match="already exists"):
        shm.publish("weights", b"again")
    lease = shm.open("weights", ttl=30)
    assert bytes(shm.map(lease)) == b"w" * 4096
    shm.unpublish("weights")
    with pytest.raises(tw.LeaseInvalid, match="not found"):
        shm.open("weights")
    assert bytes(shm.map(lease)) == b"w" * 4096  # existing leases drain
    shm.clear()
    with pytest.raises(tw.LeaseInvalid):
        shm.map(lease)
    del view
    assert shm.stats()["active_leases"] == 0


def test_a_lease_past_its_ttl_no_longer_maps(node: tw.Node) -> None:
    import time

    d = node.shm.offer(b"short-lived", ttl=0.05)
    time.sleep(0.1)
    with pytest.raises(tw.LeaseInvalid, match="expired|no longer"):
        node.shm.map(d)


def test_a_reservation_over_the_quota_is_a_clean_error() -> None:
    with tw.Node() as n, pytest.raises(MemoryError):
        n.loan(1 << 50)


def test_spin_keeps_the_threads_polling_through_gaps_and_zero_never_polls() -> None:
    """`Node(spin=...)`: the server's shared-memory thread polls through the gaps between
    asks (counted in `shm_spin_micros`); `spin=0` never polls."""

    def spun(spin: float | None) -> int:
        with tw.Node(spin=0) as client, tw.Node(spin=spin) as server:
            server.serve("echo", lambda m: m)
            echo = client.ref(server.address, "echo", transport="shm")
            msg = tw.TensorMessage(b"", [np.ones(4096, np.uint8)])
            assert echo.ask(msg, timeout=5).total_bytes == 4096  # the hello
            before = tw.tensor_transport_stats()["shm_spin_micros"]
            for _ in range(20):
                time.sleep(0.005)
                assert echo.ask(msg, timeout=5).total_bytes == 4096
            return int(tw.tensor_transport_stats()["shm_spin_micros"] - before)

    # 20 gaps of 5 ms: at least half of them spun through by the server's thread.
    assert spun(0.05) >= 50_000
    # The default spins a short window (100 µs) after each message; 0 none at all.
    default, zero = spun(None), spun(0)
    assert zero < 500 and zero <= default / 4, (zero, default)


def test_an_idle_node_does_not_spin() -> None:
    """A node's shared-memory thread spins only after messages, not after every tick of its
    timer: an idle node with a 0.3 s window spun 0.3 s every half second before."""
    with tw.Node(spin=0.3):
        before = tw.tensor_transport_stats()["shm_spin_micros"]
        time.sleep(1.2)
        spent = tw.tensor_transport_stats()["shm_spin_micros"] - before
    assert spent < 50_000


@pytest.mark.parametrize("spin", [-0.001, 1.5, float("nan"), float("inf")])
def test_spin_outside_zero_to_a_second_is_refused(spin: float) -> None:
    with pytest.raises(tw.InvalidArgument, match="spin must be a number of seconds from 0 to 1"):
        tw.Node(spin=spin)
