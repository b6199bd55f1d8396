"""What a SIGTERM does to a script that joined a run (``hopbus.join()``).

``hopbus worker -- COMMAND`` stops its script with SIGTERM when the run stops (as does ``docker
stop``). Python's default ends the process on the spot: the script's worker never leaves, and
the stopped run's summary counts its messages as of its last heartbeat (258 sent where some
1,100 went out, in a new-user trial). So a script that kept that default is unwound by it as by
Ctrl-C, a KeyboardInterrupt, and its worker leaves as a built-in one does. What stays Python's:

* a child the script forked (``multiprocessing``'s fork start method) inherits the handler; it
  dies of the signal at once, as by default (its pool's ``terminate()`` printed a
  KeyboardInterrupt traceback for every worker process);
* once the script has ended (its exit handlers run), a SIGTERM waits for the worker to leave
  (at most the stop's grace: SIGKILL follows), and the process then dies of it, exit status
  -15, as it would have; so too after an unwinding: a SIGTERM is never reported as SIGINT;
* once the worker has left (``ctx.close()``), Python's default is back.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any


class _State:
    pid: int | None = None  # the process that installed the handler
    asked = False  # a SIGTERM came
    leaving = False  # the script has ended: a SIGTERM waits for its worker to leave


def die_of_it() -> None:
    """End now, as Python's default SIGTERM would: killed by the signal."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _on_sigterm(signum: int, frame: Any) -> None:
    if os.getpid() != _State.pid:  # a child the script forked: as by default
        die_of_it()
        return
    _State.asked = True
    if not _State.leaving:
        raise KeyboardInterrupt


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install() -> None:
    """Unwind on SIGTERM: only where the script kept Python's default (its own handler stays
    its own), and from the main thread, where Python runs signal handlers."""
    if _main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        _State.pid = os.getpid()
        signal.signal(signal.SIGTERM, _on_sigterm)


def restore() -> None:
    """Python's default again, once the worker has left."""
    if _main_thread() and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def asked() -> bool:
    """A SIGTERM came (the KeyboardInterrupt that ended the script was it)."""
    return _State.asked


def leaving() -> None:
    """The script has ended: from now on a SIGTERM waits for the worker to leave."""
    _State.leaving = True


__all__ = ["asked", "die_of_it", "install", "leaving", "restore"]
