"""One tensorwire node per Ray process: it serves the arrays this process produced and fetches
the ones it consumes.

A fetch is one ask to the producer's node (``ENDPOINT``) naming the object and its token; the
reply's buffers are the object's arrays, in order. Fetches run on an event loop of their own
(a daemon thread), so several overlap and ``abort`` can cancel one from any thread.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import logging
import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray.util
from ray._private import ray_constants

from .._arrays import TORCH_ONLY, to_torch
from .._native import TensorMessage
from .._node import Node, Ref
from ._config import Config
from ._errors import FetchError
from ._settings import SETTINGS
from ._store import TOKEN_CHARS, Described, Store

ENDPOINT = "/named/tensorwire/ray/objects"
"""The endpoint every process's node serves its held objects on."""

SCHEMA = "tensorwire.ray/1"
"""What a fetch's metadata says it is."""

_MAX_REFS = 1024
"""How many producers' references (and recently aborted objects) a process keeps."""

_MAX_REQUEST = 4096
"""The longest fetch request served (an object id and a token take about 150 bytes)."""

_ABORT_MEMORY = 60.0
"""Seconds an aborted object's later fetches fail at once."""

_log = logging.getLogger("tensorwire.ray")


class Runtime:
    """This process's node, the objects it holds, and its fetches in flight."""

    def __init__(self, config: Config) -> None:
        self.config = config
        bind = self.config.bind or f"{_node_ip()}:0"
        self.node = Node(bind, **self.config.node_options())
        self.address = _reachable(self.node.address)
        """Where other processes reach this node (a wildcard bind advertises the Ray node's IP)."""
        self.store = Store()
        # Re-entrant: a fetch cancelled from a finalizer runs its done callback on a thread
        # that may already hold it.
        self._lock = threading.RLock()
        self._refs: OrderedDict[str, Ref[Any]] = OrderedDict()
        self._fetching: dict[str, set[concurrent.futures.Future[Any]]] = {}
        #: Objects whose fetches were aborted lately, so a fetch Ray starts after the abort
        #: fails at once instead of running to its timeout.
        self._aborted: OrderedDict[str, float] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.counters: Counter[str] = Counter()
        # A refused request is answered with its reason, not logged: any peer can send them.
        self.node.serve(ENDPOINT, self._serve, threads=2, log_errors=False)

    def fetch(self, obj_id: str, address: str, token: str) -> concurrent.futures.Future[Any]:
        """Starts fetching ``obj_id`` from the node at ``address``; the future's result is the
        reply message. Cancelling the future cancels the ask."""
        timeout = self.config.timeout or _ray_fetch_timeout()
        request = json.dumps({"schema": SCHEMA, "object": obj_id, "token": token})
        message = TensorMessage(request.encode(), [])
        with self._lock:
            if self._aborted.get(obj_id, 0.0) > time.monotonic():
                raise FetchError(f"fetching object {obj_id} was aborted")
            future = asyncio.run_coroutine_threadsafe(
                self._ref(address).ask_async(message, timeout), self._event_loop()
            )
            self._fetching.setdefault(obj_id, set()).add(future)
        started = time.perf_counter()
        future.add_done_callback(lambda done: self._fetched(obj_id, done, started))
        return future

    def abort(self, obj_id: str) -> int:
        """Cancels this process's fetches of ``obj_id``; returns how many were in flight."""
        with self._lock:
            futures = self._fetching.pop(obj_id, set())
            self._aborted[obj_id] = time.monotonic() + _ABORT_MEMORY
            while len(self._aborted) > _MAX_REFS:
                self._aborted.popitem(last=False)
        in_flight = [f for f in futures if not f.done()]
        # Counted first: cancelling wakes the waiter, who may read the stats at once.
        self.count("fetches_aborted", len(in_flight))
        for future in in_flight:
            future.cancel()
        return len(in_flight)

    def count(self, name: str, n: int = 1) -> None:
        """Adds ``n`` to the counter ``name`` (any thread)."""
        with self._lock:
            self.counters[name] += n

    def arrays(
        self,
        obj_id: str,
        reply: Any,
        described: Sequence[Described],
        target_buffers: Sequence[Any] | None,
    ) -> list[Any]:
        """The arrays of a fetch's ``reply``, checked against what the producer described:
        zero-copy views of the received memory (read-only over shared memory), or
        ``target_buffers`` filled with them."""
        if not isinstance(reply, TensorMessage):
            raise FetchError(f"object {obj_id}: the producer answered {type(reply).__name__}")
        buffers = reply.buffers
        if len(buffers) != len(described):
            raise FetchError(
                f"object {obj_id}: expected {len(described)} arrays, the reply has {len(buffers)}"
            )
        if target_buffers is not None and len(target_buffers) != len(described):
            raise ValueError(
                f"object {obj_id} has {len(described)} arrays, {len(target_buffers)} target "
                "buffers were given"
            )
        views = [
            _view(obj_id, i, b, what)
            for i, (b, what) in enumerate(zip(buffers, described, strict=True))
        ]
        self.count(f"fetched_{reply.route or 'unknown'}")
        self.count("fetched_bytes", reply.total_bytes)
        if target_buffers is not None:
            return [
                _fill(obj_id, i, t, a)
                for i, (t, a) in enumerate(zip(target_buffers, views, strict=True))
            ]
        return [
            to_torch(array, what.dtype) if what.kind == "torch" else array
            for array, what in zip(views, described, strict=True)
        ]

    def stats(self) -> dict[str, Any]:
        objects, nbytes = self.store.totals()
        with self._lock:
            in_flight = sum(len(f) for f in self._fetching.values())
            counters = dict(self.counters)
        return {
            "address": self.address,
            "objects_held": objects,
            "bytes_held": nbytes,
            "fetches_in_flight": in_flight,
            **counters,
            "node": self.node.stats(),
        }

    def close(self) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        self.node.close()

    def _serve(self, message: TensorMessage) -> TensorMessage:
        """Answers a fetch with the object's buffers (a lookup: no copy here)."""
        try:
            if len(message) or len(message.metadata) > _MAX_REQUEST:
                raise ValueError
            request = json.loads(bytes(message.metadata))
            obj_id, token = request["object"], request["token"]
            if request.get("schema") != SCHEMA or not isinstance(obj_id, str):
                raise ValueError
            if not isinstance(token, str) or len(token) != TOKEN_CHARS:
                raise ValueError
        except Exception:  # anything a peer sends: bad JSON, nesting, types, buffers
            self.count("requests_refused")
            raise ValueError(f"not a {SCHEMA} fetch request") from None
        held = self.store.lookup(obj_id, token)
        if held is None:
            self.count("requests_refused")
            raise LookupError(
                f"object {obj_id} is not held by the process at {self.address}: Ray freed it "
                "(its references went out of scope), or it was never produced here"
            )
        self.count("served")
        self.count("served_bytes", held.nbytes)
        return TensorMessage(json.dumps({"object": obj_id}).encode(), held.buffers)

    def _ref(self, address: str) -> Ref[Any]:
        with self._lock:
            ref = self._refs.get(address)
            if ref is not None:
                self._refs.move_to_end(address)
                return ref
        ref = self.node.ref(address, ENDPOINT)
        with self._lock:
            self._refs[address] = ref
            while len(self._refs) > _MAX_REFS:
                self._refs.popitem(last=False)
        return ref

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="tensorwire.ray fetches", daemon=True
                )
                thread.start()
                self._loop = loop
            return self._loop

    def _fetched(self, obj_id: str, future: concurrent.futures.Future[Any], started: float) -> None:
        micros = int((time.perf_counter() - started) * 1e6)
        with self._lock:
            self.counters["fetch_micros"] += micros
            futures = self._fetching.get(obj_id)
            if futures is not None:
                futures.discard(future)
                if not futures:
                    del self._fetching[obj_id]


