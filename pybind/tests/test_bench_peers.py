"""The peers' driver `ptr1-bench suite` reads (pybind/bench/bench.py --json): every case it is
asked for yields a sample per peer, or says why the peer cannot run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "pybind" / "bench" / "bench.py"
PTR1_BENCH = ROOT / "target" / "release" / "ptr1-bench"


def drive(*args: str, timeout: int = 300) -> list[dict[str, Any]]:
    """The records of one `bench.py --json` run with `args`."""
    out = subprocess.run(
        [sys.executable, str(BENCH), "--json", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.skipif(
    not PTR1_BENCH.exists(),
    reason=f"{PTR1_BENCH} is not built (cargo build --release -p ptr1-bench; "
    "scripts/test-all builds it)",
)
def test_the_driver_measures_every_case_or_says_why_not() -> None:
    records = drive(
        "--reps",
        "1",
        "--seconds",
        "0.02",
        "--sizes",
        "4KiB,64KiB",
        "--buffers",
        "1,16",
        "--modes",
        "oneway,rtt,sporadic,inflight",
        "--sporadic-gap",
        "0.002",
        "--skip",
        "rust,zmq,grpc,ray,iceoryx2,mpi",
    )
    samples = [r for r in records if r["kind"] == "sample"]
    cells = {(r["peer"], r["mode"], r["size"], r["buffers"]) for r in samples}
    for peer in (
        "tensorwire (Python)",
        "tensorwire shm (Python)",
        "tensorwire shm loaned (Python)",
    ):
        for mode in ("oneway", "rtt", "inflight"):
            for size in (4096, 65536):
                for buffers in (1, 16):
                    assert (peer, mode, size, buffers) in cells
        # The sporadic row: the smallest size, one buffer, and nothing else.
        assert [c for c in cells if c[0] == peer and c[1] == "sporadic"] == [
            (peer, "sporadic", 4096, 1)
        ]
    assert ("multiprocessing.shared_memory", "sporadic", 4096, 1) in cells
    # Against the fixture that spins through the gaps: that row only.
    spinning = ("tensorwire spinning (Python)", "tensorwire shm spinning (Python)")
    assert {c for c in cells if c[0] in spinning} == {
        (peer, "sporadic", 4096, 1) for peer in spinning
    }
    assert all(r["value"] > 0 for r in samples)
    assert all(r["cpu_s"] >= 0 and r["seconds"] > 0 for r in samples)
    kinds = {(r["peer"], r["size"]): r["transfer"] for r in samples}
    # Shared memory carries 4 KiB inside a record of its queue, copied in and out, loaned or
    # not; 64 KiB in slots.
    assert kinds[("tensorwire shm (Python)", 4096)] == "one_copy"
    assert kinds[("tensorwire shm loaned (Python)", 4096)] == "one_copy"
    assert kinds[("tensorwire shm (Python)", 65536)] == "one_copy"
    assert kinds[("tensorwire shm loaned (Python)", 65536)] == "zero_copy"
    assert kinds[("multiprocessing.shared_memory", 65536)] == "one_copy"
    described = {r["peer"]: r for r in records if r["kind"] == "peer"}
    assert (
        described["tensorwire (Python)"]["ours"]
        and not described["multiprocessing.shared_memory"]["ours"]
    )
    # The suite divides ours that spin through gaps only by peers that do too.
    assert all(described[peer]["spins_through_gaps"] for peer in spinning)
    assert not described["tensorwire (Python)"]["spins_through_gaps"]
    for mode in ("rtt", "inflight"):
        assert ("tensorwire into (Python)", mode, 65536, 16) in cells
    assert ("multiprocessing.shared_memory", "rtt", 65536, 16) in cells
    refused = [r for r in records if r["kind"] == "not_applicable"]
    assert {(r["peer"], r["mode"]) for r in refused} == {
        ("multiprocessing.shared_memory", "inflight"),
        ("tensorwire into (Python)", "oneway"),
    } | {(peer, mode) for peer in spinning for mode in ("oneway", "rtt", "inflight")}
    versions = {r["name"] for r in records if r["kind"] == "version"}
    assert {"python", "numpy", "tensorwire"} <= versions


def test_the_mpi_peers_measure_one_host_and_tcp_in_fresh_processes() -> None:
    """MPI (mpi4py over Open MPI, `mpirun -n 2`, and the same ranks in C built with mpicc) on
    one host and over TCP, each cell in a new mpirun. scripts/install-deps and
    scripts/python-env install them; a machine without them fails here under
    TENSORWIRE_REQUIRE_PEERS=1 and skips, saying why, otherwise."""
    import os
    import shutil

    try:
        import mpi4py  # noqa: F401
    except ImportError as e:
        missing = f"mpi4py is not installed ({e}; scripts/python-env installs it)"
    else:
        missing = (
            ""
            if shutil.which("mpirun") and shutil.which("mpicc")
            else "no mpirun or mpicc (scripts/install-deps installs openmpi-bin, libopenmpi-dev)"
        )
    if missing:
        if os.environ.get("TENSORWIRE_REQUIRE_PEERS") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    records = drive(
        "--fresh",
        "--reps",
        "1",
        "--seconds",
        "0.05",
        "--sizes",
        "4KiB,64KiB",
        "--buffers",
        "1,16",
        "--only",
        "mpi",  # the family: mpi4py's ranks and the C ones, one host and over TCP
        timeout=900,
    )
    assert not [r for r in records if r["kind"] in ("unavailable", "failed")], records
    samples = [r for r in records if r["kind"] == "sample"]
    cells = {(r["peer"], r["mode"], r["size"], r["buffers"]): r for r in samples}
    peers = {
        "MPI one host": ("one_copy", "python"),
        "MPI over TCP": ("kernel", "python"),
        "MPI one host (C)": ("one_copy", "c"),
        "MPI over TCP (C)": ("kernel", "c"),
    }
    described = {r["peer"]: r for r in records if r["kind"] == "peer"}
    for peer, (transfer, language) in peers.items():
        for mode in ("oneway", "rtt", "inflight"):
            for size in (4096, 65536):
                for buffers in (1, 16):
                    cell = cells[(peer, mode, size, buffers)]
                    assert cell["value"] > 0 and cell["transfer"] == transfer
        assert described[peer]["language"] == language
        assert described[peer]["spins"] and not described[peer]["ours"]


@pytest.mark.skipif(not PTR1_BENCH.exists(), reason=f"{PTR1_BENCH} is not built")
def test_fresh_the_spinning_peers_start_processes_for_the_sporadic_row_only() -> None:
    records = drive(
        "--fresh",
        "--reps",
        "1",
        "--seconds",
        "0.02",
        "--sizes",
        "4KiB",
        "--modes",
        "rtt,sporadic",
        "--sporadic-gap",
        "0.002",
        "--only",
        "twspin,twshmspin",
    )
    spinning = {"tensorwire spinning (Python)", "tensorwire shm spinning (Python)"}
    samples = {(r["peer"], r["mode"]) for r in records if r["kind"] == "sample"}
    assert samples == {(peer, "sporadic") for peer in spinning}
    refused = {(r["peer"], r["mode"]) for r in records if r["kind"] == "not_applicable"}
    assert refused == {(peer, "rtt") for peer in spinning}


def steer(peers: str, asked: list[tuple[str, int, int, int]], *more: str) -> list[list[Any]]:
    """Drives `bench.py --steer --only peers` as the suite does: waits for `ready`, asks for
    each (mode, size, buffers, rep) in turn, and returns each cell's samples as (peer, mode,
    size, buffers, rep, value, cpu_pair_us); then ends its input and checks it exits cleanly."""
    args = [sys.executable, str(BENCH), "--json", "--steer", "--reps", "1", "--seconds", "0.02"]
    args += ["--sizes", "4KiB,64KiB", "--buffers", "1,16", "--only", peers, *more]
    cells = []
    with subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdin is not None and child.stdout is not None
        out = child.stdout

        def until(kind: str) -> list[dict[str, Any]]:
            records = []
            for line in out:
                record = json.loads(line)
                if record["kind"] == kind:
                    return records
                records.append(record)
            raise AssertionError(f"the driver ended before {kind!r}: {records}")

        try:
            until("ready")
            for mode, size, buffers, rep in asked:
                line = {"rep": rep, "mode": mode, "size": size, "buffers": buffers}
                child.stdin.write(json.dumps(line) + "\n")
                child.stdin.flush()
                samples = [r for r in until("cell_done") if r["kind"] == "sample"]
                fields = ("peer", "mode", "size", "buffers", "rep", "value", "cpu_pair_us")
                cells.append([tuple(r[k] for k in fields) for r in samples])
            child.stdin.close()
            assert child.wait(timeout=120) == 0
        finally:
            child.kill()
    return cells


ASKED = [("rtt", 65536, 16, 0), ("oneway", 4096, 1, 0), ("rtt", 65536, 16, 1)]


@pytest.mark.timeout(300)
@pytest.mark.skipif(not PTR1_BENCH.exists(), reason=f"{PTR1_BENCH} is not built")
@pytest.mark.parametrize("fresh", [False, True], ids=["warm", "fresh"])
def test_steered_the_driver_measures_each_cell_it_is_asked_for_when_asked(fresh: bool) -> None:
    """`--steer` (how `ptr1-bench suite` measures MPI's C peers case by case beside its Rust
    columns): ready once its peers are made, then one cell per line, each answered by that
    cell's samples and `cell_done`; end of input ends it, cleanly."""
    cells = steer("tw", ASKED, *(["--fresh"] if fresh else []))
    for (mode, size, buffers, rep), samples in zip(ASKED, cells, strict=True):
        assert [s[:5] for s in samples] == [("tensorwire (Python)", mode, size, buffers, rep)]
        assert samples[0][5] > 0
        # The host's CPU pair, probed before the cell by the fixture's binary (`cpu-pair`).
        assert isinstance(samples[0][6], float) and samples[0][6] > 0, samples[0]


