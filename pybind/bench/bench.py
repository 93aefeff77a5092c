"""tensorwire from Python next to the transports users would pick instead, measured in one run.

    cargo build --release -p ptr1-bench
    .venv/bin/pip install pyzmq grpcio        # benchmark-only dependencies (ray: optional)
    .venv/bin/python pybind/bench/bench.py [--reps 3] [--seconds 1] [--sizes 64MiB,256MiB]
        [--modes oneway,rtt,inflight] [--buffers 1,16] [--inflight 64] [--json]

Cases are modes × sizes × buffer counts, the same matrix as `ptr1-bench suite` (which runs
this script with `--json` for its peers' table):

- oneway: ask a sink that answers the payload's byte count (checked); GB/s of payload.
- rtt: ask an echo that returns the payload (its length checked); p50 latency in µs.
- inflight: K asks to the echo outstanding (K = --inflight, at most --inflight-bytes of
  payload outstanding); asks/s.

Every server is another process on loopback:

- tensorwire (Python): a `tensorwire.Node` asking the ptr1-bench fixture over PTR1, and over
  shared memory (`transport="shm"`); in flight = asyncio asks.
- Rust engine: `ptr1-bench run` against the same fixture (left out with `--skip rust`).
- pyzmq: a ROUTER server, a DEALER client, `send_multipart(copy=False)` and
  `recv_multipart(copy=False)`; in flight = K requests sent ahead on the one socket.
- gRPC (Python): unary generic-bytes handlers; one `bytes` per call, so 16-buffer cases are
  not measured (they would add a join); in flight = K `future()` calls.
- multiprocessing.shared_memory: a segment reused for the whole case; the producer copies
  each message in (the same one copy as tensorwire's "shm copied in") and signals the
  consumer over a pipe; the echo copies the payload back through the segment. One segment
  holds one message, so there is no in-flight mode.
- Ray: an actor with `sink(*arrays)` and `echo(*arrays)`; arrays travel through Ray's object
  store; in flight = K outstanding object refs.
- iceoryx2: request-response of byte slices over its Python loan API: the client loans a
  request slice and copies the buffers in, the server answers from a loaned response slice
  (the echo copies the request into it); the client polls; the server polls, napping 1 ms
  per poll after 1 ms without a request.

A library that is not installed is reported as such, never faked. Cases rotate the peer
order rep by rep; the table shows medians and how many times better tensorwire (Python, its
best path) is than each other peer.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# No case here multiplies matrices: keep OpenBLAS from starting worker threads that poll
# for work and take CPU from whichever peer is measured (the same for every peer).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import tensorwire as tw  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PTR1_BENCH = ROOT / "target" / "release" / "ptr1-bench"  # --fixture overrides it
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
TIMEOUT = 120.0


@dataclass(frozen=True)
class Case:
    mode: str  # oneway | rtt | inflight
    size: int
    buffers: int
    inflight: int

    @property
    def label(self) -> str:
        what = {"oneway": "one-way", "rtt": "RTT p50"}.get(self.mode, f"{self.inflight} in flight")
        return f"{what} {human(self.size)} × {self.buffers}"

    @property
    def unit(self) -> str:
        return {"oneway": "GB/s", "rtt": "µs"}.get(self.mode, "asks/s")

    def better(self, a: float, b: float) -> float:
        """How many times better `a` is than `b` (latencies: lower is better)."""
        return b / a if self.mode == "rtt" else a / b


class NotApplicable(Exception):
    """This peer has no way to run this case (the reason is the message)."""


def human(size: int) -> str:
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if size >= unit:
            return f"{size // unit} {name}"
    return f"{size} B"


def parse_size(text: str) -> int:
    text = text.strip()
    for suffix, unit in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB), ("B", 1)):
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * unit
    return int(text)


def payload(size: int, buffers: int) -> list[np.ndarray]:
    """`size` bytes over `buffers` arrays, the last taking the rest (as ptr1-bench's)."""
    each = size // buffers
    lengths = [each] * (buffers - 1) + [size - each * (buffers - 1)]
    return [np.full(n, 0xA5 ^ (i & 0xFF), np.uint8) for i, n in enumerate(lengths)]


# ---- timing --------------------------------------------------------------------------------

def sequential(case: Case, seconds: float, one: Callable[[], None]) -> float:
    """Runs `one` back to back (a warm-up first); the case's figure."""
    min_ops = 100 if case.mode == "rtt" and case.size <= MiB else 3
    one()
    latencies: list[float] = []
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or len(latencies) < min_ops:
        t = time.perf_counter()
        one()
        latencies.append(time.perf_counter() - t)
    if case.mode == "rtt":
        return statistics.median(latencies) * 1e6
    return len(latencies) * case.size / elapsed / 1e9


def windowed(case: Case, seconds: float, send: Callable[[], Any], wait: Callable[[Any], None]) -> float:
    """Keeps `case.inflight` requests outstanding (`send` starts one, `wait` finishes one; at
    least 3 beyond the first window), timed from the first send to the last reply with the
    window drained, after one untimed warm-up request; asks/s."""
    wait(send())
    start = time.perf_counter()
    window = deque(send() for _ in range(case.inflight))
    sent, done = len(window), 0
    while window:
        wait(window.popleft())
        done += 1
        if time.perf_counter() - start < seconds or sent < case.inflight + 3:
            window.append(send())
            sent += 1
    return done / (time.perf_counter() - start)


def expect(got: int, want: int, what: str) -> None:
    if got != want:
        raise RuntimeError(f"{what}: {got} bytes came back, {want} were sent")


# ---- servers (child processes) -------------------------------------------------------------

def serve_zmq() -> None:
    import zmq

    sock = zmq.Context().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(port, flush=True)
    while True:
        ident, tag, *body = sock.recv_multipart(copy=False)
        if tag.bytes == b"echo":
            sock.send_multipart([ident, *body], copy=False)
        else:
            sock.send_multipart([ident, str(sum(len(f.buffer) for f in body)).encode()])


def serve_grpc() -> None:
    from concurrent import futures

    import grpc

    handler = grpc.method_handlers_generic_handler(
        "bench",
        {
            "Sink": grpc.unary_unary_rpc_method_handler(lambda req, ctx: str(len(req)).encode()),
            "Echo": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req),
        },
    )
    opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=opts)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


