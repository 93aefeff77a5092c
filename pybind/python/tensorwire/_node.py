"""Nodes, references to remote endpoints, and mailboxes, in blocking and asyncio form.

Blocking calls release the GIL and wake every 100 ms so Ctrl+C interrupts them. The asyncio
forms (``ask_async``, ``tell_async``, ``recv_async``, ``async for``) are woken through one
eventfd per event loop, registered with ``loop.add_reader``; each wake-up drains every
completion that is ready. Cancelling the awaiting task cancels the operation in the engine.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

from . import _native
from ._native import Request, TensorMessage

Reply = Any
"""What an ask returns: a TensorMessage, ``None`` (an ack), ``bytes``, an unpickled object
(with ``pickle=True``) or a ``(msg_type, bytes)`` pair for other single replies."""


class Route(NamedTuple):
    """The path a send takes (``local``, ``shm``, ``raw`` or ``http2``) and why."""

    path: str
    reason: str


_log = logging.getLogger("tensorwire")


class _LoopPump:
    """One event loop's completion queue and the futures waiting on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pump = _native.Pump()
        self.futures: dict[int, asyncio.Future[Any]] = {}
        #: Where a result nobody awaits any more goes (a received request back to its
        #: endpoint's stash), by token.
        self.orphans: dict[int, Callable[[Any], None]] = {}
        loop.add_reader(self.pump.fileno(), self._drain)

    def _drain(self) -> None:
        for token, ok, value in self.pump.drain():
            fut = self.futures.pop(token, None)
            orphan = self.orphans.pop(token, None)
            if fut is None or fut.done():
                if ok and orphan is not None:
                    orphan(value)  # cancelled meanwhile: never drop what arrived
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    async def wait(self, token: int, orphan: Callable[[Any], None] | None = None) -> Any:
        fut = asyncio.get_running_loop().create_future()
        self.futures[token] = fut
        if orphan is not None:
            self.orphans[token] = orphan
        try:
            return await fut
        except BaseException:
            # Cancelled (or the coroutine closed): withdraw the operation; if its result had
            # already arrived, hand it to `orphan` instead of losing it.
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                if orphan is not None:
                    orphan(fut.result())
            else:
                finished = self.pump.cancel(token)
                if finished is not None and finished[0] and orphan is not None:
                    orphan(finished[1])
            raise
        finally:
            self.futures.pop(token, None)
            self.orphans.pop(token, None)


_pumps: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopPump] = (
    weakref.WeakKeyDictionary()
)


def _pump() -> _LoopPump:
    loop = asyncio.get_running_loop()
    pump = _pumps.get(loop)
    if pump is None:
        pump = _pumps[loop] = _LoopPump(loop)
    return pump


