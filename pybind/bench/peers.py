"""The peers bench.py drives (besides iceoryx2_peer.py and mpi_peer.py): tensorwire from Python,
the Rust engine client, pyzmq, gRPC and multiprocessing.shared_memory (Ray: ray_peer.py), with
the servers they ask (each in a process of its own, started as `bench.py --serve NAME`).

Each peer says what its transfer does with a message's bytes (`transfer(case)`: cells.ZERO_COPY,
ONE_COPY or KERNEL), in which language its client runs, whether it busy-polls, and which
processes besides the driver work for it (`pids()`: their whole trees count in its CPU).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from cells import (
    KERNEL,
    ONE_COPY,
    TIMEOUT,
    ZERO_COPY,
    Case,
    KiB,
    NotApplicable,
    die_with_parent,
    expect,
    sequential,
    windowed,
)

import tensorwire as tw

BENCH = Path(__file__).resolve().parent / "bench.py"
# Shared memory carries a message whose encoded body is at most 8 KiB inside a record of its
# queue (the engine's INLINE_REQUEST): copied into the queue and out, as MPI's eager path copies
# through its shared-memory queues, loaned or not.
SHM_INLINE_BYTES = 8 * KiB


def start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if not line:
        raise RuntimeError(f"{' '.join(args[:3])} did not start")
    return child, line.split()[-1]


def serve_command(what: str) -> list[str]:
    return [sys.executable, str(BENCH), "--serve", what]


class Peer:
    name = ""
    note = ""
    module = ""
    language = "python"
    spins = False
    #: Whether its threads stay busy between messages however far apart they come (the suite
    #: divides ours that do only by peers that do).
    spins_through_gaps = False
    ours = False  # tensorwire itself, never a divisor

    def transfer(self, case: Case) -> str:
        return KERNEL

    def pids(self) -> list[int]:
        """The processes besides the driver that work for this peer (their trees count)."""
        return []

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Fixture:
    """The ptr1-bench fixture (`ptr1-bench serve`) the tensorwire peers ask."""

    def __init__(self, binary: Path, flags: Sequence[str] = ()) -> None:
        self.child, self.address = start([str(binary), "serve", *flags])

    def close(self) -> None:
        self.child.kill()
        self.child.wait(timeout=30)


class Tensorwire(Peer):
    module = "tensorwire"
    ours = True
    spins = True  # the engine's bounded busy-polling (NodeBuilder::busy_poll, core_busy_poll)
    #: How the in-flight cells keep asks outstanding: "nowait" — a window of
    #: `ref.ask_nowait()` whose oldest `result()` the calling thread waits for, as the
    #: iceoryx2 and MPI peers keep theirs — or "asyncio" (`ask_async` tasks on one loop).
    inflight_api = "nowait"

    def __init__(self, fixture: Fixture, transport: str, owns_fixture: bool = False) -> None:
        self.fixture, self.owns_fixture, self.transport = fixture, owns_fixture, transport
        self.name = {
            "raw": "tensorwire (Python)",
            "shm": "tensorwire shm (Python)",
            "loaned": "tensorwire shm loaned (Python)",
        }[transport]
        if transport == "loaned":
            self.note = (
                "one node.loan() per message (as iceoryx2 loans one request slice) filled once "
                "per cell and frozen, the buffers slices of it; every ask sends the same frozen "
                "buffers, which reach the fixture without a copy"
            )
        self.node = tw.Node(shared_memory=transport != "raw")
        via = "raw" if transport == "raw" else "shm"
        self.sink = self.node.ref(fixture.address, "sink", transport=via)
        self.echo = self.node.ref(fixture.address, "echo", transport=via)

    def transfer(self, case: Case) -> str:
        if self.transport == "raw":
            return KERNEL
        if case.size < SHM_INLINE_BYTES:
            return ONE_COPY
        return ZERO_COPY if self.transport == "loaned" else ONE_COPY

    def pids(self) -> list[int]:
        return [self.fixture.child.pid]

    def message(self, data: list[np.ndarray]) -> tw.TensorMessage:
        if self.transport != "loaned":
            return tw.TensorMessage(b"", data)
        # One loan holds every buffer (64-byte aligned), as a producer that writes a step's
        # tensors into one region would; its slices travel under one lease.
        starts, end = [], 0
        for array in data:
            starts.append(end)
            end = -(-(end + array.nbytes) // 64) * 64
        loan = self.node.loan(max(end, 1))
        view = np.frombuffer(loan, np.uint8)  # type: ignore[call-overload]
        for at, array in zip(starts, data, strict=True):
            view[at : at + array.nbytes] = array
        del view  # freeze() refuses while an export lives
        whole = memoryview(loan.freeze())
        parts = [whole[at : at + a.nbytes] for at, a in zip(starts, data, strict=True)]
        return tw.TensorMessage(b"", parts)

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        msg = self.message(data)
        if case.mode == "oneway":

            def one() -> None:
                reply = self.sink.ask(msg, timeout=TIMEOUT)
                expect(int(reply[1]), case.size, "sink")

            return sequential(case, seconds, one)
        if case.mode == "rtt":
            return sequential(
                case,
                seconds,
                lambda: expect(self.echo.ask(msg, timeout=TIMEOUT).total_bytes, case.size, "echo"),
            )
        if self.inflight_api == "asyncio":
            return asyncio.run(self._in_flight(case, msg, seconds))
        return windowed(
            case,
            seconds,
            lambda: self.echo.ask_nowait(msg, timeout=TIMEOUT),
            lambda pending: expect(pending.result().total_bytes, case.size, "echo"),
        )

    async def _in_flight(self, case: Case, msg: tw.TensorMessage, seconds: float) -> float:
        """`case.inflight` asks outstanding (each worker asks at least twice); timed until the
        last reply."""
        import time

        expect((await self.echo.ask_async(msg, timeout=TIMEOUT)).total_bytes, case.size, "echo")
        done, start_at = 0, time.perf_counter()

        async def worker() -> None:
            nonlocal done
            turns = 0
            while time.perf_counter() - start_at < seconds or turns < 2:
                reply = await self.echo.ask_async(msg, timeout=TIMEOUT)
                expect(reply.total_bytes, case.size, "echo")
                done += 1
                turns += 1

        await asyncio.gather(*(worker() for _ in range(case.inflight)))
        return done / (time.perf_counter() - start_at)

    def close(self) -> None:
        self.node.close()
        if self.owns_fixture:
            self.fixture.close()


def spinning_flags(gap: float) -> list[str]:
    """The fixture's flags for the spinning peers: its shared-memory thread polls for twice the
    sporadic row's gap after each message, its io_uring threads for up to that long (they back
    off after a poll that found nothing: `NodeBuilder::core_busy_poll`), so they sleep through
    few if any of that row's gaps, as MPI's ranks and iceoryx2's server spin through them."""
    window = str(max(1, round(2 * gap * 1e6)))
    return ["--core-poll-us", window, "--shm-spin-us", window]


