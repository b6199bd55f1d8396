"""Faults injected by name, for tests and for trying out how a run fails.

``HOPBUS_FAULTS="2:never_register,3:crash_at=10"`` makes worker 2 hang before it registers its
endpoint (as a process that never comes up) and worker 3 die abruptly when it is about to enter
iteration 10 (as a crash: no cleanup, no message). ``3:crash_joining`` makes a replacement for
worker 3 (``hopbus worker --rejoin``) die the same way once it has announced itself, before it
is back in the run. ``3:hang_before_report`` makes worker 3 hang after its last iteration,
before it publishes its final report (its heartbeat beating on: the gap a forged report would
use); ``3:crash_after_report`` makes it kill itself (SIGKILL) just after (its part done, as
a process killed while it leaves). ``1:leak_token`` makes worker 1 put one token more than the
rules say into its first token queue once its iterations are done, as a broken rule (or
another writer) would: the launcher's token-invariant check then fails the run. ``hopbus
train`` passes the variable on to its workers. Unknown names are refused, so a typo cannot
silently test nothing.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass

from hopbus.errors import ConfigError

ENV = "HOPBUS_FAULTS"
FLAGS = (  # no iteration
    "never_register", "crash_joining", "hang_before_report", "crash_after_report", "leak_token",
)  # fmt: skip
NAMES = (*FLAGS, "crash_at", "hang_at")


@dataclass(frozen=True)
class Faults:
    never_register: bool = False
    crash_joining: bool = False
    hang_before_report: bool = False
    crash_after_report: bool = False
    leak_token: bool = False
    crash_at: int | None = None
    hang_at: int | None = None

    @classmethod
    def for_worker(cls, worker: int, spec: str | None = None) -> Faults:
        spec = os.environ.get(ENV, "") if spec is None else spec
        found: dict[str, object] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            who, _, what = part.partition(":")
            name, _, arg = what.partition("=")
            counted = name not in FLAGS  # crash_at=ITER, hang_at=ITER
            if (
                name not in NAMES
                or not (who.isascii() and who.isdigit())
                or counted != (arg.isascii() and arg.isdigit())
            ):
                with_iter = ", ".join(n for n in NAMES if n not in FLAGS)
                raise ConfigError(
                    f"{ENV}: cannot read {part[:80]!r}; expected WORKER:NAME or WORKER:NAME=ITER, "
                    f"NAME one of {', '.join(FLAGS)}, or with =ITER {with_iter}"
                )
            if int(who) == worker:
                found[name] = True if name in FLAGS else int(arg)
        return cls(**found)  # type: ignore[arg-type]

    def before_register(self) -> None:
        if self.never_register:
            threading.Event().wait()  # until the process is stopped

    def before_report(self) -> None:
        if self.hang_before_report:
            threading.Event().wait()  # until the process is stopped

    def after_report(self) -> None:
        if self.crash_after_report:
            os.kill(os.getpid(), signal.SIGKILL)  # as kill -9 from outside

    def while_joining(self) -> None:
        if self.crash_joining:
            os._exit(70)

    def before_iteration(self, iteration: int) -> None:
        if self.crash_at is not None and iteration >= self.crash_at:
            os._exit(70)  # a crash: no cleanup, no message
        if self.hang_at is not None and iteration >= self.hang_at:
            threading.Event().wait()