def serve_mpshm() -> None:
    """The multiprocessing.shared_memory consumer: attaches the producer's segment once, then
    per line `sink N` reads the message's first and last byte (as a handler that looks at the
    data would) and answers N; `echo N` copies the N bytes to the segment's second half."""
    from multiprocessing import resource_tracker, shared_memory

    segment = shared_memory.SharedMemory(name=sys.stdin.readline().strip())
    # Python < 3.13 registers an attached segment with this process's tracker, which would
    # unlink the producer's segment when this process exits.
    resource_tracker.unregister(segment._name, "shared_memory")  # type: ignore[attr-defined]
    view = np.frombuffer(segment.buf, np.uint8)
    print("attached", flush=True)
    for line in sys.stdin:
        what, n = line.split()
        size = int(n)
        if what == "echo":
            np.copyto(view[size : 2 * size], view[:size])
        elif size:
            _ = int(view[0]) + int(view[size - 1])
        print(size, flush=True)
    del view
    segment.close()


def start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if not line:
        raise RuntimeError(f"{' '.join(args[:3])} did not start")
    return child, line.split()[-1]


# ---- peers ---------------------------------------------------------------------------------

class Peer:
    name = ""
    note = ""
    module = ""

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Tensorwire(Peer):
    module = "tensorwire"

    def __init__(self, address: str, transport: str) -> None:
        self.name = "tensorwire (Python)" if transport == "raw" else "tensorwire shm (Python)"
        self.node = tw.Node(shared_memory=transport == "shm")
        self.sink = self.node.ref(address, "sink", transport=transport)
        self.echo = self.node.ref(address, "echo", transport=transport)

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        msg = tw.TensorMessage(b"", data)
        if case.mode == "oneway":
            def one() -> None:
                reply = self.sink.ask(msg, timeout=TIMEOUT)
                expect(int(reply[1]), case.size, "sink")
            return sequential(case, seconds, one)
        if case.mode == "rtt":
            return sequential(
                case, seconds, lambda: expect(self.echo.ask(msg, timeout=TIMEOUT).total_bytes, case.size, "echo")
            )
        return asyncio.run(self._in_flight(case, msg, seconds))

    async def _in_flight(self, case: Case, msg: tw.TensorMessage, seconds: float) -> float:
        """`case.inflight` asks outstanding (each worker asks at least twice); timed until the
        last reply."""
        expect((await self.echo.ask_async(msg, timeout=TIMEOUT)).total_bytes, case.size, "echo")
        done, start = 0, time.perf_counter()

        async def worker() -> None:
            nonlocal done
            turns = 0
            while time.perf_counter() - start < seconds or turns < 2:
                reply = await self.echo.ask_async(msg, timeout=TIMEOUT)
                expect(reply.total_bytes, case.size, "echo")
                done += 1
                turns += 1

        await asyncio.gather(*(worker() for _ in range(case.inflight)))
        return done / (time.perf_counter() - start)

    def close(self) -> None:
        self.node.close()


