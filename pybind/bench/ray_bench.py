"""Arrays actor to actor inside Ray: tensorwire's Ray Direct Transport beside Ray's object store.

    scripts/python-env                      # tensorwire and Ray in .venv
    .venv/bin/python pybind/bench/ray_bench.py [--reps 3] [--seconds 1]
        [--sizes 4KiB,1MiB,64MiB,256MiB] [--skip cluster] [--json]

One transfer: the driver calls ``producer.produce(n)`` and passes the returned ref to
``consumer.consume(ref)``, and waits for the consumer's answer (it reads the first and the
last byte). Every producer fills its array in place (``ndarray.fill``) before returning it,
the same work in every column; what differs is what happens to the bytes afterwards:

- object store: a plain method; Ray copies the array into plasma, the consumer maps it.
- tensorwire: ``@ray.method(tensor_transport="tensorwire")``; the consumer fetches it with
  one ask, the producer's node copies it into shared memory the consumer maps read-only.
- tensorwire empty(): the same, but the array is ``tensorwire.ray.empty()``, a shared-memory
  slot filled in place: no copy of the payload at all.
- Ray RDT moving no bytes: a transport that moves nothing (the consumer gets empty arrays):
  what Ray's orchestration of a direct transfer costs (an extra task on the consumer after
  the metadata reached the driver), the floor under any transport.
- two raylets (``ray.cluster_utils.Cluster`` on this machine): object store vs tensorwire
  forced to PTR1 (``TENSORWIRE_RAY_TRANSPORT=raw``).

Each cell runs transfers for ``--seconds`` (at least 3) and reports the payload's GB/s over
the median transfer; columns rotate rep by rep; the table shows medians of the reps and the
ratio to the object store. The consumer's peak RSS holding one 256 MiB array (every byte
read) is reported per column, as a multiple of the array.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

MiB = 1 << 20
HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="time per cell")
    parser.add_argument("--sizes", default="4KiB,1MiB,64MiB,256MiB")
    parser.add_argument("--skip", default="", help="leave out: cluster, rss")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    skip = set(args.skip.split(","))
    out = Output(args.json)
    try:
        import ray

        import tensorwire.ray  # noqa: F401  (checked importable here; start_ray uses it)
    except ImportError as e:
        out.record(kind="unavailable", peer="Ray", reason=f"not importable: {e}")
        out.flush_table()
        return
    out.record(kind="version", name="ray", version=ray.__version__)
    env = start_ray()
    try:
        from ray_bench_actors import Consumer, Producer

        # The object store gets actors of its own: once a process has run a tensor-transport
        # method, Ray pickles the numpy arrays its plain methods return (a copy more).
        store = Producer.remote(), Consumer.remote()
        rdt = Producer.remote(), Consumer.remote()
        floor = Producer.remote(), Consumer.remote()
        columns = {
            "same host: Ray RDT moving no bytes": lambda n: transfer(
                floor[0].no_bytes, floor[1], n, "consume_nothing"
            ),
            "same host: object store": lambda n: transfer(store[0].plain, store[1], n),
            "same host: tensorwire": lambda n: transfer(rdt[0].tensorwire, rdt[1], n),
            "same host: tensorwire empty()": lambda n: transfer(rdt[0].loaned, rdt[1], n),
        }
        measure(out, "same host", columns, sizes, args)
        route = ray.get(rdt[1].stats.remote())
        out.record(
            kind="note",
            peer="same host: tensorwire",
            text=f"consumer fetched over: {route_counts(route)}",
        )
        if "rss" not in skip:
            for name, method in (
                ("object store", "plain"),
                ("tensorwire", "tensorwire"),
                ("tensorwire empty()", "loaned"),
            ):
                peak_rss(out, f"same host: {name}", Producer.remote(), Consumer.remote(), method)
    finally:
        ray.shutdown()
    if "cluster" not in skip:
        two_raylets(out, sizes, args, env)
    out.flush_table()


def transfer(method: Any, consumer: Any, nbytes: int, check: str = "consume") -> None:
    import ray

    ref = method.remote(nbytes)
    first_and_last = ray.get(getattr(consumer, check).remote(ref))
    if first_and_last != 2 * (nbytes % 251):
        raise RuntimeError(f"the consumer read {first_and_last}, expected {2 * (nbytes % 251)}")


def measure(
    out: Output,
    group: str,
    columns: dict[str, Callable[[int], None]],
    sizes: list[int],
    args: argparse.Namespace,
) -> None:
    names = list(columns)
    for size in sizes:
        for name in names:  # warm: segments mapped, connections made, pages touched
            for _ in range(2):
                columns[name](size)
        for rep in range(args.reps):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for name in order:
                times = []
                deadline = time.perf_counter() + args.seconds
                while len(times) < 3 or time.perf_counter() < deadline:
                    t0 = time.perf_counter()
                    columns[name](size)
                    times.append(time.perf_counter() - t0)
                median = statistics.median(times)
                out.sample(group, name, size, rep, size / median / 1e9, median * 1e6)


def peak_rss(out: Output, name: str, producer: Any, consumer: Any, method: str) -> None:
    """A fresh consumer's RSS before and while it holds one 256 MiB array."""
    import ray

    nbytes = 256 * MiB
    ref = getattr(producer, method).remote(nbytes)
    ray.wait([ref], fetch_local=False)
    idle = ray.get(consumer.rss.remote())
    peak = ray.get(consumer.hold_and_measure.remote(ref))
    out.record(
        kind="rss", peer=name, size=nbytes, idle=idle, peak=peak, ratio=(peak - idle) / nbytes
    )


