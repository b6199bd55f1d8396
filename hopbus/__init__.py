"""hopbus: heterogeneity-aware decentralized training (Hop, ASPLOS'19), as a message-broker
pipeline.

As a library, any training loop joins a run started by ``hopbus launch``::

    import hopbus
    ctx = hopbus.join()            # hopbus.api: the run, its settings, this worker's place

and a Keras model trains with ``model.fit(..., callbacks=[hopbus.keras.HopCallback(ctx)])``.
Importing ``hopbus`` loads nothing else until one of these is used.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_API = ("Context", "NotLaunchedError", "join", "launched")


def __getattr__(name: str) -> Any:
    if name in _API:
        from hopbus import api

        return getattr(api, name)
    if name == "keras":  # hopbus.keras.HopCallback without importing hopbus.keras first
        import importlib

        return importlib.import_module("hopbus.keras")
    raise AttributeError(f"module 'hopbus' has no attribute {name!r}")


__all__ = ["Context", "NotLaunchedError", "__version__", "join", "launched"]
