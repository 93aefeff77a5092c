"""Nodes, references to remote endpoints, and mailboxes, in blocking and asyncio form.

Blocking calls release the GIL and wake every 100 ms so Ctrl+C interrupts them. The asyncio
forms (``ask_async``, ``tell_async``, ``recv_async``, ``async for``) are woken through one
eventfd per event loop, registered with ``loop.add_reader``; each wake-up drains every
completion that is ready. Cancelling the awaiting task cancels the operation in the engine.

Lifecycle: ``close(timeout)`` (and leaving the ``with`` block, and the interpreter's exit)
finishes what is in flight, then stops. A child made by ``fork()`` cannot use the nodes it
inherited (every call raises :class:`ShutDown` at once); it makes its own.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Generic, Literal, NamedTuple, TypeAlias, overload

from typing_extensions import TypeVar

from . import _into, _native
from ._aio import _pump, cancel_soon
from ._errors import InvalidArgument, ShutDown
from ._native import Request, TensorMessage

Answer: TypeAlias = TensorMessage | bytes | tuple[str, bytes] | None
"""What an ask returns on a reference made without ``pickle``: a TensorMessage, ``bytes``,
``None`` (an ack) or a ``(msg_type, bytes)`` pair for other single replies."""

Reply = TypeVar("Reply", default=Answer)
"""What an ask on a ``Ref[Reply]`` returns: :data:`Answer`, or any unpickled object (``Any``)
on a reference made with ``pickle=True``."""


class Route(NamedTuple):
    """The path a send takes (``local``, ``shm``, ``raw`` or ``http2``) and why."""

    path: str
    reason: str


_log = logging.getLogger("tensorwire")


CLOSE_TIMEOUT = 5.0
"""Seconds ``close()`` (and leaving a ``with`` block) lets replies, acknowledgements and sends
in flight finish, by default; also what each node gets at the interpreter's exit."""

#: Nodes not closed yet, closed (gracefully, bounded) when the interpreter exits.
_open_nodes: weakref.WeakSet[Node] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for node in list(_open_nodes):
        try:
            node.close(CLOSE_TIMEOUT)
        except Exception:  # exiting anyway: say so, close the others
            _log.warning("closing a node at exit failed", exc_info=True)


