"""Two processes: the examples over every path, Ctrl+C during a blocking ask."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "python"


@pytest.mark.parametrize("transport", ["raw", "shm", "http2", "auto"])
def test_a_producer_process_streams_dicts_of_tensors_to_a_consumer(transport: str) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "two_process.py"),
            "--steps",
            "10",
            "--transport",
            transport,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "10 dicts" in out.stdout
    expected_path = "shm" if transport == "auto" else transport
    assert f"over {expected_path}:" in out.stdout, out.stdout
    assert "bias[1024],mask[64, 64],weights[256, 1024]" in out.stdout


@pytest.mark.parametrize("transport", ["raw", "http2"])
def test_the_seed_example_runs(transport: str) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "tensor_message_fast_path.py"), "--transport", transport],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"ack 1048576 floats, sum 549755289600.0 over {transport}")


ASKER = """
import signal, sys, time, tensorwire as tw
# A shell that starts the test run in the background hands SIGINT down ignored; Ctrl+C is what
# is tested here, so the child takes Python's own handler back.
signal.signal(signal.SIGINT, signal.default_int_handler)
with tw.Node() as server, tw.Node() as client:
    server.serve("slow", lambda m: time.sleep(5))
    ref = client.ref(server.address, "slow", transport="raw")
    print("asking", flush=True)
    start = time.monotonic()
    try:
        ref.ask(tw.TensorMessage(b"", []), timeout=60)
    except KeyboardInterrupt:
        print(f"interrupted after {time.monotonic() - start:.2f}", flush=True)
        sys.exit(0)
    print("not interrupted", flush=True)
    sys.exit(1)
"""


def test_ctrl_c_interrupts_a_blocking_ask() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", ASKER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "asking"
    time.sleep(0.3)
    os.kill(child.pid, signal.SIGINT)
    start = time.monotonic()
    # The node's close waits for the sleeping handler up to its shutdown deadline.
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, (out, err)
    assert out.startswith("interrupted after"), out
    assert float(out.split()[2]) < 2.0
    assert time.monotonic() - start < 20
