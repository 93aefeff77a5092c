"""tensorwire from Python next to the Rust engine, pyzmq and gRPC, measured in one run.

    cargo build --release -p ptr1-bench
    .venv/bin/pip install pyzmq grpcio      # benchmark-only dependencies
    .venv/bin/python pybind/bench/bench.py [--reps 5] [--seconds 2]

Every server is another process on loopback: the ptr1-bench fixture (tensorwire's engine,
`sink` answers a small ack), a pyzmq REP server, a gRPC (Python, unary, generic bytes
handler) server, and a `multiprocessing.shared_memory` consumer (a reused segment the
producer copies each message into, signalled over a pipe). Cases run interleaved, rep by rep; the table shows medians and ratios.
A client library that is not installed is reported as such, never faked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import tensorwire as tw

ROOT = Path(__file__).resolve().parents[2]
PTR1_BENCH = ROOT / "target" / "release" / "ptr1-bench"
MiB = 1 << 20


# ---- servers (child processes) -------------------------------------------------------------

def serve_zmq() -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(port, flush=True)
    while True:
        frames = sock.recv_multipart(copy=False)
        sock.send(str(sum(len(f.buffer) for f in frames)).encode())


def serve_grpc() -> None:
    from concurrent import futures

    import grpc

    def sink(request: bytes, context: object) -> bytes:
        return str(len(request)).encode()

    handler = grpc.method_handlers_generic_handler(
        "bench", {"Sink": grpc.unary_unary_rpc_method_handler(sink)}
    )
    opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=opts)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


def serve_mpshm() -> None:
    """A multiprocessing.shared_memory consumer: attaches the producer's segment once, then
    for each message reads its length from stdin, touches the bytes it was told about (one
    read of the first and last byte, as a handler that looks at the data would) and acks."""
    from multiprocessing import shared_memory

    from multiprocessing import resource_tracker

    name = sys.stdin.readline().strip()
    segment = shared_memory.SharedMemory(name=name)
    # Python < 3.13 registers an attached segment with this process's tracker, which would
    # unlink the producer's segment when this process exits.
    resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]
    view = np.frombuffer(segment.buf, np.uint8)
    print("attached", flush=True)
    for line in sys.stdin:
        size = int(line)
        if size:
            _ = int(view[0]) + int(view[size - 1])
        print(size, flush=True)
    del view
    segment.close()


def start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if not line:
        raise RuntimeError(f"{args[0]} did not start")
    return child, line.split()[-1]


# ---- clients -------------------------------------------------------------------------------

def timed(seconds: float, one: Callable[[], int]) -> float:
    """Runs `one` (returns payload bytes moved) repeatedly for `seconds`; returns bytes/s."""
    one()  # warm
    moved, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        moved += one()
    return moved / elapsed


def tensorwire_oneway(
    node: tw.Node, address: str, size: int, seconds: float, transport: str = "raw"
) -> float:
    ref = node.ref(address, "sink", transport=transport)
    payload = np.ones(size, np.uint8)

    def one() -> int:
        ref.ask(tw.TensorMessage(b"", [payload]), timeout=60)
        return size

    return timed(seconds, one)


def tensorwire_async_asks(node: tw.Node, address: str, size: int, seconds: float, inflight: int) -> float:
    ref = node.ref(address, "sink", transport="raw")
    msg = tw.TensorMessage(b"", [np.ones(size, np.uint8)])

    async def main() -> float:
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            await asyncio.gather(*(ref.ask_async(msg) for _ in range(inflight)))
            count += inflight
        return count / elapsed

    return asyncio.run(main())


def rust_oneway(address: str, size: int, seconds: float) -> float:
    out = subprocess.run(
        [str(PTR1_BENCH), "run", "--connect", address, "--transport", "engine", "--mode", "oneway",
         "--size", str(size), "--seconds", str(seconds), "--json"],
        capture_output=True, text=True, check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["gb_per_s"]) * 1e9


def zmq_client(port: str):  # type: ignore[no-untyped-def]
    import zmq

    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def zmq_oneway(sock, size: int, seconds: float) -> float:  # type: ignore[no-untyped-def]
    payload = np.ones(size, np.uint8)

    def one() -> int:
        sock.send(payload, copy=False)
        sock.recv()
        return size

    return timed(seconds, one)


def zmq_asks(sock, size: int, seconds: float) -> float:  # type: ignore[no-untyped-def]
    payload = np.ones(size, np.uint8)
    return timed(seconds, lambda: (sock.send(payload, copy=False), sock.recv(), 1)[2])


def mpshm_oneway(size: int, seconds: float) -> float:
    """multiprocessing.shared_memory, a reused segment: the producer copies each message in
    (the same one copy as tensorwire's shm "copied in") and tells the consumer over a pipe."""
    from multiprocessing import shared_memory

    segment = shared_memory.SharedMemory(create=True, size=size)
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", "mpshm"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        child.stdin.write(segment.name + "\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "attached"
        target = np.frombuffer(segment.buf, np.uint8)
        payload = np.ones(size, np.uint8)

        def one() -> int:
            np.copyto(target, payload)
            child.stdin.write(f"{size}\n")
            child.stdin.flush()
            child.stdout.readline()
            return size

        rate = timed(seconds, one)
        del target
        return rate
    finally:
        child.stdin.close()
        child.wait(timeout=10)
        segment.close()
        segment.unlink()


def grpc_oneway(port: str, size: int, seconds: float) -> float:
    import grpc

    opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=opts)
    sink = channel.unary_unary("/bench/Sink")
    payload = np.ones(size, np.uint8).tobytes()  # gRPC Python takes bytes

    def one() -> int:
        sink(payload, timeout=60)
        return size

    try:
        return timed(seconds, one)
    finally:
        channel.close()


