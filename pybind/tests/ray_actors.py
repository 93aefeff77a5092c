"""Actors the Ray tests run (a module of its own so Ray's workers import it by name)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np
import ray

import tensorwire as tw
import tensorwire.ray as twr


def pattern(nbytes: int, index: int) -> np.ndarray:
    """``nbytes`` bytes cycling with period 251 from ``index``: a shifted, truncated or
    swapped array never matches."""
    return np.resize((np.arange(251, dtype=np.uint16) + index).astype(np.uint8), nbytes)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@ray.remote(enable_tensor_transport=True)
class Producer:
    def __init__(self) -> None:
        self._release = threading.Event()
        self.kept: Any = None

    @ray.method(tensor_transport="tensorwire")
    def make(self, nbytes: int, count: int) -> list[np.ndarray]:
        return [pattern(nbytes, i) for i in range(count)]

    @ray.method(tensor_transport="tensorwire")
    def make_one(self, nbytes: int) -> np.ndarray:
        return pattern(nbytes, 0)

    @ray.method(tensor_transport="tensorwire")
    def make_loaned(self, nbytes: int) -> np.ndarray:
        array = twr.empty(nbytes, np.uint8)
        array[:] = pattern(nbytes, 3)
        self.kept = array
        return array

    @ray.method(tensor_transport="tensorwire")
    def again(self, index: int) -> np.ndarray:
        """Writes another pattern into the array ``make_loaned`` returned, returns it again."""
        self.kept[:] = pattern(len(self.kept), index)
        return self.kept

    def scribble(self) -> None:
        """Writes over the array ``make_loaned`` returned (the object must not change)."""
        self.kept[:] = 0

    @ray.method(tensor_transport="tensorwire_torch")
    def make_torch(self, n: int) -> list[Any]:
        """CPU torch tensors: float32, and bfloat16 (which numpy lacks)."""
        return torch_pair(n)

    def put(self, nbytes: int) -> list[ray.ObjectRef]:
        return [ray.put(pattern(nbytes, 5), _tensor_transport="tensorwire")]

    def stall(self) -> None:
        """From now on the node's handler threads wait before answering a fetch."""
        runtime = twr._runtime.current()
        assert runtime is not None
        lookup, release = runtime.store.lookup, self._release
        self._release.clear()

        def stalled(obj_id: str, token: str) -> Any:
            runtime.count("stalled")
            release.wait(60)
            return lookup(obj_id, token)

        runtime.store.lookup = stalled  # type: ignore[method-assign]

    def unstall(self) -> None:
        self._release.set()

    def stats(self) -> dict[str, Any]:
        stats = twr.stats()
        stats.pop("node", None)
        return {**stats, "rss": rss(), "process": tw.tensor_transport_stats()}

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())


@ray.remote(enable_tensor_transport=True)
class Consumer:
    def check(self, arrays: Any, nbytes: int, count: int, first: int = 0) -> dict[str, Any]:
        """Compares what arrived with :func:`pattern`; returns what it saw."""
        if isinstance(arrays, np.ndarray):
            arrays = [arrays]
        intact = len(arrays) == count and all(
            a.dtype == np.uint8 and np.array_equal(a, pattern(nbytes, first + i))
            for i, a in enumerate(arrays)
        )
        return {
            "intact": intact,
            "count": len(arrays),
            "writable": [a.flags.writeable for a in arrays],
        }

    def check_torch(self, tensors: list[Any], n: int) -> dict[str, Any]:
        """Compares torch tensors that arrived with :func:`torch_pair`."""
        import torch

        expected = torch_pair(n)
        return {
            "types": [type(t).__name__ for t in tensors],
            "dtypes": [str(t.dtype) for t in tensors],
            "intact": all(torch.equal(t, e) for t, e in zip(tensors, expected, strict=True)),
            "writable": [_writable(t) for t in tensors],
        }

    def get(self, refs: list[ray.ObjectRef], nbytes: int) -> bool:
        (arrays,) = ray.get(refs)
        return bool(np.array_equal(arrays, pattern(nbytes, 5)))

    def peak_rss_of(self, array: np.ndarray) -> dict[str, int]:
        """The process's RSS while it holds ``array`` (after reading every byte)."""
        total = int(array.sum(dtype=np.uint64))
        return {"rss": rss(), "sum": total}

    def rss(self) -> int:
        return rss()

    def stats(self) -> dict[str, Any]:
        stats = twr.stats()
        stats.pop("node", None)
        return stats

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())


@ray.remote(enable_tensor_transport=True)
class Plain:
    """Ray's object store, for the benchmark: the same arrays through a plain method."""

    def make(self, nbytes: int, count: int) -> list[np.ndarray]:
        return [pattern(nbytes, i) for i in range(count)]


def torch_pair(n: int) -> list[Any]:
    """Two CPU torch tensors of ``n`` elements: float32 and bfloat16 (imported here: Ray's
    workers import this module whether or not torch is installed)."""
    import torch

    base = torch.arange(n, dtype=torch.float32) % 251
    return [base, (base / 8).to(torch.bfloat16)]


def _writable(tensor: Any) -> bool:
    """Whether an in-place op on ``tensor`` works (a torch tensor over read-only memory
    would crash or change the sender's bytes; the transport copies into one it may write)."""
    tensor.add_(0)
    return True


def wait_for(predicate: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())
