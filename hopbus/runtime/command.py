"""``hopbus worker --run R -- COMMAND ARGS...``: one copy of a user's training script as a worker.

The torchrun convention: this process takes the worker's id (``--id``, or the run's next one),
starts COMMAND with the environment ``hopbus.join()`` reads (hopbus/runtime/env.py), passes its
output through, forwards SIGTERM and Ctrl-C to it (and to everything it started), and ends as
it ends, stopping whatever the script left running (hopbus/runtime/reaper.py). It is also
where the run hears about a script that failed outside hopbus's own calls: one that crashed
(its last lines of stderr name the cause), was killed, or exited 0 without finishing its part
of the run (it never called ``hopbus.join()``, or stopped training early). ``hopbus launch``
starts N of these.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import redis

from hopbus.coord import read
from hopbus.coord.broker import _die_with_parent
from hopbus.coord.client import connect, quick
from hopbus.coord.control import taken
from hopbus.coord.keys import INTERRUPTED, INTERRUPTED_LINE, JOIN_FAILED, RunKeys
from hopbus.coord.runs import RunStateError, join_worker, said_why
from hopbus.errors import ConfigError, RunFailure
from hopbus.runtime import env
from hopbus.runtime.join import check_trainer, ready_to_join
from hopbus.runtime.last_words import cause, said
from hopbus.runtime.node import place_taken, read_run_config, redis_failures, refused_place
from hopbus.runtime.reaper import become_subreaper, command_line, descendants, named, stop_all
from hopbus.runtime.worker import report_failure

KEPT_LINES = 200  # enough to find a traceback's header under a long TensorFlow message

STOP_GRACE_S = 5.0


def shown_command(command: list[str]) -> str:
    """A command as a line shows it: 80 characters at most, cut in the middle (a long
    interpreter path at its start, the script's name and arguments at its end)."""
    shown = shlex.join(command)
    return shown if len(shown) <= 80 else f"{shown[:30]}...{shown[-47:]}"


def startable(command: list[str]) -> None:
    """One line if ``command`` names no program this process can start (a typo, a folder, a
    file that is not executable): before a worker id is taken for it, as a run's ids are given
    once each. The start itself can still fail (the line Popen's error gives)."""
    program = command[0]
    if shutil.which(program) is not None:
        return
    if os.sep not in program:
        why = "no such program on PATH"
    elif os.path.isdir(program):
        why = os.strerror(errno.EISDIR)
    elif os.path.exists(program):
        why = os.strerror(errno.EACCES)
    else:
        why = os.strerror(errno.ENOENT)
    raise ConfigError(f"cannot start `{shown_command(command)}`: {why}")


class ScriptFailed(RunFailure):
    """The script failed; the run was told already (by the script itself or here)."""


READ_BYTES = 1 << 16
"""The script's stderr is read this much at most at a time: a line without end (gigabytes
written without a newline) costs no more memory than this."""
KEPT_CHARS = 2000  # of each of its last lines: the head of a long one tells what it is


class _Pump(threading.Thread):
    """Copies the script's stderr to ours as it comes, keeping the head of each of its last
    ``KEPT_LINES`` lines (``tail``) and counting what it copied (``copied``): the caller
    waits for it while it still moves, so that a script's last words are read whole."""

    def __init__(self, source: IO[bytes], sink: Any) -> None:
        super().__init__(name="hopbus-stderr", daemon=True)
        self.source, self.sink = source, sink
        self.tail: collections.deque[str] = collections.deque(maxlen=KEPT_LINES)
        self.copied = 0

    def run(self) -> None:
        within = False  # in a line longer than one read: its head is kept already
        while raw := self.source.readline(READ_BYTES):
            self.copied += len(raw)
            with contextlib.suppress(OSError, ValueError):
                self.sink.write(raw)
                self.sink.flush()
            if not within:
                line = raw[: KEPT_CHARS * 4].decode(errors="replace").rstrip()[:KEPT_CHARS]
                if line.strip():
                    self.tail.append(line)
            within = not raw.endswith(b"\n")

    def drain(self, still_s: float = 5.0) -> None:
        """Wait for the end of the script's stderr while bytes still come (a last traceback
        behind a flood of output), but no longer than ``still_s`` once they stop (something
        the script started holds it open)."""
        seen, since = -1, time.monotonic()
        while self.is_alive():
            self.join(0.2)
            if self.copied != seen:
                seen, since = self.copied, time.monotonic()
            elif time.monotonic() - since >= still_s:
                return


def script_env(
    run: str, worker: int, redis_url: str, *, bind: str, advertise: str | None,
    timeout: float | None, curve: Path | None, device: str | None, rejoin: bool,
    tensorboard: Path | None,
) -> dict[str, str]:  # fmt: skip
    """This environment with the run's variables set (any stale ones of another run gone)."""
    out = {k: v for k, v in os.environ.items() if k not in env.WORKER_VARS}
    out.update({env.RUN: run, env.REDIS: redis_url, env.ID: str(worker), env.BIND: bind})
    out[env.SCRIPT] = "1"
    optional = {
        env.ADVERTISE: advertise,
        env.TIMEOUT: None if timeout is None else repr(timeout),
        env.CURVE: None if curve is None else str(Path(curve).resolve()),
        env.DEVICE: device,
        env.REJOIN: "1" if rejoin else None,
        env.TENSORBOARD: None if tensorboard is None else str(Path(tensorboard).resolve()),
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    return out


def run_command(
    run: str,
    worker: int | None,
    redis_url: str,
    command: list[str],
    *,
    timeout: float | None = None,
    **settings: Any,
) -> int:
    """Run ``command`` as worker ``worker`` of ``run``; returns the worker's id once the script
    finished its part. Raises ScriptFailed (reported to the run) if it did not."""
    keys = RunKeys(run)
    who = "worker" if worker is None else f"worker {worker}"
    wait = timeout or 60.0
    with redis_failures(who, run, redis_url):
        client = connect(redis_url, timeout=wait)
        cfg, topo = read_run_config(client, keys, wait)
        check_trainer(cfg, run, script=True)
        if worker is not None and not 0 <= worker < topo.n:
            raise ConfigError(f"--id {worker}: run {run!r} has workers 0..{topo.n - 1}")
        if worker is None:
            ready_to_join(cfg, run, settings.get("curve"), settings.get("bind"))
            startable(command)
            worker = join_worker(client, keys, topo.n, redis_url)
        elif not settings.get("rejoin") and (why := taken(client, keys, worker)):
            # before the script starts: a stray's script would only be refused, or fail,
            # and its failure is not the run's to hear
            raise place_taken(who, run, worker, why)
    shown = shown_command(command)
    variables = script_env(run, worker, redis_url, timeout=timeout, **settings)
    become_subreaper()  # what the script orphans stays below this process: stop_all finds it
    try:
        proc = subprocess.Popen(
            command,
            env=variables,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
    except OSError as exc:  # its place given, not taken: the run hears it as of a built-in
        why = exc.strerror or str(exc)  # worker that failed before taking it (JOIN_FAILED: a
        if exc.errno == errno.ENOENT and os.path.exists(command[0]):  # process started with
            why += " (the interpreter its #! line names?)"  # --id may take it still)
        line = f"worker {worker}: cannot start `{shown}`: {why}"
        report_failure(redis_url, run, worker, line, kind=JOIN_FAILED)
        raise RunFailure(line) from None
    assert proc.stderr is not None
    pump = _Pump(proc.stderr, sys.stderr.buffer)
    pump.start()
    try:
        code = proc.wait()
        names = {pid: command_line(pid) for pid in descendants()}  # while they are there
        left = stop_all(STOP_GRACE_S)  # before the pump: a leftover may hold the script's stderr
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (the CLI's handler, or a launcher that died):
        if proc.poll() is None:  # the script stops too, with its grace, and all it started
            stop_all(STOP_GRACE_S, keep=proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(1.0)
        else:  # it had exited: what it left behind goes now, whenever the stop came
            stop_all(0.0)
        _interrupted(redis_url, keys, worker)
        raise
    if left:
        print(
            f"hopbus: worker {worker}: stopped {len(left)} process{'es' * (len(left) > 1)} "
            f"that `{shown}` left running when it exited: {named(left, names)}",
            file=sys.stderr,
            flush=True,
        )
    pump.drain()
    tail = list(pump.tail)
    program = shutil.which(command[0], path=variables.get("PATH")) or command[0]
    other = os.path.realpath(program) != os.path.realpath(sys.executable)
    return _outcome(client, keys, worker, redis_url, shown, code, tail, other=other)


def _interrupted(url: str, keys: RunKeys, worker: int) -> None:
    """Why this worker is gone, for hopbus watch and its peers, as a built-in worker's says
    (cli/cluster.py): unless its part was done (a script that lingered after its report).
    Best effort, a second at most: the stop must not wait on a frozen broker."""
    with contextlib.suppress(redis.RedisError, ConfigError, OSError, ValueError):
        if quick(url).hexists(keys.result, str(worker)):
            return
    report_failure(url, keys.run, worker, INTERRUPTED_LINE, kind=INTERRUPTED)


def _outcome(
    client: redis.Redis, keys: RunKeys, worker: int, url: str, shown: str, code: int,
    tail: list[str], *, other: bool = False,
) -> int:  # fmt: skip
    """The worker's id if the script finished its part; otherwise ScriptFailed, the run told
    unless the script said itself (a ``hopbus: error:`` line: it reported what it had to).
    ``other``: the command is another program than the Python hopbus runs in."""
    own = said(tail)  # the script's "hopbus: error:" line, where it is its last word
    if code == 0:
        reached: int | None = None  # its counter: it joined, and trained that far
        try:
            if client.hexists(keys.result, str(worker)):
                return worker
            reached = read.integer(client.get(keys.iter(worker)), 0)
        except redis.RedisError:
            pass  # cannot tell: say what is known
        why = f"worker {worker}: `{shown}` exited 0 without finishing its part of the run " + (
            "(it must call hopbus.join(), then train until the run is done: model.fit with "
            "hopbus.keras.HopCallback, or ctx.start(params), then ctx.begin() and "
            "ctx.end(params) in a loop while not ctx.done)"
            if reached is None
            else f"(it joined, and stopped in iteration {reached}: train until ctx.done, e.g. "
            "model.fit with hopbus.keras.HopCallback and epochs enough, or ctx.begin() and "
            "ctx.end(params) in a loop while not ctx.done)"
        )
    elif own is not None and refused_place(own, keys.run, worker):  # a twin took the place
        refused = RunStateError(own)  # between this process's check and its script's claim:
        refused.said = True  # refused as a stray started later is, writing nothing
        raise refused
    elif own is not None:  # on stderr already: not a second time; the run told, by hopbus's
        with contextlib.suppress(redis.RedisError):  # API (or by something else it ran?)
            if worker not in said_why(client, keys, worker + 1):
                report_failure(url, keys.run, worker, own)
        failed = ScriptFailed(own)
        failed.said = True
        raise failed
    elif code < 0:
        why = f"worker {worker}: `{shown}` was killed by {signal.Signals(-code).name}"
    else:
        why = f"worker {worker}: `{shown}` exited with status {code}: {cause(tail)}"
        if other and "No module named 'hopbus'" in why:  # another Python than hopbus's
            why += (
                f"; hopbus is installed for {sys.executable}: activate its environment, or "
                f"name that interpreter after --"
            )
    report_failure(url, keys.run, worker, why)
    raise ScriptFailed(why)


__all__ = ["ScriptFailed", "run_command", "script_env"]
