"""DLPack on every path, with numpy, torch and JAX: zero-copy where the consumer keeps
read-only memory read-only, a copy where it cannot (unversioned DLPack, torch) or asks for one,
and DLPack producers (torch tensors, JAX arrays) sent as buffers. JAX runs in a process of its
own (it warns when a process that loaded it forks)."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

import tensorwire as tw
from helpers import need, need_installed

PATHS = ["local", "local-lent", "shm", "raw", "http2"]
READ_ONLY = {"local": False, "local-lent": True, "shm": True, "raw": False, "http2": False}
"""Whether what arrives over a path is read-only memory (a sender's in this process, lent with
``lend=True``; a sealed shared-memory slot) or memory of the receiver's own (a writable
payload copied for a receiver in this process, the receive memory of a socket)."""


@pytest.fixture
def pair() -> Iterator[tuple[tw.Node, tw.Node]]:
    with tw.Node() as server, tw.Node() as client:
        server.serve("echo", lambda m: m)
        yield server, client


def echoed(pair: tuple[tw.Node, tw.Node], path: str, payload: np.ndarray) -> tw.TensorMessage:
    server, client = pair
    # "local" needs both ends in one node; the others cross a real transport.
    local = path.startswith("local")
    node, address = (server, server.address) if local else (client, server.address)
    message = tw.TensorMessage(b"", [payload], lend=path == "local-lent")
    transport = "local" if local else path
    reply = node.ref(address, "echo", transport=transport).ask(message)
    assert isinstance(reply, tw.TensorMessage)
    return reply


@pytest.mark.parametrize("path", PATHS)
def test_numpy_takes_a_received_buffer_without_a_copy_read_only_where_it_is(
    pair: tuple[tw.Node, tw.Node], path: str
) -> None:
    payload = np.arange(1 << 18, dtype=np.uint8)
    reply = echoed(pair, path, payload)
    buffer = reply.buffers[0]
    assert buffer.__dlpack_device__() == (1, 0)
    array = np.from_dlpack(buffer)
    assert np.shares_memory(array, np.frombuffer(buffer, np.uint8))
    assert array.flags.writeable == (not READ_ONLY[path])
    del reply, buffer
    gc.collect()
    assert np.array_equal(array, payload), "the array keeps the memory alive"


@pytest.mark.parametrize("path", PATHS)
def test_numpy_gets_a_writable_copy_when_it_asks_for_one(
    pair: tuple[tw.Node, tw.Node], path: str
) -> None:
    payload = np.arange(4096, dtype=np.uint8)
    buffer = echoed(pair, path, payload).buffers[0]
    owned = np.from_dlpack(buffer, copy=True)
    assert owned.flags.writeable and np.array_equal(owned, payload)
    assert not np.shares_memory(owned, np.frombuffer(buffer, np.uint8))


@pytest.mark.parametrize("path", ["local-lent", "shm"])
def test_read_only_memory_goes_to_an_unversioned_consumer_as_a_copy_never_shared(
    pair: tuple[tw.Node, tw.Node], path: str
) -> None:
    # Above 8 KiB: a smaller body crosses shared memory inside the control record and arrives
    # as the receiver's own (writable) memory.
    payload = np.arange(1 << 16, dtype=np.uint8)
    buffer = echoed(pair, path, payload).buffers[0]
    assert not buffer.writable
    # What an old consumer (JAX) asks for: the unversioned format cannot say read-only.
    assert '"dltensor"' in repr(buffer.__dlpack__())
    with pytest.raises(BufferError, match="copy=False forbids"):
        buffer.__dlpack__(copy=False)
    # A DLPack 1.x consumer that keeps the flag gets the memory itself.
    assert '"dltensor_versioned"' in repr(buffer.__dlpack__(max_version=(1, 0), copy=False))


@pytest.mark.parametrize("path", PATHS)
def test_torch_takes_a_received_buffer_and_never_writes_into_read_only_memory(
    pair: tuple[tw.Node, tw.Node], path: str
) -> None:
    torch = need("torch")
    payload = np.arange(1 << 16, dtype=np.uint8)
    sent = payload.copy()
    buffer = echoed(pair, path, sent).buffers[0]
    tensor = torch.from_dlpack(buffer)
    assert tensor.dtype == torch.uint8 and tensor.numpy().tobytes() == payload.tobytes()
    tensor += 1  # torch has no read-only tensors: it must hold its own copy of read-only memory
    shared = tensor.numpy().tobytes() == bytes(buffer)
    assert shared == (not READ_ONLY[path]), path
    assert np.array_equal(sent, payload), "the sender's array is untouched"
    copied = torch.from_dlpack(buffer, copy=True)
    copied += 1
    assert bytes(buffer) == (payload + (0 if READ_ONLY[path] else 1)).astype(np.uint8).tobytes()


@pytest.mark.parametrize("path", ["shm", "raw"])
def test_torch_tensors_are_sent_through_dlpack(pair: tuple[tw.Node, tw.Node], path: str) -> None:
    torch = need("torch")
    tensor = torch.arange(1000, dtype=torch.float32)
    server, client = pair
    reply = client.ref(server.address, "echo", transport=path).ask(tw.TensorMessage(b"", [tensor]))
    assert isinstance(reply, tw.TensorMessage)
    assert torch.equal(torch.from_dlpack(reply.buffers[0]).view(torch.float32), tensor)


JAX_CASES = """
import sys
import numpy as np
import jax.numpy as jnp
import tensorwire as tw

payload = np.arange(1 << 16, dtype=np.uint8)
with tw.Node() as server, tw.Node() as client:
    server.serve("echo", lambda m: m)
    for path in ("local", "shm", "raw", "http2"):
        node = server if path == "local" else client
        ref = node.ref(server.address, "echo", transport=path)
        buffer = ref.ask(tw.TensorMessage(b"", [payload])).buffers[0]
        for copy in (None, True):
            array = jnp.from_dlpack(buffer, copy=copy)
            assert np.array_equal(np.asarray(array), payload), (path, copy)
        sent = jnp.arange(1000, dtype=jnp.float32)  # a JAX array goes out through DLPack
        back = ref.ask(tw.TensorMessage(b"", [sent])).buffers[0]
        assert np.array_equal(np.frombuffer(back, np.float32), np.asarray(sent)), path
        print(path, "ok", flush=True)
"""


def test_jax_takes_received_buffers_and_sends_its_arrays_on_every_path() -> None:
    # In a process of its own: JAX is multithreaded and warns when a process that loaded it
    # forks, which other tests here do (Ray, multiprocessing).
    need_installed("jax")
    done = subprocess.run(
        [sys.executable, "-c", JAX_CASES], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["local", "ok", "shm", "ok", "raw", "ok", "http2", "ok"]


def test_a_tensor_dlpack_cannot_share_is_refused_naming_it(pair: tuple[tw.Node, tw.Node]) -> None:
    torch = need("torch")
    transposed = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    with pytest.raises(tw.InvalidArgument, match="buffer 0 .*not C-contiguous"):
        tw.TensorMessage(b"", [transposed])