SPINNING_ONLY = "spins through the sporadic row's gaps; measured on that row only"


class SpinningTensorwire(Tensorwire):
    """tensorwire from Python against a fixture that spins through the sporadic row's gaps
    (`spinning_flags`): the like-with-like figure beside peers that spin through them. Measured
    on that row only; on the others the default fixture's own bounded polling is the one."""

    names = {"raw": "tensorwire spinning (Python)", "shm": "tensorwire shm spinning (Python)"}
    spins_through_gaps = True
    note = (
        "the fixture's threads poll through the sporadic row's gaps (serve --core-poll-us and "
        "--shm-spin-us at twice the gap), as MPI's ranks and iceoryx2's server do; the CPU "
        "they burn is counted"
    )

    def __init__(self, fixture: Fixture, transport: str, owns_fixture: bool = False) -> None:
        super().__init__(fixture, transport, owns_fixture)
        self.name = self.names[transport]

    @staticmethod
    def applies(case: Case) -> bool:
        """Whether it measures `case`: the sporadic row only."""
        return case.gap > 0

    @classmethod
    def measures(cls, peer: str, case: Case) -> bool:
        """Whether the peer called `peer` measures `case` (every other peer: every case)."""
        return peer not in cls.names.values() or cls.applies(case)

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        if not self.applies(case):
            raise NotApplicable(SPINNING_ONLY)
        return super().measure(case, data, seconds)


