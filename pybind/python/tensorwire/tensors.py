"""Pack a dict of numpy arrays (or CPU torch tensors) into a TensorMessage, and back.

The metadata is JSON recording each tensor's name, dtype (with byte order), shape and kind, and
a schema version, so a receiver never needs to know shapes in advance. Buffers go out without
a copy; :func:`unpack` returns zero-copy views over the received memory. numpy is required,
torch optional (imported only when a torch tensor is packed or ``as_torch=True``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._native import TensorMessage

SCHEMA = "tensorwire.tensors/1"
"""The metadata schema this module writes and reads."""

_TORCH_ONLY = {"bfloat16": "int16"}


def pack(
    tensors: Mapping[str, Any],
    *,
    contiguous: bool = False,
    version: int = 1,
) -> TensorMessage:
    """A TensorMessage carrying ``tensors`` (name → numpy array or CPU torch tensor).

    A non-contiguous input raises ``ValueError`` naming it, unless ``contiguous=True`` asks for
    a contiguous copy of it. The arrays must not change until the send completes.
    """
    entries = []
    buffers = []
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__}")
        array, kind, dtype = _as_array(name, tensor)
        if not array.flags.c_contiguous:
            if not contiguous:
                raise ValueError(
                    f"tensor {name!r} is not C-contiguous (shape {array.shape}, strides "
                    f"{array.strides}); pass contiguous=True to send a contiguous copy"
                )
            array = np.ascontiguousarray(array)
        entries.append({"name": name, "dtype": dtype, "shape": list(array.shape), "kind": kind})
        buffers.append(array.reshape(-1).view(np.uint8) if array.ndim else array.reshape(1).view(np.uint8))
    metadata = json.dumps({"schema": SCHEMA, "tensors": entries}, separators=(",", ":"))
    return TensorMessage(metadata.encode(), buffers, version=version)


def unpack(message: TensorMessage, *, as_torch: bool | None = None) -> dict[str, Any]:
    """The tensors of a message made by :func:`pack`, as zero-copy views.

    ``as_torch`` returns torch tensors (``None``: torch where the sender packed torch and torch
    is installed). torch tensors are zero-copy over writable receive memory (PTR1, HTTP/2);
    over read-only memory (same process, shared memory) they are copies, because torch cannot
    mark a tensor read-only — pass ``as_torch=False`` for zero-copy read-only numpy views.
    Raises ``ValueError`` when the metadata does not describe the buffers.
    """
    try:
        meta = json.loads(bytes(message.metadata))
    except ValueError as e:
        raise ValueError(f"the metadata is not tensorwire.tensors JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        raise ValueError(f"the metadata is not schema {SCHEMA!r}")
    entries = meta.get("tensors")
    buffers = message.buffers
    if not isinstance(entries, list) or len(entries) != len(buffers):
        raise ValueError(
            f"the metadata describes {len(entries) if isinstance(entries, list) else '?'} "
            f"tensors but the message has {len(buffers)} buffers"
        )
    out: dict[str, Any] = {}
    for entry, buffer in zip(entries, buffers, strict=True):
        name, dtype, shape, kind = _entry(entry)
        storage = _TORCH_ONLY.get(dtype, dtype)
        try:
            np_dtype = np.dtype(storage)
        except TypeError as e:
            raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r}") from e
        count = math.prod(shape)
        expected = count * np_dtype.itemsize
        raw = memoryview(buffer)
        if raw.nbytes != expected:
            raise ValueError(
                f"tensor {name!r}: {dtype}{shape} needs {expected} bytes, the buffer has "
                f"{raw.nbytes}"
            )
        array = np.frombuffer(buffer, dtype=np_dtype, count=count).reshape(shape)
        torch_wanted = as_torch if as_torch is not None else (kind == "torch" and _has_torch())
        if dtype in _TORCH_ONLY and not torch_wanted:
            import warnings

            warnings.warn(
                f"tensor {name!r} is {dtype}, which numpy lacks: returned as its raw "
                f"{_TORCH_ONLY[dtype]} bits (install torch, or view it with ml_dtypes)",
                stacklevel=2,
            )
        out[name] = _to_torch(array, dtype) if torch_wanted else array
    return out


def _as_array(name: str, tensor: Any) -> tuple[np.ndarray, str, str]:
    module = type(tensor).__module__
    if module.startswith("torch"):
        import torch

        if tensor.device.type != "cpu":
            raise ValueError(f"tensor {name!r} is on {tensor.device}; move it to the CPU first")
        tensor = tensor.detach()
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype in _TORCH_ONLY:
            tensor = tensor.view(getattr(torch, _TORCH_ONLY[dtype]))
            return tensor.numpy(), "torch", dtype
        array = tensor.numpy()
        return array, "torch", array.dtype.str
    if isinstance(tensor, np.ndarray):
        if tensor.dtype.hasobject:
            raise ValueError(f"tensor {name!r} has dtype object; only plain numeric data travels")
        return tensor, "numpy", tensor.dtype.str
    raise TypeError(f"tensor {name!r} is a {type(tensor).__name__}, not a numpy array or torch tensor")


def _entry(entry: Any) -> tuple[str, str, tuple[int, ...], str]:
    if not isinstance(entry, dict):
        raise ValueError("a tensor entry in the metadata is not an object")
    name, dtype, shape, kind = (entry.get(k) for k in ("name", "dtype", "shape", "kind"))
    if not isinstance(name, str) or not isinstance(dtype, str):
        raise ValueError("a tensor entry lacks its name or dtype")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"tensor {name!r}: the shape {shape!r} is not a list of sizes")
    return name, dtype, tuple(shape), kind if isinstance(kind, str) else "numpy"


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _to_torch(array: np.ndarray, dtype: str) -> Any:
    import torch

    if not array.flags.writeable:
        # torch has no read-only tensors: a tensor over read-only memory (a sealed
        # shared-memory mapping, or the sender's memory in this process) would let an in-place
        # op crash the process or change the sender's data. Copy instead; `as_torch=False`
        # gives zero-copy read-only numpy views.
        array = array.copy()
    tensor = torch.from_numpy(array)
    if dtype in _TORCH_ONLY:
        tensor = tensor.view(getattr(torch, dtype))
    return tensor
