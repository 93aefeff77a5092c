"""Ray as a peer of bench.py: an actor asked with arrays as arguments (through the object store
per call), or with refs of arrays put into the store once per cell ("Ray (in store)")."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
from cells import KERNEL, ONE_COPY, ZERO_COPY, Case, KiB, expect, sequential, windowed
from peers import Peer

# Ray passes arguments and return values below 100 KiB inline, inside its gRPC messages
# (`max_direct_call_object_size`); larger ones go through its shared-memory object store.
RAY_INLINE_BYTES = 100 * KiB


class RaySession:
    """One Ray cluster for the whole run, shared by both Ray peers (a fresh-process run starts
    new actors per cell, not a new cluster: a cluster takes seconds to start)."""

    ray: Any = None

    @classmethod
    def get(cls) -> Any:
        if cls.ray is None:
            import ray

            # Ray waits 30 s for its GCS to write its port; on a loaded 2-core machine it took
            # longer twice in a row (CI, 2026-12-07: "Timed out waiting for file
            # .../gcs_server_port"), so it gets 120 s (Ray's own default with a rocksdb GCS) and
            # three tries. A variable the caller set wins.
            os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
            for attempt in (1, 2, 3):
                try:
                    # 2 GiB holds the largest in-flight case (2 × 256 MiB each way); Ray spills
                    # beyond it.
                    ray.init(
                        num_cpus=2,
                        include_dashboard=False,
                        log_to_driver=False,
                        logging_level="ERROR",
                        object_store_memory=2 * (1 << 30),
                    )
                    break
                except Exception as e:  # on a loaded machine its start can time out: once more
                    ray.shutdown()
                    if attempt == 3:
                        raise
                    print(f"Ray did not start ({e}); trying again", file=sys.stderr)
            cls.ray = ray
        return cls.ray

    @classmethod
    def shutdown(cls) -> None:
        if cls.ray is not None:
            cls.ray.shutdown()
            cls.ray = None

    @classmethod
    def raylet_pids(cls) -> list[int]:
        """The raylets (which hold the object store) among this process's children."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if (entry / "comm").read_text().strip() == "raylet":
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found


class Ray(Peer):
    """An actor with `sink(*arrays)` and `echo(*arrays)`. As arguments, arrays are put into
    Ray's object store per call (one copy; below 100 KiB inline in gRPC); "in store", they were
    put there once per cell and each call passes their object refs: the sink reads them from the
    store where they are, the echo hands the refs back and the driver reads them (no copy)."""

    module = "ray"

    def __init__(self, in_store: bool) -> None:
        ray = RaySession.get()
        self.in_store = in_store
        self.name = "Ray (in store)" if in_store else "Ray"
        self.note = (
            "an actor; arrays put into the object store once per cell, their refs passed: the sink "
            "reads them in the store, the echo returns the refs and the driver gets them"
            if in_store
            else "an actor; arrays as arguments, through the object store per call"
        )

        @ray.remote
        class Actor:
            def sink(self, *arrays: np.ndarray) -> int:
                return sum(a.nbytes for a in arrays)

            def echo(self, *arrays: np.ndarray) -> list[np.ndarray]:
                return list(arrays)

            def echo_refs(self, refs: list[Any]) -> list[Any]:
                return refs

            def pid(self) -> int:
                import os

                return os.getpid()

        self.ray = ray
        self.actor = Actor.remote()  # type: ignore[attr-defined]
        self.actor_pid = ray.get(self.actor.pid.remote())

    def transfer(self, case: Case) -> str:
        if self.in_store:
            return ZERO_COPY
        return KERNEL if case.size // case.buffers < RAY_INLINE_BYTES else ONE_COPY

    def pids(self) -> list[int]:
        return [self.actor_pid, *RaySession.raylet_pids()]

    def measure(self, case: Case, data: list[np.ndarray], seconds: float) -> float:
        ray, actor = self.ray, self.actor
        if self.in_store:
            refs = [ray.put(a) for a in data]
            if case.mode == "oneway":
                return sequential(
                    case,
                    seconds,
                    lambda: expect(ray.get(actor.sink.remote(*refs)), case.size, "sink"),
                )

            def wait_refs(ref: Any) -> None:
                expect(sum(a.nbytes for a in ray.get(ray.get(ref))), case.size, "echo")

            if case.mode == "rtt":
                return sequential(case, seconds, lambda: wait_refs(actor.echo_refs.remote(refs)))
            return windowed(case, seconds, lambda: actor.echo_refs.remote(refs), wait_refs)
        if case.mode == "oneway":
            return sequential(
                case, seconds, lambda: expect(ray.get(actor.sink.remote(*data)), case.size, "sink")
            )

        def wait(ref: Any) -> None:
            expect(sum(a.nbytes for a in ray.get(ref)), case.size, "echo")

        if case.mode == "rtt":
            return sequential(case, seconds, lambda: wait(actor.echo.remote(*data)))
        return windowed(case, seconds, lambda: actor.echo.remote(*data), wait)

    def close(self) -> None:
        self.ray.kill(self.actor)
