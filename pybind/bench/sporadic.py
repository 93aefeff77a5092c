"""Asks that come now and then, from Python: a `tw.Node` client asks the `ptr1-bench serve`
fixture's echo for 4 KiB, with gaps of 0 to 10 ms between asks (both ends go idle in
between, as a training step's sends do), and prints each gap's p50 and p90. `socket` times
the same over a plain TCP socket between two Python processes (blocking `recv`,
`TCP_NODELAY`), the floor a Python user knows.

    .venv/bin/python pybind/bench/sporadic.py [raw|shm|auto|socket|handlers]

`handlers` asks a Python handler (`node.serve` with a function) in another node of this
process over shared memory instead, the serving node made with `spin=` None (the default), 0
and 0.05 s, and says how long its shared-memory threads spun (`shm_spin_micros`).

Needs `cargo build --release -p ptr1-bench` (but for `socket` and `handlers`).
docs/benchmarks.md, "Asks that come now and then" and "Spinning through the gaps", reads it."""

from __future__ import annotations

import functools
import multiprocessing as mp
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import tensorwire as tw

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import Fixture  # noqa: E402  (this folder's module)

PTR1_BENCH = Path(__file__).resolve().parents[2] / "target" / "release" / "ptr1-bench"

SIZE = 4096
GAPS = (0, 50e-6, 200e-6, 1e-3, 10e-3)


def main() -> None:
    transport = sys.argv[1] if len(sys.argv) > 1 else "raw"
    if transport == "socket":
        over_a_socket()
        return
    if transport == "handlers":
        python_handlers()
        return
    if not PTR1_BENCH.exists():
        raise SystemExit(f"{PTR1_BENCH} is missing: cargo build --release -p ptr1-bench")
    fixture = Fixture(PTR1_BENCH)
    try:
        with tw.Node() as node:
            echo = node.ref(fixture.address, "echo", transport=transport)
            message = tw.TensorMessage(b"", [np.ones(SIZE, np.uint8)])
            report(transport, lambda: echo.ask(message))
    finally:
        fixture.close()


def python_handlers() -> None:
    message = tw.TensorMessage(b"", [np.ones(SIZE, np.uint8)])
    for spin in (None, 0.0, 0.05):
        with tw.Node(spin=spin) as server, tw.Node() as client:
            server.serve("echo", lambda m: m)
            echo = client.ref(server.address, "echo", transport="shm")
            before = tw.tensor_transport_stats()["shm_spin_micros"]
            report(f"Python handler, spin={spin}", functools.partial(echo.ask, message))
            spun = tw.tensor_transport_stats()["shm_spin_micros"] - before
            print(
                f"Python handler, spin={spin}: the shared-memory threads of both nodes (the "
                f"asking one at its default) spun {spun / 1e6:.2f} s"
            )


def report(label: str, ask: Callable[[], object]) -> None:
    for _ in range(100):
        ask()
    for gap in GAPS:
        latencies = []
        for _ in range(2000 if gap < 1e-3 else 200):
            wait(gap)
            start = time.perf_counter()
            ask()
            latencies.append(time.perf_counter() - start)
        latencies.sort()
        p50 = latencies[len(latencies) // 2] * 1e6
        p90 = latencies[len(latencies) * 9 // 10] * 1e6
        print(f"{label}, gap {gap * 1e6:6.0f} µs: p50 {p50:7.1f} µs, p90 {p90:7.1f} µs", flush=True)


def wait(gap: float) -> None:
    """Sleeps through gaps of a millisecond and more; shorter ones are spun (a sleep that short
    oversleeps by the timer slack)."""
    if gap >= 1e-3:
        time.sleep(gap)
        return
    end = time.perf_counter() + gap
    while time.perf_counter() < end:
        pass


def over_a_socket() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    server = mp.get_context("spawn").Process(target=echo_server, args=(listener,), daemon=True)
    server.start()
    with socket.create_connection(listener.getsockname()) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        message, reply = b"x" * SIZE, bytearray(SIZE)

        def ask() -> None:
            conn.sendall(message)
            got = 0
            while got < SIZE:
                got += conn.recv_into(memoryview(reply)[got:])

        report("plain TCP socket", ask)
    server.join(timeout=10)


def echo_server(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(SIZE)
    while True:
        got = 0
        while got < SIZE:
            n = conn.recv_into(memoryview(buf)[got:])
            if n == 0:
                return
            got += n
        conn.sendall(buf)


if __name__ == "__main__":
    main()
