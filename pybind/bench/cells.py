"""What the peers' driver (bench.py) and the MPI ranks (mpi_peer.py) share: the cases, how one
cell is timed, what a transfer does per message, and the CPU a cell burned.

No tensorwire import here: the MPI ranks load this module and nothing else of the benchmark.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
TIMEOUT = 120.0
#: The sporadic row (`--modes sporadic`): RTT of the smallest size, one buffer, each ask after
#: an untimed sleep this long (bench.py's default; the suite passes its SPORADIC_GAP).
SPORADIC_GAP = 0.010

_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """`preexec_fn` of every server the benchmark starts: the kernel kills the child when the
    process that started it dies, even by SIGKILL (the OOM killer), so no peer server outlives
    its driver holding memory and spinning."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# What a transfer does with each message's bytes (the suite's verdict divides only within one
# of these, and only within one language — a peer in C counting as Rust's):
ZERO_COPY = "zero_copy"  # handed off by reference: the receiver reads the sender's memory
ONE_COPY = "one_copy"  # copied once through shared memory, no kernel in the data path
KERNEL = "kernel"  # through the kernel: a socket (TCP, a Unix datagram, gRPC)


@dataclass(frozen=True)
class Case:
    mode: str  # oneway | rtt | inflight (the sporadic row is rtt with a gap)
    size: int
    buffers: int
    inflight: int
    gap: float = 0.0  # seconds of untimed sleep before each ask (the sporadic row)

    @property
    def key(self) -> str:
        """The mode as the suite reads it: `sporadic` for RTT with a gap."""
        return "sporadic" if self.gap else self.mode

    @property
    def label(self) -> str:
        what = {"oneway": "one-way", "rtt": "RTT p50"}.get(self.mode, f"{self.inflight} in flight")
        apart = f", {self.gap * 1e3:g} ms apart" if self.gap else ""
        return f"{what} {human(self.size)} × {self.buffers}{apart}"

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


def lengths(size: int, buffers: int) -> list[int]:
    """`size` bytes over `buffers` arrays, the last taking the rest (as ptr1-bench's)."""
    each = size // buffers
    return [each] * (buffers - 1) + [size - each * (buffers - 1)]


def payload(size: int, buffers: int) -> list[np.ndarray]:
    return [np.full(n, 0xA5 ^ (i & 0xFF), np.uint8) for i, n in enumerate(lengths(size, buffers))]


def expect(got: int, want: int, what: str) -> None:
    if got != want:
        raise RuntimeError(f"{what}: {got} bytes came back, {want} were sent")


# ---- timing --------------------------------------------------------------------------------


def sequential(case: Case, seconds: float, one: Callable[[], None]) -> float:
    """Runs `one` back to back (a warm-up first), or each after an untimed sleep of `case.gap`
    (the sleeps count towards `seconds`, as ptr1-bench's `--gap`); the case's figure."""
    min_ops = 100 if case.mode == "rtt" and case.size <= MiB else 3
    one()
    latencies: list[float] = []
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or len(latencies) < min_ops:
        if case.gap:
            time.sleep(case.gap)
        t = time.perf_counter()
        one()
        latencies.append(time.perf_counter() - t)
    if case.mode == "rtt":
        return statistics.median(latencies) * 1e6
    return len(latencies) * case.size / elapsed / 1e9


def windowed(
    case: Case, seconds: float, send: Callable[[], Any], wait: Callable[[Any], None]
) -> float:
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


# ---- CPU -----------------------------------------------------------------------------------

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system seconds) of a live process, from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: fields start after the last ')'.
    fields = text[text.rfind(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def cpu_seconds(own: int, trees: Iterable[int]) -> float:
    """User + system seconds so far of process `own` (all its threads), of every live process in
    the trees rooted at `trees` and of `own`'s children that exited and were waited for (10 ms
    ticks): the difference of two readings is what they burned in between."""
    roots = set(trees)
    table: dict[int, tuple[int, float]] = {}
    if roots:
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (found := _stat(int(entry))) is not None:
                table[int(entry)] = found
    elif (found := _stat(own)) is not None:
        table[own] = found
    members = set(roots) & set(table)
    grew = True
    while grew:  # add children until no process is left whose parent is a member
        more = {pid for pid, (parent, _) in table.items() if parent in members} - members
        members |= more
        grew = bool(more)
    members.add(own)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN) if own == os.getpid() else None
    exited = waited.ru_utime + waited.ru_stime if waited else 0.0
    return exited + sum(table[pid][1] for pid in members if pid in table)
