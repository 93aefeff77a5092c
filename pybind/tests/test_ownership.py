"""One ownership rule on every path: once `ask`/`tell` returned, the sender may reuse its
buffers, and nothing a receiver holds changes — in this process and across processes, for
requests and for replies. Zero copies where the rule allows: immutable inputs (`bytes`,
read-only arrays), frozen loans, and `lend=True`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import tensorwire as tw

#: How long the received arrays are held while their senders reuse their buffers (the issue
#: asks for 90 s; a shorter hold proves less about slots reused under pressure).
HOLD_SECONDS = float(os.environ.get("TENSORWIRE_HOLD_SECONDS", "90"))

MIB = 1 << 20

REUSING_SENDER = textwrap.dedent(
    """
    # Another process: sends to "inbox" over `transport` from ONE buffer it rewrites before
    # every send, for `seconds`.
    import sys, time, numpy as np, tensorwire as tw
    address, transport, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    buffer = np.empty(1 << 20, np.uint8)
    with tw.Node() as node:
        ref = node.ref(address, "inbox-" + transport, transport=transport)
        buffer[:] = 0xAB
        ref.tell(tw.TensorMessage(b"held", [buffer]))
        print(ref.route().path, flush=True)
        end, sent = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            buffer[:] = sent % 251
            ref.tell(tw.TensorMessage(b"churn", [buffer]))
            sent += 1
            time.sleep(0.01)
        print(f"sent {sent}", flush=True)
        sys.stdin.readline()
    """
)


@pytest.mark.timeout(HOLD_SECONDS + 90)
def test_held_arrays_never_change_while_their_senders_reuse_their_buffers() -> None:
    """In one process (tell and ask's reply) and from another process (shared memory and
    PTR1), all at once for HOLD_SECONDS."""
    with tw.Node() as receiver, tw.Node() as sender:
        inboxes = {
            t: receiver.endpoint(f"inbox-{t}", capacity=4096) for t in ("local", "shm", "raw")
        }

        # A handler that answers from one buffer it rewrites for every request.
        weights = np.empty(MIB, np.uint8)
        calls = [0]

        def answer(message: tw.TensorMessage) -> tw.TensorMessage:
            weights[:] = calls[0] % 251
            calls[0] += 1
            return tw.TensorMessage(b"", [weights])

        receiver.serve("weights", answer)
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", REUSING_SENDER, receiver.address, t, str(HOLD_SECONDS)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for t in ("shm", "raw")
        ]
        try:
            held: dict[str, np.ndarray] = {}
            buffer = np.empty(MIB, np.uint8)
            local = sender.ref(receiver.address, "inbox-local")
            assert local.route().path == "local"
            buffer[:] = 0xAB
            local.tell(tw.TensorMessage(b"held", [buffer]))
            reply = sender.ref(receiver.address, "weights").ask(tw.TensorMessage(b"", []))
            held["reply"] = np.frombuffer(reply.buffers[0], np.uint8)
            assert reply.route == "local" and held["reply"][0] == 0
            del reply
            for transport, inbox in inboxes.items():
                first = inbox.recv(timeout=30)
                assert first is not None and first.message.metadata == b"held", transport
                held[transport] = np.frombuffer(first.message.buffers[0], np.uint8)
            for proc, transport in zip(procs, ("shm", "raw"), strict=True):
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == transport

            stop = threading.Event()
            sent = [0]

            def reuse_locally() -> None:
                weights_ref = sender.ref(receiver.address, "weights")
                while not stop.is_set():
                    buffer[:] = sent[0] % 251
                    local.tell(tw.TensorMessage(b"churn", [buffer]))
                    weights_ref.ask(tw.TensorMessage(b"", []))
                    sent[0] += 1
                    time.sleep(0.005)

            churner = threading.Thread(target=reuse_locally)
            churner.start()
            churned = dict.fromkeys(inboxes, 0)
            end = time.monotonic() + HOLD_SECONDS
            while time.monotonic() < end:
                for transport, inbox in inboxes.items():
                    while inbox.recv(timeout=0) is not None:
                        churned[transport] += 1  # dropped at once: its memory is reused
                for name, array in held.items():
                    assert array[0] == held_value(name) and array[-1] == held_value(name), name
                time.sleep(0.01)
            stop.set()
            churner.join(30)
            for name, array in held.items():
                assert np.all(array == held_value(name)), f"{name}: every byte is what was sent"
            assert sent[0] > 100 and calls[0] > 100, "the local sender reused its buffers meanwhile"
            for transport, count in churned.items():
                assert count > 100, f"{transport}: the sender kept sending meanwhile ({count})"
            for proc in procs:
                assert proc.stdout is not None and proc.stdout.readline().startswith("sent")
        finally:
            for proc in procs:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(30)
                if proc.stdout is not None:
                    proc.stdout.close()


def held_value(name: str) -> int:
    return 0 if name == "reply" else 0xAB


def test_a_writable_buffer_reaches_a_local_receiver_as_a_copy_of_its_own(node: tw.Node) -> None:
    inbox = node.endpoint("inbox")
    x = np.arange(4096, dtype=np.float32)
    node.ref(node.address, "inbox").tell(tw.TensorMessage(b"", [x]))
    request = inbox.recv(timeout=10)
    assert request is not None
    got = np.frombuffer(request.message.buffers[0], np.float32)
    assert not np.shares_memory(got, x)
    assert got.flags.writeable, "a copy that is the receiver's alone is writable"
    x[:] = -1
    assert np.array_equal(got, np.arange(4096, dtype=np.float32))


@pytest.mark.parametrize(
    "kind", ["bytes", "array over bytes", "view of bytes", "frozen loan", "lend=True"]
)
def test_zero_copy_in_process_where_the_rule_allows_it(node: tw.Node, kind: str) -> None:
    inbox = node.endpoint("inbox")
    lend = False
    if kind == "bytes":
        source: object = bytes(range(256)) * 64
        original = np.frombuffer(source, np.uint8)  # type: ignore[call-overload]
    elif kind == "array over bytes":
        array = np.frombuffer(bytes(range(256)) * 64, np.uint8)[16:]
        source, original = array, array
    elif kind == "view of bytes":
        data = bytes(range(256)) * 64
        source, original = memoryview(data)[8:], np.frombuffer(data, np.uint8)
    elif kind == "frozen loan":
        loan = node.loan(16384)
        np.frombuffer(loan, np.uint8)[:] = 7
        source = loan.freeze()
        original = np.frombuffer(source, np.uint8)  # type: ignore[call-overload]
    else:
        array = np.arange(16384, dtype=np.uint8)
        source, original, lend = array, array, True
    node.ref(node.address, "inbox").tell(tw.TensorMessage(b"", [source], lend=lend))
    request = inbox.recv(timeout=10)
    assert request is not None
    got = np.frombuffer(request.message.buffers[0], np.uint8)
    assert np.shares_memory(got, original), f"{kind}: no copy"
    assert not got.flags.writeable, f"{kind}: the sender's memory is read-only for the receiver"


@pytest.mark.parametrize("kind", ["array set read-only", "read-only view of a bytearray"])
def test_a_read_only_view_of_memory_its_owner_may_write_reaches_a_local_receiver_as_a_copy(
    node: tw.Node, kind: str
) -> None:
    """Read-only is a view's promise, not the memory's: the owner writes on."""
    inbox = node.endpoint("inbox")
    if kind == "array set read-only":
        owner = np.arange(16384, dtype=np.uint8)
        owner.setflags(write=False)
        source: object = owner
    else:
        owner = bytearray(range(256)) * 64  # type: ignore[assignment]
        source = memoryview(owner).toreadonly()
    node.ref(node.address, "inbox").tell(tw.TensorMessage(b"", [source]))
    request = inbox.recv(timeout=10)
    assert request is not None
    got = np.frombuffer(request.message.buffers[0], np.uint8)
    before = got.copy()
    if isinstance(owner, np.ndarray):
        owner.setflags(write=True)
    owner[:] = b"\x00" * len(owner) if isinstance(owner, bytearray) else 0
    assert np.array_equal(got, before), f"{kind}: the receiver's bytes changed"


def test_a_handlers_reply_reaches_a_local_asker_as_a_copy_unless_lent(node: tw.Node) -> None:
    weights = np.arange(8192, dtype=np.float32)
    node.serve("copied", lambda m: tw.TensorMessage(b"", [weights]))
    node.serve("lent", lambda m: tw.TensorMessage(b"", [weights], lend=True))
    copied = node.ref(node.address, "copied").ask(tw.TensorMessage(b"", []))
    lent = node.ref(node.address, "lent").ask(tw.TensorMessage(b"", []))
    assert not np.shares_memory(np.frombuffer(copied.buffers[0], np.float32), weights)
    assert np.shares_memory(np.frombuffer(lent.buffers[0], np.float32), weights)


@pytest.mark.parametrize("path", ["local", "raw"])
def test_a_received_writable_buffer_sent_on_in_process_reaches_its_receiver_as_a_copy(
    node: tw.Node, path: str
) -> None:
    """A receiver that forwards what it got to another endpoint of its process still holds a
    writable view: its later writes must not reach the next receiver."""
    first, second = node.endpoint("first"), node.endpoint("second")
    with tw.Node() as sender:
        sender.ref(node.address, "first", transport=path).tell(
            tw.TensorMessage(b"", [np.arange(4096, dtype=np.uint8)])
        )
    request = first.recv(timeout=10)
    assert request is not None
    held = np.frombuffer(request.message.buffers[0], np.uint8)
    assert held.flags.writeable, f"{path}: received memory of its own is writable"
    node.ref(node.address, "second").tell(request.message)
    forwarded = second.recv(timeout=10)
    assert forwarded is not None
    got = np.frombuffer(forwarded.message.buffers[0], np.uint8)
    assert not np.shares_memory(got, held)
    held[:] = 99
    assert np.array_equal(got, np.arange(4096, dtype=np.uint8))


def test_a_received_message_sent_on_before_it_was_looked_at_goes_without_a_copy(
    node: tw.Node,
) -> None:
    """Nobody here can write it yet, so it is shared as it is — and its buffers are read-only
    for its holder from then on."""
    first, second = node.endpoint("first"), node.endpoint("second")
    with tw.Node() as sender:
        sender.ref(node.address, "first", transport="raw").tell(
            tw.TensorMessage(b"", [np.arange(4096, dtype=np.uint8)])
        )
    request = first.recv(timeout=10)
    assert request is not None
    message = request.message
    node.ref(node.address, "second").tell(message)
    forwarded = second.recv(timeout=10)
    assert forwarded is not None
    got = np.frombuffer(forwarded.message.buffers[0], np.uint8)
    held = np.frombuffer(message.buffers[0], np.uint8)
    assert np.shares_memory(got, held), "no copy"
    assert not held.flags.writeable, "sent on unseen: read-only for its holder too"
    with pytest.raises(ValueError):
        held[0] = 1
    assert np.array_equal(got, np.arange(4096, dtype=np.uint8))


def test_a_read_only_received_buffer_sent_on_in_process_stays_zero_copy(node: tw.Node) -> None:
    first, second = node.endpoint("first"), node.endpoint("second")
    weights = np.arange(16384, dtype=np.uint8)
    node.ref(node.address, "first").tell(tw.TensorMessage(b"", [weights], lend=True))
    request = first.recv(timeout=10)
    assert request is not None
    assert not request.message.buffers[0].writable
    node.ref(node.address, "second").tell(request.message)
    forwarded = second.recv(timeout=10)
    assert forwarded is not None
    assert np.shares_memory(np.frombuffer(forwarded.message.buffers[0], np.uint8), weights)


@pytest.mark.parametrize("path", ["raw", "shm"])
@pytest.mark.parametrize("size", [4 << 10, 4 * MIB])
def test_a_handler_that_rewrites_the_array_it_replied_from_never_changes_a_sent_reply(
    node: tw.Node, path: str, size: int
) -> None:
    """The handler answers from one array and rewrites it as soon as `reply()` returned: over
    a transport that writes the reply after that (PTR1), every reply must still arrive as it
    was when it was handed over."""
    endpoint = node.endpoint("rewriting")
    rounds = 20
    array = np.zeros(size, np.uint8)

    failures: list[BaseException] = []

    def serve() -> None:
        try:
            for k in range(rounds):
                request = endpoint.recv(timeout=30)
                assert request is not None
                array[:] = k
                request.reply(tw.TensorMessage(b"%d" % k, [array]))
                array[:] = 255  # at once, for the "next request"
        except BaseException as e:
            failures.append(e)
            raise

    server = threading.Thread(target=serve)
    server.start()
    try:
        with tw.Node() as asker:
            ref = asker.ref(node.address, "rewriting", transport=path)
            for k in range(rounds):
                reply = ref.ask(tw.TensorMessage(b"", []), timeout=30)
                got = np.frombuffer(reply.buffers[0], np.uint8)
                assert reply.metadata == b"%d" % k
                assert (got == k).all(), (path, size, k, np.unique(got))
    finally:
        server.join(60)
    assert not server.is_alive() and not failures, failures