def two_raylets(
    out: Output, sizes: list[int], args: argparse.Namespace, env: dict[str, str]
) -> None:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"first": 1}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=2, resources={"second": 1})
    ray.init(
        address=cluster.address,
        log_to_driver=False,
        runtime_env={"env_vars": {**env, "TENSORWIRE_RAY_TRANSPORT": "raw"}},
    )
    try:
        cluster.wait_for_nodes()
        from ray_bench_actors import Consumer, Producer

        def pair() -> tuple[Any, Any]:
            return (
                Producer.options(resources={"first": 0.01}).remote(),
                Consumer.options(resources={"second": 0.01}).remote(),
            )

        store, rdt = pair(), pair()
        columns = {
            "two raylets: object store": lambda n: transfer(store[0].plain, store[1], n),
            "two raylets: tensorwire PTR1": lambda n: transfer(rdt[0].tensorwire, rdt[1], n),
        }
        measure(out, "two raylets", columns, sizes, args)
        route = ray.get(rdt[1].stats.remote())
        out.record(
            kind="note",
            peer="two raylets: tensorwire PTR1",
            text=f"consumer fetched over: {route_counts(route)}",
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


def route_counts(stats: dict[str, Any]) -> str:
    return (
        ", ".join(
            f"{k.removeprefix('fetched_')} {v}"
            for k, v in sorted(stats.items())
            if k.startswith("fetched_") and k != "fetched_bytes"
        )
        or "nothing"
    )


class Output:
    """JSON lines (``--json``) or a table at the end."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.records: list[dict[str, Any]] = []

    def record(self, **fields: Any) -> None:
        self.records.append(fields)
        if self.as_json:
            print(json.dumps(fields), flush=True)

    def sample(
        self, group: str, peer: str, size: int, rep: int, gbps: float, micros: float
    ) -> None:
        self.record(
            kind="sample",
            group=group,
            peer=peer,
            mode="actor",
            size=size,
            buffers=1,
            rep=rep,
            value=gbps,
            micros=micros,
        )

    def flush_table(self) -> None:
        if self.as_json:
            return
        samples: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
        for r in self.records:
            if r["kind"] == "sample":
                samples.setdefault((r["group"], r["peer"], r["size"]), []).append(r)
            elif r["kind"] in ("note", "unavailable", "version"):
                print(
                    f"{r['kind']}: {r.get('peer', r.get('name'))}: "
                    f"{r.get('text', r.get('reason', r.get('version')))}"
                )
        groups: dict[str, list[str]] = {}
        for group, peer, _ in samples:
            if peer not in groups.setdefault(group, []):
                groups[group].append(peer)
        for group, peers in groups.items():
            print(f"\n{group}: GB/s of payload (median of reps; µs per transfer); × object store")
            print("| size | " + " | ".join(peers) + " |")
            print("|---|" + "---:|" * len(peers))
            for size in sorted({s for g, _, s in samples if g == group}):
                cells, base = [], None
                for peer in peers:
                    rows = samples.get((group, peer, size), [])
                    gbps = statistics.median(r["value"] for r in rows) if rows else float("nan")
                    us = statistics.median(r["micros"] for r in rows) if rows else float("nan")
                    base = gbps if "object store" in peer else base
                    ratio = (
                        f" ({gbps / base:.2f}×)"
                        if base and "object store" not in peer and "no bytes" not in peer
                        else ""
                    )
                    cells.append(f"{gbps:.3f} ({us:,.0f} µs){ratio}")
                print(f"| {format_size(size)} | " + " | ".join(cells) + " |")
        rss = [r for r in self.records if r["kind"] == "rss"]
        if rss:
            print("\nconsumer RSS holding one 256 MiB array (every byte read), × the array:")
            for r in rss:
                print(
                    f"  {r['peer']}: {r['ratio']:.2f}× (idle {r['idle'] / MiB:.0f} MiB, "
                    f"peak {r['peak'] / MiB:.0f} MiB)"
                )


def start_ray() -> dict[str, str]:
    """Registers tensorwire's transports and starts a one-host Ray whose workers import this
    folder's actors; the workers' environment variables."""
    import ray

    import tensorwire.ray as twr

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    twr.register()
    env = {"PYTHONPATH": str(HERE), "OPENBLAS_NUM_THREADS": "1"}
    ray.init(
        num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env}
    )
    return env


def parse_size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(text[: -len(unit)]) * factor
    return int(text)


def format_size(n: int) -> str:
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor} {unit}"
    return f"{n} B"


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    np.seterr(all="ignore")
    main()
