"""Ctrl-C and SIGTERM as one request to stop that cannot get lost.

Python turns a signal into a KeyboardInterrupt wherever the main thread happens to be. One that
lands in a finalizer, or in a library that catches BaseException, is swallowed, and a launcher
that missed it would go on training with nobody to stop it. So the handler also records the
request, and the long loops (the launcher following a run) call :func:`check`, which raises it
again. Once asked, hopbus stops: every later ``check`` raises too.
"""

from __future__ import annotations

import signal
from typing import Any

_asked: list[int] = []  # the signals received, in order


def handler(signum: int, frame: Any) -> None:
    _asked.append(signum)
    raise KeyboardInterrupt


def install() -> None:
    """Route SIGINT and SIGTERM through the recording handler (main thread only)."""
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def requested() -> bool:
    return bool(_asked)


def said() -> str:
    """How the stop is said at the end: a SIGTERM is named (a launcher stopping its workers
    after another failed, ``docker stop``), as it was no Ctrl-C at this process's terminal."""
    return "interrupted by SIGTERM" if _asked and _asked[-1] == signal.SIGTERM else "interrupted"


def check() -> None:
    """Raise KeyboardInterrupt if a stop was asked for, even one whose first raise was lost."""
    if _asked:
        raise KeyboardInterrupt
