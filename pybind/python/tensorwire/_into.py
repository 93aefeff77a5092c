"""Receiving into buffers you own (``into=``): the views handed to the native layer, and the
check of a :func:`tensorwire.tensors.pack` message's dtypes made before anything is written.

The native layer checks the count and the byte size of every buffer, copies the received bytes
into yours once (GIL released for big ones) and lets the received memory go at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import tensors
from ._arrays import TORCH_ONLY
from ._errors import InvalidArgument


def views(into: Sequence[Any]) -> list[Any]:
    """Writable buffer-protocol views of ``into``: numpy arrays, ``bytearray``, ``memoryview``
    and other buffers as they are; CPU torch tensors as numpy views of the same memory."""
    out = []
    for index, target in enumerate(into):
        if type(target).__module__.startswith("torch"):
            out.append(_torch_view(index, target))
        else:
            out.append(target)
    return out


def checker(targets: list[Any]) -> Callable[[bytes], None]:
    """A check of received metadata against ``targets``: when the metadata is
    :func:`tensors.pack`'s, each tensor's dtype must be the dtype of its target (targets
    without a dtype, such as ``bytearray``, are checked by size only)."""

    def check(metadata: bytes) -> None:
        entries = _packed_entries(metadata)
        if entries is None:
            return
        for index, ((name, dtype, shape), target) in enumerate(zip(entries, targets, strict=False)):
            have = getattr(target, "dtype", None)
            if have is None:
                continue
            want = np.dtype(TORCH_ONLY.get(dtype, dtype))
            if np.dtype(have) != want:
                raise InvalidArgument(
                    f"into[{index}] has dtype {np.dtype(have)}, but tensor {name!r} arrived as "
                    f"{dtype}{list(shape)}: receive into arrays of the dtypes sent"
                )

    return check


def _packed_entries(metadata: bytes) -> list[tuple[str, str, tuple[int, ...]]] | None:
    """``(name, dtype, shape)`` of each tensor if ``metadata`` is ``tensors.pack``'s."""
    if not metadata.startswith(b"{"):
        return None
    try:
        meta = json.loads(metadata)
    except ValueError:
        return None
    if not isinstance(meta, dict) or meta.get("schema") != tensors.SCHEMA:
        return None
    entries = meta.get("tensors")
    if not isinstance(entries, list):
        return None
    out = []
    for entry in entries:
        try:
            name, dtype, shape, _ = tensors._entry(entry)
        except ValueError as e:
            # InvalidArgument, so the request is kept for the next receive (not lost).
            raise InvalidArgument(f"the received metadata: {e}") from None
        if dtype not in TORCH_ONLY:
            try:
                np.dtype(dtype)
            except TypeError:
                raise InvalidArgument(f"tensor {name!r}: unknown dtype {dtype!r}") from None
        out.append((name, dtype, shape))
    return out


def _torch_view(index: int, tensor: Any) -> Any:
    import torch

    if tensor.device.type != "cpu":
        raise InvalidArgument(f"into[{index}] is on {tensor.device}; receive into CPU memory")
    if not tensor.is_contiguous():
        raise InvalidArgument(f"into[{index}] is not contiguous: receive into contiguous memory")
    tensor = tensor.detach()
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype in TORCH_ONLY:
        tensor = tensor.view(getattr(torch, TORCH_ONLY[dtype]))
    return tensor.numpy()