class Node:
    """A tensorwire node: serves endpoints on one port and sends to other nodes.

    ``transport`` sets the node's preference (``auto``, ``raw``, ``http2``, ``shm``) and wins
    over ``PULSING_TENSOR_TRANSPORT``; TLS keyword arguments win over ``TENSORWIRE_TLS_*``.
    ``shared_memory`` is ``True`` (same-host peers of this user get shared memory, unless the
    node requires TLS or client certificates), ``"same-user"`` (them even then: an explicit
    opt-in; handlers see the peer's ``Request.credentials``) or ``False``.
    Shared-memory segments beyond an idle cache of ``shm_idle_keep`` bytes (default 128 MiB)
    go back to the system once idle for ``shm_idle_after`` seconds (default 30: a training
    step's messages, step after step, reuse memory already faulted in).
    ``spin`` (seconds, at most 1) is how long the node's threads keep polling for the next
    message before they sleep: its shared-memory and handler threads after each message, a
    caller waiting for a reply at most that long, its io_uring threads at most that long while
    they carry its one active connection (up to 20 µs within it, after the last bytes moved,
    while several connections are active). The default (``None``) polls for microseconds; a
    larger window answers messages that come that far apart without a wake-up, for a CPU kept
    busy through the gaps (``0``: never poll). An idle node does not poll.
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
        shm_idle_keep: int | None = None,
        shm_idle_after: float | None = None,
        spin: float | None = None,
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
            shm_idle_keep=shm_idle_keep,
            shm_idle_after=shm_idle_after,
            spin=spin,
        )
        #: The tasks serving coroutine handlers.
        self._serving: set[asyncio.Task[None]] = set()
        _open_nodes.add(self)

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
        log_errors: bool = True,
    ) -> None:
        """Serves ``name`` with ``handler(message) -> reply``.

        ``handler`` is a function (run on ``threads`` threads of its own), a coroutine
        function, or an object with ``receive_tensor(message)``. A coroutine function runs on
        the event loop that is running when ``serve`` is called, up to ``concurrency``
        requests at once (a slow one does not hold the others up; beyond that, requests wait
        in the endpoint's mailbox of ``capacity``). Its return value answers asks (see
        :data:`Reply`); an exception it raises reaches the asker as a :class:`RemoteError`
        with the exception's type and text, and is logged (unless ``log_errors=False``: for
        refusals any peer can provoke, which the asker is told).
        """
        target = handler.receive_tensor if hasattr(handler, "receive_tensor") else handler
        if inspect.iscoroutinefunction(target):
            if concurrency < 1:
                raise ValueError("serve needs concurrency >= 1")
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise InvalidArgument(
                    f"serve({name!r}, ...) got a coroutine function, which runs on the event "
                    "loop running when serve is called, and no event loop is running here: "
                    "call serve from async code (inside asyncio.run), or pass a plain function "
                    "(it runs on threads of its own)"
                ) from None
            endpoint = self._native.endpoint(name, capacity)
            task = loop.create_task(
                _serve_coroutines(endpoint, target, name, concurrency, pickle, log_errors)
            )
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)
            return
        if not callable(target):
            raise TypeError(
                f"handler must be callable or have receive_tensor(), not {type(handler).__name__}"
            )
        call: Callable[[TensorMessage], Any] = target
        if not log_errors:
            self._native.serve(name, call, threads=threads, pickle=pickle)
            return

        def logged(message: TensorMessage) -> Any:
            try:
                return call(message)
            except Exception:
                # The asker gets the text; a tell's failure would otherwise vanish.
                _log.exception("the handler serving %r raised", name)
                raise

        self._native.serve(name, logged, threads=threads, pickle=pickle)

    @overload
    def ref(
        self, address: str, name: str, transport: str = "auto", *, pickle: Literal[False] = False
    ) -> Ref[Answer]: ...
    @overload
    def ref(
        self, address: str, name: str, transport: str = "auto", *, pickle: bool
    ) -> Ref[Any]: ...
    def ref(
        self, address: str, name: str, transport: str = "auto", *, pickle: bool = False
    ) -> Ref[Any]:
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

    @property
    def closed(self) -> bool:
        """Whether the node is closed."""
        return self._native.closed

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Closes the node gracefully (idempotent): from now on it takes no new request
        (senders are told the node is closing) and no new connection; the requests it has are
        answered — each reply and acknowledgement is written in full — and its own sends
        complete; then it stops. What is still in flight after ``timeout`` seconds fails.

        Handler threads keep serving meanwhile. Coroutine handlers need their event loop to
        run: from async code use ``await node.aclose()`` (``close()`` there blocks the loop,
        so their requests wait out the timeout). A node inherited through ``fork()`` is left
        alone (it belongs to the parent)."""
        _open_nodes.discard(self)
        self._native.close(timeout)
        for task in list(self._serving):
            cancel_soon(task)

    async def aclose(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """:meth:`close` without blocking the event loop (coroutine handlers finish their
        requests meanwhile)."""
        _open_nodes.discard(self)
        await asyncio.get_running_loop().run_in_executor(None, self._native.close, timeout)
        for task in list(self._serving):
            cancel_soon(task)

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


class Ref(Generic[Reply]):
    """A reference to an endpoint on some node: resolved once, cheap to call, safe to share
    between threads and to reuse for any number of sends. ``Reply`` is what its asks return
    (:data:`Answer`; ``Any`` with ``pickle=True``)."""

    __slots__ = ("node", "address", "name", "transport", "pickle", "_native")

    def __init__(self, node: Node, address: str, name: str, transport: str, pickle: bool) -> None:
        self.node = node
        self.address = address
        self.name = name
        self.transport = transport
        self.pickle = pickle
        self._native = node._native.ref(address, name, transport, pickle)

    def ask(
        self, message: TensorMessage, timeout: float = 30.0, *, into: Sequence[Any] | None = None
    ) -> Reply:
        """Sends ``message`` and waits for the reply (GIL released, Ctrl+C interrupts).

        The message's buffers are no longer used by the transport once this returns or raises.
        With ``into`` (writable buffers you own: numpy arrays, CPU torch tensors, bytearrays),
        the reply's buffers are copied into them — one per buffer, of the same sizes and (for
        :func:`tensors.pack` messages) dtypes, else :class:`InvalidArgument` and nothing is
        written (``error.received`` is the reply) — and the reply returned carries them.
        """
        if into is None:
            reply: Reply = self._native.ask(message, timeout)
            return reply
        targets = _into.views(into)
        filled: Reply = self._native.ask(
            message, timeout, into=targets, check=_into.checker(targets)
        )
        return filled

    def tell(self, message: TensorMessage, timeout: float = 30.0) -> None:
        """Sends ``message``; returns once it is in the receiver's mailbox."""
        self._native.tell(message, timeout)

    def tell_nowait(self, message: TensorMessage, timeout: float = 30.0) -> None:
        """Sends ``message`` without waiting for the receiver (fire and forget). A failure is
        counted (``tensor_transport_stats()["tells_failed"]``) and logged on the
        ``tensorwire`` logger; do not change the message's buffers until it has been sent."""
        self._native.tell_nowait(message, timeout)

    def ask_nowait(
        self, message: TensorMessage, timeout: float = 30.0, *, into: Sequence[Any] | None = None
    ) -> Pending[Reply]:
        """Sends ``message`` and returns at once; :meth:`Pending.result` waits for the reply
        on the calling thread. One thread keeps several asks in flight this way without an
        event loop (start a window of them, then take the oldest's result and start the
        next). ``into`` as for :meth:`ask`. Do not change the message's buffers until its
        result is there (after :meth:`Pending.cancel`, until its timeout: the transport may
        still be copying them). Dropping the :class:`Pending` unwaited cancels the ask."""
        if into is None:
            return Pending(self._native.ask_nowait(message, timeout))
        targets = _into.views(into)
        return Pending(
            self._native.ask_nowait(message, timeout, into=targets, check=_into.checker(targets))
        )

    async def ask_async(
        self, message: TensorMessage, timeout: float = 30.0, *, into: Sequence[Any] | None = None
    ) -> Reply:
        """The asyncio form of :meth:`ask`; cancelling the task cancels the ask."""
        pump = _pump()
        if into is None:
            reply: Reply = await pump.wait(self._native.ask_start(pump.pump, message, timeout))
            return reply
        targets = _into.views(into)
        token = self._native.ask_start(
            pump.pump, message, timeout, into=targets, check=_into.checker(targets)
        )
        # Written into ``into`` only now, once this coroutine was not cancelled.
        arrived: _native.Arrived = await pump.wait(token, _native.Arrived.withdraw)
        filled: Reply = arrived.fill()
        return filled

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


class Pending(Generic[Reply]):
    """An ask in flight, from :meth:`Ref.ask_nowait`."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.Pending) -> None:
        self._native = native

    def result(self, timeout: float | None = None) -> Reply:
        """Waits for the reply on this thread (GIL released; over shared memory this thread
        reads the connection itself for a short spin window, over PTR1 it polls briefly, then
        it sleeps) and returns it, or raises the ask's error; later calls give the same.
        ``timeout``: seconds to wait at most (``None``: until the ask's own timeout), after
        which :class:`DeadlineExceeded` is raised with :meth:`done` still ``False`` and the
        ask goes on (once :meth:`done` is ``True``, a ``DeadlineExceeded`` is the ask's own
        timeout). One thread at a time may wait for it (another gets
        :class:`InvalidArgument`); Ctrl+C interrupts the wait, not the ask. In a child made by
        ``fork()``, :class:`ShutDown` at once."""
        reply: Reply = self._native.result(timeout)
        return reply

    def done(self) -> bool:
        """Whether :meth:`result` would return without waiting."""
        return self._native.done()

    def cancel(self) -> bool:
        """Cancels the ask unless it finished or a thread waits for it; ``True`` if it was
        cancelled (:meth:`result` then raises :class:`Cancelled`; a request already sent
        may still be acted on by the peer, and the message's buffers may still be read by
        the transport until the ask's timeout)."""
        return self._native.cancel()

    def __repr__(self) -> str:
        return f"<tensorwire.Pending {'done' if self.done() else 'in flight'}>"


async def _serve_coroutines(
    endpoint: _native.Endpoint,
    handler: Callable[[TensorMessage], Any],
    name: str,
    concurrency: int,
    pickle: bool,
    log_errors: bool,
) -> None:
    """Takes requests off ``endpoint`` in batches and runs ``handler`` on each, at most
    ``concurrency`` at once; ends when the node closes."""
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
            task = asyncio.create_task(_answer(request, handler, name, slots, log_errors))
            running.add(task)
            task.add_done_callback(running.discard)


async def _answer(
    request: Request,
    handler: Callable[[TensorMessage], Any],
    name: str,
    slots: asyncio.Semaphore,
    log_errors: bool,
) -> None:
    try:
        try:
            value = await handler(request.message)
        except Exception as exc:
            if log_errors:
                _log.exception("the handler serving %r raised", name)
            _deliver(request.fail, f"{type(exc).__name__}: {exc}", name)
        else:
            # Without waiting for the transport: the event loop must not block on a peer.
            _deliver(request.reply_nowait, value, name)
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

    def recv(
        self, timeout: float | None = None, *, into: Sequence[Any] | None = None
    ) -> Request | None:
        """The next request, waiting up to ``timeout`` seconds (forever when ``None``);
        ``None`` when the time passed. The GIL is released; Ctrl+C interrupts.

        With ``into``, the request's buffers are copied into those buffers of yours (as for
        :meth:`Ref.ask`); on a mismatch :class:`InvalidArgument` is raised, nothing is written
        and the request is kept for the next receive (``error.received`` is it too)."""
        if into is None:
            if self._stash:
                return self._stash.pop(0)
            return self._native.recv(timeout, pickle=self._pickle)
        targets = _into.views(into)
        check = _into.checker(targets)
        if self._stash:
            return self._take_stashed(targets, check)
        try:
            return self._native.recv(timeout, pickle=self._pickle, into=targets, check=check)
        except InvalidArgument as e:
            self._keep(e)
            raise

    async def recv_async(self, *, into: Sequence[Any] | None = None) -> Request:
        """The next request (asyncio); ``into`` as for :meth:`recv`. Cancelling it never loses
        a request: one that arrived meanwhile goes back into the mailbox where it was."""
        targets = None if into is None else _into.views(into)
        check = None if targets is None else _into.checker(targets)
        if self._stash:
            return self._take_stashed(targets, check)
        pump = _pump()
        token = self._native.recv_start(pump.pump, pickle=self._pickle, into=targets, check=check)
        # Delivered (and written into ``into``) only now, once this coroutine was not cancelled;
        # a request a cancelled receive had taken goes back into the mailbox where it was, for
        # whichever receive comes next (one waiting now included).
        arrived: _native.Arrived = await pump.wait(token, _native.Arrived.withdraw)
        try:
            request: Request = arrived.fill()
        except InvalidArgument as e:
            self._keep(e)
            raise
        return request

    def _take_stashed(
        self, targets: list[Any] | None, check: Callable[[bytes], None] | None
    ) -> Request:
        """The oldest stashed request, received into ``targets`` if given (it stays stashed if
        it does not fit)."""
        if targets is None:
            return self._stash.pop(0)
        request = self._stash[0].copy_into(targets, check)
        self._stash.pop(0)
        return request

    def _keep(self, error: InvalidArgument) -> None:
        """A request that did not fit the buffers given goes back for the next receive."""
        received = getattr(error, "received", None)
        if isinstance(received, Request):
            self._stash.insert(0, received)

    def __aiter__(self) -> AsyncIterator[Request]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Request]:
        while True:
            try:
                yield await self.recv_async()
            except ShutDown:
                return

    def __repr__(self) -> str:
        return f"<tensorwire.Endpoint {self.path}>"