class TensorwireInto(Tensorwire):
    """Echo replies received into arrays allocated once per case (`ask(msg, into=...)`), over
    shared memory: the reply's bytes land in memory the caller owns (the sender copies its
    buffers into a slot, the receiver copies them out into its arrays: two copies, beside
    peers that make one — the comparison the issue asks for, not a flattering one)."""

    note = (
        "the echo's reply received into arrays allocated once (ask(msg, into=...)): copied "
        "into a slot by the sender and out into the arrays by the receiver"
    )

    def __init__(self, fixture: Fixture, owns_fixture: bool = False) -> None:
        super().__init__(fixture, "shm", owns_fixture)
        self.name = "tensorwire into (Python)"

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        if case.mode == "oneway":
            raise NotApplicable("the sink's reply carries no buffers to receive into")
        msg = tw.TensorMessage(b"", data)
        if case.mode == "rtt":
            into = [np.empty_like(a) for a in data]
            return sequential(
                case,
                seconds,
                lambda: expect(
                    self.echo.ask(msg, timeout=TIMEOUT, into=into).total_bytes, case.size, "echo"
                ),
            )
        # Each outstanding ask's arrays, allocated once and touched before the clock starts
        # (as a training loop's would be after its first step).
        intos = [[np.full_like(a, 0) for a in data] for _ in range(case.inflight)]
        if self.inflight_api == "asyncio":
            return asyncio.run(self._in_flight_into(case, msg, intos, seconds))
        # The window holds `case.inflight` asks; the next one reuses the arrays of the one
        # just finished (the oldest), which nothing receives into any more.
        sent = 0

        def send() -> tw.Pending[tw.Answer]:
            nonlocal sent
            into = intos[sent % len(intos)]
            sent += 1
            return self.echo.ask_nowait(msg, timeout=TIMEOUT, into=into)

        return windowed(
            case,
            seconds,
            send,
            lambda pending: expect(pending.result().total_bytes, case.size, "echo"),
        )

    async def _in_flight_into(
        self, case: Case, msg: tw.TensorMessage, intos: list[list[np.ndarray]], seconds: float
    ) -> float:
        import time

        first = await self.echo.ask_async(msg, timeout=TIMEOUT, into=intos[0])
        expect(first.total_bytes, case.size, "echo")
        done, start_at = 0, time.perf_counter()

        async def worker(into: list[np.ndarray]) -> None:
            nonlocal done
            turns = 0
            while time.perf_counter() - start_at < seconds or turns < 2:
                reply = await self.echo.ask_async(msg, timeout=TIMEOUT, into=into)
                expect(reply.total_bytes, case.size, "echo")
                done, turns = done + 1, turns + 1

        await asyncio.gather(*(worker(into) for into in intos))
        return done / (time.perf_counter() - start_at)


