"""tensorwire as a Ray Direct Transport: the ``TensorTransportManager`` Ray calls.

One-sided: the producer only keeps its arrays (``extract_tensor_transport_metadata``); the
consumer fetches them with one ask (``recv_multiple_tensors``, or ``fetch_multiple_tensors``
then ``wait_fetch_complete`` when Ray overlaps several). Ray calls ``garbage_collect`` on the
producer when the object goes out of scope and ``abort_transport`` on the consumer when a
transfer failed or hung.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from ray.experimental import (
    CommunicatorMetadata,
    TensorTransportManager,
    TensorTransportMetadata,
    register_tensor_transport,
)
from ray.experimental.rdt import util
from ray.experimental.rdt.tensor_transport_manager import FetchRequest

from .. import _errors as tw_errors
from .._arrays import TORCH_ONLY, has_torch, torch_module
from ._config import Config
from ._errors import FetchError, FetchTimeout
from ._runtime import current, runtime
from ._settings import SETTINGS
from ._store import Described

NUMPY = "TENSORWIRE"
"""The transport for numpy arrays (``tensor_transport="tensorwire"``; Ray upper-cases names)."""

TORCH = "TENSORWIRE_TORCH"
"""The transport for CPU torch tensors, registered where torch is importable (Ray binds one
data type to each transport name)."""

_log = logging.getLogger("tensorwire.ray")
_registering = threading.Lock()


@dataclass
class TensorwireMetadata(TensorTransportMetadata):
    """Where an object's arrays are and how to rebuild them; travels through Ray.

    Unpickling it registers the transport in the receiving process and offers it the
    producer's settings, so a task or actor Ray did not set up can still fetch.
    """

    address: str = ""
    token: str = ""
    pid: int = 0
    described: list[Described] = field(default_factory=list)
    nbytes: int = 0
    config: Config = field(default_factory=Config)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        register_managers()
        SETTINGS.adopt(self.config)


@dataclass
class TensorwireFetch(FetchRequest):
    """A fetch in flight; dropping it unawaited cancels it."""

    future: concurrent.futures.Future[Any] | None = None
    meta: TensorwireMetadata | None = None
    target_buffers: list[Any] | None = None

    def __del__(self) -> None:
        if self.future is not None and not self.future.done():
            self.future.cancel()


class TensorwireTransport(TensorTransportManager):
    """The manager Ray instantiates once per process, for numpy arrays."""

    name = NUMPY

    def __init__(self) -> None:
        self._checked: set[str] = set()
        self._checked_lock = threading.Lock()

    def tensor_transport_backend(self) -> str:
        return self.name

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    def actor_has_tensor_transport(self, actor: ray.actor.ActorHandle[Any]) -> bool:
        """Starts the actor's node once (on first use by this caller), so a missing
        package, a bad bind address or unreadable TLS files fail here, with the reason."""
        key = actor._actor_id.hex()
        with self._checked_lock:
            if key in self._checked:
                return True
        # Not on "_ray_system": a fetch stalled there would hold the check up.
        probe: Any = actor.__ray_call__.options(concurrency_group="_ray_system_error").remote(
            _start_node, SETTINGS.current().shareable()
        )
        try:
            ray.get(probe, timeout=60)
        except ray.exceptions.GetTimeoutError:
            raise ValueError(
                f"{actor} did not answer tensorwire's check within 60 s (is it busy or stuck?)"
            ) from None
        except Exception as e:
            raise ValueError(
                f"the tensorwire transport cannot start in {actor}: {e}. Install tensorwire "
                "in the actor's environment and check tensorwire.ray.register()'s settings "
                "and the actor's TENSORWIRE_RAY_* / TENSORWIRE_TLS_* environment"
            ) from e
        with self._checked_lock:
            self._checked.add(key)
        return True

    def extract_tensor_transport_metadata(
        self, obj_id: str, rdt_object: list[Any]
    ) -> TensorwireMetadata:
        rt = runtime()
        token, described = rt.store.hold(obj_id, rdt_object)
        return TensorwireMetadata(
            tensor_meta=[_ray_meta(t) for t in rdt_object],
            tensor_device="cpu",
            address=rt.address,
            token=token,
            pid=os.getpid(),
            described=described,
            nbytes=sum(_nbytes(d) for d in described),
            config=SETTINGS.current().shareable(),
        )

    def get_communicator_metadata(
        self,
        src_actor: ray.actor.ActorHandle[Any] | None,
        dst_actor: ray.actor.ActorHandle[Any] | None,
        backend: str | None = None,
    ) -> CommunicatorMetadata:
        if dst_actor is not None and not getattr(dst_actor, "_ray_enable_tensor_transport", True):
            # Ray would run the fetch on the actor's task thread, behind the task that waits
            # for it: a hang until Ray's fetch timeout.
            raise ValueError(
                f"{dst_actor} receives a tensorwire object but was created without "
                "@ray.remote(enable_tensor_transport=True); Ray needs it on consuming actors "
                "too, to fetch beside the running task"
            )
        return CommunicatorMetadata()

    def recv_multiple_tensors(
        self,
        obj_id: str,
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
        target_buffers: list[Any] | None = None,
    ) -> list[Any]:
        request = self.fetch_multiple_tensors(
            obj_id, tensor_transport_metadata, communicator_metadata, target_buffers
        )
        return self.wait_fetch_complete(request)

    def fetch_multiple_tensors(
        self,
        obj_id: str,
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
        target_buffers: list[Any] | None = None,
    ) -> TensorwireFetch:
        meta = _ours(obj_id, tensor_transport_metadata)
        SETTINGS.adopt(meta.config)
        rt = runtime()
        future = rt.fetch(obj_id, meta.address, meta.token)
        return TensorwireFetch(
            obj_id=obj_id, tensors=[], future=future, meta=meta, target_buffers=target_buffers
        )

    def wait_fetch_complete(self, fetch_request: FetchRequest, timeout: float = -1) -> list[Any]:
        if not isinstance(fetch_request, TensorwireFetch) or fetch_request.future is None:
            return fetch_request.tensors
        meta, obj_id = fetch_request.meta, fetch_request.obj_id
        assert meta is not None
        rt = runtime()
        where = (
            f"object {obj_id} ({len(meta.described)} arrays, {meta.nbytes} bytes) from the "
            f"tensorwire node at {meta.address} (pid {meta.pid})"
        )
        try:
            reply = fetch_request.future.result(None if timeout < 0 else timeout)
        except concurrent.futures.TimeoutError:
            raise FetchTimeout(f"fetching {where}: not done after {timeout:.3g} s") from None
        except concurrent.futures.CancelledError:
            rt.count("fetch_failures")
            raise FetchError(f"fetching {where} was aborted") from None
        except tw_errors.DeadlineExceeded as e:
            rt.count("fetch_failures")
            raise FetchTimeout(f"fetching {where}: {e}") from e
        except tw_errors.ConnectionFailed as e:
            rt.count("fetch_failures")
            raise FetchError(
                f"fetching {where} failed: {e}. The producing process has probably exited "
                "(its arrays went with it)"
            ) from e
        except tw_errors.Error as e:
            rt.count("fetch_failures")
            raise FetchError(f"fetching {where} failed: {e}") from e
        tensors = rt.arrays(obj_id, reply, meta.described, fetch_request.target_buffers)
        fetch_request.future = None
        return tensors

    def send_multiple_tensors(
        self,
        tensors: list[Any],
        tensor_transport_metadata: TensorTransportMetadata,
        communicator_metadata: CommunicatorMetadata,
    ) -> None:
        raise NotImplementedError("tensorwire is one-sided: the consumer fetches")

    def garbage_collect(
        self, obj_id: str, tensor_transport_meta: TensorTransportMetadata, tensors: list[Any]
    ) -> None:
        rt = current()
        if rt is not None:
            rt.store.drop(obj_id)

    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata) -> None:
        rt = current()
        if rt is not None:
            rt.abort(obj_id)


class TensorwireTorchTransport(TensorwireTransport):
    """The same manager for CPU torch tensors (Ray binds one data type to each name)."""

    name = TORCH


def _start_node(actor: Any, config: Config) -> str:
    """Runs in an actor: starts its node (once, with the caller's settings unless it has its
    own) and says where it listens."""
    conflict = SETTINGS.adopt(config)
    if conflict is not None:
        raise RuntimeError(
            f"tensorwire in this process cannot take the caller's settings: {conflict}"
        )
    return runtime().address


def _ours(obj_id: str, meta: TensorTransportMetadata) -> TensorwireMetadata:
    if not isinstance(meta, TensorwireMetadata):
        raise FetchError(
            f"object {obj_id} was not produced by the tensorwire transport "
            f"(its metadata is a {type(meta).__name__})"
        )
    return meta


def _ray_meta(tensor: Any) -> tuple[Any, Any]:
    """The ``(shape, dtype)`` pair Ray records (torch types for torch tensors)."""
    return (tensor.shape, tensor.dtype)


def _nbytes(d: Described) -> int:
    return math.prod(d.shape) * np.dtype(TORCH_ONLY.get(d.dtype, d.dtype)).itemsize


def register_managers() -> None:
    """Registers both transports with Ray in this process, unless they are (the torch one
    only where torch is importable)."""
    managers: list[tuple[str, type[TensorwireTransport], type]] = [
        (NUMPY, TensorwireTransport, np.ndarray)
    ]
    if has_torch():
        managers.append((TORCH, TensorwireTorchTransport, torch_module().Tensor))
    with _registering:
        for name, manager, data_type in managers:
            if name in util.transport_manager_info:
                continue
            try:
                register_tensor_transport(name, ["cpu"], manager, data_type)
            except ValueError:  # Ray registered it meanwhile (from the driver's list)
                _log.debug("tensorwire.ray: %s was registered meanwhile", name)
