"""tensors.pack / unpack: dicts of arrays in, zero-copy views out, shapes from the metadata."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tensorwire as tw
from helpers import need
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


@pytest.mark.parametrize("transport", ["raw", "shm"])
def test_torch_tensors_round_trip_bfloat16_included(
    node: tw.Node, server: tw.Node, transport: str
) -> None:
    torch = need("torch")
    batch = {
        "w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.linspace(-2, 2, 5, dtype=torch.bfloat16),
        "i": torch.tensor(7, dtype=torch.int64),
    }
    for message in (
        tensors.pack(batch),
        node.ref(server.address, "echo", transport).ask(tensors.pack(batch)),
    ):
        assert isinstance(message, tw.TensorMessage)
        out = tensors.unpack(message)
        for name, tensor in batch.items():
            assert isinstance(out[name], torch.Tensor) and out[name].dtype == tensor.dtype, name
            assert torch.equal(out[name], tensor), name
    # numpy receivers get bfloat16's raw bits, and are told so.
    with pytest.warns(UserWarning, match="bfloat16, which numpy lacks"):
        raw = tensors.unpack(tensors.pack(batch), as_torch=False)
    assert raw["b"].dtype == np.int16


def test_extra_json_round_trips_beside_the_tensors(node: tw.Node, server: tw.Node) -> None:
    extra = {"step": np.int64(1200), "layers": [3, 4], "lr": np.float32(0.5), "tag": "warmup"}
    message = tensors.pack({"g": np.ones(3, np.float32)}, extra=extra, version=9)
    reply = node.ref(server.address, "echo", transport="raw").ask(message)
    assert isinstance(reply, tw.TensorMessage)
    out = tensors.unpack(reply)
    assert out.extra == {"step": 1200, "layers": [3, 4], "lr": 0.5, "tag": "warmup"}
    assert list(out) == ["g"] and reply.version == 9
    assert tensors.unpack(tensors.pack({})).extra is None
    with pytest.raises(ValueError, match="extra must be JSON"):
        tensors.pack({}, extra={"a": object()})
    with pytest.raises(ValueError, match="extra must be JSON"):
        tensors.pack({}, extra=float("nan"))


def test_numpy_and_python_scalars_travel_and_come_back_as_scalars() -> None:
    batch = {
        "step": 12,
        "loss": 0.25,
        "done": True,
        "z": 1 + 2j,
        "n": np.float16(1.5),
        "i": np.int8(-3),
    }
    out = tensors.unpack(tensors.pack(batch))
    assert out == batch
    assert [type(out[k]) for k in batch] == [int, float, bool, complex, np.float16, np.int8]
    with pytest.raises(ValueError, match="does not fit 64 bits"):
        tensors.pack({"big": 1 << 70})
    with pytest.raises(TypeError, match="other values go in extra="):
        tensors.pack({"name": "text"})
