"""The arrays a producing process keeps for Ray until Ray frees the object.

Each object is held under its Ray object id with a random token: only a fetch that presents
the token gets the bytes, so a peer that can reach the port but guesses object ids gets
nothing. The token travels in Ray's metadata and in the fetch; over PTR1 without TLS a peer
that can read the network can read it (and the arrays) too.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _errors as tw_errors
from .._arrays import as_array
from .._native import Buffer, Loan


@dataclass(frozen=True)
class Described:
    """What a consumer needs to rebuild one array: its dtype (numpy ``dtype.str``, or the
    torch dtype's name for torch-only ones), shape and kind (``numpy`` or ``torch``)."""

    dtype: str
    shape: tuple[int, ...]
    kind: str


TOKEN_CHARS = 32
"""A token is this many lowercase hex digits (128 random bits)."""


@dataclass(frozen=True)
class Held:
    """One object's bytes, in the order Ray listed its arrays."""

    token: str
    buffers: tuple[Any, ...]
    described: tuple[Described, ...]
    nbytes: int
    loaned: int
    """How many of them travel from a frozen loan (no copy on the same host)."""


class Store:
    """Thread-safe: Ray's task thread adds, tensorwire's handler threads read, Ray's
    garbage-collection callback drops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Held] = {}

    def hold(self, obj_id: str, tensors: Sequence[Any]) -> tuple[str, list[Described]]:
        """Keeps ``tensors`` (numpy arrays or CPU torch tensors) under ``obj_id``; returns the
        object's token and what describes each array. Raises ``ValueError`` (naming the
        array) for what cannot travel: object or structured dtypes, tensors off the CPU.
        Holding an id again (Ray retrying the task that made it) keeps the first copy."""
        with self._lock:
            held = self._held.get(obj_id)
        if held is not None:
            return held.token, list(held.described)
        buffers: list[Any] = []
        described: list[Described] = []
        nbytes = loaned = 0
        for index, tensor in enumerate(tensors):
            array, kind, dtype = _as_array(index, tensor)
            frozen = self._frozen_loan(array)
            if frozen is not None:
                buffers.append(frozen)
                loaned += 1
            else:
                buffers.append(_flat_bytes(array))
            described.append(Described(dtype, tuple(int(d) for d in array.shape), kind))
            nbytes += array.nbytes
        held = Held(
            secrets.token_hex(TOKEN_CHARS // 2), tuple(buffers), tuple(described), nbytes, loaned
        )
        with self._lock:
            held = self._held.setdefault(obj_id, held)
        return held.token, list(held.described)

    def lookup(self, obj_id: str, token: str) -> Held | None:
        """The object, if it is held here and ``token`` is its token."""
        with self._lock:
            held = self._held.get(obj_id)
        if held is None or not hmac.compare_digest(held.token.encode(), token.encode()):
            return None
        return held

    def drop(self, obj_id: str) -> bool:
        """Forgets the object (its memory goes when no fetch still sends it)."""
        with self._lock:
            return self._held.pop(obj_id, None) is not None

    def totals(self) -> tuple[int, int]:
        """How many objects are held, and their bytes."""
        with self._lock:
            return len(self._held), sum(h.nbytes for h in self._held.values())

    @staticmethod
    def _frozen_loan(array: np.ndarray) -> Buffer | None:
        """The loan ``array`` covers exactly (made by :func:`tensorwire.ray.empty`), frozen
        into a read-only buffer; ``None`` for any other array, and for a loan frozen before
        (an array returned again: its later writes went to a private copy, so its bytes
        travel as a copy). From then on the producer's writes to ``array`` go to a private
        copy: the object's bytes never change."""
        base = array.base
        while isinstance(base, np.ndarray):
            base = base.base
        if not isinstance(base, Loan) or not array.flags.c_contiguous or base.frozen:
            return None
        if array.nbytes != len(base) or array.__array_interface__["data"][0] != base.address:
            return None
        try:
            return base.freeze()
        except (BufferError, tw_errors.ShutDown):
            return None  # a view of it is exported, or it was frozen meanwhile: a copy


def _as_array(index: int, tensor: Any) -> tuple[np.ndarray, str, str]:
    """``tensor`` as a C-contiguous numpy array (copied only if it was not contiguous), its
    kind and its dtype's name."""
    array, kind, dtype = as_array(f"#{index}", tensor)
    if array.dtype.fields is not None or array.dtype.kind == "V":
        raise ValueError(
            f"array #{index} has the structured dtype {array.dtype}; only plain numeric "
            "arrays travel (send each field as an array of its own)"
        )
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return array, kind, dtype


def _flat_bytes(array: np.ndarray) -> np.ndarray:
    """The array's bytes as a flat uint8 view (no copy)."""
    return array.reshape(-1).view(np.uint8)
