"""A private copy of what came over shared memory: ``msg.copy()`` gives buffers of this
process alone — equal bytes, writable, sharing no memory with the received views (what
catches a "copy" that is a view), and intact once the received message is gone and more
messages came (docs/python.md, "What a same-user peer can and cannot do"). A sender that
rewrites its own segment under the views is `shm::hostile_more` in the Rust tests."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import numpy as np

import tensorwire as tw

SENDER = textwrap.dedent(
    """
    # Another process: tells "inbox" over shared memory one message, then on "more" eight
    # more of the same sizes (its slots freed by the receiver are used again).
    import sys, numpy as np, tensorwire as tw
    with tw.Node() as node:
        ref = node.ref(sys.argv[1], "inbox", transport="shm")
        print(ref.route().path, flush=True)
        ref.tell(tw.TensorMessage(b"original", [(np.arange(1 << 20) % 251).astype(np.uint8),
                                                np.full(256 << 10, 7, np.uint8)]))
        if sys.stdin.readline().strip() == "more":
            for k in range(8):
                ref.tell(tw.TensorMessage(b"more", [np.full(1 << 20, k, np.uint8),
                                                     np.full(256 << 10, k, np.uint8)]))
            print("sent", flush=True)
        sys.stdin.readline()
    """
)


def test_a_copy_of_a_message_received_over_shared_memory_is_writable_and_shares_nothing() -> None:
    sent = [(np.arange(1 << 20) % 251).astype(np.uint8), np.full(256 << 10, 7, np.uint8)]
    with tw.Node() as receiver:
        inbox = receiver.endpoint("inbox", capacity=64)
        sender = subprocess.Popen(
            [sys.executable, "-c", SENDER, receiver.address],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert sender.stdin is not None and sender.stdout is not None
        try:
            assert sender.stdout.readline().strip() == "shm", "the sender reaches us over shm"
            request = inbox.recv(timeout=30)
            assert request is not None and request.message.metadata == b"original"
            received = [np.frombuffer(b, np.uint8) for b in request.message.buffers]
            assert not any(r.flags.writeable for r in received), "views of the sender's memory"

            copy = request.message.copy()
            assert copy.version == request.message.version
            assert copy.metadata == b"original"
            assert all(b.writable for b in copy.buffers)
            mine = [np.frombuffer(b, np.uint8) for b in copy.buffers]
            for i, (own, got, expected) in enumerate(zip(mine, received, sent, strict=True)):
                assert np.array_equal(own, got), i
                assert np.array_equal(own, expected), i
                assert own.flags.writeable, i
                assert not np.shares_memory(own, got), f"buffer {i} shares the received memory"

            # Drop every reference to the received message: its slots go back to the sender,
            # which fills them with other bytes.
            del request, received
            gc.collect()
            sender.stdin.write("more\n")
            sender.stdin.flush()
            for _ in range(8):
                more = inbox.recv(timeout=30)
                assert more is not None and more.message.metadata == b"more"
                del more
            assert sender.stdout.readline().strip() == "sent"
            for i, (own, expected) in enumerate(zip(mine, sent, strict=True)):
                assert np.array_equal(own, expected), f"buffer {i} changed after the drop"
            mine[0][:] = 1
            assert np.all(np.frombuffer(copy.buffers[0], np.uint8) == 1), "the copy is writable"
        finally:
            sender.stdin.close()
            try:
                sender.wait(timeout=30)
            except subprocess.TimeoutExpired:
                sender.kill()
                sender.wait()
            sender.stdout.close()
