"""The one error the data plane raises to its owner (bad frames are drops, not errors)."""

from __future__ import annotations


class TransportError(Exception):
    """A socket could not be bound, or a send blocked past its timeout. ``str(error)`` is one
    line naming the peer (or the inbox) and the endpoint."""
