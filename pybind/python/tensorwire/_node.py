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
                self.pump.cancel(token)
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
    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        bind: str = "127.0.0.1:0",
        *,
        transport: str | None = None,
        shared_memory: bool = True,
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
        self._loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

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
    ) -> None:
        """Serves ``name`` with ``handler(message) -> reply`` on ``threads`` threads of its own.

        ``handler`` is a function, a coroutine function (run on the event loop that is running
        when ``serve`` is called), or an object with ``receive_tensor(message)``. Its return
        value answers asks (see :data:`Reply`); an exception it raises reaches the asker as a
        :class:`RemoteError` with the exception's type and text.
        """
        target = handler.receive_tensor if hasattr(handler, "receive_tensor") else handler
        call: Callable[[TensorMessage], Any]
        if inspect.iscoroutinefunction(target):
            loop = asyncio.get_running_loop()
            self._loops.add(loop)
            coroutine_fn = target

            def call(message: TensorMessage) -> Any:
                if not loop.is_running():
                    raise RuntimeError(
                        f"the event loop serving {name!r} is not running; the request cannot be handled"
                    )
                return asyncio.run_coroutine_threadsafe(coroutine_fn(message), loop).result()

        elif callable(target):
            call = target
        else:
            raise TypeError(
                f"handler must be callable or have receive_tensor(), not {type(handler).__name__}"
            )

        def logged(message: TensorMessage) -> Any:
            try:
                return call(message)
            except Exception:
                # The asker gets the text; a tell's failure would otherwise vanish.
                _log.exception("the handler serving %r raised", name)
                raise

        self._native.serve(name, logged, threads=threads, pickle=pickle)

    def ref(self, address: str, name: str, transport: str = "auto", *, pickle: bool = False) -> Ref:
        """A reference to endpoint ``name`` at ``address``.

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
        """This node's driver, pools and connection gauges."""
        return self._native.stats()

    def close(self) -> None:
        """Stops the node (idempotent): in-flight calls fail, endpoints close.

        It waits for running handlers; from the event loop that coroutine handlers run on, use
        ``await node.aclose()`` (this would wait for handlers that wait for this loop).
        """
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running in self._loops:
            raise RuntimeError(
                "close() on the event loop this node's coroutine handlers run on would wait "
                "for them forever: use `await node.aclose()` or `async with tw.Node()`"
            )
        self._native.close()

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop (handlers may still need it)."""
        await asyncio.get_running_loop().run_in_executor(None, self._native.close)

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
    """A reference to an endpoint on some node; cheap to create."""

    def __init__(self, node: Node, address: str, name: str, transport: str, pickle: bool) -> None:
        self.node = node
        self.address = address
        self.name = name
        self.transport = transport
        self.pickle = pickle

    def ask(self, message: TensorMessage, timeout: float = 30.0) -> Reply:
        """Sends ``message`` and waits for the reply (GIL released, Ctrl+C interrupts).

        The message's buffers are no longer used by the transport once this returns or raises.
        """
        return self.node._native.ask(
            self.address,
            self.name,
            message,
            timeout=timeout,
            transport=self.transport,
            pickle=self.pickle,
        )

    def tell(self, message: TensorMessage, timeout: float = 30.0) -> None:
        """Sends ``message``; returns once it is in the receiver's mailbox."""
        self.node._native.tell(
            self.address, self.name, message, timeout=timeout, transport=self.transport
        )

    async def ask_async(self, message: TensorMessage, timeout: float = 30.0) -> Reply:
        """The asyncio form of :meth:`ask`; cancelling the task cancels the ask."""
        pump = _pump()
        token = self.node._native.ask_start(
            pump.pump,
            self.address,
            self.name,
            message,
            timeout=timeout,
            transport=self.transport,
            pickle=self.pickle,
        )
        return await pump.wait(token)

    async def tell_async(self, message: TensorMessage, timeout: float = 30.0) -> None:
        """The asyncio form of :meth:`tell`."""
        pump = _pump()
        token = self.node._native.tell_start(
            pump.pump, self.address, self.name, message, timeout=timeout, transport=self.transport
        )
        await pump.wait(token)

    def route(self) -> Route:
        """The path the next send takes and why (it can change from ``raw`` to ``shm`` once
        the peer proved it is on this host)."""
        path, reason = self.node._native.route(self.address, self.transport)
        return Route(path, reason)

    def __repr__(self) -> str:
        return f"<tensorwire.Ref {self.name} at {self.address} transport={self.transport}>"


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
