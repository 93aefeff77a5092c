"""numpy arrays from what users send (numpy arrays and scalars, CPU torch tensors, Python
numbers), and torch tensors from received arrays: shared by :mod:`tensorwire.tensors` and
:mod:`tensorwire.ray`. torch is optional: imported only when a torch tensor is given or asked
for.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np

TORCH_ONLY = {"bfloat16": "int16"}
"""torch dtypes numpy lacks, and the numpy dtype of the same size their bits travel as."""


def as_array(name: str, tensor: Any) -> tuple[np.ndarray, str, str]:
    """``tensor`` as a numpy array (no copy), its kind (``numpy``, ``numpy-scalar``,
    ``python``, ``torch``) and its dtype's name (numpy ``dtype.str``, or the torch name of a
    torch-only dtype). ``name`` names it in errors."""
    module = type(tensor).__module__
    if module.startswith("torch"):
        torch = torch_module()
        if tensor.device.type != "cpu":
            raise ValueError(f"tensor {name!r} is on {tensor.device}; move it to the CPU first")
        tensor = tensor.detach()
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype in TORCH_ONLY:
            tensor = tensor.view(getattr(torch, TORCH_ONLY[dtype]))
            return tensor.numpy(), "torch", dtype
        array = tensor.numpy()
        return array, "torch", array.dtype.str
    if isinstance(tensor, np.ndarray | np.generic):
        kind = "numpy" if isinstance(tensor, np.ndarray) else "numpy-scalar"
        array = np.asarray(tensor)
        if array.dtype.hasobject:
            raise ValueError(f"tensor {name!r} has dtype object; only plain numeric data travels")
        return array, kind, array.dtype.str
    if isinstance(tensor, bool | int | float | complex):
        array = np.asarray(tensor)
        if array.dtype.hasobject:  # an int past 64 bits
            raise ValueError(f"tensor {name!r}: {tensor} does not fit 64 bits")
        return array, "python", array.dtype.str
    raise TypeError(
        f"tensor {name!r} is a {type(tensor).__name__}, not a numpy array, torch tensor or "
        "number (other values go in extra=)"
    )


def to_torch(array: np.ndarray, dtype: str) -> Any:
    """A CPU torch tensor of ``array`` (``dtype`` names a torch-only dtype its bits are):
    zero-copy over writable memory, a copy over read-only memory, which torch cannot mark
    read-only (an in-place op would crash the process on a sealed shared-memory mapping, or
    change the sender's data in this process)."""
    torch = torch_module()
    if not array.flags.writeable:
        array = array.copy()
    tensor = torch.from_numpy(array)
    if dtype in TORCH_ONLY:
        tensor = tensor.view(getattr(torch, dtype))
    return tensor


def torch_module() -> ModuleType:
    """The ``torch`` module (``ImportError`` when it is not installed)."""
    return importlib.import_module("torch")


def has_torch() -> bool:
    """Whether torch can be imported."""
    try:
        torch_module()
    except ImportError:
        return False
    return True
