"""The console script's target. Imports nothing heavy itself, so that a Ctrl-C or SIGTERM while
typer, numpy and networkx are still loading ends quietly like one at any later moment."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from typing import NoReturn

from hopbus.runtime import interrupts  # the signal module only

INTERRUPTED = 130


def exit_interrupted() -> NoReturn:
    """End with status 130 after Ctrl-C or SIGTERM, every time.

    A plain ``sys.exit(130)`` is not enough: when the interrupt lands inside a library's
    ``exec()`` of a string (scipy's first import does one, and the launcher imports scipy
    lazily), CPython marks the KeyboardInterrupt as unhandled although hopbus caught it, and at
    its very end the interpreter re-sends SIGINT to itself: the status becomes -2 at random.
    By this point every process hopbus started is stopped, so run the exit handlers, flush,
    and leave with the documented status."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # closed, or None
            stream.flush()
    with contextlib.suppress(OSError, ValueError):
        print(f"hopbus: {interrupts.said()}", file=sys.stderr, flush=True)
    atexit._run_exitfuncs()
    os._exit(INTERRUPTED)


def main() -> None:
    # SIGTERM while typer, numpy and networkx load ends as Ctrl-C does (130, not the default
    # action's 143); the commands that start processes install their own handler later
    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        signal.signal(signal.SIGTERM, interrupts.handler)
    try:
        from hopbus.cli.main import main as run

        run()
    except KeyboardInterrupt:  # while importing, or after the command had returned
        exit_interrupted()
    finally:
        _leaving()


def _leaving() -> None:
    """From here the interpreter only shuts down (joins threads, flushes): a SIGTERM now,
    such as the launcher's to a worker that is already leaving on its own, would raise
    KeyboardInterrupt inside ``threading._shutdown`` and print a traceback into the log. The
    exit status is decided, so one such signal is let pass; a second (Ctrl-C again, at a
    process that hangs there) ends it at once, as interrupted."""
    heard: list[int] = []

    def _late(signum: int, frame: object) -> None:
        heard.append(signum)
        if len(heard) > 1:
            os._exit(INTERRUPTED)

    with contextlib.suppress(ValueError):  # not the main thread
        signal.signal(signal.SIGTERM, _late)
        signal.signal(signal.SIGINT, _late)
