"""iceoryx2 as a peer: request-response of byte slices over its Python loan API, a server
process polling both services, in two variants that differ in what each message's bytes go
through:

- copied into the loan (one copy): the client loans a request slice and copies the buffers
  into it; the echo copies the request into a loaned response slice.
- written in place (zero-copy hand-off): the client loans a request slice and writes only one
  byte at the start of each buffer, as a producer would whose output lands straight in the
  loan; the sink reads the first and the last byte; the echo answers a loaned response slice of
  the same size written in place (its first and last byte), not a copy of the request.

The client polls for the response; the server polls, napping 1 ms per poll only after 100 ms
without a request (longer than a 256 MiB copy between two requests), so it does not take a
core from the other peers' measurements and no request in a cell waits for a nap.

    python iceoryx2_peer.py NAME copy|inplace   (the server; bench.py starts it)
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from cells import (
    ONE_COPY,
    ZERO_COPY,
    Case,
    die_with_parent,
    expect,
    lengths,
    sequential,
    windowed,
)


def offsets(case: Case) -> list[int]:
    """Where each buffer of the case starts in one slice."""
    at, found = 0, []
    for n in lengths(case.size, case.buffers):
        found.append(at)
        at += n
    return found


class Iceoryx2:
    module = "iceoryx2"
    language = "python"
    spins = True
    spins_through_gaps = True  # its server polls through gaps up to 100 ms without a nap
    ours = False

    def __init__(self, in_place: bool) -> None:
        import iceoryx2 as iox2  # ImportError: not installed

        self.in_place = in_place
        self.name = "iceoryx2 in place" if in_place else "iceoryx2"
        self.note = (
            "request-response over its Python loan API, "
            + (
                "written in place: one byte per buffer written into the loaned request, the echo "
                "answers a loaned response with its first and last byte written (no payload copy "
                "either way)"
                if in_place
                else "a slice loaned per request and the buffers copied into it, the echo copies "
                "the request into a loaned response"
            )
            + "; the client polls, the server polls (napping 1 ms per poll only after 100 ms "
            "without a request)"
        )
        self.iox2 = iox2
        self.restarted = False
        self.start()

    def start(self) -> None:
        """A new server process and this process's clients of its two services."""
        iox2 = self.iox2
        name = f"tensorwire-bench/{time.monotonic_ns()}"
        self.child = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                name,
                "inplace" if self.in_place else "copy",
            ],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
        )
        try:
            assert self.child.stdout is not None
            if self.child.stdout.readline().strip() != "ready":
                raise RuntimeError("the iceoryx2 server did not start")
            iox2.set_log_level_from_env_or(iox2.LogLevel.Error)
            self.node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
            self.clients = {
                kind: service(iox2, self.node, f"{name}/{kind}")
                .client_builder()
                .initial_max_slice_len(4096)
                .allocation_strategy(iox2.AllocationStrategy.PowerOfTwo)
                .create()
                for kind in ("sink", "echo")
            }
            for client in self.clients.values():
                handshake(client)
        except BaseException:
            self.child.kill()  # its server loop never ends by itself
            raise

    def transfer(self, case: Case) -> str:
        return ZERO_COPY if self.in_place else ONE_COPY

    def pids(self) -> list[int]:
        return [self.child.pid]

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        """The cell; a request left unanswered (the in-place server hung so three times in 4 KiB
        one-way cells, once in CI on 2026-12-07; cause not found) restarts the server and
        measures the cell again, once per run, saying so; a second hang fails the peer."""
        try:
            return self.measure_once(case, data, seconds)
        except NoResponse as hang:  # not the cell's own timeout (a TimeoutError): that ends it
            if self.restarted:
                raise
            self.restarted = True
            print(
                f"{self.name}: {case.label}: {hang}; its server restarted, the cell measured "
                "again (once per run; its CPU figure includes the wait)",
                file=sys.stderr,
            )
            self.close()
            self.start()
            return self.measure_once(case, data, seconds)

    def measure_once(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        kind = "sink" if case.mode == "oneway" else "echo"
        client = self.clients[kind]
        starts = offsets(case)

        def send() -> Any:
            request = client.loan_slice_uninit(case.size)
            target = np.asarray(request.payload().as_memory_view())
            if self.in_place:
                target[starts] = 0xA5
            else:
                for at, array in zip(starts, data, strict=True):
                    target[at : at + array.size] = array
            return request.assume_init().send()

        def wait(pending: Any) -> None:
            got = np.asarray(response_to(pending).payload().as_memory_view())
            n = int.from_bytes(got.tobytes(), "little") if kind == "sink" else got.size
            expect(n, case.size, kind)

        if case.mode == "inflight":
            return windowed(case, seconds, send, wait)
        return sequential(case, seconds, lambda: wait(send()))

    def close(self) -> None:
        self.clients.clear()
        self.child.kill()
        self.child.wait(timeout=30)
        if self.child.stdout is not None:
            self.child.stdout.close()


class NoResponse(Exception):
    """A request the iceoryx2 server left unanswered for RESPONSE_TIMEOUT."""


#: How long a request may go unanswered before the cell fails (the suite's cell timeout is
#: 300 s; a 256 MiB echo takes tens of milliseconds).
RESPONSE_TIMEOUT = 30.0


def response_to(pending: Any) -> Any:
    """Polls for the response to `pending`; a request that reached no server, a server that
    went away, or no answer within RESPONSE_TIMEOUT raises instead of spinning until the cell's
    timeout (the in-place peer hung so twice in 4 KiB one-way cells, cause not found)."""
    if pending.number_of_server_connections == 0:
        raise RuntimeError("the iceoryx2 request reached no server")
    until = time.monotonic() + RESPONSE_TIMEOUT
    while True:
        for _ in range(4096):  # the hot poll stays as bare as a `while receive() is None` loop
            if (response := pending.receive()) is not None:
                return response
        if not pending.is_connected:
            # A server that answered and then let go of the request reads as disconnected: its
            # response may have come between the last look and this check.
            if (response := pending.receive()) is not None:
                return response
            raise RuntimeError("the iceoryx2 server disconnected before it answered")
        if time.monotonic() > until:
            raise NoResponse(
                f"no iceoryx2 response within {RESPONSE_TIMEOUT:.0f} s "
                f"({pending.number_of_server_connections} server connection(s))"
            )


def handshake(client: Any, within: float = 10.0) -> None:
    """One request of one byte answered on `client`'s service before any is timed: a client
    whose server has not seen it yet is retried for up to `within` seconds."""
    until = time.monotonic() + within
    while True:
        request = client.loan_slice_uninit(1)
        np.asarray(request.payload().as_memory_view())[:] = 0
        pending = request.assume_init().send()
        if pending.number_of_server_connections > 0:
            response_to(pending)
            return
        del pending
        if time.monotonic() > until:
            raise RuntimeError(f"the iceoryx2 server did not connect within {within:.0f} s")
        time.sleep(1e-3)


def service(iox2: Any, node: Any, name: str) -> Any:
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


def serve(name: str, in_place: bool) -> None:
    """The sink (answers the byte count, 8 bytes little-endian) and the echo, polled in turn."""
    import iceoryx2 as iox2

    iox2.set_log_level_from_env_or(iox2.LogLevel.Error)
    node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
    servers = [
        (
            kind,
            service(iox2, node, f"{name}/{kind}")
            .server_builder()
            .initial_max_slice_len(8 if kind == "sink" else 4096)
            .allocation_strategy(iox2.AllocationStrategy.PowerOfTwo)
            .create(),
        )
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
                if in_place and body.size:
                    _ = int(body[0]) + int(body[body.size - 1])  # a handler that looks at it
                response = request.loan_slice_uninit(8)
                np.asarray(response.payload().as_memory_view())[:] = np.frombuffer(
                    body.size.to_bytes(8, "little"), np.uint8
                )
            else:
                response = request.loan_slice_uninit(body.size)
                answer = np.asarray(response.payload().as_memory_view())
                if in_place:
                    if body.size:
                        answer[0] = answer[body.size - 1] = 0x5A
                else:
                    np.copyto(answer, body)
            response.assume_init().send()
            del body, request
        if served:
            idle_since = time.perf_counter()
        elif time.perf_counter() - idle_since > 0.1:
            time.sleep(1e-3)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in ("copy", "inplace"):
        raise SystemExit(__doc__)
    serve(sys.argv[1], sys.argv[2] == "inplace")