class RustEngine(Peer):
    name = "Rust engine"
    note = "ptr1-bench run, a process per sample"

    def __init__(self, address: str) -> None:
        self.address = address

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        out = subprocess.run(
            [str(PTR1_BENCH), "run", "--connect", self.address, "--mode", case.mode,
             "--size", str(case.size), "--buffers", str(case.buffers), "--inflight",
             str(case.inflight), "--seconds", str(seconds), "--json"],
            capture_output=True, text=True, check=True,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        key = {"oneway": "gb_per_s", "rtt": "latency_p50_us"}.get(case.mode, "ops_per_s")
        return float(result[key])


class PythonHandlers(RustEngine):
    """The Rust engine client asking a tensorwire node whose `echo` and `sink` are Python
    functions (`node.serve`), in a process of its own: beside "Rust engine" (the same client
    asking the Rust fixture), what a Python handler adds."""

    name = "Python handlers (Rust client)"
    note = "ptr1-bench run against tw.Node().serve(...) handlers in Python"

    def __init__(self) -> None:
        self.child, address = start([sys.executable, __file__, "--serve", "tw-handlers"])
        super().__init__(address)

    def close(self) -> None:
        self.child.kill()


def serve_tw_handlers() -> None:
    """A tensorwire node whose `echo` returns the message and whose `sink` answers the byte
    count as the Rust fixture does (an `ack` single reply)."""
    with tw.Node() as node:
        node.serve("echo", lambda m: m, threads=2)
        node.serve("sink", lambda m: ("ack", str(m.total_bytes).encode()), threads=2)
        print(node.address, flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})


class Zmq(Peer):
    name = "pyzmq"
    module = "zmq"
    note = "ROUTER/DEALER, copy=False both ways"

    def __init__(self) -> None:
        import zmq

        self.child, port = start([sys.executable, __file__, "--serve", "zmq"])
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.connect(f"tcp://127.0.0.1:{port}")

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        sock = self.sock
        if case.mode == "oneway":
            def one() -> None:
                sock.send_multipart([b"sink", *data], copy=False)
                expect(int(sock.recv()), case.size, "sink")
            return sequential(case, seconds, one)

        def send() -> None:
            sock.send_multipart([b"echo", *data], copy=False)

        def wait(_: None) -> None:
            expect(sum(len(f.buffer) for f in sock.recv_multipart(copy=False)), case.size, "echo")

        if case.mode == "rtt":
            return sequential(case, seconds, lambda: wait(send()))
        return windowed(case, seconds, send, wait)

    def close(self) -> None:
        self.sock.close(linger=0)
        self.child.kill()


