"""A plain Ray task in a module that does not import tensorwire: the transport must register
itself in the worker when the object's metadata is unpickled with the task's arguments (which
imports tensorwire.ray)."""

from __future__ import annotations

import sys

import numpy as np
import ray


@ray.remote
def fetch_in_a_task(refs: list[ray.ObjectRef], nbytes: int) -> dict[str, bool]:
    registered = "TENSORWIRE" in sys.modules["ray.experimental.rdt.util"].transport_manager_info
    (array,) = ray.get(refs)
    expected = np.resize((np.arange(251, dtype=np.uint16) + 5).astype(np.uint8), nbytes)
    return {"registered": registered, "intact": bool(np.array_equal(array, expected))}