@pytest.mark.timeout(600)
@pytest.mark.skipif(not PTR1_BENCH.exists(), reason=f"{PTR1_BENCH} is not built")
def test_steered_mpi_ranks_in_c_answer_cell_after_cell() -> None:
    """The peers the suite steers: mpirun inherits no stdin from the driver (it forwards its
    stdin to rank 0, and took the second cell's line before)."""
    import os
    import shutil

    if not (shutil.which("mpirun") and shutil.which("mpicc")):
        missing = "no mpirun or mpicc (scripts/install-deps installs openmpi-bin, libopenmpi-dev)"
        if os.environ.get("TENSORWIRE_REQUIRE_PEERS") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    cells = steer("mpic", ASKED)
    for (mode, size, buffers, rep), samples in zip(ASKED, cells, strict=True):
        assert [s[:5] for s in samples] == [("MPI one host (C)", mode, size, buffers, rep)]
        assert samples[0][5] > 0


@pytest.mark.skipif(not PTR1_BENCH.exists(), reason=f"{PTR1_BENCH} is not built")
def test_steered_a_case_outside_the_matrix_is_refused_not_guessed() -> None:
    asked = json.dumps({"rep": 0, "mode": "rtt", "size": 12345, "buffers": 1})
    out = subprocess.run(
        [sys.executable, str(BENCH), "--json", "--steer", "--sizes", "4KiB", "--only", "tw"],
        input=asked + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "is not a case of this matrix" in out.stderr
    assert not [line for line in out.stdout.splitlines() if '"sample"' in line]
