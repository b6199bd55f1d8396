"""Start a run's nodes by forking them from one process that has already imported hopbus.

Each ``hopbus worker`` started afresh spends about a second of CPU importing numpy, redis-py,
pyzmq, networkx, pydantic and hopbus before its first step: N seconds of a laptop's cores for
``hopbus train -n N``, and most of the test suite's time. So the launcher starts one process
that imports all of that once (this module, run as ``python -m hopbus.runtime.forkserver``),
and asks it to fork each node: the same ``hopbus worker`` command line, in a session of its
own, its output into its log, its environment the launcher's, asked to die with the server as
the server is asked to die with the launcher. It is ``multiprocessing``'s forkserver made for
one job: the server holds no thread, no socket and no Redis connection when it forks, and
nothing of TensorFlow or of a user's code is ever imported into it (a node imports those after
the fork, as any process would).

The launcher talks to the server over its stdin and stdout, a line each way:
``{"argv": [...], "log": PATH, "name": NAME}`` asks for a node, ``ok PID`` answers it, and
``exit PID STATUS`` (Popen's returncode: negative for a signal) tells each end. A server that
cannot start, or dies before answering, leaves the launcher to start every node the plain way
(``HOPBUS_FORKSERVER=0`` asks for that from the start: each node a fresh interpreter).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from hopbus.errors import RunFailure
from hopbus.runtime import env as envvars
from hopbus.runtime import interrupts
from hopbus.runtime.reaper import prctl, proc_stat

ANSWER_S = 60.0
"""How long the launcher waits for the server's answers (its imports, on a busy machine)
before it kills it and starts the nodes the plain way (at once for a server stopped with
kill -STOP)."""

ARG_MAX_BYTES = 128 * 1024 - 1
"""The longest single argument Linux takes (MAX_ARG_STRLEN, its NUL included)."""

UNTOLD_S = 2.0
"""How long a node may have ended without its server telling (a server stopped with kill
-STOP, or hung) before the launcher kills the server and looks at the node itself."""

GONE_CODE = -signal.SIGTERM
"""The exit status told of a node whose server died before telling its end: the kernel sent
it SIGTERM then (it asked to die with the server)."""


def wanted(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether nodes are forked from a server (Linux; not turned off by HOPBUS_FORKSERVER=0)."""
    value = environ.get(envvars.FORKSERVER, "").strip()
    return hasattr(os, "fork") and sys.platform == "linux" and (not value or envvars.flag(value))


