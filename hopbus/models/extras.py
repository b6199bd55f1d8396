"""Optional dependencies (the pip extras): one place that turns a missing package into the one
line a user needs, before any worker starts, instead of a traceback from every worker."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from hopbus.errors import ConfigError

TORCH_CPU = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
"""PyTorch's CPU build: what the bench extra's torch should be unless a GPU is meant (PyPI's
torch pulls gigabytes of CUDA libraries)."""


def install_hint(extra: str) -> str:
    """The command that installs ``extra``: ``pip install -e '.[tf]'``; for ``bench``, the
    CPU build of PyTorch first."""
    if extra == "bench":
        return f"{TORCH_CPU}, then pip install -e '.[bench]'"
    return f"pip install -e '.[{extra}]'"


MISSING_HINTS = {"tensorflow": install_hint("tf"), "keras": install_hint("tf"), "torch": TORCH_CPU}
"""What installs each package a user's script commonly lacks that hopbus's extras hold, by
its import name."""


def missing_hint(module: str) -> str | None:
    """What installs ``module`` (a script's ``No module named 'keras'``), if an extra of
    hopbus's holds it: ``pip install -e '.[tf]'``; PyTorch's CPU build for torch."""
    return MISSING_HINTS.get(module.partition(".")[0])


def require(module: str, *, feature: str, package: str, extra: str, load: bool = True) -> None:
    """Refuse ``feature`` in one ConfigError line when ``module`` cannot be imported.

    ``load=False`` only locates the module (milliseconds, where importing TensorFlow takes
    seconds): enough for the launcher's check of a package that is not installed at all.
    """
    try:
        if load:
            importlib.import_module(module)
        elif importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
    except (ImportError, OSError) as exc:  # OSError: a package whose shared libraries are broken
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"{feature} needs {package}: {install_hint(extra)} (import {module} failed: {why})"
        ) from None


def load(module: str, *, feature: str, package: str, extra: str) -> ModuleType:
    """``module`` imported, or the one-line ConfigError of :func:`require`."""
    require(module, feature=feature, package=package, extra=extra)
    return importlib.import_module(module)