class Grpc(Peer):
    name = "gRPC (Python)"
    module = "grpc"
    note = "unary, one bytes per call: 16-buffer cases not measured"

    def __init__(self) -> None:
        import grpc

        self.child, port = start([sys.executable, __file__, "--serve", "grpc"])
        opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=opts)
        self.sink = self.channel.unary_unary("/bench/Sink")
        self.echo = self.channel.unary_unary("/bench/Echo")

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        if case.buffers != 1:
            raise NotApplicable("one bytes object per call")
        body = data[0].tobytes()  # gRPC Python takes bytes (a copy, outside the timing)
        if case.mode == "oneway":
            return sequential(
                case, seconds, lambda: expect(int(self.sink(body, timeout=TIMEOUT)), case.size, "sink")
            )
        if case.mode == "rtt":
            return sequential(case, seconds, lambda: expect(len(self.echo(body, timeout=TIMEOUT)), case.size, "echo"))
        return windowed(
            case, seconds,
            lambda: self.echo.future(body, timeout=TIMEOUT),
            lambda f: expect(len(f.result()), case.size, "echo"),
        )

    def close(self) -> None:
        self.channel.close()
        self.child.kill()


class MpShm(Peer):
    name = "multiprocessing.shared_memory"
    module = "multiprocessing.shared_memory"
    note = "a reused segment, signalled over a pipe; no in-flight mode"

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        if case.mode == "inflight":
            raise NotApplicable("one segment holds one message")
        from multiprocessing import shared_memory

        segment = shared_memory.SharedMemory(create=True, size=2 * case.size)
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", "mpshm"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        stdin, stdout = child.stdin, child.stdout
        try:
            stdin.write(segment.name + "\n")
            stdin.flush()
            if stdout.readline().strip() != "attached":
                raise RuntimeError("the multiprocessing.shared_memory consumer did not attach")
            view = np.frombuffer(segment.buf, np.uint8)
            back = np.empty(case.size, np.uint8)
            what = "sink" if case.mode == "oneway" else "echo"

            def one() -> None:
                at = 0
                for array in data:
                    np.copyto(view[at : at + array.size], array)
                    at += array.size
                stdin.write(f"{what} {case.size}\n")
                stdin.flush()
                expect(int(stdout.readline()), case.size, what)
                if what == "echo":
                    np.copyto(back, view[case.size : 2 * case.size])

            try:
                return sequential(case, seconds, one)
            finally:
                del view  # before close(): a live view would make it raise BufferError
        finally:
            stdin.close()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
            segment.close()
            segment.unlink()


class Ray(Peer):
    name = "Ray"
    module = "ray"
    note = "an actor; arrays through the object store"

    def __init__(self) -> None:
        import ray

        # 2 GiB holds the largest in-flight case (2 × 256 MiB each way); Ray spills beyond it.
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 object_store_memory=2 * GiB)

        @ray.remote
        class Fixture:
            def sink(self, *arrays: np.ndarray) -> int:
                return sum(a.nbytes for a in arrays)

            def echo(self, *arrays: np.ndarray) -> list[np.ndarray]:
                return list(arrays)

        self.ray = ray
        self.actor = Fixture.remote()  # type: ignore[attr-defined]
        ray.get(self.actor.sink.remote())

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        ray, actor = self.ray, self.actor
        if case.mode == "oneway":
            return sequential(case, seconds, lambda: expect(ray.get(actor.sink.remote(*data)), case.size, "sink"))

        def wait(ref: Any) -> None:
            expect(sum(a.nbytes for a in ray.get(ref)), case.size, "echo")

        if case.mode == "rtt":
            return sequential(case, seconds, lambda: wait(actor.echo.remote(*data)))
        return windowed(case, seconds, lambda: actor.echo.remote(*data), wait)

    def close(self) -> None:
        self.ray.shutdown()


