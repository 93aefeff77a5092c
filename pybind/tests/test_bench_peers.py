"""The peers' driver `ptr1-bench suite` reads (pybind/bench/bench.py --json): every case it is
asked for yields a sample per peer, or says why the peer cannot run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "pybind" / "bench" / "bench.py"
PTR1_BENCH = ROOT / "target" / "release" / "ptr1-bench"


@pytest.mark.skipif(
    not PTR1_BENCH.exists(),
    reason=f"{PTR1_BENCH} is not built (cargo build --release -p ptr1-bench; scripts/test-all builds it)",
)
def test_the_driver_measures_every_case_or_says_why_not() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--json", "--reps", "1", "--seconds", "0.02",
         "--sizes", "4KiB,64KiB", "--buffers", "1,16", "--skip", "rust,zmq,grpc,ray,iceoryx2"],
        capture_output=True, text=True, timeout=300, check=True,
    )
    records = [json.loads(line) for line in out.stdout.splitlines()]
    samples = [r for r in records if r["kind"] == "sample"]
    cells = {(r["peer"], r["mode"], r["size"], r["buffers"]) for r in samples}
    for peer in ("tensorwire (Python)", "tensorwire shm (Python)"):
        for mode in ("oneway", "rtt", "inflight"):
            for size in (4096, 65536):
                for buffers in (1, 16):
                    assert (peer, mode, size, buffers) in cells
    assert all(r["value"] > 0 for r in samples)
    assert ("multiprocessing.shared_memory", "rtt", 65536, 16) in cells
    refused = [r for r in records if r["kind"] == "not_applicable"]
    assert {(r["peer"], r["mode"]) for r in refused} == {("multiprocessing.shared_memory", "inflight")}
    versions = {r["name"] for r in records if r["kind"] == "version"}
    assert {"python", "numpy", "tensorwire"} <= versions
