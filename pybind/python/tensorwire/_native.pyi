"""Type stubs of tensorwire's native module (checked by mypy.stubtest in CI)."""

from collections.abc import Callable, Iterable
from typing import Any, final

from typing_extensions import Buffer as _BufferLike

__all__ = [
    "TensorMessage",
    "Buffer",
    "Node",
    "Endpoint",
    "Request",
    "Pump",
    "Loan",
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

@final
class Loan:
    """A writable shared-memory slot on loan."""

    def __len__(self) -> int: ...
    def freeze(self) -> Buffer: ...

@final
class TensorMessage:
    """A version, opaque metadata bytes and an ordered list of contiguous buffers."""

    def __new__(
        cls, metadata: bytes | str | _BufferLike | None, buffers: Iterable[Any], version: int = 1
    ) -> TensorMessage: ...
    @property
    def version(self) -> int: ...
    @property
    def metadata(self) -> bytes: ...
    @property
    def buffers(self) -> tuple[Any, ...]: ...
    @property
    def total_bytes(self) -> int: ...
    def __len__(self) -> int: ...

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
    def message(self) -> TensorMessage: ...
    def reply(self, value: Any = None) -> None: ...
    def fail(self, text: str) -> None: ...

@final
class Pump:
    """One event loop's completion queue."""

    def __new__(cls) -> Pump: ...
    def fileno(self) -> int: ...
    def drain(self) -> list[tuple[int, bool, Any]]: ...
    def cancel(self, token: int) -> None: ...
    def __len__(self) -> int: ...

@final
class Endpoint:
    """A mailbox endpoint."""

    @property
    def path(self) -> str: ...
    def __len__(self) -> int: ...
    def recv(self, timeout: float | None = None, *, pickle: bool = False) -> Request | None: ...
    def recv_start(self, pump: Pump, *, pickle: bool = False) -> int: ...

@final
class Node:
    """A tensorwire node (native)."""

    def __new__(
        cls,
        bind: str = "127.0.0.1:0",
        *,
        transport: str | None = None,
        shared_memory: bool = True,
        cores: int | None = None,
        mailbox_capacity: int | None = None,
        cert: str | None = None,
        key: str | None = None,
        ca: str | None = None,
        require_client_cert: bool = False,
        require_tls: bool | None = None,
        server_name: str | None = None,
    ) -> Node: ...
    @property
    def address(self) -> str: ...
    def endpoint(self, name: str, capacity: int | None = None) -> Endpoint: ...
    def serve(
        self, name: str, handler: Callable[[TensorMessage], Any], *, threads: int = 1, pickle: bool = False
    ) -> None: ...
    def ask(
        self,
        address: str,
        path: str,
        message: TensorMessage,
        *,
        timeout: float = 30.0,
        transport: str = "auto",
        pickle: bool = False,
    ) -> Any: ...
    def tell(
        self, address: str, path: str, message: TensorMessage, *, timeout: float = 30.0, transport: str = "auto"
    ) -> None: ...
    def ask_start(
        self,
        pump: Pump,
        address: str,
        path: str,
        message: TensorMessage,
        *,
        timeout: float = 30.0,
        transport: str = "auto",
        pickle: bool = False,
    ) -> int: ...
    def tell_start(
        self,
        pump: Pump,
        address: str,
        path: str,
        message: TensorMessage,
        *,
        timeout: float = 30.0,
        transport: str = "auto",
    ) -> int: ...
    def route(self, address: str, transport: str = "auto") -> tuple[str, str]: ...
    def loan(self, nbytes: int) -> Loan: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...

def tensor_transport_stats() -> dict[str, Any]: ...
def io_uring_unavailable() -> str | None: ...