class Iceoryx2(Peer):
    name = "iceoryx2"
    module = "iceoryx2"
    note = ("request-response over its Python loan API (a slice loaned per request, the buffers "
            "copied into it); the client polls, the server polls (napping 1 ms per poll only "
            "after 100 ms without a request)")

    def __init__(self) -> None:
        import iceoryx2 as iox2  # ImportError: not installed

        self.iox2 = iox2
        name = f"tensorwire-bench/{time.monotonic_ns()}"
        self.child = subprocess.Popen(
            [sys.executable, __file__, "--serve", "iceoryx2", name], stdout=subprocess.PIPE, text=True
        )
        try:
            assert self.child.stdout is not None
            if self.child.stdout.readline().strip() != "ready":
                raise RuntimeError("the iceoryx2 server did not start")
            iox2.set_log_level_from_env_or(iox2.LogLevel.Error)
            self.node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
            self.clients = {
                kind: iceoryx2_service(iox2, self.node, f"{name}/{kind}").client_builder()
                .initial_max_slice_len(4096).allocation_strategy(iox2.AllocationStrategy.PowerOfTwo)
                .create()
                for kind in ("sink", "echo")
            }
        except BaseException:
            self.child.kill()  # its server loop never ends by itself
            raise

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        kind = "sink" if case.mode == "oneway" else "echo"
        client = self.clients[kind]

        def send() -> Any:
            request = client.loan_slice_uninit(case.size)
            target, at = np.asarray(request.payload().as_memory_view()), 0
            for array in data:
                target[at : at + array.size] = array
                at += array.size
            return request.assume_init().send()

        def wait(pending: Any) -> None:
            while (response := pending.receive()) is None:
                pass
            got = np.asarray(response.payload().as_memory_view())
            n = int.from_bytes(got.tobytes(), "little") if kind == "sink" else got.size
            expect(n, case.size, kind)

        if case.mode == "inflight":
            return windowed(case, seconds, send, wait)
        return sequential(case, seconds, lambda: wait(send()))

    def close(self) -> None:
        self.clients.clear()
        self.child.kill()
        self.child.wait(timeout=30)


def iceoryx2_service(iox2: Any, node: Any, name: str) -> Any:
    """A request-response service of byte slices, as many requests in flight as the suite keeps
    (both ends open it with the same limits)."""
    iox2.set_log_level_from_env_or(iox2.LogLevel.Error)  # no "no config file" line per process
    u8 = iox2.Slice[ctypes.c_uint8]
    return (
        node.service_builder(iox2.ServiceName.new(name))
        .request_response(u8, u8)
        .max_active_requests_per_client(64)
        .open_or_create()
    )


def serve_iceoryx2(name: str) -> None:
    """An iceoryx2 sink (answers the byte count, 8 bytes little-endian) and echo (copies the
    request into a loaned response), polled in turn. After 100 ms without a request (longer
    than a 256 MiB copy between two requests) it naps 1 ms per poll, so it does not take a
    core from the other peers' measurements, and a request in a cell never waits for a nap."""
    import iceoryx2 as iox2

    iox2.set_log_level_from_env_or(iox2.LogLevel.Error)
    node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
    servers = [
        (kind, iceoryx2_service(iox2, node, f"{name}/{kind}").server_builder()
         .initial_max_slice_len(8 if kind == "sink" else 4096)
         .allocation_strategy(iox2.AllocationStrategy.PowerOfTwo).create())
        for kind in ("sink", "echo")
    ]
    print("ready", flush=True)
    idle_since = time.perf_counter()
    while True:
        served = False
        for kind, server in servers:
            request = server.receive()
            if request is None:
                continue
            served = True
            body = np.asarray(request.payload().as_memory_view())
            if kind == "sink":
                response = request.loan_slice_uninit(8)
                np.asarray(response.payload().as_memory_view())[:] = np.frombuffer(
                    body.size.to_bytes(8, "little"), np.uint8
                )
            else:
                response = request.loan_slice_uninit(body.size)
                np.copyto(np.asarray(response.payload().as_memory_view()), body)
            response.assume_init().send()
            del body, request
        if served:
            idle_since = time.perf_counter()
        elif time.perf_counter() - idle_since > 0.1:
            time.sleep(1e-3)


