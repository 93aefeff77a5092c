"""TensorMessage: the public surface, buffers held without copying, bad input refused."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

import tensorwire as tw


def test_public_surface() -> None:
    for name in [
        "TensorMessage",
        "Node",
        "Ref",
        "Endpoint",
        "Request",
        "Buffer",
        "Route",
        "tensor_transport_stats",
        "tensors",
        "Error",
        "RemoteError",
        "DeadlineExceeded",
        "UnknownEndpoint",
        "TransportUnavailable",
        "LimitExceeded",
    ]:
        assert hasattr(tw, name), name
    assert issubclass(tw.DeadlineExceeded, TimeoutError)
    assert issubclass(tw.ConnectionFailed, ConnectionError)
    assert issubclass(tw.InvalidArgument, ValueError)
    assert issubclass(tw.UnknownEndpoint, LookupError)
    assert issubclass(tw.LimitExceeded, MemoryError)
    assert all(issubclass(getattr(tw, e), tw.Error) for e in tw._errors.__all__)


def test_attributes_and_a_metadata_only_message() -> None:
    m = tw.TensorMessage(b"only metadata", [])
    assert (m.version, m.metadata, m.buffers, m.total_bytes, len(m)) == (
        1,
        b"only metadata",
        (),
        0,
        0,
    )
    m = tw.TensorMessage("text", [b"ab", bytearray(b"cde")], version=7)
    assert (m.version, m.metadata, m.total_bytes, len(m)) == (7, b"text", 5, 2)


def test_buffers_of_any_dtype_and_kind_are_held_without_a_copy() -> None:
    x = np.arange(1000, dtype=np.float64)
    ba = bytearray(b"x" * 100)
    mm = mmap.mmap(-1, 4096)
    m = tw.TensorMessage(b"", [x, ba, memoryview(ba)[10:20], mm, np.zeros((3, 4), np.int16)])
    assert m.total_bytes == 8000 + 100 + 10 + 4096 + 24
    assert m.buffers[0] is x
    # Held as exports: the bytearray cannot be resized while the message holds it.
    with pytest.raises(BufferError):
        ba.extend(b"more")
    del m
    tw.tensor_transport_stats()  # drains released exports
    ba.extend(b"more")  # released
    mm.close()


def test_a_non_contiguous_buffer_is_refused_naming_its_index() -> None:
    a = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match=r"buffer 1 .*not C-contiguous"):
        tw.TensorMessage(b"", [a, a.T])
    with pytest.raises(ValueError, match=r"buffer 0 .*not C-contiguous"):
        tw.TensorMessage(b"", [a[:, ::2]])


def test_objects_without_the_buffer_protocol_are_refused() -> None:
    with pytest.raises(ValueError, match=r"buffer 0 \(int\)"):
        tw.TensorMessage(b"", [3])
    with pytest.raises(TypeError, match="metadata"):
        tw.TensorMessage(42, [])


def test_one_array_passed_as_the_buffer_list_is_refused_not_split_into_rows() -> None:
    with pytest.raises(TypeError, match="list of buffers, not one ndarray"):
        tw.TensorMessage(b"", np.zeros((3, 4), np.float32))
    with pytest.raises(TypeError, match="list of buffers, not one bytes"):
        tw.TensorMessage(b"", b"abc")
    assert len(tw.TensorMessage(b"", [np.zeros((3, 4), np.float32)])) == 1
    assert len(tw.TensorMessage(b"", list(np.zeros((3, 4), np.float32)))) == 3
