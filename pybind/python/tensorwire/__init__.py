"""tensorwire: move tensors between processes and machines.

A :class:`TensorMessage` is a ``version``, opaque ``metadata`` bytes and an ordered list of
contiguous buffers. A :class:`Node` serves endpoints on one port and sends to other nodes; the
router picks the path per send (same process, shared memory, raw TCP/PTR1, HTTP/2 + TLS) and
:meth:`Ref.route` says which and why. See ``docs/python.md``.
"""

from __future__ import annotations

from . import tensors
from ._errors import (
    Cancelled,
    ConnectionFailed,
    DeadlineExceeded,
    EndpointExists,
    Error,
    InvalidArgument,
    IoError,
    LeaseInvalid,
    LimitExceeded,
    OutOfMemory,
    Overloaded,
    ProtocolError,
    RemoteError,
    SharedMemoryError,
    ShutDown,
    TLSError,
    TransportUnavailable,
    UnknownEndpoint,
)
from ._native import (
    Buffer,
    Descriptor,
    Loan,
    Request,
    Shm,
    TensorMessage,
    io_uring_unavailable,
    tensor_transport_stats,
)
from ._node import Answer, Endpoint, Node, Pending, Ref, Route

__all__ = [
    "Answer",
    "Buffer",
    "Cancelled",
    "Descriptor",
    "LeaseInvalid",
    "Loan",
    "SharedMemoryError",
    "Shm",
    "ConnectionFailed",
    "DeadlineExceeded",
    "Endpoint",
    "EndpointExists",
    "Error",
    "InvalidArgument",
    "IoError",
    "LimitExceeded",
    "Node",
    "OutOfMemory",
    "Overloaded",
    "Pending",
    "ProtocolError",
    "Ref",
    "RemoteError",
    "Request",
    "Route",
    "ShutDown",
    "TLSError",
    "TensorMessage",
    "TransportUnavailable",
    "UnknownEndpoint",
    "io_uring_unavailable",
    "tensor_transport_stats",
    "tensors",
]