# ---- the run -------------------------------------------------------------------------------

VERSIONS = ["numpy", "tensorwire", "pyzmq", "grpcio", "ray", "iceoryx2"]


def main() -> None:
    global PTR1_BENCH
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="time per cell")
    parser.add_argument("--sizes", default="4KiB,1MiB,64MiB,256MiB")
    parser.add_argument("--modes", default="oneway,rtt,inflight")
    parser.add_argument("--buffers", default="1")
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--inflight-bytes", type=parse_size, default=512 * MiB)
    parser.add_argument("--skip", default="", help="peers to leave out: tw,twshm,rust,pyhandlers,zmq,grpc,mpshm,ray,iceoryx2")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--fixture", type=Path, default=PTR1_BENCH,
                        help="the ptr1-bench binary whose fixture the tensorwire peers ask")
    parser.add_argument("--cell-timeout", type=float, default=300.0,
                        help="seconds one peer may take for one case before it counts as failed")
    args = parser.parse_args()
    if args.serve:
        what, *rest = args.serve
        if what == "iceoryx2":
            return serve_iceoryx2(rest[0])
        servers = {"zmq": serve_zmq, "grpc": serve_grpc, "mpshm": serve_mpshm, "tw-handlers": serve_tw_handlers}
        return servers[what]()
    PTR1_BENCH = args.fixture
    if not PTR1_BENCH.exists():
        raise SystemExit(f"{PTR1_BENCH} is missing: cargo build --release -p ptr1-bench")

    def out_of_time(signum: int, frame: object) -> None:
        raise TimeoutError(f"no result within --cell-timeout {args.cell_timeout} s")

    signal.signal(signal.SIGALRM, out_of_time)

    def emit(record: dict[str, Any]) -> None:
        if args.json:
            print(json.dumps(record), flush=True)

    cases = [
        Case(mode, size, buffers, min(args.inflight, max(1, args.inflight_bytes // size)) if mode == "inflight" else 1)
        for mode in args.modes.split(",")
        for size in map(parse_size, args.sizes.split(","))
        for buffers in map(int, args.buffers.split(","))
    ]
    emit({"kind": "version", "name": "python", "version": platform.python_version()})
    for dist in VERSIONS:
        try:
            emit({"kind": "version", "name": dist, "version": importlib.metadata.version(dist)})
        except importlib.metadata.PackageNotFoundError:
            pass

    fixture, address = start([str(PTR1_BENCH), "serve"])
    skip = set(args.skip.split(","))
    makers: list[tuple[str, str, Callable[[], Peer]]] = [
        ("tw", "tensorwire (Python)", lambda: Tensorwire(address, "raw")),
        ("twshm", "tensorwire shm (Python)", lambda: Tensorwire(address, "shm")),
        ("rust", "Rust engine", lambda: RustEngine(address)),
        ("pyhandlers", "Python handlers (Rust client)", PythonHandlers),
        ("zmq", "pyzmq", Zmq),
        ("grpc", "gRPC (Python)", Grpc),
        ("mpshm", "multiprocessing.shared_memory", MpShm),
        ("ray", "Ray", Ray),
        ("iceoryx2", "iceoryx2", Iceoryx2),
    ]
    peers: list[Peer] = []
    for key, name, make in makers:
        if key in skip:
            continue
        try:
            peer = make()
        except ImportError as e:
            emit({"kind": "unavailable", "peer": name, "reason": f"not installed ({e})"})
            print(f"{name}: not installed ({e}); not measured", file=sys.stderr)
            continue
        except Exception as e:  # a peer that cannot start is reported, not faked
            emit({"kind": "unavailable", "peer": name, "reason": f"{type(e).__name__}: {e}"})
            print(f"{name}: not measured: {e}", file=sys.stderr)
            continue
        peers.append(peer)
        if peer.note:
            emit({"kind": "note", "peer": name, "text": peer.note})

    results: dict[Case, dict[str, list[float]]] = {c: {p.name: [] for p in peers} for c in cases}
    not_applicable: dict[tuple[Case, str], str] = {}
    spent: dict[str, float] = {}  # seconds each peer took, set-up excluded
    failed: list[Peer] = []
    try:
        for rep in range(args.reps):
            for c, case in enumerate(cases):
                data = payload(case.size, case.buffers)
                for peer in failed:
                    if peer in peers:
                        peers.remove(peer)
                        try:
                            peer.close()
                        except Exception as e:
                            print(f"{peer.name}: close failed: {e}", file=sys.stderr)
                if not peers:
                    break
                turn = (rep + c) % len(peers)
                for peer in peers[turn:] + peers[:turn]:  # rotate the order
                    began = time.perf_counter()
                    signal.setitimer(signal.ITIMER_REAL, args.cell_timeout)  # a wedged peer fails
                    try:
                        value = peer.measure(case, data, args.seconds)
                    except NotApplicable as why:
                        not_applicable[(case, peer.name)] = str(why)
                        continue
                    except Exception as e:  # one peer failing leaves the others measured
                        reason = f"{case.label}: {type(e).__name__}: {e}"
                        emit({"kind": "failed", "peer": peer.name, "reason": reason})
                        print(f"{peer.name} failed, left out from here on: {reason}", file=sys.stderr)
                        failed.append(peer)
                        continue
                    finally:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                        spent[peer.name] = spent.get(peer.name, 0.0) + time.perf_counter() - began
                    results[case][peer.name].append(value)
                    emit({"kind": "sample", "peer": peer.name, "mode": case.mode, "size": case.size,
                          "buffers": case.buffers, "inflight": case.inflight, "rep": rep, "value": value})
            took = ", ".join(f"{name} {t:.1f} s" for name, t in spent.items())
            print(f"peers: rep {rep + 1}/{args.reps} done ({took})", file=sys.stderr)
    finally:
        for peer in peers:
            try:
                peer.close()
            except Exception as e:  # closing a broken peer must not hide the results
                print(f"{peer.name}: close failed: {e}", file=sys.stderr)
        fixture.kill()
    for (case, name), why in not_applicable.items():
        emit({"kind": "not_applicable", "peer": name, "mode": case.mode, "size": case.size,
              "buffers": case.buffers, "reason": why})
    if not args.json:
        print_table(cases, results, args)


def print_table(cases: list[Case], results: dict[Case, dict[str, list[float]]], args: argparse.Namespace) -> None:
    print(f"\nmedians of {args.reps} interleaved reps, {args.seconds} s per cell, loopback, servers in other processes:\n")
    for case in cases:
        medians = {k: statistics.median(v) for k, v in results[case].items() if v}
        ours = [v for k, v in medians.items() if k.startswith("tensorwire")]
        if not ours:
            continue
        best = max(ours, key=lambda v: case.better(v, 1.0) if v else 0.0)
        cells = [f"{k} {v:,.2f}" for k, v in medians.items()]
        ratios = [f"÷ {k} {case.better(best, v):.2f}×" for k, v in medians.items() if not k.startswith("tensorwire")]
        print(f"- {case.label} ({case.unit}): " + ", ".join(cells) + ("; tensorwire " + ", ".join(ratios) if ratios else ""))
    handlers = [
        (case, statistics.median(r[PythonHandlers.name]), statistics.median(r[RustEngine.name]))
        for case, r in results.items()
        if r.get(PythonHandlers.name) and r.get(RustEngine.name)
    ]
    if handlers:
        print("\nPython handlers (node.serve) against the Rust fixture, the same Rust client:\n")
        for case, py, rust in handlers:
            extra = f", {py - rust:+.1f} µs" if case.mode == "rtt" else ""
            print(f"- {case.label} ({case.unit}): Python {py:,.2f}, Rust {rust:,.2f}: {case.better(py, rust):.2f}×{extra}")


if __name__ == "__main__":
    main()