class RustEngine(Peer):
    name = "Rust engine"
    note = "ptr1-bench run, a process per sample"
    language = "rust"
    ours = True

    def __init__(self, binary: Path, address: str) -> None:
        self.binary, self.address = binary, address

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        out = subprocess.run(
            [
                str(self.binary),
                "run",
                "--connect",
                self.address,
                "--mode",
                case.mode,
                "--size",
                str(case.size),
                "--buffers",
                str(case.buffers),
                "--inflight",
                str(case.inflight),
                "--seconds",
                str(seconds),
                "--gap",
                f"{case.gap * 1e6:.0f}us",
                "--json",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        key = {"oneway": "gb_per_s", "rtt": "latency_p50_us"}.get(case.mode, "ops_per_s")
        return float(result[key])


class PythonHandlers(RustEngine):
    """The Rust engine client asking a tensorwire node whose `echo` and `sink` are Python
    functions (`node.serve`), in a process of its own: beside "Rust engine" (the same client
    asking the Rust fixture), what a Python handler adds. Its client is Rust: it counts among
    the Rust paths (whose peers are MPI's ranks in C)."""

    name = "Python handlers (Rust client)"
    note = "ptr1-bench run against tw.Node().serve(...) handlers in Python"

    def __init__(self, binary: Path) -> None:
        self.child, address = start(serve_command("tw-handlers"))
        super().__init__(binary, address)

    def pids(self) -> list[int]:
        return [self.child.pid]

    def close(self) -> None:
        self.child.kill()
        self.child.wait(timeout=30)


def serve_tw_handlers() -> None:
    """A tensorwire node whose `echo` returns the message and whose `sink` answers the byte
    count as the Rust fixture does (an `ack` single reply)."""
    with tw.Node() as node:
        node.serve("echo", lambda m: m, threads=2)
        node.serve("sink", lambda m: ("ack", str(m.total_bytes).encode()), threads=2)
        print(node.address, flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})


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


class Zmq(Peer):
    name = "pyzmq"
    module = "zmq"
    note = "ROUTER/DEALER, copy=False both ways"

    def __init__(self) -> None:
        import zmq

        self.child, port = start(serve_command("zmq"))
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.connect(f"tcp://127.0.0.1:{port}")

    def pids(self) -> list[int]:
        return [self.child.pid]

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
        self.child.wait(timeout=30)


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


class Grpc(Peer):
    name = "gRPC (Python)"
    module = "grpc"
    note = "unary, one bytes per call: 16-buffer cases not measured"

    def __init__(self) -> None:
        import grpc

        self.child, port = start(serve_command("grpc"))
        opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=opts)
        self.sink = self.channel.unary_unary("/bench/Sink")
        self.echo = self.channel.unary_unary("/bench/Echo")

    def pids(self) -> list[int]:
        return [self.child.pid]

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        if case.buffers != 1:
            raise NotApplicable("one bytes object per call")
        body = data[0].tobytes()  # gRPC Python takes bytes (a copy, outside the timing)
        if case.mode == "oneway":
            return sequential(
                case,
                seconds,
                lambda: expect(int(self.sink(body, timeout=TIMEOUT)), case.size, "sink"),
            )
        if case.mode == "rtt":
            return sequential(
                case,
                seconds,
                lambda: expect(len(self.echo(body, timeout=TIMEOUT)), case.size, "echo"),
            )
        return windowed(
            case,
            seconds,
            lambda: self.echo.future(body, timeout=TIMEOUT),
            lambda f: expect(len(f.result()), case.size, "echo"),
        )

    def close(self) -> None:
        self.channel.close()
        self.child.kill()
        self.child.wait(timeout=30)


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


class MpShm(Peer):
    name = "multiprocessing.shared_memory"
    module = "multiprocessing.shared_memory"
    note = "a reused segment, signalled over a pipe; no in-flight mode"

    def __init__(self) -> None:
        self.child: subprocess.Popen[str] | None = None

    def transfer(self, case: Case) -> str:
        return ONE_COPY

    def pids(self) -> list[int]:
        return [self.child.pid] if self.child else []

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        if case.mode == "inflight":
            raise NotApplicable("one segment holds one message")
        from multiprocessing import shared_memory

        segment = shared_memory.SharedMemory(create=True, size=2 * case.size)
        child = self.child = subprocess.Popen(
            serve_command("mpshm"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
        )
        assert child.stdin is not None and child.stdout is not None
        stdin, stdout = child.stdin, child.stdout
        try:
            stdin.write(segment.name + "\n")
            stdin.flush()
            if stdout.readline().strip() != "attached":
                raise RuntimeError("the multiprocessing.shared_memory consumer did not attach")
            # Held in a list so the view can be dropped before close() (a live view makes it
            # raise BufferError) while `one` still names it.
            views = [np.frombuffer(segment.buf, np.uint8)]
            back = np.empty(case.size, np.uint8)
            what = "sink" if case.mode == "oneway" else "echo"

            def one() -> None:
                at = 0
                view = views[0]
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
                views.clear()  # before close(): a live view would make it raise BufferError
        finally:
            stdin.close()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
            self.child = None
            segment.close()
            segment.unlink()
