"""Small helpers shared by the tests."""

from __future__ import annotations

import os

import numpy as np


def floats(n: int, seed: int = 0) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) + seed).astype(np.float32)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