class ForkServer:
    """The launcher's side: one server, the nodes it forked, and their exit statuses."""

    def __init__(self, env: dict[str, str], run: str, longest: int) -> None:
        """``longest``: the longest node command line, in bytes: the server's own is made as
        long (blanks at its end), so that each node can show its own in its place."""
        from hopbus.coord.broker import _die_with_parent

        argv = [sys.executable, "-m", "hopbus.runtime.forkserver", "--run", run]
        room = max(1, longest - sum(len(os.fsencode(a)) + 1 for a in argv))
        blanks = [" " * ARG_MAX_BYTES] * (room // (ARG_MAX_BYTES + 1))  # Linux's bound on one
        blanks.append(" " * max(1, room - len(blanks) * (ARG_MAX_BYTES + 1)))  # argument
        self.proc = subprocess.Popen(
            [*argv, *blanks],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # it says what it has to say on stdout, or nothing
            env=env,
            start_new_session=True,  # Ctrl-C reaches the launcher only, as for its nodes
            # SIGKILL: it has nothing to clean up, and a stopped server (kill -STOP) would
            # hold a SIGTERM, and its nodes, until someone sent SIGCONT
            preexec_fn=lambda: _die_with_parent(signal.SIGKILL),  # noqa: PLW1509
        )
        assert self.proc.stdout is not None
        self._out = self.proc.stdout.fileno()
        self._buf = b""
        self._answers: list[tuple[int, int]] = []  # (pid, start time) of each node forked
        self.exits: dict[int, int] = {}
        self.ended = False  # the server is gone: what it did not tell is found by looking
        self.orphaned: set[int] = set()  # nodes whose end it did not live to tell

    @classmethod
    def launch(
        cls, env: dict[str, str], run: str, nodes: list[tuple[list[str], Path, str]]
    ) -> tuple[ForkServer | None, list[Forked] | None]:
        """A server for ``nodes``, and the nodes it forked (None: see ``start``; no server
        if it could not be started at all)."""
        longest = max(len(os.fsencode(" ".join(command_line(argv)))) for argv, _, _ in nodes)
        try:
            server = cls(env, run, longest + 1)
        except OSError:  # (E2BIG, ENOMEM, ...): the nodes, started plainly, will say it
            return None, None
        return server, server.start(nodes)

    def start(self, nodes: list[tuple[list[str], Path, str]]) -> list[Forked] | None:
        """Fork every node (``hopbus`` arguments, log file, short name); None if the server
        failed first, with none of them left running: the caller starts them itself."""
        try:
            assert self.proc.stdin is not None
            for argv, log, name in nodes:
                line = json.dumps({"argv": argv, "log": str(log), "name": name})
                self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.close()  # no more: it ends once its last node has ended
            deadline = time.monotonic() + ANSWER_S
            while len(self._answers) < len(nodes) and not self.ended:
                fields = proc_stat(self.proc.pid)
                if time.monotonic() >= deadline or (fields is not None and fields[0] in "Tt"):
                    break
                self.pump(min(1.0, deadline - time.monotonic()))
        except (OSError, ValueError):
            pass  # a server that died before reading: its pipe is broken
        except BaseException:  # Ctrl-C while it forks: nothing of it is left running
            self.abandon()
            raise
        if len(self._answers) == len(nodes):
            return [Forked(self, pid, since) for pid, since in self._answers]
        started = len(self._answers)
        self.abandon()
        if started:  # some may have taken their place in the run: a second start is refused
            raise RunFailure(
                f"hopbus's fork server stopped after starting {started} of {len(nodes)} "
                f"nodes ({self.died() or 'no answer'}); start the run again, or with "
                f"{envvars.FORKSERVER}=0"
            )
        return None

    def abandon(self) -> None:
        """Kill the server and whatever it forked already (each in a group of its own, or
        about to be: the node itself too)."""
        for pid, since in self._answers:
            if _started(pid) == since:
                for kill in (os.killpg, os.kill):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        kill(pid, signal.SIGKILL)
        self.kill()

    def kill(self) -> None:
        """Kill the server (its nodes get their parent-death signal): what it did not tell
        is found by looking at them."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        self.ended = True
        self._look()

    def close(self) -> None:
        """Read the server's last words and collect it once its nodes have ended (a second
        at most, then it is killed: by then the launcher has stopped every node)."""
        deadline = time.monotonic() + 1.0
        while not self.ended and time.monotonic() < deadline:
            self.pump(deadline - time.monotonic())
        if not self.ended:
            self.kill()

    def pump(self, timeout: float) -> None:
        """Read what the server said within ``timeout`` seconds (0: only what is there)."""
        if self.ended:
            self._look()
            if timeout > 0 and any(pid not in self.exits for pid, _ in self._answers):
                time.sleep(min(timeout, 0.05))  # polling: these are no children of ours
            return
        ready = select.select([self._out], [], [], max(0.0, timeout))[0]
        if not ready:
            return
        with interrupts.deferred():  # what was read is parsed: a Ctrl-C waits for it
            self._read()

    def _read(self) -> None:
        data = os.read(self._out, 1 << 16)
        if not data:  # the server ended: after its last node, or killed
            self.ended = True
            self.proc.wait()
            self._look()
            return
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            words = line.split()
            if len(words) == 3 and words[0] == b"ok":
                self._answers.append((int(words[1]), int(words[2])))
            elif len(words) == 3 and words[0] == b"exit":
                self.exits[int(words[1])] = int(words[2])

    def _look(self) -> None:
        """With the server gone, a node it did not report is over once it is gone too."""
        for pid, since in self._answers:
            if pid not in self.exits and not _alive(pid, since):
                self.exits[pid] = GONE_CODE
                self.orphaned.add(pid)

    def died(self) -> str | None:
        """How the server ended, if it died early (killed, or crashed)."""
        code = self.proc.returncode
        if code is None or code == 0:
            return None
        return (
            f"was killed by {signal.Signals(-code).name}"
            if code < 0
            else f"exited with status {code}"
        )


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot: field 22): with its pid, which
    process it is, as a pid freed by an ended node may be another's by the time it is read."""
    fields = proc_stat(pid)
    return int(fields[19]) if fields else None


