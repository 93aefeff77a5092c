"""What the children of the fork tests run (a module of its own, so that the spawn and
forkserver start methods can import it)."""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np

import tensorwire as tw

#: The parent's node, inherited by children made by fork (set by the test before it forks).
INHERITED: dict[str, Any] = {}


def child(parent_address: str, results: Any) -> None:
    """Reports (as a dict on `results`) what the inherited node did, and what a node of the
    child's own did; a failure is reported too, so the test never waits for nothing."""
    try:
        _child(parent_address, results)
    except BaseException as e:
        results.put({"failed": f"{type(e).__name__}: {e}"})
        raise


def _child(parent_address: str, results: Any) -> None:
    report: dict[str, Any] = {}
    node = INHERITED.get("node")
    if node is not None:  # fork: the parent's node came along
        started = time.monotonic()
        calls = {
            "ask": lambda: INHERITED["ref"].ask(tw.TensorMessage(b"x", []), timeout=3),
            "tell": lambda: INHERITED["ref"].tell(tw.TensorMessage(b"x", []), timeout=3),
            "ref": lambda: node.ref(parent_address, "echo"),
            "endpoint": lambda: node.endpoint("more"),
            "recv": lambda: INHERITED["endpoint"].recv(timeout=3),
            "ask_nowait": lambda: INHERITED["ref"].ask_nowait(tw.TensorMessage(b"x", [])).result(3),
            "pending": lambda: INHERITED["pending"].result(timeout=3),
            "pending_cancel": lambda: INHERITED["pending"].cancel(),
            "stats": node.stats,
        }
        for name, call in calls.items():
            try:
                call()
                report[name] = "no error"
            except tw.ShutDown as e:
                report[name] = "ShutDown: fork" if "fork()" in str(e) else f"ShutDown: {e}"
            except Exception as e:  # noqa: BLE001 - reported to the test
                report[name] = f"{type(e).__name__}: {e}"
        node.close()  # a no-op on the parent's node: it returns at once
        report["inherited_seconds"] = time.monotonic() - started
    with tw.Node() as own:
        if node is not None:
            _inherited_shared_memory(report, own)
        own.serve("echo", lambda m: m)
        payload = np.arange(1 << 16, dtype=np.float32)
        here = own.ref(own.address, "echo").ask(tw.TensorMessage(b"", [payload]))
        report["own_in_process"] = bool(
            np.array_equal(np.frombuffer(here.buffers[0], np.float32), payload)
        )
        parent = own.ref(parent_address, "echo").ask(tw.TensorMessage(b"", [payload]))
        report["own_to_parent"] = bool(
            np.array_equal(np.frombuffer(parent.buffers[0], np.float32), payload)
        )
        report["own_route_to_parent"] = parent.route
        never = own.endpoint("never")  # kept: nobody receives from it
        try:
            own.ref(own.address, "never").ask(tw.TensorMessage(b"", []), timeout=0.2)
            report["own_deadline"] = "no error"
        except tw.DeadlineExceeded:
            report["own_deadline"] = "DeadlineExceeded"
        del never
    results.put(report)


def _inherited_shared_memory(report: dict[str, Any], own: tw.Node) -> None:
    """Reads of the parent's shared memory (not inherited: refused, not a crash), then the
    objects dropped in the child."""
    held = {
        "buf": INHERITED.pop("shm_buffer"),
        "loan": INHERITED.pop("loan"),
        "message": INHERITED.pop("shm_message"),
    }
    sink = own.ref(own.address, "sink-never-read", transport="local")
    reads = {
        "shm_bytes": lambda: bytes(held["buf"]),
        "shm_numpy": lambda: np.frombuffer(held["buf"], np.uint8).sum(),
        "shm_memoryview": lambda: memoryview(held["buf"])[0],
        "shm_dlpack": lambda: np.from_dlpack(held["buf"]).sum(),
        "loan_view": lambda: memoryview(held["loan"])[0],
        "loan_freeze": lambda: held["loan"].freeze(),
        "message_buffer": lambda: bytes(held["message"].buffers[0]),
        "message_metadata": lambda: held["message"].metadata,
        "message_copy": lambda: held["message"].copy(),
        "message_sent_on": lambda: sink.tell(held["message"], timeout=3),
        "shm_stats": lambda: INHERITED["shm"].stats(),
    }
    for name, read in reads.items():
        try:
            read()
            report[name] = "no error"
        except BufferError as e:
            report[name] = "BufferError: fork" if "fork()" in str(e) else f"BufferError: {e}"
        except tw.ShutDown as e:
            report[name] = "ShutDown: fork" if "fork()" in str(e) else f"ShutDown: {e}"
        except Exception as e:  # noqa: BLE001 - reported to the test
            report[name] = f"{type(e).__name__}: {e}"
    held.clear()  # dropped in the child
    gc.collect()


class Samples:
    """A torch dataset whose workers each send their samples to the parent's ``sink`` with a
    node of their own, and check that the parent's node they inherited fails clearly."""

    def __init__(self, sink_address: str, count: int) -> None:
        self.sink_address = sink_address
        self.count = count
        self.node: tw.Node | None = None

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Any:
        import torch

        inherited = INHERITED.get("ref")
        if inherited is not None and self.node is None:
            try:
                inherited.tell(tw.TensorMessage(b"x", []), timeout=3)
                raise AssertionError("the parent's node worked in a worker")
            except tw.ShutDown as e:
                assert "fork()" in str(e), e
        if self.node is None:
            self.node = tw.Node()  # one per worker process, made in the worker
        sample = torch.full((256,), float(index))
        ref = self.node.ref(self.sink_address, "sink")
        ref.tell(tw.tensors.pack({"sample": sample, "index": np.array(index)}), timeout=30)
        return sample
