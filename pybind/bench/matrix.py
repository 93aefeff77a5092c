"""The matrix of cells run over the chosen peers for `bench.py`: warm (peers made once), fresh
(a peer made per cell) or steered by the suite one case at a time; every record emitted as a
JSON line with --json."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from cells import Case, NotApplicable, cpu_seconds, payload


def close(peer: Any) -> None:
    try:
        peer.close()
    except Exception as e:  # closing a broken peer must not hide the results
        print(f"{peer.name}: close failed: {e}", file=sys.stderr)


class Run:
    """One run of the matrix over the peers: warm (peers made once) or fresh (a peer made per
    cell); emits every record as a JSON line with --json."""

    def __init__(self, args: argparse.Namespace, cases: list[Case], fixture: Path) -> None:
        self.args, self.cases, self.fixture_path = args, cases, fixture
        self.results: dict[Case, dict[str, list[float]]] = {c: {} for c in cases}
        self.unavailable: set[str] = set()
        self.failed: set[str] = set()
        self.described: set[str] = set()
        self.not_applicable: dict[tuple[Case, str], str] = {}
        self.spent: dict[str, float] = {}  # seconds each peer took, set-up excluded
        self.fixture: Any = None
        self.spinning: Any = None
        self.probes = True  # until the fixture's binary cannot probe, or probes keep timing out
        self.probe_timeouts = 0  # in a row
        self.last_spun = False  # the last cell's peer polls on after its last request

    def emit(self, record: dict[str, Any]) -> None:
        if self.args.json:
            print(json.dumps(record), flush=True)

    def shared_fixture(self) -> Any:
        from peers import Fixture

        if self.fixture is None:
            self.fixture = Fixture(self.fixture_path)
        return self.fixture

    def spinning_fixture(self) -> Any:
        from peers import Fixture, spinning_flags

        if self.spinning is None:
            self.spinning = Fixture(self.fixture_path, spinning_flags(self.args.sporadic_gap))
        return self.spinning

    def make(self, name: str, make: Callable[[], Any]) -> Any:
        """The peer, or None (reported once) when it cannot be made here."""
        try:
            peer = make()
        except ImportError as e:
            reason = f"not installed ({e})"
        except Exception as e:  # a peer that cannot start is reported, not faked
            reason = f"{type(e).__name__}: {e}"
        else:
            try:
                self.describe(name, peer)
            except BaseException:
                close(peer)
                raise
            return peer
        if name not in self.unavailable:
            self.unavailable.add(name)
            self.emit({"kind": "unavailable", "peer": name, "reason": reason})
            print(f"{name}: not measured: {reason}", file=sys.stderr)
        return None

    def describe(self, name: str, peer: Any) -> None:
        """Says once what the peer is and how it is driven."""
        if name in self.described:
            return
        self.described.add(name)
        self.emit(
            {
                "kind": "peer",
                "peer": name,
                "language": peer.language,
                "spins": peer.spins,
                "spins_through_gaps": peer.spins_through_gaps,
                "ours": peer.ours,
            }
        )
        if peer.note:
            self.emit({"kind": "note", "peer": name, "text": peer.note})

    def cpu_pair(self) -> float | None:
        """How fast the host's two CPUs pass memory right now (`ptr1-bench cpu-pair`: the
        median 4 KiB round trip between two threads, µs), as the suite probes before its own
        cells: the hypervisor moves the vCPUs between placements 3-4x apart, and every
        same-host figure moves with them. Taken while no peer of this driver runs a cell,
        and 150 ms after a peer that polls through gaps (iceoryx2's server polls for 100 ms
        after its last request). None when it cannot be taken: the process may use fewer than
        two CPUs, the fixture's binary cannot probe, or probes timed out (10 s) twice in a row
        — then probing stops, with one `probe_note` record saying why."""
        if not self.probes:
            return None
        if self.last_spun:
            time.sleep(0.15)
            self.last_spun = False
        why = None
        if len(os.sched_getaffinity(0)) < 2:
            why = "this process may use one CPU: no pair to probe"
        else:
            try:
                out = subprocess.run(
                    [str(self.fixture_path), "cpu-pair"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=True,
                ).stdout
                self.probe_timeouts = 0
                return float(out.strip())
            except subprocess.TimeoutExpired:
                self.probe_timeouts += 1
                if self.probe_timeouts < 2:
                    return None
                why = "two probes in a row took over 10 s"
            except (OSError, subprocess.SubprocessError, ValueError) as e:
                why = f"{self.fixture_path} cpu-pair failed: {e}"
        self.probes = False
        self.emit({"kind": "probe_note", "text": f"no more CPU-pair probes: {why}"})
        return None

    def cell(
        self, peer: Any, case: Case, data: list[np.ndarray], rep: int, probe: float | None
    ) -> None:
        """Measures one cell, with the CPU it burned; `probe` is the host's CPU pair taken
        before it (`cpu_pair`). A failure leaves the peer out from here on."""
        began = time.perf_counter()
        cpu_before = cpu_seconds(os.getpid(), peer.pids())
        signal.setitimer(signal.ITIMER_REAL, self.args.cell_timeout)  # a wedged peer fails
        try:
            value = peer.measure(case, data, self.args.seconds)
        except NotApplicable as why:
            self.not_applicable[(case, peer.name)] = str(why)
            return
        except Exception as e:  # one peer failing leaves the others measured
            reason = f"{case.label}: {type(e).__name__}: {e}"
            self.emit({"kind": "failed", "peer": peer.name, "reason": reason})
            print(f"{peer.name} failed, left out from here on: {reason}", file=sys.stderr)
            self.failed.add(peer.name)
            return
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.last_spun = bool(peer.spins_through_gaps)
            took = time.perf_counter() - began
            self.spent[peer.name] = self.spent.get(peer.name, 0.0) + took
        cpu = cpu_seconds(os.getpid(), peer.pids()) - cpu_before
        self.results[case].setdefault(peer.name, []).append(value)
        self.emit(
            {
                "kind": "sample",
                "peer": peer.name,
                "mode": case.key,
                "size": case.size,
                "buffers": case.buffers,
                "inflight": case.inflight,
                "rep": rep,
                "value": value,
                "transfer": peer.transfer(case),
                "cpu_s": cpu,
                "seconds": took,
                "cpu_pair_us": probe,
            }
        )

    def warm(self, chosen: list[tuple[str, Callable[[], Any]]]) -> None:
        peers = self.make_all(chosen)
        try:
            for rep in range(self.args.reps):
                for c, case in enumerate(self.cases):
                    if not self.warm_case(peers, rep, c, case):
                        break
                self.progress(rep)
        finally:
            for peer in peers:
                close(peer)

    def make_all(self, chosen: list[tuple[str, Callable[[], Any]]]) -> list[Any]:
        """Every chosen peer that can be made here (warm: once for the whole run)."""
        peers: list[Any] = []
        try:
            for name, make in chosen:
                if (peer := self.make(name, make)) is not None:
                    peers.append(peer)
        except BaseException:
            for peer in peers:
                close(peer)
            raise
        return peers

    def warm_case(self, peers: list[Any], rep: int, c: int, case: Case) -> bool:
        """One case on every warm peer, the order rotated by repetition and case; False once
        no peer is left."""
        for peer in [p for p in peers if p.name in self.failed]:
            peers.remove(peer)
            close(peer)
        if not peers:
            return False
        data = payload(case.size, case.buffers)
        turn = (rep + c) % len(peers)
        # One probe for the case's cells (seconds apart; the host's placement moves within
        # minutes), taken before any of them runs.
        probe = self.cpu_pair()
        for peer in peers[turn:] + peers[:turn]:  # rotate the order
            self.cell(peer, case, data, rep, probe)
        return True

    def fresh(self, chosen: list[tuple[str, Callable[[], Any]]]) -> None:
        for rep in range(self.args.reps):
            for c, case in enumerate(self.cases):
                self.fresh_case(chosen, rep, c, case)
            self.progress(rep)

    def fresh_case(
        self, chosen: list[tuple[str, Callable[[], Any]]], rep: int, c: int, case: Case
    ) -> None:
        """One case on every chosen peer, each made for the cell and closed after it."""
        from peers import SPINNING_ONLY, SpinningTensorwire

        if not chosen:
            return
        data = payload(case.size, case.buffers)
        turn = (rep + c) % len(chosen)
        for name, make in chosen[turn:] + chosen[:turn]:
            if name in self.unavailable or name in self.failed:
                continue
            if not SpinningTensorwire.measures(name, case):
                # Measured on the sporadic row only: no processes for the others.
                self.not_applicable[(case, name)] = SPINNING_ONLY
                continue
            # Probed before the peer is made: a new server may spin at first (iceoryx2's).
            probe = self.cpu_pair()
            if (peer := self.make(name, make)) is None:
                continue
            try:
                self.cell(peer, case, data, rep, probe)
            finally:
                close(peer)

    def steered(self, chosen: list[tuple[str, Callable[[], Any]]], asks: TextIO) -> None:
        """Cells one at a time as the suite asks for them on stdin (`--steer`), so its Rust
        columns and these peers are measured seconds apart, case by case: one JSON line per
        cell ({"rep": R, "mode": M, "size": S, "buffers": B}, a case of the matrix), answered
        by the cell's records and {"kind": "cell_done"}; end of input ends the run. Warm peers
        are made first, then {"kind": "ready"} says so."""
        peers = [] if self.args.fresh else self.make_all(chosen)
        by_key = {(case.key, case.size, case.buffers): c for c, case in enumerate(self.cases)}
        self.emit({"kind": "ready"})
        try:
            for line in asks:
                if not line.strip():
                    continue
                asked = json.loads(line)
                rep = int(asked["rep"])
                c = by_key.get((asked["mode"], int(asked["size"]), int(asked["buffers"])))
                if c is None:
                    raise SystemExit(f"--steer: {line.strip()} is not a case of this matrix")
                if self.args.fresh:
                    self.fresh_case(chosen, rep, c, self.cases[c])
                else:
                    self.warm_case(peers, rep, c, self.cases[c])
                self.emit({"kind": "cell_done"})
        finally:
            for peer in peers:
                close(peer)

    def progress(self, rep: int) -> None:
        took = ", ".join(f"{name} {t:.1f} s" for name, t in self.spent.items())
        print(f"peers: rep {rep + 1}/{self.args.reps} done ({took})", file=sys.stderr)

    def finish(self) -> None:
        """Says which cells each peer could not run, then closes Ray and the fixtures (every
        one of them, whichever close fails)."""
        from ray_peer import RaySession

        with contextlib.ExitStack() as closing:
            for fixture in (self.fixture, self.spinning):
                if fixture is not None:
                    closing.callback(fixture.close)
            closing.callback(RaySession.shutdown)
            for (case, name), why in self.not_applicable.items():
                self.emit(
                    {
                        "kind": "not_applicable",
                        "peer": name,
                        "mode": case.key,
                        "size": case.size,
                        "buffers": case.buffers,
                        "reason": why,
                    }
                )
