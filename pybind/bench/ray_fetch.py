"""Where a ``tensorwire.ray`` transfer's time goes beyond what Ray's own orchestration costs.

    .venv/bin/python pybind/bench/ray_fetch.py [--size 1MiB] [--transfers 150]

Two measurements, medians:

- outside Ray: a producer process serving the object from a Python handler, as
  ``tensorwire.ray``'s runtime does, and this process fetching it with one ask — blocking on
  the calling thread, with ``ask_nowait``, and through an asyncio loop on a thread of its own
  (the runtime's way, so that Ray's ``abort_transport`` can cancel from any thread);
- inside Ray (``ray_bench.py``'s actors, alternated transfer by transfer): a transport that
  moves no bytes (Ray's floor), the object store, and ``tensorwire.ray``, with the
  consumer's own time per fetch (the runtime's ``fetch_micros`` counter).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import tensorwire as tw

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ray_bench import parse_size, start_ray  # noqa: E402  (this folder's module)

ENDPOINT = "/named/tensorwire/ray/objects"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1MiB", help="bytes of the object (4KiB, 1MiB, …)")
    parser.add_argument("--transfers", type=int, default=150, help="per column")
    args = parser.parse_args()
    size = parse_size(args.size)
    outside = outside_ray(size, args.transfers)
    print(f"outside Ray, {args.size}: " + ", ".join(f"{k} {v:.0f} µs" for k, v in outside.items()))
    inside, fetch = inside_ray(size, args.transfers)
    print(
        f"inside Ray, {args.size}: "
        + ", ".join(f"{k} {v:.0f} µs" for k, v in inside.items())
        + f"; the consumer's fetch {fetch:.0f} µs"
    )


def outside_ray(size: int, transfers: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    addresses: Any = ctx.Queue()
    stop = ctx.Event()
    producer = ctx.Process(target=produce, args=(size, addresses, stop))
    producer.start()
    try:
        with tw.Node() as node:
            ref = node.ref(addresses.get(timeout=60), ENDPOINT)
            request = tw.TensorMessage(json.dumps({"object": "x", "token": "y"}).encode(), [])
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True).start()

            def through_loop() -> None:
                asyncio.run_coroutine_threadsafe(ref.ask_async(request, 30), loop).result()

            columns: dict[str, Callable[[], Any]] = {
                "blocking ask": lambda: ref.ask(request, 30),
                "ask_nowait": lambda: ref.ask_nowait(request, 30).result(),
                "asyncio loop thread": through_loop,
            }
            medians = alternate(columns, transfers)
            loop.call_soon_threadsafe(loop.stop)
            return medians
    finally:
        stop.set()
        producer.join(30)


def produce(size: int, addresses: Any, stop: Any) -> None:
    """The producer process: one array, served as the runtime serves held objects."""
    array = np.ones(size, np.uint8)

    def serve(message: tw.TensorMessage) -> tw.TensorMessage:
        json.loads(bytes(message.metadata))
        return tw.TensorMessage(json.dumps({"object": "x"}).encode(), [array])

    with tw.Node() as node:
        node.serve(ENDPOINT, serve, threads=2, log_errors=False)
        addresses.put(node.address)
        stop.wait()


def inside_ray(size: int, transfers: int) -> tuple[dict[str, float], float]:
    import ray

    start_ray()
    try:
        from ray_bench_actors import Consumer, Producer

        floor = Producer.remote(), Consumer.remote()
        store = Producer.remote(), Consumer.remote()
        rdt = Producer.remote(), Consumer.remote()
        columns: dict[str, Callable[[], Any]] = {
            "Ray RDT moving no bytes": lambda: ray.get(
                floor[1].consume_nothing.remote(floor[0].no_bytes.remote(size))
            ),
            "object store": lambda: ray.get(store[1].consume.remote(store[0].plain.remote(size))),
            "tensorwire": lambda: ray.get(rdt[1].consume.remote(rdt[0].tensorwire.remote(size))),
        }
        before = ray.get(rdt[1].stats.remote())
        medians = alternate(columns, transfers)
        after = ray.get(rdt[1].stats.remote())
    finally:
        ray.shutdown()
    fetched = sum(
        after[k] - before.get(k, 0)
        for k in after
        if k.startswith("fetched_") and k != "fetched_bytes"
    )
    fetch = (after["fetch_micros"] - before.get("fetch_micros", 0)) / max(fetched, 1)
    return medians, fetch


def alternate(columns: dict[str, Callable[[], Any]], transfers: int) -> dict[str, float]:
    """Median µs per call of each column, the columns taking turns (after 10 warm calls)."""
    for call in columns.values():
        for _ in range(10):
            call()
    times: dict[str, list[float]] = {name: [] for name in columns}
    for _ in range(transfers):
        for name, call in columns.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


if __name__ == "__main__":
    main()
