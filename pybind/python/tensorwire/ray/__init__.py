"""tensorwire as a Ray Direct Transport: Ray stays the scheduler, tensorwire moves the arrays.

Call :func:`register` in the driver before creating actors, then mark producing methods with
``@ray.method(tensor_transport="tensorwire")`` (or ``ray.put(x, _tensor_transport=
"tensorwire")``). Each Ray process that produces or consumes such an object starts one
tensorwire node; the producer keeps its arrays until Ray frees the object, the consumer
fetches them with one ask: over shared memory on the same host (zero copies for arrays made
by :func:`empty`, one otherwise; numpy consumers get read-only views, torch consumers a copy),
over PTR1 across hosts, over HTTP/2 + TLS when TLS is configured. See ``docs/ray.md``.

What it does not do: GPU tensors (CPU numpy arrays and CPU torch tensors only), two-sided
sends (Ray's ``send_multiple_tensors``; the consumer always fetches), or moving anything that
is not an array (the rest of the value goes through Ray as usual).
"""

from __future__ import annotations

import math
from typing import Any

try:
    import ray  # noqa: F401
    from ray.experimental import register_tensor_transport  # noqa: F401
except ImportError as _missing:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tensorwire.ray needs Ray with custom tensor transports (ray>=2.60): "
        "pip install 'tensorwire[ray]'"
    ) from _missing

import numpy as np  # noqa: E402

from ._config import TRANSPORTS, Config  # noqa: E402
from ._errors import FetchError, FetchTimeout  # noqa: E402
from ._manager import (  # noqa: E402
    TensorwireMetadata,
    TensorwireTorchTransport,
    TensorwireTransport,
    register_managers,
)
from ._runtime import current, runtime  # noqa: E402
from ._settings import SETTINGS  # noqa: E402

TRANSPORT = "tensorwire"
"""The name to pass as ``tensor_transport=`` for numpy arrays."""

TORCH_TRANSPORT = "tensorwire_torch"
"""The name for CPU torch tensors (registered where torch is importable)."""

__all__ = [
    "TRANSPORT",
    "TORCH_TRANSPORT",
    "TRANSPORTS",
    "FetchError",
    "FetchTimeout",
    "TensorwireMetadata",
    "TensorwireTorchTransport",
    "TensorwireTransport",
    "empty",
    "register",
    "stats",
]


def register(
    *,
    transport: str | None = None,
    bind: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    ca: str | None = None,
    require_client_cert: bool = False,
    server_name: str | None = None,
    timeout: float | None = None,
) -> None:
    """Makes the ``tensorwire`` transport available to Ray with these settings (call it in
    the driver, before creating the actors that use it). Importing :mod:`tensorwire.ray`
    already registers the transport in a process (import it in modules that define actors
    using it); the settings reach an actor with the first call of one of its tensorwire
    methods, and a consumer with the metadata of what it fetches. Settings a process gets
    from its environment apply where nothing was given.

    ``transport``: the path each node prefers, ``auto`` (shared memory between processes of
    one host, PTR1 across hosts), ``shm``, ``raw`` (PTR1 always) or ``http2``; unset, a
    worker's ``TENSORWIRE_RAY_TRANSPORT``, then ``PULSING_TENSOR_TRANSPORT``, decide.
    ``bind``: the address each node listens on (default: the Ray node's IP, a free port;
    ``TENSORWIRE_RAY_BIND``). ``cert``/``key``/``ca``/``require_client_cert``/
    ``server_name``: TLS, as for :class:`tensorwire.Node` (files must exist on every host;
    unset, ``TENSORWIRE_TLS_*``); a node that requires TLS or client certificates does not
    use shared memory. ``timeout``: seconds a fetch may take (default: Ray's
    ``RAY_rdt_fetch_fail_timeout_milliseconds``, 60 s; ``TENSORWIRE_RAY_TIMEOUT``).

    Once this process's node has started (its first transfer), other settings raise
    ``ValueError``.
    """
    register_managers()
    SETTINGS.configure(
        Config(
            transport=transport,
            bind=bind,
            cert=cert,
            key=key,
            ca=ca,
            require_client_cert=require_client_cert,
            server_name=server_name,
            timeout=timeout,
        )
    )


def empty(shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """A writable array in a shared-memory slot of this process's node, to fill in place and
    return from a ``tensor_transport="tensorwire"`` method: a consumer on the same host maps
    the slot itself, so the array's bytes are never copied.

    Once Ray holds it as an object, the bytes the consumer sees never change: later writes to
    this array go to a private copy.
    """
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise ValueError("empty() needs a plain numeric dtype, not object")
    nbytes = math.prod(dims) * dt.itemsize
    loan = runtime().node.loan(max(nbytes, 1))
    # numpy.ndarray(buffer=) keeps the address, not an export: the loan can be frozen later.
    return np.ndarray(dims, dt, buffer=loan)  # type: ignore[arg-type]


def stats() -> dict[str, Any]:
    """This process's transport: the address of its node, the objects and bytes it holds for
    Ray, fetches in flight, counters (``served``, ``fetched_shm``, ``fetched_raw``,
    ``fetched_http2``, ``fetch_failures``, ``fetches_aborted``, …) and its node's
    :meth:`tensorwire.Node.stats` under ``node``. Empty when this process never used it."""
    rt = current()
    return rt.stats() if rt is not None else {}


register_managers()
