"""Shared fixtures: nodes that close after each test, a server with the usual endpoints."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import tensorwire as tw


@pytest.fixture
def node() -> Iterator[tw.Node]:
    with tw.Node() as n:
        yield n


@pytest.fixture
def server() -> Iterator[tw.Node]:
    """A node with `echo`, `sum` (replies bytes), `fail` (raises) and `slow` (sleeps)."""
    import time

    with tw.Node() as n:
        n.serve("echo", lambda m: m, threads=2)
        n.serve("sum", lambda m: str(sum(len(memoryview(b)) for b in m.buffers)).encode())

        def fail(m: tw.TensorMessage) -> None:
            raise RuntimeError("the handler refused: " + bytes(m.metadata).decode())

        n.serve("fail", fail)

        def slow(m: tw.TensorMessage) -> None:
            time.sleep(float(bytes(m.metadata)))

        n.serve("slow", slow)
        yield n
