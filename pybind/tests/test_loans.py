"""Loans: filled in place, frozen into a read-only buffer whose bytes never change again.

freeze() tracks exports exactly (the buffer protocol's get and release): it refuses while a
memoryview or numpy.frombuffer view is alive. numpy.ndarray(buffer=) and torch.frombuffer
keep only the address; after freeze() they write to a private copy, never to the frozen
buffer or to what a peer received.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorwire as tw
from helpers import need


def test_freeze_refuses_while_a_memoryview_is_exported(node: tw.Node) -> None:
    loan = node.loan(4096)
    view = memoryview(loan)
    view[:4] = b"abcd"
    with pytest.raises(BufferError, match="1 view"):
        loan.freeze()
    view.release()
    assert bytes(loan.freeze())[:4] == b"abcd"


def test_freeze_refuses_while_a_numpy_frombuffer_array_is_alive(node: tw.Node) -> None:
    loan = node.loan(4096)
    array = np.frombuffer(loan, np.uint8)
    array[:] = 3
    with pytest.raises(BufferError, match="still exported"):
        loan.freeze()
    del array
    buffer = loan.freeze()
    assert bytes(buffer) == b"\x03" * 4096 and loan.frozen


def test_an_ndarray_built_on_the_loan_writes_privately_after_freeze(node: tw.Node) -> None:
    loan = node.loan(1 << 20)
    held = np.ndarray((1 << 20,), np.uint8, buffer=loan)  # keeps the address, not the export
    held[:] = 7
    buffer = loan.freeze()
    assert np.all(held == 7), "it still reads the bytes"
    held[:] = 9  # a write after freeze: private to this array
    assert bytes(buffer) == b"\x07" * (1 << 20), "the frozen buffer did not change"


def test_a_peer_never_sees_a_write_made_after_freeze(node: tw.Node) -> None:
    with tw.Node() as other:
        inbox = other.endpoint("inbox")
        loan = node.loan(1 << 20)
        held = np.ndarray((1 << 20,), np.uint8, buffer=loan)
        held[:] = 5
        buffer = loan.freeze()
        node.ref(other.address, "inbox", transport="shm").tell(tw.TensorMessage(b"", [buffer]))
        held[:] = 6
        request = inbox.recv(timeout=5)
        assert request is not None
        assert np.all(np.frombuffer(request.message.buffers[0], np.uint8) == 5)


def test_a_torch_tensor_built_on_the_loan_writes_privately_after_freeze(node: tw.Node) -> None:
    torch = need("torch")
    loan = node.loan(4096)
    tensor = torch.frombuffer(loan, dtype=torch.uint8)
    tensor[:] = 1
    buffer = loan.freeze()
    tensor[:] = 2
    assert bytes(buffer) == b"\x01" * 4096


def test_a_frozen_loan_takes_no_more_views_and_cannot_be_frozen_twice(node: tw.Node) -> None:
    loan = node.loan(16)
    loan.freeze()
    with pytest.raises(BufferError, match="frozen"):
        memoryview(loan)
    with pytest.raises(tw.ShutDown, match="already frozen"):
        loan.freeze()
