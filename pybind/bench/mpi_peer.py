"""MPI as a peer: mpi4py over the machine's Open MPI, two ranks started by `mpirun -n 2`, on one
host with Open MPI's default transport (Debian's: the ob1 PML over the shared-memory `vader`
BTL, large messages copied once by CMA) or forced onto TCP (`--mca pml ob1 --mca btl
self,tcp`).

The driver (bench.py, not an MPI process) starts mpirun once per peer and steers both ranks
over a Unix socket: per cell it sends the case to both, rank 0 (the client) measures and
answers the figure, rank 1 (the server) answers "done". Between cells both ranks block on that
socket, outside MPI, so neither spins while other peers are measured; inside a cell both spin
in MPI's progress loop, as MPI does.

Per message, as the other peers: one-way = the buffers to rank 1, which answers an 8-byte ack
with the byte count (checked); RTT = the buffers there and back; in flight = K requests
outstanding (nonblocking sends and receives), rank 1 echoing each as it completes. Each buffer
is its own message (tag = its index); the receiver posts its receives into buffers it
allocated once per cell.

`MpiC` runs the same ranks written in C (mpi_rank.c, compiled with mpicc on first use): MPI
without an interpreter, the peer the suite sets beside tensorwire's Rust clients.

    python mpi_peer.py --rank SOCKET   (what mpirun runs; not for people)
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from cells import (
    KERNEL,
    ONE_COPY,
    Case,
    die_with_parent,
    expect,
    lengths,
    sequential,
    windowed,
)

ACK_TAG, STOP_TAG, REPLY_TAG = 200, 999, 100
START_TIMEOUT = 60.0


def mpirun_command(tcp: bool) -> tuple[list[str], dict[str, str], list[str]]:
    """The mpirun command line (ahead of the rank program), its environment and what was set
    and why (for the peer's note). Raises ImportError when MPI is not installed."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise ImportError(
            "no mpirun (apt-get install openmpi-bin libopenmpi-dev; scripts/install-deps does)"
        )
    args = [mpirun, "-n", "2"]
    env = dict(os.environ)
    said: list[str] = []
    if os.geteuid() == 0:
        # Open MPI refuses root unless told twice.
        env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        said.append("as root: OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
    if (os.cpu_count() or 1) < 2:
        args.append("--oversubscribe")
        said.append("--oversubscribe (fewer than 2 CPUs)")
    ptrace = Path("/proc/sys/kernel/yama/ptrace_scope")
    if not tcp and ptrace.exists() and ptrace.read_text().strip() != "0":
        # CMA (process_vm_readv) needs ptrace rights between the ranks; without them vader
        # fails at the first large message, so it copies through its FIFOs instead.
        env["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
        said.append("Yama ptrace_scope != 0: OMPI_MCA_btl_vader_single_copy_mechanism=none")
    if tcp:
        args += ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp"]
    return args, env, said


class Mpi:
    """The driver's side of one MPI peer (one mpirun, two ranks)."""

    module = "mpi4py"
    language = "python"
    ours = False

    def __init__(self, tcp: bool) -> None:
        import mpi4py  # ImportError: not installed

        self._start(
            tcp,
            [sys.executable, str(Path(__file__).resolve())],
            f"mpi4py {mpi4py.__version__}",
        )

    def _start(self, tcp: bool, program: list[str], what: str) -> None:
        """Starts `mpirun -n 2 PROGRAM --rank SOCKET` and waits for both ranks to connect."""
        self.tcp = tcp
        self.name = "MPI over TCP" if tcp else "MPI one host"
        self.transfer_kind = KERNEL if tcp else ONE_COPY
        self.spins = True
        self.spins_through_gaps = True  # both ranks' progress loops spin inside a cell
        args, env, said = mpirun_command(tcp)
        transport = (
            "ob1 + tcp BTL (--mca pml ob1 --mca btl self,tcp)"
            if tcp
            else "Open MPI's default on one host (here ob1 + vader shared memory, CMA single copy)"
        )
        self.note = f"{what}, `mpirun -n 2`, {transport}; both ranks spin while they wait" + (
            "; " + "; ".join(said) if said else ""
        )
        self.dir = tempfile.mkdtemp(prefix="tw-bench-mpi-")
        path = os.path.join(self.dir, "control")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(2)
        self.child = subprocess.Popen(
            [*args, *program, "--rank", path],
            env=env,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        try:
            self.ranks = self._accept_ranks()
        except BaseException:
            self.close()
            raise

    def _accept_ranks(self) -> dict[int, Any]:
        """Both ranks' control connections, by rank."""
        ranks: dict[int, Any] = {}
        deadline = time.monotonic() + START_TIMEOUT
        self.listener.settimeout(1.0)
        while len(ranks) < 2:
            if self.child.poll() is not None:
                raise RuntimeError(
                    f"mpirun exited with {self.child.returncode} before both ranks connected"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"the MPI ranks did not connect within {START_TIMEOUT:.0f} s")
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            stream = conn.makefile("rwb", buffering=0)
            ranks[int(stream.readline())] = (conn, stream)
        return ranks

    def transfer(self, case: Case) -> str:
        return self.transfer_kind

    def pids(self) -> list[int]:
        return [self.child.pid]

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        command = (
            json.dumps(
                {
                    "mode": case.mode,
                    "size": case.size,
                    "buffers": case.buffers,
                    "inflight": case.inflight,
                    "gap": case.gap,
                    "seconds": seconds,
                }
            ).encode()
            + b"\n"
        )
        for _, stream in self.ranks.values():
            stream.write(command)
        answers = {rank: stream.readline() for rank, (_, stream) in self.ranks.items()}
        for rank, line in answers.items():
            if not line:
                raise RuntimeError(f"MPI rank {rank} hung up (mpirun: {self.child.poll()})")
        result = json.loads(answers[0])
        if "error" in result:
            raise RuntimeError(f"MPI rank 0: {result['error']}")
        if json.loads(answers[1]).get("error"):
            raise RuntimeError(f"MPI rank 1: {json.loads(answers[1])['error']}")
        return float(result["value"])

    def close(self) -> None:
        for conn, stream in getattr(self, "ranks", {}).values():
            with contextlib.suppress(OSError):
                stream.write(b'{"quit": true}\n')
            conn.close()
        try:
            self.child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.child.pid, 9)
            self.child.wait(timeout=10)
        self.listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class MpiC(Mpi):
    """The same two ranks written in C (`mpi_rank.c`, the same cells and checks, no interpreter
    in the loop): MPI's own figures, the peer of tensorwire's Rust clients."""

    module = ""
    language = "c"

    def __init__(self, tcp: bool) -> None:
        self._start(tcp, [compiled_rank()], "C ranks (mpi_rank.c, mpicc -O2)")
        self.name += " (C)"


_COMPILED: dict[str, str] = {}
COMPILE_TIMEOUT = 120.0


def compiled_rank() -> str:
    """mpi_rank.c compiled with mpicc, once per process, into a directory removed at exit.
    Raises ImportError when mpicc or the C compiler it drives is missing, RuntimeError when the
    build fails (the failure is kept: the second MPI peer in C does not build again)."""
    if "path" in _COMPILED:
        return _COMPILED["path"]
    if "error" in _COMPILED:
        raise RuntimeError(_COMPILED["error"])
    mpicc = shutil.which("mpicc")
    if mpicc is None:
        raise ImportError("no mpicc (apt-get install libopenmpi-dev; scripts/install-deps does)")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        raise ImportError("no C compiler for mpicc (apt-get install gcc; install-deps does)")
    directory = tempfile.mkdtemp(prefix="tw-bench-mpi-rank-")
    atexit.register(shutil.rmtree, directory, True)
    binary = os.path.join(directory, "mpi_rank")
    source = Path(__file__).resolve().with_name("mpi_rank.c")
    try:
        done = subprocess.run(
            [mpicc, "-O2", "-Wall", "-o", binary, str(source)],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT,
        )
        failure = (
            f"mpicc failed on {source.name}: {done.stderr.strip()[-500:]}"
            if done.returncode != 0
            else ""
        )
    except subprocess.TimeoutExpired:
        failure = f"mpicc took more than {COMPILE_TIMEOUT:.0f} s on {source.name}"
    if failure:
        _COMPILED["error"] = failure
        raise RuntimeError(failure)
    _COMPILED["path"] = binary
    return binary


# ---- the ranks -----------------------------------------------------------------------------


def rank_main(path: str) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    stream = conn.makefile("rwb", buffering=0)
    stream.write(f"{rank}\n".encode())
    for line in stream:
        command = json.loads(line)
        if command.get("quit"):
            break
        fields = ("mode", "size", "buffers", "inflight", "gap")
        case = Case(**{field: command[field] for field in fields})
        try:
            if rank == 0:
                answer: dict[str, Any] = {"value": client(MPI, comm, case, command["seconds"])}
            else:
                server(MPI, comm, case)
                answer = {"done": True}
        except Exception as e:  # the driver reports it as this peer's failure
            answer = {"error": f"{type(e).__name__}: {e}"}
        stream.write(json.dumps(answer).encode() + b"\n")
    conn.close()


def allocated(MPI: Any, comm: Any, make: Any) -> Any:
    """`make()`'s buffers, once both ranks have theirs: a rank that could not allocate makes
    both give up the cell before any message (a server without its receives would leave the
    client waiting for replies forever)."""
    try:
        made, ok = make(), True
    except MemoryError:
        made, ok = None, False
    if not comm.allreduce(ok, op=MPI.LAND):
        raise MemoryError("a rank could not allocate the case's buffers")
    return made


def client(MPI: Any, comm: Any, case: Case, seconds: float) -> float:
    """Rank 0: sends the case's messages to rank 1 and times them; then tells it to stop."""
    slots = case.inflight if case.mode == "inflight" else 1

    def make() -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
        data = [
            np.full(n, 0xA5 ^ (i & 0xFF), np.uint8)
            for i, n in enumerate(lengths(case.size, case.buffers))
        ]
        replies = [
            [np.empty(n, np.uint8) for n in lengths(case.size, case.buffers)] for _ in range(slots)
        ]
        return data, replies

    data, replies = allocated(MPI, comm, make)
    ack = np.zeros(1, np.int64)
    issued = 0

    def send() -> tuple[list[Any], list[Any]]:
        nonlocal issued
        slot = replies[issued % slots]
        issued += 1
        if case.mode == "oneway":
            receives = [comm.Irecv(ack, source=1, tag=ACK_TAG)]
        else:
            receives = [comm.Irecv(b, source=1, tag=REPLY_TAG + j) for j, b in enumerate(slot)]
        sends = [comm.Isend(b, dest=1, tag=j) for j, b in enumerate(data)]
        return receives, sends

    # A reply of the wrong length is reported once the window has drained: raising at once
    # would leave requests outstanding while rank 1 waits to send them back.
    wrong: list[str] = []

    def wait(pending: tuple[list[Any], list[Any]]) -> None:
        receives, sends = pending
        statuses = [MPI.Status() for _ in receives]
        MPI.Request.Waitall(receives, statuses)
        MPI.Request.Waitall(sends)
        try:
            if case.mode == "oneway":
                expect(int(ack[0]), case.size, "sink")
            else:
                expect(sum(s.Get_count(MPI.BYTE) for s in statuses), case.size, "echo")
        except RuntimeError as e:
            wrong.append(str(e))

    try:
        if case.mode == "inflight":
            figure = windowed(case, seconds, send, wait)
        else:
            figure = sequential(case, seconds, lambda: wait(send()))
    finally:
        comm.Send(np.zeros(1, np.int64), dest=1, tag=STOP_TAG)
    if wrong:
        raise RuntimeError(f"{wrong[0]} ({len(wrong)} such replies)")
    return figure


def server(MPI: Any, comm: Any, case: Case) -> None:
    """Rank 1: a receive posted per buffer of each of K slots (K = the requests the client keeps
    outstanding), served in order: the ack (one-way) or the buffers back (echo); until the
    client's stop."""
    slots = case.inflight if case.mode == "inflight" else 1
    buffers = allocated(
        MPI,
        comm,
        lambda: [
            [np.empty(n, np.uint8) for n in lengths(case.size, case.buffers)] for _ in range(slots)
        ],
    )
    stop = comm.Irecv(np.zeros(1, np.int64), source=0, tag=STOP_TAG)

    def post(slot: int) -> list[Any]:
        return [comm.Irecv(b, source=0, tag=j) for j, b in enumerate(buffers[slot])]

    posted = [post(k) for k in range(slots)]
    ack = np.zeros(1, np.int64)
    k = 0
    while True:
        first = MPI.Status()
        index = MPI.Request.Waitany([stop, *posted[k]], first)
        if index == 0:
            break
        statuses = [MPI.Status() for _ in posted[k]]
        MPI.Request.Waitall(posted[k], statuses)  # the one Waitany completed is now null:
        statuses[index - 1] = first  # its status is the one Waitany gave
        if case.mode == "oneway":
            ack[0] = sum(s.Get_count(MPI.BYTE) for s in statuses)
            comm.Send(ack, dest=0, tag=ACK_TAG)
        else:
            MPI.Request.Waitall(
                [comm.Isend(b, dest=0, tag=REPLY_TAG + j) for j, b in enumerate(buffers[k])]
            )
        posted[k] = post(k)
        k = (k + 1) % slots
    for requests in posted:  # the receives the stop left posted
        for request in requests:
            request.Cancel()
        MPI.Request.Waitall(requests)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2])
    else:
        raise SystemExit(__doc__)
