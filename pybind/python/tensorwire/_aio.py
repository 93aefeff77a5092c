"""The asyncio bridge: one completion queue (`_native.Pump`) per event loop, its eventfd
registered with ``loop.add_reader``; each wake-up drains every completion that is ready and
resolves the futures waiting on them."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

from . import _native


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
            try:
                self._deliver(token, ok, value)
            except Exception as e:  # one failed delivery must not strand the rest of the batch
                asyncio.get_running_loop().call_exception_handler(
                    {"message": "tensorwire: delivering a completion failed", "exception": e}
                )

    def _deliver(self, token: int, ok: bool, value: Any) -> None:
        fut = self.futures.pop(token, None)
        orphan = self.orphans.pop(token, None)
        if fut is None or fut.done():
            if ok and orphan is not None:
                orphan(value)  # cancelled meanwhile: never drop what arrived
            return
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


#: Each loop's queue, held weakly: the loop's reader callback holds it while the loop is
#: open. A strong value would keep its key alive (its futures refer to their loop), so a loop
#: closed with operations still waiting would leak with its queue and their engine operations.
_pumps: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.ref[_LoopPump]] = (
    weakref.WeakKeyDictionary()
)


def _pump() -> _LoopPump:
    loop = asyncio.get_running_loop()
    held = _pumps.get(loop)
    pump = None if held is None else held()
    if pump is None:
        pump = _LoopPump(loop)
        _pumps[loop] = weakref.ref(pump)
    return pump


def cancel_soon(task: asyncio.Task[Any]) -> None:
    """Cancels ``task`` from any thread: at once on its own loop's thread or when its loop is
    not running, through the loop while another thread runs it; nothing if its loop is
    closed."""
    loop = task.get_loop()
    if loop.is_closed():
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    try:
        if running is loop or not loop.is_running():
            task.cancel()  # its loop's thread, or no thread runs the loop now
        else:
            loop.call_soon_threadsafe(task.cancel)
    except RuntimeError:
        pass  # closed meanwhile
