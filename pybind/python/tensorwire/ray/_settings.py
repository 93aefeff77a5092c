"""The settings this process's node starts with.

They come from :func:`tensorwire.ray.register` in this process; else from the latest caller
that reached this process before its node started (Ray's check before an actor method, or the
metadata of an object it fetches); else from the environment. A bind address never travels:
each process binds where its own settings say.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._config import Config


class Settings:
    """This process's settings, and those its node started with (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._given: Config | None = None
        self._explicit = False
        self._started: Config | None = None

    def configure(self, config: Config) -> None:
        """Settings given in this process (``register()``): they win over any caller's.
        Raises ``ValueError`` once the node runs with other settings."""
        with self._lock:
            if self._started is not None and config.resolved() != self._started:
                raise ValueError(
                    f"tensorwire.ray: this process's node already runs with {self._started}; "
                    f"register({config}) must come before the first transfer"
                )
            self._given, self._explicit = config, True

    def adopt(self, config: Config) -> str | None:
        """Settings a caller sent; kept unless this process was given its own or started.
        Returns why they cannot apply when this process's node already runs with others."""
        config = config.shareable()
        with self._lock:
            if not self._explicit and self._started is None:
                self._given = config
                return None
            if self._started is not None and not self._explicit:
                wanted = config.resolved()
                if wanted.shareable() != self._started.shareable():
                    return f"its node already runs with {self._started}, not {wanted}"
            return None

    def current(self) -> Config:
        """The settings this process's node starts with (see the module's text)."""
        with self._lock:
            return self._given if self._given is not None else Config()

    def start(self, resolve: Callable[[Config], Config]) -> Config:
        """The settings to start this process's node with, resolved, noted as started (so a
        ``register()`` from now on cannot be silently lost)."""
        with self._lock:
            self._started = resolve(self._given if self._given is not None else Config())
            return self._started

    def start_failed(self) -> None:
        """The node did not start: settings may still change."""
        with self._lock:
            self._started = None


SETTINGS = Settings()
"""This process's settings."""
