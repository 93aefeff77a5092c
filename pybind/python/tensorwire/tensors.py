"""Pack a dict of numpy arrays, CPU torch tensors and scalars into a TensorMessage, and back.

The metadata is JSON recording each tensor's name, dtype (with byte order), shape and kind, a
schema version and the caller's own JSON (``extra=``: a step, layer ids), so a receiver never
needs to know shapes in advance. Buffers go out without a copy; :func:`unpack` returns
zero-copy views over the received memory. numpy is required, torch optional (imported only
when a torch tensor is packed or ``as_torch=True``).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ._arrays import TORCH_ONLY, as_array, has_torch, to_torch
from ._native import TensorMessage

SCHEMA = "tensorwire.tensors/1"
"""The metadata schema this module writes and reads."""


class Unpacked(dict[str, Any]):
    """What :func:`unpack` returns: the tensors by name, and the sender's ``extra``."""

    extra: Any
    """The JSON value the sender passed as ``pack(..., extra=)`` (``None`` if it passed none)."""

    def __init__(self, tensors: dict[str, Any], extra: Any) -> None:
        super().__init__(tensors)
        self.extra = extra


def pack(
    tensors: Mapping[str, Any],
    *,
    extra: Any = None,
    contiguous: bool = False,
    version: int = 1,
) -> TensorMessage:
    """A TensorMessage carrying ``tensors`` (name → numpy array, CPU torch tensor, numpy scalar
    or Python ``bool``/``int``/``float``/``complex``) and ``extra``, any JSON value (numpy
    scalars in it become Python numbers), which :func:`unpack` returns as ``.extra``.

    A non-contiguous input raises ``ValueError`` naming it, unless ``contiguous=True`` asks for
    a contiguous copy of it. The arrays must not change until the send completes.
    """
    entries = []
    buffers = []
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__}")
        array, kind, dtype = as_array(name, tensor)
        if not array.flags.c_contiguous:
            if not contiguous:
                raise ValueError(
                    f"tensor {name!r} is not C-contiguous (shape {array.shape}, strides "
                    f"{array.strides}); pass contiguous=True to send a contiguous copy"
                )
            array = np.ascontiguousarray(array)
        entries.append({"name": name, "dtype": dtype, "shape": list(array.shape), "kind": kind})
        buffers.append(
            array.reshape(-1).view(np.uint8) if array.ndim else array.reshape(1).view(np.uint8)
        )
    header: dict[str, Any] = {"schema": SCHEMA, "tensors": entries}
    if extra is not None:
        header["extra"] = extra
    try:
        metadata = json.dumps(header, separators=(",", ":"), allow_nan=False, default=_json_scalar)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"extra must be JSON (dicts, lists, str, finite numbers, None): {e}"
        ) from None
    return TensorMessage(metadata.encode(), buffers, version=version)


def unpack(message: TensorMessage, *, as_torch: bool | None = None) -> Unpacked:
    """The tensors of a message made by :func:`pack`, as zero-copy views (scalars as the
    scalars that were packed), and the sender's ``extra`` as ``.extra``.

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
        storage = TORCH_ONLY.get(dtype, dtype)
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
        torch_wanted = as_torch if as_torch is not None else (kind == "torch" and has_torch())
        if dtype in TORCH_ONLY and not torch_wanted:
            warnings.warn(
                f"tensor {name!r} is {dtype}, which numpy lacks: returned as its raw "
                f"{TORCH_ONLY[dtype]} bits (install torch, or view it with ml_dtypes)",
                stacklevel=2,
            )
        if kind in ("python", "numpy-scalar") and shape:
            raise ValueError(f"tensor {name!r}: a scalar cannot have the shape {list(shape)}")
        if kind == "python":
            out[name] = array.item()
        elif kind == "numpy-scalar":
            out[name] = array[()]
        else:
            out[name] = to_torch(array, dtype) if torch_wanted else array
    return Unpacked(out, meta.get("extra"))


def _json_scalar(value: Any) -> Any:
    """numpy scalars in ``extra`` as Python numbers (``json.dumps``'s ``default``)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _entry(entry: Any) -> tuple[str, str, tuple[int, ...], str]:
    if not isinstance(entry, dict):
        raise ValueError("a tensor entry in the metadata is not an object")
    name, dtype, shape, kind = (entry.get(k) for k in ("name", "dtype", "shape", "kind"))
    if not isinstance(name, str) or not isinstance(dtype, str):
        raise ValueError("a tensor entry lacks its name or dtype")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"tensor {name!r}: the shape {shape!r} is not a list of sizes")
    return name, dtype, tuple(shape), kind if isinstance(kind, str) else "numpy"
