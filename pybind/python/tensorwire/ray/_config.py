"""The transport's settings: what ``register()`` was given, else the worker's environment."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

TRANSPORTS = ("auto", "raw", "shm", "http2")
"""The values of ``transport=`` (``auto``: shared memory on one host, PTR1 across hosts)."""

_ENV = {
    "transport": "TENSORWIRE_RAY_TRANSPORT",
    "bind": "TENSORWIRE_RAY_BIND",
    "timeout": "TENSORWIRE_RAY_TIMEOUT",
}
"""Where a worker looks for a setting ``register()`` left unset. TLS files left unset come from
``TENSORWIRE_TLS_*``, which :class:`tensorwire.Node` reads itself."""


@dataclass(frozen=True)
class Config:
    """How each process's tensorwire node is started and how it fetches.

    ``None`` means "not given": the process's environment (:data:`_ENV`) decides, then the
    default. ``transport`` defaults to the node's (``PULSING_TENSOR_TRANSPORT``, else
    ``auto``); ``bind`` to this Ray node's IP address on a free port.
    """

    transport: str | None = None
    bind: str | None = None
    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    require_client_cert: bool = False
    server_name: str | None = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        if self.transport is not None and self.transport not in TRANSPORTS:
            raise ValueError(
                f"transport={self.transport!r}: expected one of {', '.join(TRANSPORTS)}"
            )
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"timeout={self.timeout!r}: expected seconds > 0")
        if (self.cert is None) != (self.key is None):
            raise ValueError("cert and key go together: give both, or neither")

    def resolved(self) -> Config:
        """Every unset field from the environment, checked like an argument."""
        values: dict[str, Any] = {}
        for name, variable in _ENV.items():
            raw = os.environ.get(variable) if getattr(self, name) is None else None
            if raw:
                values[name] = _parse(name, raw)
        return replace(self, **values)

    def shareable(self) -> Config:
        """These settings as another process may adopt them: without the bind address
        (another process, or another host, binds where its own settings say)."""
        return replace(self, bind=None)

    def node_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`tensorwire.Node` (bind excluded)."""
        return {
            "transport": self.transport,
            "cert": self.cert,
            "key": self.key,
            "ca": self.ca,
            "require_client_cert": self.require_client_cert,
            "server_name": self.server_name,
        }


def _parse(name: str, raw: str) -> Any:
    if name == "transport" and raw not in TRANSPORTS:
        raise ValueError(f"{_ENV[name]}={raw!r}: expected one of {', '.join(TRANSPORTS)}")
    if name == "timeout":
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{_ENV[name]}={raw!r}: expected seconds") from None
    return raw