class Node:
    """A tensorwire node: serves endpoints on one port and sends to other nodes.

    ``transport`` sets the node's preference (``auto``, ``raw``, ``http2``, ``shm``) and wins
    over ``PULSING_TENSOR_TRANSPORT``; TLS keyword arguments win over ``TENSORWIRE_TLS_*``.
    ``shared_memory`` is ``True`` (same-host peers of this user get shared memory, unless the
    node requires TLS or client certificates), ``"same-user"`` (them even then: an explicit
    opt-in; handlers see the peer's ``Request.credentials``) or ``False``.
    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        bind: str = "127.0.0.1:0",
        *,
        transport: str | None = None,
        shared_memory: bool | str = True,
        cores: int | None = None,
        mailbox_capacity: int | None = None,
        cert: str | None = None,
        key: str | None = None,
        ca: str | None = None,
        require_client_cert: bool = False,
        require_tls: bool | None = None,
        server_name: str | None = None,
    ) -> None:
        self._native = _native.Node(
            bind,
            transport=transport,
            shared_memory=shared_memory,
            cores=cores,
            mailbox_capacity=mailbox_capacity,
            cert=cert,
            key=key,
            ca=ca,
            require_client_cert=require_client_cert,
            require_tls=require_tls,
            server_name=server_name,
        )
        #: The tasks serving coroutine handlers.
        self._serving: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        """The address it listens on, ``"ip:port"``."""
        return self._native.address

    def endpoint(self, name: str, *, capacity: int | None = None, pickle: bool = False) -> Endpoint:
        """A mailbox at ``name`` holding up to ``capacity`` requests (default: the node's
        ``mailbox_capacity``, 256); a full mailbox holds senders back (backpressure).
        ``pickle=True`` lets its requests reply with any picklable object."""
        return Endpoint(self._native.endpoint(name, capacity), pickle)

    def serve(
        self,
        name: str,
        handler: Callable[[TensorMessage], Any] | Any,
        *,
        threads: int = 1,
        pickle: bool = False,
        concurrency: int = 64,
        capacity: int | None = None,
    ) -> None:
        """Serves ``name`` with ``handler(message) -> reply``.

        ``handler`` is a function (run on ``threads`` threads of its own), a coroutine
        function, or an object with ``receive_tensor(message)``. A coroutine function runs on
        the event loop that is running when ``serve`` is called, up to ``concurrency``
        requests at once (a slow one does not hold the others up; beyond that, requests wait
        in the endpoint's mailbox of ``capacity``). Its return value answers asks (see
        :data:`Reply`); an exception it raises reaches the asker as a :class:`RemoteError`
        with the exception's type and text, and is logged.
        """
        target = handler.receive_tensor if hasattr(handler, "receive_tensor") else handler
        if inspect.iscoroutinefunction(target):
            if concurrency < 1:
                raise ValueError("serve needs concurrency >= 1")
            loop = asyncio.get_running_loop()
            endpoint = self._native.endpoint(name, capacity)
            task = loop.create_task(_serve_coroutines(endpoint, target, name, concurrency, pickle))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)
            return
        if not callable(target):
            raise TypeError(
                f"handler must be callable or have receive_tensor(), not {type(handler).__name__}"
            )
        call: Callable[[TensorMessage], Any] = target

        def logged(message: TensorMessage) -> Any:
            try:
                return call(message)
            except Exception:
                # The asker gets the text; a tell's failure would otherwise vanish.
                _log.exception("the handler serving %r raised", name)
                raise

        self._native.serve(name, logged, threads=threads, pickle=pickle)

    def ref(self, address: str, name: str, transport: str = "auto", *, pickle: bool = False) -> Ref:
        """A reference to endpoint ``name`` at ``address``, resolved once (reuse it: it is
        cheap to call and safe to share between threads).

        ``transport`` forces a path (``local``, ``shm``, ``raw``, ``http2``); a forced path the
        router cannot take raises :class:`TransportUnavailable` instead of falling back.
        """
        return Ref(self, address, name, transport, pickle)

    def loan(self, nbytes: int) -> _native.Loan:
        """A writable shared-memory slot to fill in place (``numpy.frombuffer(loan, ...)``);
        ``loan.freeze()`` seals it into a read-only :class:`Buffer` that reaches a same-host
        peer over shared memory without a copy."""
        return self._native.loan(nbytes)

    @property
    def shm(self) -> _native.Shm:
        """The node's shared-memory regions and leases: ``offer``, ``publish``, ``open``,
        ``map``, ``release``, ``unpublish``, ``clear``, ``stats``."""
        return self._native.shm

    def stats(self) -> dict[str, Any]:
        """This node's driver, receive pool (``pool``), driver gauges (``gauges``) and shared
        memory (``shm``), as numbers and dicts."""
        return self._native.stats()

    def close(self) -> None:
        """Stops the node (idempotent): in-flight calls fail, endpoints close, it waits for
        handler threads that are running. Coroutine handlers still running finish on their
        loop; their replies go nowhere."""
        self._native.close()
        for task in list(self._serving):
            task.cancel()

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self._native.close)
        for task in list(self._serving):
            task.cancel()

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Node:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<tensorwire.Node {self.address}>"


class Ref:
    """A reference to an endpoint on some node: resolved once, cheap to call, safe to share
    between threads and to reuse for any number of sends."""

    __slots__ = ("node", "address", "name", "transport", "pickle", "_native")

    def __init__(self, node: Node, address: str, name: str, transport: str, pickle: bool) -> None:
        self.node = node
        self.address = address
        self.name = name
        self.transport = transport
        self.pickle = pickle
        self._native = node._native.ref(address, name, transport, pickle)

    def ask(self, message: TensorMessage, timeout: float = 30.0) -> Reply:
        """Sends ``message`` and waits for the reply (GIL released, Ctrl+C interrupts).

        The message's buffers are no longer used by the transport once this returns or raises.
        """
        return self._native.ask(message, timeout)

    def tell(self, message: TensorMessage, timeout: float = 30.0) -> None:
        """Sends ``message``; returns once it is in the receiver's mailbox."""
        self._native.tell(message, timeout)

    def tell_nowait(self, message: TensorMessage, timeout: float = 30.0) -> None:
        """Sends ``message`` without waiting for the receiver (fire and forget). A failure is
        counted (``tensor_transport_stats()["tells_failed"]``) and logged on the
        ``tensorwire`` logger; do not change the message's buffers until it has been sent."""
        self._native.tell_nowait(message, timeout)

    async def ask_async(self, message: TensorMessage, timeout: float = 30.0) -> Reply:
        """The asyncio form of :meth:`ask`; cancelling the task cancels the ask."""
        pump = _pump()
        return await pump.wait(self._native.ask_start(pump.pump, message, timeout))

    async def tell_async(self, message: TensorMessage, timeout: float = 30.0) -> None:
        """The asyncio form of :meth:`tell`."""
        pump = _pump()
        await pump.wait(self._native.tell_start(pump.pump, message, timeout))

    def route(self) -> Route:
        """The path the next send takes and why (it may change from ``raw`` to ``shm`` once
        the peer proved it is on this host, or back when shared memory is full)."""
        path, reason = self._native.route()
        return Route(path, reason)

    def __repr__(self) -> str:
        return f"<tensorwire.Ref {self.name} at {self.address} transport={self.transport}>"