def _alive(pid: int, since: int) -> bool:
    """Whether node ``pid`` (started at ``since``) still runs: a zombie does not (its parent
    has yet to collect it; this process, if it is that parent: PID 1 in a container, a
    subreaper), nor a process that took its pid after it."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    fields = proc_stat(pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == since


class Forked:
    """One forked node, as much of ``subprocess.Popen`` as the launcher uses."""

    def __init__(self, server: ForkServer, pid: int, since: int) -> None:
        self.server = server
        self.pid = pid
        self.since = since  # its start time: a pid alone may name another process later
        self.returncode: int | None = None
        self._ended_at: float | None = None  # when it was first seen ended, its end untold

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.pump(0)
            self.returncode = self.server.exits.get(self.pid)
        if self.returncode is None and self._untold():
            self.server.kill()  # (stopped, or hung): it goes, its nodes are looked at
            self.returncode = self.server.exits.get(self.pid)
        return self.returncode

    def _untold(self) -> bool:
        """Whether it ended UNTOLD_S ago and its server has not said so: a server that does
        not collect its nodes (stopped with kill -STOP, or hung)."""
        if self.server.ended or _alive(self.pid, self.since):
            self._ended_at = None
            return False
        now = time.monotonic()
        self._ended_at = now if self._ended_at is None else self._ended_at
        return now - self._ended_at > UNTOLD_S

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(f"node {self.pid}", timeout or 0.0)
            self.server.pump(min(left, 0.1 if self._ended_at is not None else 1.0))
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        # as Popen: an ended node is not signalled (its pid may be another process's now)
        if self.poll() is None and _started(self.pid) == self.since:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# -- the server's side ----------------------------------------------------------------------------
def _preload() -> None:
    """What every node imports before its first step, imported once here."""
    import hopbus.cli.main
    import hopbus.runtime.command
    import hopbus.runtime.join
    import hopbus.runtime.own_code
    import hopbus.runtime.worker  # noqa: F401


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # the launcher is gone: the kernel ends us next
        os.write(1, line.encode() + b"\n")


def serve() -> tuple[list[str], str] | None:
    """Fork a node for each request on stdin; in a node, return its (argv, name) for the
    caller to run; in the server, None once stdin has closed and every node has ended."""
    _preload()
    import threading

    if threading.active_count() > 1:  # something started a thread here (a sitecustomize's
        sys.exit(3)  # agent): a fork would copy its locks held; the launcher starts plainly
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select below
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a session of its own: the launcher decides
    children: set[int] = set()
    buf = b""
    reading = True
    while reading or children:
        watched = [0, wake_r] if reading else [wake_r]
        ready = select.select(watched, [], [])[0]
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            _say(f"exit {pid} {os.waitstatus_to_exitcode(status)}")
        if 0 not in ready:
            continue
        data = os.read(0, 1 << 16)
        if not data:
            reading = False
            continue
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            request = json.loads(line)
            server = os.getpid()
            pid = os.fork()
            if pid == 0:
                _become(request["log"], (wake_r, wake_w), server)
                return [str(a) for a in request["argv"]], str(request["name"])
            children.add(pid)
            _say(f"ok {pid} {_started(pid) or 0}")
    return None


def _become(log: str, fds: tuple[int, int], server: int) -> None:
    """In a fresh fork of ``server``: what ``Popen(start_new_session=True, stdout=log,
    stderr=STDOUT, stdin=DEVNULL, preexec_fn=_die_with_parent)`` would have given it. A
    failure here ends it with status 1 and a line in its log, where it could open it."""
    try:
        _set_up(log, fds, server)
    except BaseException as exc:
        with contextlib.suppress(BaseException):
            os.write(2, f"hopbus: error: cannot start this node: {exc}\n".encode())
        os._exit(1)


def _set_up(log: str, fds: tuple[int, int], server: int) -> None:
    from hopbus.coord.broker import _die_with_parent

    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in fds:
        os.close(fd)
    os.setsid()
    _die_with_parent()
    if os.getppid() != server:  # it died before the line above took effect (or before
        os._exit(1)  # this node first ran): the launcher is stopping everything
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    os.dup2(null, 0)
    os.close(null)
    np = sys.modules.get("numpy")
    if np is not None:  # numpy's global generator is not reseeded by a fork, as random's is
        np.random.seed()


PR_SET_NAME = 15


def command_line(argv: list[str]) -> list[str]:
    """A node's command line, as a node started the plain way has it."""
    return [sys.executable, "-m", "hopbus", *argv]


def _retitle(words: list[str], name: str) -> None:
    """Show the node as what it is: its own command line where ps, pgrep -f and
    /proc/PID/cmdline read it (written over the server's, which was made as long), and its
    short name where ps -o comm and top read it. Nothing if the kernel does not tell where
    the command line lies."""
    import ctypes

    prctl(PR_SET_NAME, name.encode()[:15])
    fields = proc_stat("self")
    if fields is None:
        return
    with contextlib.suppress(Exception):
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49: arg_start, arg_end
        text = b"".join(os.fsencode(w) + b"\0" for w in words)
        if 0 < start < end and len(text) <= end - start:
            ctypes.memmove(start, text.ljust(end - start, b"\0"), end - start)


if __name__ == "__main__":
    node = serve()
    if node is not None:  # a node: from here on it is `python -m hopbus ARGV`
        argv, name = node
        _retitle(command_line(argv), name)
        import hopbus
        from hopbus.cli.entry import main

        sys.argv = [str(Path(hopbus.__file__).with_name("__main__.py")), *argv]
        main()
