"""Ctrl-C and SIGTERM as one request to stop that cannot get lost.

Python turns a signal into a KeyboardInterrupt wherever the main thread happens to be. One that
lands in a finalizer, or in a library that catches BaseException, is swallowed, and a launcher
that missed it would go on training with nobody to stop it. So the handler also records the
request, and the long loops (the launcher following a run) call :func:`check`, which raises it
again. Once asked, hopbus stops: every later ``check`` raises too.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

_asked: list[int] = []  # the signals received, in order
_holding = [0]  # how many deferred() blocks the main thread is in


def handler(signum: int, frame: Any) -> None:
    _asked.append(signum)
    if not _holding[0]:
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A short step a stop must not cut in two (progress replayed but its metrics line not
    yet written: the summary would tell an iteration metrics.jsonl lacks). A Ctrl-C or
    SIGTERM that lands inside is raised as the block ends. Nothing inside may wait on the
    network: the stop would wait with it."""
    before = len(_asked)
    _holding[0] += 1
    try:
        yield
    finally:
        _holding[0] -= 1
    if not _holding[0] and len(_asked) > before:
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