async def _serve_coroutines(
    endpoint: _native.Endpoint,
    handler: Callable[[TensorMessage], Any],
    name: str,
    concurrency: int,
    pickle: bool,
) -> None:
    """Takes requests off ``endpoint`` in batches and runs ``handler`` on each, at most
    ``concurrency`` at once; ends when the node closes."""
    from ._errors import ShutDown

    pump = _pump()
    slots = asyncio.Semaphore(concurrency)
    running: set[asyncio.Task[None]] = set()
    while True:
        try:
            batch: list[Request] = await pump.wait(
                endpoint.recv_batch_start(pump.pump, concurrency, pickle=pickle)
            )
        except ShutDown:
            return
        for request in batch:
            await slots.acquire()
            task = asyncio.create_task(_answer(request, handler, name, slots))
            running.add(task)
            task.add_done_callback(running.discard)


async def _answer(
    request: Request, handler: Callable[[TensorMessage], Any], name: str, slots: asyncio.Semaphore
) -> None:
    try:
        try:
            value = await handler(request.message)
        except Exception as exc:
            _log.exception("the handler serving %r raised", name)
            _deliver(request.fail, f"{type(exc).__name__}: {exc}", name)
        else:
            _deliver(request.reply, value, name)
    finally:
        slots.release()


def _deliver(answer: Callable[[Any], None], value: Any, name: str) -> None:
    try:
        answer(value)
    except Exception:  # the node closed meanwhile, or a reply of the wrong type
        _log.warning("could not answer a request to %r", name, exc_info=True)


class Endpoint:
    """A mailbox endpoint: ``recv`` (blocking), ``await recv_async()``, ``async for``."""

    def __init__(self, native: _native.Endpoint, pickle: bool) -> None:
        self._native = native
        self._pickle = pickle
        #: Requests that arrived for an asyncio receive that was cancelled meanwhile.
        self._stash: list[Request] = []

    @property
    def path(self) -> str:
        """Its actor path."""
        return self._native.path

    def __len__(self) -> int:
        return len(self._native) + len(self._stash)

    def recv(self, timeout: float | None = None) -> Request | None:
        """The next request, waiting up to ``timeout`` seconds (forever when ``None``);
        ``None`` when the time passed. The GIL is released; Ctrl+C interrupts."""
        if self._stash:
            return self._stash.pop(0)
        return self._native.recv(timeout, pickle=self._pickle)

    async def recv_async(self) -> Request:
        """The next request (asyncio). Cancelling it never loses a request: one that arrived
        meanwhile is kept for the next receive."""
        if self._stash:
            return self._stash.pop(0)
        pump = _pump()
        token = self._native.recv_start(pump.pump, pickle=self._pickle)
        request: Request = await pump.wait(token, self._stash.append)
        return request

    def __aiter__(self) -> AsyncIterator[Request]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Request]:
        from ._errors import ShutDown

        while True:
            try:
                yield await self.recv_async()
            except ShutDown:
                return

    def __repr__(self) -> str:
        return f"<tensorwire.Endpoint {self.path}>"
