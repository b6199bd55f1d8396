"""What a user's script leaves running: found and stopped by the process that ran it.

``hopbus worker -- COMMAND`` runs a script it did not write. A script may start processes of
its own (a data loader's workers, ``sh -c`` around the real program, a daemon that forks twice
and calls ``setsid`` to leave its session), and Linux's parent-death signal reaches only the
direct child. So the worker process becomes a *child subreaper* (``PR_SET_CHILD_SUBREAPER``):
whatever its descendants orphan is re-parented to it rather than to init, and at the end it
can find every process below it in ``/proc``, ask them to stop (SIGTERM), and kill those that
do not within a grace period. Linux only; elsewhere nothing is found and nothing is stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


def prctl(option: int, arg: object) -> bool:
    """``prctl(option, arg)`` (Linux): whether it succeeded; False where there is no libc."""
    with contextlib.suppress(Exception):
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    return False


def is_subreaper() -> bool:
    """Whether this process is a child subreaper already (Linux; False elsewhere)."""
    import ctypes

    flag = ctypes.c_int(0)
    return prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag)) and bool(flag.value)


def become_subreaper(on: bool = True) -> bool:
    """Orphaned descendants of this process become its children (Linux), or, ``on=False``,
    no longer do; whether it took."""
    return prctl(PR_SET_CHILD_SUBREAPER, int(on))


def named(pids: list[int], names: dict[int, str | None]) -> str:
    """``pid 12 `sleep 300`, pid 13 and 2 more``: leftovers as a line names them."""
    which = ", ".join(
        f"pid {pid}" + (f" `{names[pid]}`" if names.get(pid) else "") for pid in pids[:5]
    )
    return which + (f" and {len(pids) - 5} more" if len(pids) > 5 else "")


@contextlib.contextmanager
def leftovers_stopped(whose: str, grace_s: float) -> Iterator[None]:
    """User code called in a process of hopbus's own (the launcher's check of --model and
    --data, which hopbus worker runs again where it trains): the processes it starts and
    leaves running are stopped at the block's end (SIGTERM, SIGKILL after ``grace_s``) and
    named on stderr, as ``hopbus worker -- COMMAND`` stops what a script leaves. This process
    is a subreaper meanwhile, so a daemon that left its session is found too. Those running
    before the block (an embedded redis-server) are not touched."""
    before = set(descendants())
    was = is_subreaper()  # a process of the API's user may be one already: it stays so
    took = not was and become_subreaper()
    try:
        yield
    finally:
        if took:
            become_subreaper(on=False)
        new = lambda: [p for p in descendants() if p not in before]  # noqa: E731
        names = {pid: command_line(pid) for pid in new()}
        left = _stop(new, grace_s, reap=False)
        _reap_these(left)
        if left:
            print(
                f"hopbus: stopped {len(left)} process{'es' * (len(left) > 1)} that {whose} "
                f"left running: {named(left, names)}",
                file=sys.stderr,
                flush=True,
            )


def proc_stat(pid: int | str) -> list[str] | None:
    """``/proc/PID/stat``'s fields from the third (state) on (``pid`` "self": this process's);
    None if it is gone, or there is no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # pid (comm) state ppid ...: comm may hold spaces and parentheses; it ends at the last ')'
    return stat[stat.rindex(")") + 2 :].split()


def _parents() -> dict[int, tuple[int, str]]:
    """Every live process's parent and state letter, from /proc (zombies included)."""
    found: dict[int, tuple[int, str]] = {}
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:  # no /proc (not Linux): nothing found
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        fields = proc_stat(entry.name)
        if fields is None:
            continue  # gone meanwhile
        found[int(entry.name)] = (int(fields[1]), fields[0])
    return found


def descendants(root: int | None = None) -> list[int]:
    """The live (not zombie) processes below ``root`` (this process), nearest first."""
    root = os.getpid() if root is None else root
    procs = _parents()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        if procs[pid][1] != "Z":
            out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def command_line(pid: int, limit: int = 100) -> str | None:
    """A process's command line as one printable line of at most ``limit`` characters (None
    if it is gone, or not ours to read): a leftover named by what it is, not by its pid."""
    from hopbus.coord.read import text

    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return text(raw.rstrip(b"\0").replace(b"\0", b" "), limit) or None


def _reap() -> None:
    """Collect the exit status of this process's children that have ended (re-parented
    orphans included), so that they leave the process table."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def stop_all(grace_s: float, *, keep: int | None = None) -> list[int]:
    """SIGTERM every process below this one, SIGKILL those still there after ``grace_s``;
    returns the pids it found. ``keep``: a child whose exit status its Popen still has to
    collect (it is signalled, not reaped here)."""
    return _stop(descendants, grace_s, reap=keep is None)


def marked(name: str, value: str) -> list[int]:
    """The live processes (this one aside) whose environment, as they were started with it,
    holds ``name=value``: what a process tree left behind even where the process that would
    have stopped it is gone (killed with SIGKILL, its orphans re-parented to init). A process
    that cleared its environment, or another user's, is not found. Linux only."""
    mark = f"{name}={value}".encode()
    found = []
    for pid, (_, state) in _parents().items():
        if state == "Z" or pid == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if mark in environ.split(b"\0"):
            found.append(pid)
    return found


def stop_marked(name: str, value: str, grace_s: float) -> list[int]:
    """SIGTERM the processes ``marked`` finds, SIGKILL those still there after ``grace_s``;
    returns the pids it found."""
    return _stop(lambda: marked(name, value), grace_s, reap=False)


def _stop(find: Callable[[], list[int]], grace_s: float, *, reap: bool) -> list[int]:
    """SIGTERM what ``find()`` finds, SIGKILL those ``find()`` still finds after ``grace_s``
    (at once on a Ctrl-C meanwhile: no grace left, no orphan). ``reap``: collect the exit
    status of this process's own ended children as it goes."""
    found = find()
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = found
    try:
        while left and time.monotonic() < deadline:
            if reap:
                _reap()
            time.sleep(0.05)  # polling processes that are no children of a Popen of ours
            alive = set(find())
            left = [pid for pid in left if pid in alive]
    except KeyboardInterrupt:  # told to stop now (Ctrl-C, SIGTERM): no grace left, no orphan
        _kill([*left, *find()])
        raise
    _kill(left)
    if reap:
        time.sleep(0.05 if left else 0.0)  # SIGKILL is not instant; reap what it ended
        _reap()
    return found


def _reap_these(pids: list[int], wait_s: float = 1.0) -> None:
    """Collect the exit status of those of ``pids`` that are this process's children (a
    SIGKILL takes a moment), so that they leave the process table; others are not ours."""
    todo = set(pids)
    deadline = time.monotonic() + wait_s
    while todo:
        for pid in list(todo):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    todo.discard(pid)
            except (ChildProcessError, OSError):  # not a child of this process
                todo.discard(pid)
        if not todo or time.monotonic() >= deadline:
            return
        time.sleep(0.02)  # polling: a killed child's status comes within milliseconds


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


__all__ = [
    "become_subreaper",
    "command_line",
    "descendants",
    "leftovers_stopped",
    "marked",
    "named",
    "stop_all",
    "stop_marked",
]
