"""What a fetch raises."""

from __future__ import annotations

from .. import _errors


class FetchError(_errors.Error):
    """Fetching an object's arrays from the process that produced them failed; the message
    says which object, from where, and why (``__cause__`` is tensorwire's own error)."""

    __module__ = "tensorwire.ray"


class FetchTimeout(FetchError, TimeoutError):
    """A fetch did not complete within its timeout."""

    __module__ = "tensorwire.ray"
