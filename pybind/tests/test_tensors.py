"""tensors.pack / unpack: dicts of arrays in, zero-copy views out, shapes from the metadata."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tensorwire as tw
from tensorwire import tensors


def test_a_dict_of_arrays_round_trips_with_dtypes_shapes_and_byte_order(
    node: tw.Node, server: tw.Node
) -> None:
    batch = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "be_i32": np.arange(5, dtype=">i4"),
        "bool": np.array([True, False, True]),
        "scalar": np.array(2.5),
        "empty": np.zeros((0, 7), np.float16),
        "c64": np.ones(3, np.complex64),
    }
    msg = tensors.pack(batch)
    meta = json.loads(msg.metadata)
    assert meta["schema"] == tensors.SCHEMA
    assert [t["name"] for t in meta["tensors"]] == list(batch)
    reply = node.ref(server.address, "echo", transport="raw").ask(msg)
    out = tensors.unpack(reply)
    assert list(out) == list(batch)
    for name, array in batch.items():
        assert out[name].dtype == array.dtype, name
        assert out[name].shape == array.shape, name
        assert np.array_equal(out[name], array), name
    assert out["f32"].flags.writeable  # received over TCP into our own memory


def test_packing_does_not_copy_and_unpacking_gives_views() -> None:
    a = np.arange(1000, dtype=np.float64)
    msg = tensors.pack({"a": a})
    assert np.shares_memory(np.frombuffer(msg.buffers[0], np.uint8), a)
    out = tensors.unpack(msg)
    assert np.shares_memory(out["a"], a)


def test_a_non_contiguous_input_is_refused_unless_asked_to_copy() -> None:
    a = np.zeros((8, 8), np.float32).T
    with pytest.raises(ValueError, match="tensor 'a' is not C-contiguous"):
        tensors.pack({"a": a})
    msg = tensors.pack({"a": a}, contiguous=True)
    assert tensors.unpack(msg)["a"].shape == (8, 8)


def test_metadata_that_does_not_match_the_buffers_is_refused() -> None:
    good = json.loads(tensors.pack({"a": np.zeros(4, np.float32)}).metadata)
    wrong_shape = dict(good, tensors=[dict(good["tensors"][0], shape=[5])])
    with pytest.raises(ValueError, match="needs 20 bytes, the buffer has 16"):
        tensors.unpack(tw.TensorMessage(json.dumps(wrong_shape), [np.zeros(4, np.float32)]))
    with pytest.raises(ValueError, match="describes 1 tensors but the message has 2"):
        tensors.unpack(tw.TensorMessage(json.dumps(good), [b"x" * 16, b"y"]))
    with pytest.raises(ValueError, match="not tensorwire.tensors JSON"):
        tensors.unpack(tw.TensorMessage(b"\xff", []))
    with pytest.raises(ValueError, match="not a list of sizes"):
        bad = dict(good, tensors=[dict(good["tensors"][0], shape=[-1])])
        tensors.unpack(tw.TensorMessage(json.dumps(bad), [b"x" * 16]))
    with pytest.raises(TypeError, match="not a numpy array"):
        tensors.pack({"a": [1, 2, 3]})


def test_torch_tensors_round_trip_when_torch_is_installed() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed: torch cases skipped")
    batch = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}
    out = tensors.unpack(tensors.pack(batch))
    assert isinstance(out["w"], torch.Tensor) and out["b"].dtype == torch.bfloat16
    assert torch.equal(out["w"], batch["w"]) and torch.equal(out["b"], batch["b"])
