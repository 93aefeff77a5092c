"""tensorwire's exceptions: one hierarchy under :class:`Error`.

Each class also inherits the builtin a caller would catch for that kind of failure, so
``except TimeoutError`` and ``except tensorwire.Error`` both work. Messages say what failed,
where (peer, path, transport) and what to do.
"""

from __future__ import annotations

__all__ = [
    "Error",
    "DeadlineExceeded",
    "ConnectionFailed",
    "ProtocolError",
    "TLSError",
    "InvalidArgument",
    "EndpointExists",
    "UnknownEndpoint",
    "LimitExceeded",
    "OutOfMemory",
    "Overloaded",
    "RemoteError",
    "TransportUnavailable",
    "ShutDown",
    "Cancelled",
    "SharedMemoryError",
    "LeaseInvalid",
    "IoError",
]


class Error(Exception):
    """Base class of every tensorwire error."""


class DeadlineExceeded(Error, TimeoutError):
    """A call did not complete within its timeout."""


class ConnectionFailed(Error, ConnectionError):
    """Connecting failed, or the connection closed before the answer arrived."""


class ProtocolError(ConnectionFailed):
    """The peer sent bytes that are not valid PTR1/PTM1, or an answer of the wrong kind."""


class TLSError(ConnectionFailed):
    """The TLS handshake or certificate check failed."""


class InvalidArgument(Error, ValueError):
    """The call was given something it cannot use (a bad path, option or message)."""


class EndpointExists(InvalidArgument):
    """An endpoint with this name already exists on the node."""


class UnknownEndpoint(Error, LookupError):
    """No endpoint at that path (on this node or the peer)."""

    def __init__(self, message: str, text: str = "") -> None:
        super().__init__(message)
        #: The peer's text, when the peer said so.
        self.text = text


class LimitExceeded(Error, MemoryError):
    """A message is over a size limit (``PULSING_MAX_TENSOR_*``): this node's, when it sends
    or receives a reply (:attr:`side` ``"local"``), or the peer's, when it refused the request
    or could not send its reply (``"peer"``). :attr:`variable` names the setting."""

    def __init__(self, message: str, side: str = "local", variable: str | None = None) -> None:
        super().__init__(message)
        #: Whose limit: ``"local"`` (this node's) or ``"peer"``.
        self.side = side
        #: The environment variable that sets the limit, if one does.
        self.variable = variable


class OutOfMemory(Error, MemoryError):
    """Receive or shared memory is exhausted (pool, quota, descriptor limit)."""


class Overloaded(Error, RuntimeError):
    """A queue is full (mailbox, request queue); retry later."""


class RemoteError(Error):
    """The remote handler failed; :attr:`text` is what it said."""

    def __init__(self, message: str, text: str = "") -> None:
        super().__init__(message)
        #: The error text the peer sent.
        self.text = text


class TransportUnavailable(Error, RuntimeError):
    """The path a send must take is not available (io_uring blocked, HTTP/2 not set up)."""


class ShutDown(Error, RuntimeError):
    """The node (or the endpoint's mailbox) is closed."""


class Cancelled(Error):
    """The operation was cancelled."""


class SharedMemoryError(Error):
    """A shared-memory region or lease could not be used (a peer's region lacks its seals,
    is smaller than declared, …)."""


class LeaseInvalid(SharedMemoryError, LookupError):
    """The name or lease is not (or no longer) valid: unknown, released, expired, revoked."""


class IoError(Error, OSError):
    """A system call failed (binding the port, creating threads or descriptors)."""
