"""Small helpers shared by the tests."""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import numpy as np
import pytest


def floats(n: int, seed: int = 0) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) + seed).astype(np.float32)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def need(module: str) -> ModuleType:
    """Imports an optional package a test needs (``torch``, ``jax.numpy``). Missing, the test
    is skipped, saying so; with ``TENSORWIRE_REQUIRE_TORCH=1`` (``_JAX``, … after the top-level
    name), as ``scripts/test-all`` sets, a missing package fails the test instead."""
    top = module.partition(".")[0]
    if os.environ.get(f"TENSORWIRE_REQUIRE_{top.upper()}"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{top} is not installed: its cases are skipped")


def need_installed(module: str) -> None:
    """As :func:`need`, without importing it here: for a package a child process uses (JAX
    warns, and the warning fails the run, when a process that loaded it forks)."""
    top = module.partition(".")[0]
    if importlib.util.find_spec(top) is not None:
        return
    if os.environ.get(f"TENSORWIRE_REQUIRE_{top.upper()}"):
        raise AssertionError(f"{top} is not installed, and TENSORWIRE_REQUIRE_{top.upper()} is set")
    pytest.skip(f"{top} is not installed: its cases are skipped")