# ---- the run -------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", choices=["zmq", "grpc", "mpshm"], help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--inflight", type=int, default=64)
    args = parser.parse_args()
    if args.serve == "zmq":
        return serve_zmq()
    if args.serve == "grpc":
        return serve_grpc()
    if args.serve == "mpshm":
        return serve_mpshm()
    if not PTR1_BENCH.exists():
        raise SystemExit(f"{PTR1_BENCH} is missing: cargo build --release -p ptr1-bench")

    children = []
    fixture, address = start([str(PTR1_BENCH), "serve"])
    children.append(fixture)
    others: dict[str, str] = {}
    for name, module in [("zmq", "zmq"), ("grpc", "grpc")]:
        try:
            __import__(module)
        except ImportError:
            print(f"{name}: not installed ({module}); its columns are left out")
            continue
        child, port = start([sys.executable, __file__, "--serve", name])
        children.append(child)
        others[name] = port
    zsock = zmq_client(others["zmq"]) if "zmq" in others else None

    cases: dict[str, dict[str, Callable[[], float]]] = {}
    with tw.Node(shared_memory=False) as node, tw.Node() as shm_node:
        for size in (64 * MiB, 256 * MiB):
            row: dict[str, Callable[[], float]] = {
                "tensorwire (Python)": lambda s=size: tensorwire_oneway(node, address, s, args.seconds),
                "Rust engine": lambda s=size: rust_oneway(address, s, args.seconds),
            }
            if zsock is not None:
                row["pyzmq copy=False"] = lambda s=size: zmq_oneway(zsock, s, args.seconds)
            if "grpc" in others:
                row["gRPC (Python)"] = lambda s=size: grpc_oneway(others["grpc"], s, args.seconds)
            row["tensorwire shm (Python)"] = lambda s=size: tensorwire_oneway(
                shm_node, address, s, args.seconds, "shm"
            )
            row["multiprocessing.shared_memory"] = lambda s=size: mpshm_oneway(s, args.seconds)
            cases[f"one-way {size // MiB} MiB (GB/s)"] = row
        row = {
            f"tensorwire asyncio, {args.inflight} in flight": lambda: tensorwire_async_asks(
                node, address, 4096, args.seconds, args.inflight
            ),
        }
        if zsock is not None:
            row["pyzmq REQ/REP"] = lambda: zmq_asks(zsock, 4096, args.seconds)
        cases["asks 4 KiB (asks/s)"] = row

        results: dict[str, dict[str, list[float]]] = {c: {k: [] for k in r} for c, r in cases.items()}
        for rep in range(args.reps):
            for case, row in cases.items():
                names = list(row)
                names = names[rep % len(names):] + names[: rep % len(names)]  # rotate the order
                for name in names:
                    results[case][name].append(row[name]())
            print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)

    for child in children:
        child.kill()
    print(f"\nmedians of {args.reps} interleaved reps, {args.seconds} s each, loopback, another process:\n")
    for case, row in results.items():
        medians = {k: statistics.median(v) for k, v in row.items()}
        ours, first = next(iter(medians.items()))
        scale = 1e9 if "GB/s" in case else 1.0
        cells = [f"{k} {v / scale:,.2f}" for k, v in medians.items()]
        ratios = [f"{ours} ÷ {k} = {first / v:.2f}×" for k, v in list(medians.items())[1:]]
        print(f"- {case}: " + ", ".join(cells) + ("; " + "; ".join(ratios) if ratios else ""))


if __name__ == "__main__":
    main()
