"""Registering the transport with Ray, and the settings this process's node starts with.

Importing :mod:`tensorwire.ray` registers the transport in that process (so a module that
defines ``@ray.method(tensor_transport="tensorwire")`` passes Ray's check wherever it is
imported). The settings come from :func:`tensorwire.ray.register` in this process; else from
the latest caller that reached this process before its node started (Ray's check before an
actor method, or the metadata of an object it fetches); else from the environment. A bind
address never travels: each process binds where its own settings say.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np

from ._config import Config

NUMPY = "TENSORWIRE"
"""The transport for numpy arrays (``tensor_transport="tensorwire"``; Ray upper-cases names)."""

TORCH = "TENSORWIRE_TORCH"
"""The transport for CPU torch tensors, registered where torch is importable (Ray binds one
data type to each transport name)."""

_lock = threading.Lock()
_log = logging.getLogger("tensorwire.ray")
_settings: Config | None = None
_explicit = False
_started: Config | None = None


def ensure_registered() -> None:
    """Registers both transports in this process unless they are."""
    from ray.experimental import register_tensor_transport
    from ray.experimental.rdt import util

    from ._manager import TensorwireTorchTransport, TensorwireTransport

    with _lock:
        for name, manager, data_type in (
            (NUMPY, TensorwireTransport, np.ndarray),
            (TORCH, TensorwireTorchTransport, _torch_tensor_type()),
        ):
            if data_type is None or name in util.transport_manager_info:
                continue
            try:
                register_tensor_transport(name, ["cpu"], manager, data_type)
            except ValueError:  # Ray registered it meanwhile (from the driver's list)
                _log.debug("tensorwire.ray: %s was registered meanwhile", name)


def configure(config: Config) -> None:
    """Settings given in this process (``register()``): they win over any caller's."""
    global _settings, _explicit
    with _lock:
        if _started is not None and config.resolved() != _started:
            raise ValueError(
                f"tensorwire.ray: this process's node already runs with {_started}; "
                f"register({config}) must come before the first transfer"
            )
        _settings, _explicit = config, True


def adopt(config: Config) -> str | None:
    """Settings a caller sent; kept unless this process was given its own or started. Returns
    why they cannot apply when this process's node already runs with other settings."""
    global _settings
    config = config.shareable()
    with _lock:
        if not _explicit and _started is None:
            _settings = config
            return None
        if _started is not None and not _explicit:
            wanted = config.resolved()
            if wanted.shareable() != _started.shareable():
                return f"its node already runs with {_started}, not {wanted}"
        return None


def settings() -> Config:
    """The settings this process's node starts with (see the module's text)."""
    with _lock:
        return _settings if _settings is not None else Config()


def start(resolve: Callable[[Config], Config]) -> Config:
    """The settings to start this process's node with, resolved, noted as started (so a
    ``register()`` from now on cannot be silently lost)."""
    global _started
    with _lock:
        _started = resolve(_settings if _settings is not None else Config())
        return _started


def start_failed() -> None:
    global _started
    with _lock:
        _started = None


def _torch_tensor_type() -> type | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.Tensor  # type: ignore[no-any-return]
