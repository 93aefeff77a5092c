"""A producer process streams dicts of tensors to a consumer process.

    python examples/python/two_process.py [--steps N] [--transport auto|raw|shm|http2]

The consumer (a child process) serves `consume`, unpacks each dict without knowing shapes in
advance and answers with a checksum; the producer checks it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np

import tensorwire as tw
from tensorwire import tensors


def consumer() -> None:
    with tw.Node() as node:

        def consume(msg: tw.TensorMessage) -> bytes:
            batch = tensors.unpack(msg)
            total = sum(float(a.sum(dtype=np.float64)) for a in batch.values())
            shapes = ",".join(f"{k}{list(v.shape)}" for k, v in sorted(batch.items()))
            return f"{total:.1f} {shapes}".encode()

        node.serve("consume", consume, threads=2)
        print(node.address, flush=True)
        sys.stdin.readline()  # until the producer closes our stdin


def producer(steps: int, transport: str) -> None:
    child = subprocess.Popen(
        [sys.executable, __file__, "--consumer"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        address = child.stdout.readline().strip()
        with tw.Node() as node:
            ref = node.ref(address, "consume", transport=transport)
            start, sent = time.monotonic(), 0
            for step in range(steps):
                batch = {
                    "weights": np.full((256, 1024), step, np.float32),
                    "bias": np.arange(1024, dtype=np.float64),
                    "mask": np.ones((64, 64), np.uint8),
                }
                reply = ref.ask(tensors.pack(batch), timeout=60).decode()
                expected = sum(float(a.sum(dtype=np.float64)) for a in batch.values())
                total = float(reply.split()[0])
                if abs(total - expected) > 1e-6 * max(1.0, expected):
                    raise SystemExit(f"step {step}: consumer saw {total}, sent {expected}")
                sent += sum(a.nbytes for a in batch.values())
            elapsed = time.monotonic() - start
            route = ref.route()
            print(
                f"{steps} dicts, {sent / 1e6:.1f} MB in {elapsed:.2f} s "
                f"({sent / elapsed / 1e9:.2f} GB/s) over {route.path}: {reply.split(' ', 1)[1]}"
            )
    finally:
        if child.stdin:
            child.stdin.close()
        child.wait(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--consumer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--transport", default="auto", choices=["auto", "raw", "shm", "http2"])
    args = parser.parse_args()
    consumer() if args.consumer else producer(args.steps, args.transport)
