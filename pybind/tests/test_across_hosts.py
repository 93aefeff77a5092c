"""Python nodes on two hosts of a network test bed (`netbed.py`): the route between them,
and asks that survive packet loss. Each node is its own process inside its host."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from netbed import NetBed

SERVER = """
import sys, tensorwire as tw
with tw.Node(bind=sys.argv[1]) as node:
    node.serve("echo", lambda m: m, threads=2)
    print(node.address, flush=True)
    sys.stdin.read()
"""

CLIENT = """
import json, sys, time
import numpy as np
import tensorwire as tw
from tensorwire import tensors
address, asks = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(7)
with tw.Node(bind=sys.argv[3]) as node:
    ref = node.ref(address, "echo")
    latencies, intact = [], 0
    for i in range(asks):
        size = int(4096 * 2 ** rng.integers(0, 12))
        sent = {f"t{j}": rng.integers(0, 255, size // 4, dtype=np.uint8) for j in range(4)}
        start = time.perf_counter()
        back = tensors.unpack(ref.ask(tensors.pack(sent), timeout=60))
        latencies.append(time.perf_counter() - start)
        intact += all(np.array_equal(back[k], v) for k, v in sent.items())
    route, reason = ref.route()
    latencies.sort()
    print(json.dumps({"route": route, "reason": reason, "intact": intact,
                      "p50_ms": 1e3 * latencies[len(latencies) // 2],
                      "max_ms": 1e3 * latencies[-1]}))
"""


@pytest.fixture
def bed() -> Iterator[NetBed]:
    with NetBed(2) as bed:
        yield bed


def ask_across(bed: NetBed, asks: int) -> dict[str, object]:
    server_host, client_host = bed.hosts
    with tempfile.TemporaryFile("w+") as server_err:
        server = server_host.popen(
            [sys.executable, "-c", SERVER, f"{server_host.ip}:0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=server_err,
        )
        try:
            assert server.stdout is not None
            ready, _, _ = select.select([server.stdout], [], [], 60)
            address = server.stdout.readline().strip() if ready else ""
            server_err.seek(0)
            assert address.startswith(server_host.ip), (address, server_err.read())
            client = subprocess.run(
                client_host.argv(
                    [sys.executable, "-c", CLIENT, address, str(asks), f"{client_host.ip}:0"]
                ),
                capture_output=True,
                text=True,
                timeout=240,
            )
            assert client.returncode == 0, client.stderr
            result: dict[str, object] = json.loads(client.stdout)
            return result
        finally:
            try:
                server.communicate(input="", timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def test_a_python_node_on_another_host_is_reached_over_ptr1_and_says_why(bed: NetBed) -> None:
    result = ask_across(bed, 20)
    assert result["intact"] == 20
    assert result["route"] == "raw", result
    assert "another host or network namespace" in str(result["reason"]), result


@pytest.mark.parametrize("per_mille", [1, 10])
def test_python_asks_survive_packet_loss(bed: NetBed, per_mille: int) -> None:
    bed.drop_randomly(1, per_mille)
    result = ask_across(bed, 200)
    print(f"Python at {per_mille}‰ loss: {result}")
    assert result["intact"] == 200, result
