"""Asks that come now and then, from Python: a `tw.Node` client asks the `ptr1-bench serve`
fixture's echo for 4 KiB, with gaps of 0 to 10 ms between asks (both ends go idle in
between, as a training step's sends do), and prints each gap's p50 and p90.

    .venv/bin/python pybind/bench/sporadic.py [raw|shm|auto]

Needs `cargo build --release -p ptr1-bench`. docs/benchmarks.md, "Asks that come now and
then", reads it."""

import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import tensorwire as tw

ROOT = Path(__file__).resolve().parents[2]
PTR1_BENCH = ROOT / "target" / "release" / "ptr1-bench"
GAPS = (0, 50e-6, 200e-6, 1e-3, 10e-3)


def wait(gap):
    """Sleeps for gaps of a millisecond and more; shorter ones are spun (a sleep that short
    oversleeps)."""
    if gap >= 1e-3:
        time.sleep(gap)
        return
    end = time.perf_counter() + gap
    while time.perf_counter() < end:
        pass


def main():
    transport = sys.argv[1] if len(sys.argv) > 1 else "raw"
    if not PTR1_BENCH.exists():
        raise SystemExit(f"{PTR1_BENCH} is missing: cargo build --release -p ptr1-bench")
    fixture = subprocess.Popen([PTR1_BENCH, "serve"], stdout=subprocess.PIPE, text=True)
    try:
        found = (re.search(r"(\d+\.\d+\.\d+\.\d+:\d+)", line) for line in fixture.stdout)
        address = next(m.group(1) for m in found if m)
        with tw.Node() as node:
            echo = node.ref(address, "echo", transport=transport)
            message = tw.TensorMessage(b"", [np.ones(4096, np.uint8)])
            for _ in range(100):
                echo.ask(message)
            for gap in GAPS:
                latencies = []
                for _ in range(2000 if gap < 1e-3 else 200):
                    wait(gap)
                    start = time.perf_counter()
                    echo.ask(message)
                    latencies.append(time.perf_counter() - start)
                latencies.sort()
                p50 = latencies[len(latencies) // 2] * 1e6
                p90 = latencies[len(latencies) * 9 // 10] * 1e6
                print(
                    f"{transport}, gap {gap * 1e6:6.0f} µs: p50 {p50:7.1f} µs, p90 {p90:7.1f} µs",
                    flush=True,
                )
    finally:
        fixture.kill()
        fixture.wait()


if __name__ == "__main__":
    main()
