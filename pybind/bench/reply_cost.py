"""What a Python handler's reply costs now that a handler may rewrite the array it replied
from: over PTR1 (raw TCP) the reply's writable buffers are copied below 1 MiB and waited for
from 1 MiB (`docs/python.md`, "Replies"). Against the same array lent (`lend=True`: sent as it
is, as every writable reply was before), RTT p50 in µs, a handler of its own in a server
process, cells of 0.3 s interleaved, medians of 7.

    .venv/bin/python pybind/bench/reply_cost.py

docs/benchmarks.md, "What a handler's reply costs", reads it."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import tensorwire as tw

SERVER = """
import sys, numpy as np, tensorwire as tw
arrays = {}
def array(m):
    n = int(bytes(m.metadata))
    if n not in arrays:
        arrays[n] = np.ones(n, np.uint8)
    return arrays[n]
with tw.Node(shared_memory=False) as node:
    node.serve("w", lambda m: tw.TensorMessage(b"", [array(m)]), threads=1)
    node.serve("l", lambda m: tw.TensorMessage(b"", [array(m)], lend=True), threads=1)
    print(node.address, flush=True)
    sys.stdin.readline()
"""

SIZES = [4 << 10, 256 << 10, 1 << 20, 4 << 20]
ROUNDS = 7
CELL_SECONDS = 0.3


def cell(ref: tw.Ref, message: tw.TensorMessage) -> float:
    """The p50 of back-to-back asks for a cell's time, in µs (after 20 to warm up)."""
    for _ in range(20):
        ref.ask(message)
    latencies = []
    end = time.monotonic() + CELL_SECONDS
    while time.monotonic() < end:
        started = time.perf_counter_ns()
        ref.ask(message)
        latencies.append(time.perf_counter_ns() - started)
    return statistics.median(latencies) / 1000


def main() -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert server.stdin is not None and server.stdout is not None
    address = server.stdout.readline().strip()
    p50s: dict[tuple[int, str], list[float]] = {(s, k): [] for s in SIZES for k in "wl"}
    with tw.Node(shared_memory=False) as node:
        refs = {kind: node.ref(address, kind, transport="raw") for kind in "wl"}
        for round_ in range(ROUNDS):
            for size in SIZES:
                for kind in "wl" if round_ % 2 == 0 else "lw":
                    message = tw.TensorMessage(str(size).encode(), [])
                    p50s[(size, kind)].append(cell(refs[kind], message))
    server.stdin.write("\n")
    server.stdin.flush()
    server.wait(10)
    print("size | writable reply p50 µs | lent p50 µs | writable ÷ lent")
    for size in SIZES:
        writable = statistics.median(p50s[(size, "w")])
        lent = statistics.median(p50s[(size, "l")])
        print(f"{size >> 10} KiB | {writable:.1f} | {lent:.1f} | {writable / lent:.2f}")


if __name__ == "__main__":
    main()
