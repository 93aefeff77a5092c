"""Type stubs of tensorwire's native module (checked by mypy.stubtest in CI)."""

from collections.abc import Callable, Iterable
from typing import Any, final

from typing_extensions import Buffer as _BufferLike

__all__ = [
    "TensorMessage",
    "Buffer",
    "Node",
    "Ref",
    "Endpoint",
    "Request",
    "Pump",
    "Arrived",
    "Pending",
    "Loan",
    "Shm",
    "Descriptor",
    "tensor_transport_stats",
    "io_uring_unavailable",
]

@final
class Buffer:
    """Received engine memory as a Python buffer; views keep it alive."""

    def __len__(self) -> int: ...
    def __bytes__(self) -> bytes: ...
    @property
    def writable(self) -> bool: ...
    def __dlpack__(
        self,
        *,
        stream: Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

@final
class Loan:
    """A writable shared-memory slot on loan."""

    def __len__(self) -> int: ...
    @property
    def address(self) -> int: ...
    @property
    def frozen(self) -> bool: ...
    def freeze(self) -> Buffer: ...

@final
class Descriptor:
    """One leased view of a region."""

    def __new__(
        cls, region_id: int, generation: int, offset: int, len: int, lease_id: int
    ) -> Descriptor: ...
    @property
    def region_id(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def len(self) -> int: ...
    @property
    def lease_id(self) -> int: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Shm:
    """A node's shared-memory regions and leases."""

    def offer(self, data: Any, ttl: float = 60.0) -> Descriptor: ...
    def publish(self, name: str, data: Any) -> None: ...
    def open(self, name: str, ttl: float = 60.0) -> Descriptor: ...
    def map(self, descriptor: Descriptor) -> Buffer: ...
    def release(self, descriptor: Descriptor) -> bool: ...
    def unpublish(self, name: str) -> None: ...
    def clear(self) -> None: ...
    def stats(self) -> dict[str, Any]: ...

@final
class TensorMessage:
    """A version, opaque metadata bytes and an ordered list of contiguous buffers."""

    def __new__(
        cls,
        metadata: bytes | str | _BufferLike | None,
        buffers: Iterable[Any],
        version: int = 1,
        *,
        lend: bool = False,
    ) -> TensorMessage: ...
    @property
    def lend(self) -> bool: ...
    @property
    def version(self) -> int: ...
    @property
    def metadata(self) -> bytes: ...
    @property
    def buffers(self) -> tuple[Any, ...]: ...
    @property
    def route(self) -> str | None: ...
    @property
    def total_bytes(self) -> int: ...
    def __len__(self) -> int: ...
    def copy(self) -> TensorMessage: ...

@final
class Request:
    """A request taken from a mailbox."""

    @property
    def path(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def peer(self) -> str | None: ...
    @property
    def identity(self) -> str | None: ...
    @property
    def credentials(self) -> tuple[int, int] | None: ...
    @property
    def message(self) -> TensorMessage: ...
    def reply(self, value: Any = None) -> None: ...
    def reply_nowait(self, value: Any = None) -> None: ...
    def copy_into(self, into: Any, check: Callable[[bytes], None] | None = None) -> Request: ...
    def fail(self, text: str) -> None: ...

@final
class Pump:
    """One event loop's completion queue."""

    def __new__(cls) -> Pump: ...
    def fileno(self) -> int: ...
    def drain(self) -> list[tuple[int, bool, Any]]: ...
    def cancel(self, token: int) -> tuple[bool, Any] | None: ...
    def __len__(self) -> int: ...

@final
class Arrived:
    """A message an asyncio receive got, not yet delivered (nor written into ``into=``)."""

    def fill(self) -> Any: ...
    def withdraw(self) -> None: ...

@final
class Endpoint:
    """A mailbox endpoint."""

    @property
    def path(self) -> str: ...
    def __len__(self) -> int: ...
    def recv(
        self,
        timeout: float | None = None,
        *,
        pickle: bool = False,
        into: Any | None = None,
        check: Callable[[bytes], None] | None = None,
    ) -> Request | None: ...
    def recv_start(
        self,
        pump: Pump,
        *,
        pickle: bool = False,
        into: Any | None = None,
        check: Callable[[bytes], None] | None = None,
    ) -> int: ...
    def recv_batch_start(self, pump: Pump, max: int = 64, *, pickle: bool = False) -> int: ...

@final
class Ref:
    """A resolved reference to an endpoint (native)."""

    def ask(
        self,
        message: TensorMessage,
        timeout: float = 30.0,
        *,
        into: Any | None = None,
        check: Callable[[bytes], None] | None = None,
    ) -> Any: ...
    def tell(self, message: TensorMessage, timeout: float = 30.0) -> None: ...
    def tell_nowait(self, message: TensorMessage, timeout: float = 30.0) -> None: ...
    def ask_start(
        self,
        pump: Pump,
        message: TensorMessage,
        timeout: float = 30.0,
        *,
        into: Any | None = None,
        check: Callable[[bytes], None] | None = None,
    ) -> int: ...
    def tell_start(self, pump: Pump, message: TensorMessage, timeout: float = 30.0) -> int: ...
    def ask_nowait(
        self,
        message: TensorMessage,
        timeout: float = 30.0,
        *,
        into: Any | None = None,
        check: Callable[[bytes], None] | None = None,
    ) -> Pending: ...
    def route(self) -> tuple[str, str]: ...

@final
class Pending:
    """An ask in flight, waited for on the calling thread (native)."""

    def result(self, timeout: float | None = None) -> Any: ...
    def done(self) -> bool: ...
    def cancel(self) -> bool: ...

@final
class Node:
    """A tensorwire node (native)."""

    def __new__(
        cls,
        bind: str = "127.0.0.1:0",
        *,
        transport: str | None = None,
        shared_memory: bool | str | None = None,
        cores: int | None = None,
        mailbox_capacity: int | None = None,
        cert: str | None = None,
        key: str | None = None,
        ca: str | None = None,
        require_client_cert: bool = False,
        require_tls: bool | None = None,
        server_name: str | None = None,
        shm_idle_keep: int | None = None,
        shm_idle_after: float | None = None,
        spin: float | None = None,
    ) -> Node: ...
    @property
    def address(self) -> str: ...
    def endpoint(self, name: str, capacity: int | None = None) -> Endpoint: ...
    def serve(
        self,
        name: str,
        handler: Callable[[TensorMessage], Any],
        *,
        threads: int = 1,
        pickle: bool = False,
    ) -> None: ...
    def ref(
        self, address: str, name: str, transport: str = "auto", pickle: bool = False
    ) -> Ref: ...
    def route(self, address: str, transport: str = "auto") -> tuple[str, str]: ...
    def loan(self, nbytes: int) -> Loan: ...
    @property
    def shm(self) -> Shm: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self, timeout: float = 5.0) -> None: ...
    @property
    def closed(self) -> bool: ...

def tensor_transport_stats() -> dict[str, Any]: ...
def io_uring_unavailable() -> str | None: ...
