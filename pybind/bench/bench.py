"""tensorwire from Python next to the transports users would pick instead, measured in one run.

    cargo build --release -p ptr1-bench
    .venv/bin/pip install pyzmq grpcio iceoryx2 mpi4py   # benchmark-only (ray: scripts/python-env)
    .venv/bin/python pybind/bench/bench.py [--reps 3] [--seconds 1] [--sizes 64MiB,256MiB]
        [--modes oneway,rtt,inflight,sporadic] [--buffers 1,16] [--inflight 64] [--fresh] [--json]

Cases are modes × sizes × buffer counts, the same matrix as `ptr1-bench suite` (which runs
this script with `--json` and every mode for its peers' table and verdicts):

- oneway: ask a sink that answers the payload's byte count (checked); GB/s of payload.
- rtt: ask an echo that returns the payload (its length checked); p50 latency in µs.
- inflight: K asks to the echo outstanding (K = --inflight, at most --inflight-bytes of
  payload outstanding); asks/s.
- sporadic: one row, RTT of the smallest size with one buffer, each ask after an untimed
  sleep (--sporadic-gap, 10 ms), as a training step's asks come: the threads of both ends go
  idle in between, unless they busy-poll (MPI's ranks, iceoryx2's server: see the CPU they
  burn); p50 µs.

Every server is another process on loopback. Each peer says what its transfer does with a
message's bytes — a zero-copy hand-off, one copy through shared memory, or through the kernel
— and the suite divides only within one of these (and one language; a peer in C beside the
Rust columns). The peers:

- tensorwire (Python): a `tensorwire.Node` asking the ptr1-bench fixture over PTR1 (kernel),
  over shared memory with the buffers copied in (one copy; < 8 KiB inside a record of the
  shared-memory queue, copied in and out as MPI's eager path does: counted as one copy too),
  and with the buffers as slices of one frozen `node.loan()` per message, as iceoryx2 loans
  one request slice (zero-copy; < 8 KiB: in the queue, a copy); in flight = a window of
  `ask_nowait()` whose oldest `result()` the calling thread waits for, as the iceoryx2 and MPI
  peers keep theirs (`--tw-inflight asyncio`: `ask_async` tasks on one event loop instead).
  "tensorwire into": the echo's reply received over shared memory into arrays allocated once
  (`ask(msg, into=...)`; counted with the one-copy peers, though it copies twice: into the
  sender's slot and out into the arrays). "tensorwire spinning" and "tensorwire shm
  spinning": the same against a second fixture whose threads poll through the sporadic row's
  gaps (`serve --core-poll-us --shm-spin-us` at twice the gap), as MPI's ranks and iceoryx2's
  server spin through them; measured on that row only.
- Rust engine: `ptr1-bench run` against the same fixture (left out with `--skip rust`).
- pyzmq: ROUTER/DEALER, `copy=False` both ways (kernel).
- gRPC (Python): unary generic-bytes handlers, one `bytes` per call, so 16-buffer cases are not
  measured (kernel).
- multiprocessing.shared_memory: a segment reused for the whole case, the producer copies each
  message in and signals over a pipe (one copy); no in-flight mode.
- Ray: an actor, arrays as arguments through the object store (one copy; below 100 KiB per
  array inline in gRPC: kernel); Ray (in store): the arrays put there once per cell, their refs
  passed (zero-copy).
- iceoryx2: request-response over its loan API, the buffers copied into the loan (one copy);
  iceoryx2 in place: written straight into the loan (zero-copy). iceoryx2_peer.py.
- MPI one host / MPI over TCP: mpi4py over Open MPI, `mpirun -n 2`, its default transport on one
  host (one copy) and `--mca pml ob1 --mca btl self,tcp` (kernel). mpi_peer.py. "(C)": the
  same ranks in C (mpi_rank.c, compiled with mpicc on first use), language "c": the suite sets
  them beside its Rust clients, not beside Python.

Each sample carries the CPU seconds the cell burned (user + system of this process and of the
peer's server processes, from /proc): tensorwire, iceoryx2 and MPI busy-poll.

`--fresh` measures every cell with new processes (a new fixture, server, actor or mpirun per
cell, made before the cell and closed after it): a user's first seconds, not a warm process.

A library that is not installed is reported as such, never faked. Cases rotate the peer order
rep by rep; the table shows medians by what the transfer does (the suite prints the verdicts).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import signal
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

# No case here multiplies matrices: keep OpenBLAS from starting worker threads that poll
# for work and take CPU from whichever peer is measured (the same for every peer).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import contextlib

from cells import (  # noqa: E402
    SPORADIC_GAP,
    Case,
    MiB,
    parse_size,
)
from matrix import Run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PTR1_BENCH = ROOT / "target" / "release" / "ptr1-bench"  # --fixture overrides it
VERSIONS = ["numpy", "tensorwire", "pyzmq", "grpcio", "ray", "iceoryx2", "mpi4py"]
# --skip keys: a family key ("ray", "iceoryx2", "mpi") leaves out all its variants.
KEYS = (
    "tw,twshm,twloaned,twinto,twspin,twshmspin,rust,pyhandlers,zmq,grpc,mpshm,ray,rayinstore,"
    "iceoryx2,iceoryx2inplace,mpi,mpitcp,mpic,mpitcpc"
)
FAMILIES = {
    "rayinstore": "ray",
    "iceoryx2inplace": "iceoryx2",
    "mpitcp": "mpi",
    "mpic": "mpi",
    "mpitcpc": "mpi",
}


def serve(what: str) -> None:
    from peers import serve_grpc, serve_mpshm, serve_tw_handlers, serve_zmq

    {"zmq": serve_zmq, "grpc": serve_grpc, "mpshm": serve_mpshm, "tw-handlers": serve_tw_handlers}[
        what
    ]()


def makers(
    fresh: bool, shared: Any, spinning: Any, gap: float
) -> list[tuple[str, str, Callable[[], Any]]]:
    """(skip key, name, constructor) of every peer. Warm, the tensorwire peers share one fixture
    (`shared`), the spinning ones another (`spinning`, polling through `gap`); fresh, each
    makes its own."""
    from iceoryx2_peer import Iceoryx2
    from mpi_peer import Mpi, MpiC
    from peers import (
        Fixture,
        Grpc,
        MpShm,
        PythonHandlers,
        RustEngine,
        SpinningTensorwire,
        Tensorwire,
        TensorwireInto,
        Zmq,
        spinning_flags,
    )
    from ray_peer import Ray

    def tensorwire(transport: str) -> Callable[[], Any]:
        if fresh:
            return lambda: Tensorwire(Fixture(PTR1_BENCH), transport, owns_fixture=True)
        return lambda: Tensorwire(shared(), transport)

    def spinning_tensorwire(transport: str) -> Callable[[], Any]:
        if fresh:
            return lambda: SpinningTensorwire(
                Fixture(PTR1_BENCH, spinning_flags(gap)), transport, owns_fixture=True
            )
        return lambda: SpinningTensorwire(spinning(), transport)

    def into() -> Any:
        if fresh:
            return TensorwireInto(Fixture(PTR1_BENCH), owns_fixture=True)
        return TensorwireInto(shared())

    return [
        ("tw", "tensorwire (Python)", tensorwire("raw")),
        ("twshm", "tensorwire shm (Python)", tensorwire("shm")),
        ("twloaned", "tensorwire shm loaned (Python)", tensorwire("loaned")),
        ("twinto", "tensorwire into (Python)", into),
        ("twspin", SpinningTensorwire.names["raw"], spinning_tensorwire("raw")),
        ("twshmspin", SpinningTensorwire.names["shm"], spinning_tensorwire("shm")),
        ("rust", "Rust engine", lambda: RustEngine(PTR1_BENCH, shared().address)),
        ("pyhandlers", "Python handlers (Rust client)", lambda: PythonHandlers(PTR1_BENCH)),
        ("zmq", "pyzmq", Zmq),
        ("grpc", "gRPC (Python)", Grpc),
        ("mpshm", "multiprocessing.shared_memory", MpShm),
        ("ray", "Ray", lambda: Ray(in_store=False)),
        ("rayinstore", "Ray (in store)", lambda: Ray(in_store=True)),
        ("iceoryx2", "iceoryx2", lambda: Iceoryx2(in_place=False)),
        ("iceoryx2inplace", "iceoryx2 in place", lambda: Iceoryx2(in_place=True)),
        ("mpi", "MPI one host", lambda: Mpi(tcp=False)),
        ("mpitcp", "MPI over TCP", lambda: Mpi(tcp=True)),
        ("mpic", "MPI one host (C)", lambda: MpiC(tcp=False)),
        ("mpitcpc", "MPI over TCP (C)", lambda: MpiC(tcp=True)),
    ]


def positive_seconds(text: str) -> float:
    """A number of seconds above 0 (argparse type)."""
    seconds = float(text)
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, not {text}")
    return seconds


def own_stdin() -> TextIO:
    """This process's stdin for itself alone: the peers' processes get /dev/null instead (mpirun
    forwards its stdin to rank 0, and would take the lines `--steer` is asked with)."""
    asks = os.fdopen(os.dup(0), "r")  # not inherited: os.dup makes it close-on-exec
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return asks


def main() -> None:
    global PTR1_BENCH
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="time per cell (default 1 s; 0.5 s with --fresh)",
    )
    parser.add_argument("--sizes", default="4KiB,1MiB,64MiB,256MiB")
    parser.add_argument("--modes", default="oneway,rtt,inflight")
    parser.add_argument("--buffers", default="1")
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument(
        "--sporadic-gap",
        type=positive_seconds,
        default=SPORADIC_GAP,
        help="seconds of untimed sleep before each ask of the sporadic row (the suite passes "
        "its own)",
    )
    parser.add_argument("--inflight-bytes", type=parse_size, default=512 * MiB)
    parser.add_argument(
        "--tw-inflight",
        choices=["nowait", "asyncio"],
        default="nowait",
        help="how tensorwire keeps asks in flight: a window of ask_nowait() on the calling "
        "thread, or asyncio tasks (ask_async)",
    )
    parser.add_argument("--skip", default="", help=f"peers to leave out: {KEYS}")
    parser.add_argument("--only", default="", help="only these peers (same keys as --skip)")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="new processes for every cell (fixture, server, actor, mpirun)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--steer",
        action="store_true",
        help="measure the cells the caller asks for on stdin, one JSON line each "
        '({"rep": R, "mode": M, "size": S, "buffers": B}), answering each with its records and '
        '{"kind": "cell_done"} (`ptr1-bench suite` steers its C peers this way); needs --json',
    )
    parser.add_argument(
        "--fixture",
        type=Path,
        default=PTR1_BENCH,
        help="the ptr1-bench binary whose fixture the tensorwire peers ask",
    )
    parser.add_argument(
        "--cell-timeout",
        type=float,
        default=300.0,
        help="seconds one peer may take for one case before it counts as failed",
    )
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve)
    if args.seconds is None:
        args.seconds = 0.5 if args.fresh else 1.0
    if args.steer and not args.json:
        raise SystemExit("--steer answers in JSON lines: add --json")
    if args.steer:
        asks = own_stdin()
    PTR1_BENCH = args.fixture
    if not PTR1_BENCH.exists():
        raise SystemExit(f"{PTR1_BENCH} is missing: cargo build --release -p ptr1-bench")
    from peers import SpinningTensorwire, Tensorwire

    import tensorwire  # noqa: F401  (fails here, early, when the package is missing)

    Tensorwire.inflight_api = args.tw_inflight

    def out_of_time(signum: int, frame: object) -> None:
        raise TimeoutError(f"no result within --cell-timeout {args.cell_timeout} s")

    signal.signal(signal.SIGALRM, out_of_time)
    sizes = list(map(parse_size, args.sizes.split(",")))
    cases = [
        Case(
            mode,
            size,
            buffers,
            min(args.inflight, max(1, args.inflight_bytes // size)) if mode == "inflight" else 1,
        )
        for mode in args.modes.split(",")
        if mode != "sporadic"
        for size in sizes
        for buffers in map(int, args.buffers.split(","))
    ]
    if "sporadic" in args.modes.split(","):
        cases.append(Case("rtt", min(sizes), 1, 1, args.sporadic_gap))
    run = Run(args, cases, PTR1_BENCH)
    run.emit({"kind": "version", "name": "python", "version": platform.python_version()})
    for dist in VERSIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            run.emit({"kind": "version", "name": dist, "version": importlib.metadata.version(dist)})
    run.emit({"kind": "load", "loadavg": os.getloadavg()[0], "fresh": args.fresh})
    skip, only = set(filter(None, args.skip.split(","))), set(filter(None, args.only.split(",")))

    def chosen(key: str) -> bool:
        keys = {key, FAMILIES.get(key, key)}
        return not keys & skip and (not only or bool(keys & only))

    picked = [
        (name, make)
        for key, name, make in makers(
            args.fresh, run.shared_fixture, run.spinning_fixture, args.sporadic_gap
        )
        # The spinning peers measure the sporadic row only: left out without it.
        if chosen(key) and any(SpinningTensorwire.measures(name, case) for case in cases)
    ]
    try:
        if args.steer:
            run.steered(picked, asks)
        else:
            (run.fresh if args.fresh else run.warm)(picked)
    finally:
        run.finish()
    if not args.json:
        print_table(cases, run.results, args)


def print_table(
    cases: list[Case], results: dict[Case, dict[str, list[float]]], args: argparse.Namespace
) -> None:
    how = "fresh processes per cell" if args.fresh else "warm processes"
    print(
        f"\nmedians of {args.reps} interleaved reps, {args.seconds} s per cell, {how}, loopback, "
        "servers in other processes (ratios: `ptr1-bench suite`, within one kind of transfer):\n"
    )
    for case in cases:
        medians = {k: statistics.median(v) for k, v in results[case].items() if v}
        if medians:
            cells = ", ".join(f"{k} {v:,.2f}" for k, v in medians.items())
            print(f"- {case.label} ({case.unit}): {cells}")


if __name__ == "__main__":
    main()
