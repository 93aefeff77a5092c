"""The actors of ``ray_bench.py`` (a module of its own so Ray's workers import it by name)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import ray
from ray.experimental import (
    CommunicatorMetadata,
    TensorTransportManager,
    TensorTransportMetadata,
    register_tensor_transport,
)

import tensorwire as tw
import tensorwire.ray as twr


class NoBytes(TensorTransportManager):
    """A Ray Direct Transport that moves no bytes (the consumer gets empty arrays of the
    right shape): what Ray's own orchestration of a transfer costs, the floor under any
    transport's time."""

    def tensor_transport_backend(self) -> str:
        return "NO_BYTES"

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    def actor_has_tensor_transport(self, actor: Any) -> bool:
        return True

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: list[Any]) -> Any:
        return TensorTransportMetadata([(a.shape, a.dtype) for a in rdt_object], "cpu")

    def get_communicator_metadata(self, src: Any, dst: Any, backend: Any = None) -> Any:
        return CommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id: str, meta: Any, comm: Any, target: Any = None) -> Any:
        return [np.empty(shape, dtype) for shape, dtype in meta.tensor_meta]

    def send_multiple_tensors(self, *args: Any) -> None:
        raise NotImplementedError

    def garbage_collect(self, *args: Any) -> None:
        pass

    def abort_transport(self, *args: Any) -> None:
        pass


def _register_no_bytes() -> None:
    from ray.experimental.rdt import util

    if "NO_BYTES" not in util.transport_manager_info:
        register_tensor_transport("no_bytes", ["cpu"], NoBytes, np.ndarray)


_register_no_bytes()


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@ray.remote(enable_tensor_transport=True)
class Producer:
    """Fills an array of ``nbytes`` with ``nbytes % 251`` and returns it, three ways."""

    def __init__(self) -> None:
        self._arrays: dict[int, np.ndarray] = {}

    def _filled(self, nbytes: int) -> np.ndarray:
        array = self._arrays.get(nbytes)
        if array is None:
            array = self._arrays[nbytes] = np.empty(nbytes, np.uint8)
        array.fill(nbytes % 251)
        return array

    def plain(self, nbytes: int) -> np.ndarray:
        return self._filled(nbytes)

    @ray.method(tensor_transport="tensorwire")
    def tensorwire(self, nbytes: int) -> np.ndarray:
        return self._filled(nbytes)

    @ray.method(tensor_transport="no_bytes")
    def no_bytes(self, nbytes: int) -> np.ndarray:
        return self._filled(nbytes)

    @ray.method(tensor_transport="tensorwire")
    def loaned(self, nbytes: int) -> np.ndarray:
        array = twr.empty(nbytes, np.uint8)
        array.fill(nbytes % 251)
        return array


@ray.remote(enable_tensor_transport=True)
class Consumer:
    def consume(self, array: np.ndarray) -> int:
        return int(array[0]) + int(array[-1])

    def consume_nothing(self, array: np.ndarray) -> int:
        return 2 * (array.size % 251)  # NoBytes delivers no bytes to check

    def rss(self) -> int:
        return rss()

    def hold_and_measure(self, array: np.ndarray) -> int:
        """The RSS while holding ``array`` with every byte read (every page mapped in)."""
        int(array.sum(dtype=np.uint64))
        return rss()

    def stats(self) -> dict[str, Any]:
        stats = twr.stats()
        stats.pop("node", None)
        stats["process"] = tw.tensor_transport_stats()
        return stats