def _view(obj_id: str, index: int, buffer: Any, what: Described) -> np.ndarray:
    """``buffer`` as the array ``what`` describes, after checking its length."""
    dtype = np.dtype(TORCH_ONLY.get(what.dtype, what.dtype))
    count = math.prod(what.shape)
    if memoryview(buffer).nbytes != count * dtype.itemsize:
        raise FetchError(
            f"object {obj_id}: array #{index} ({what.dtype}{list(what.shape)}) needs "
            f"{count * dtype.itemsize} bytes, the reply has {memoryview(buffer).nbytes}"
        )
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(what.shape)


def _fill(obj_id: str, index: int, target: Any, array: np.ndarray) -> Any:
    """Copies ``array`` into the caller's ``target`` (numpy array or CPU torch tensor)."""
    into = target.numpy() if type(target).__module__.startswith("torch") else target
    if not isinstance(into, np.ndarray) or into.shape != array.shape:
        raise ValueError(
            f"object {obj_id}: target buffer #{index} must be an array of shape "
            f"{list(array.shape)}, not {type(target).__name__} {getattr(into, 'shape', '')}"
        )
    if into.dtype != array.dtype or not into.flags.writeable:
        raise ValueError(
            f"object {obj_id}: target buffer #{index} must be a writable {array.dtype} array, "
            f"not {'read-only ' if not into.flags.writeable else ''}{into.dtype}"
        )
    np.copyto(into, array)
    return target


def _reachable(address: str) -> str:
    """``address`` with a wildcard host (``0.0.0.0``, ``[::]``) replaced by this Ray node's IP."""
    host, _, port = address.rpartition(":")
    if host in ("0.0.0.0", "[::]", "::"):
        return f"{_node_ip()}:{port}"
    return address


def _node_ip() -> str:
    try:
        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    except Exception:  # not inside Ray, or no route out: this host only
        return "127.0.0.1"


def _ray_fetch_timeout() -> float:
    return float(ray_constants.RDT_FETCH_FAIL_TIMEOUT_SECONDS)


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    """This process's runtime, started the first time with the process's settings."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            config = SETTINGS.start(Config.resolved)
            try:
                _runtime = Runtime(config)
            except BaseException:
                SETTINGS.start_failed()
                raise
            atexit.register(_runtime.close)
        return _runtime


def current() -> Runtime | None:
    """This process's runtime, if it started one."""
    return _runtime
