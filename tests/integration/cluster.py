"""Running the real cluster from tests: ``hopbus train`` as a subprocess against the tests'
redis-server, each run under its own id and folder."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

_ids = itertools.count()


class Collector:
    """An on_message callback that records messages and lets a test wait for a condition
    (up to 20 s: the deadline only decides how long a broken build takes to fail)."""

    def __init__(self) -> None:
        self.messages: list = []
        self._cond = threading.Condition()

    def __call__(self, msg) -> None:
        with self._cond:
            self.messages.append(msg)
            self._cond.notify_all()

    def wait_for(self, pred: Callable[[list], bool]) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: pred(self.messages), 20.0), "timed out"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOPBUS_")}
    env.update(extra)
    return env


def hopbus_args(*args: str) -> list[str]:
    """The command line of ``python -m hopbus ARGS``, with this interpreter."""
    return [sys.executable, "-m", "hopbus", *args]


def hopbus(*args: str, env: dict[str, str] | None = None, timeout: float = 60):
    """``python -m hopbus ARGS`` to its end, output captured (a short command: create, a
    refused worker, inspect)."""
    return subprocess.run(
        hopbus_args(*args),
        capture_output=True,
        text=True,
        env=env or clean_env(),
        timeout=timeout,
        check=False,
    )


def script_workers(
    run: str,
    command: Sequence[str],
    env: dict[str, str],
    ids: Iterable[int | None],
    cwd: Path | None = None,
) -> list[subprocess.Popen]:
    """Hand-started ``hopbus worker --run RUN [--id I] -- COMMAND``, one per id (None: the id
    Redis gives it), as on other machines; stdout and stderr piped, as text."""
    return [
        subprocess.Popen(
            hopbus_args(
                "worker", "--run", run, *([] if i is None else ["--id", str(i)]), "--", *command
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        for i in ids
    ]


def train_args(redis_url: str, out: Path, *flags: str) -> tuple[list[str], str]:
    run = f"t{os.getpid()}-{next(_ids)}"
    args = hopbus_args("train", "--redis", redis_url, "--run", run)
    return [*args, "--out", str(out), "--json", *flags], run


def train(
    redis_url: str, out: Path, *flags: str, env: dict[str, str] | None = None, timeout: float = 240
) -> tuple[subprocess.CompletedProcess, dict | None]:
    args, _ = train_args(redis_url, out, *flags)
    p = subprocess.run(
        args, capture_output=True, text=True, env=env or clean_env(), timeout=timeout, check=False
    )
    summary = json.loads(p.stdout) if p.stdout.strip() else None
    return p, summary


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (to prove nothing was left running)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def redis_commands_of(client, pid: int) -> list[str]:
    """The last command of each of process ``pid``'s connections to ``client``'s Redis, as
    CLIENT LIST tells (``blpop`` while it waits for a token): its sockets' local ports, read
    from /proc, matched against the clients' addresses. Linux only."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as fh:
            for line in fh.readlines()[1:]:
                cols = line.split()
                if cols[9] in inodes:
                    ports.add(int(cols[1].rpartition(":")[2], 16))
    return [c["cmd"] for c in client.client_list() if int(c["addr"].rpartition(":")[2]) in ports]


def env_without(package: str, folder: Path) -> dict[str, str]:
    """An environment in which ``import PACKAGE`` fails, installed or not: a sitecustomize in
    ``folder`` (put on PYTHONPATH) inserts a finder first on sys.meta_path that refuses it. For
    the tests of what a user without an optional extra sees."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import sys\n\n\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {package!r} or name.startswith({package + '.'!r}):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r} (hidden)', name=name)\n"
        "        return None\n\n\n"
        "sys.meta_path.insert(0, Hide())\n"
    )
    return clean_env(PYTHONPATH=str(folder))


def follow_through(
    watch: subprocess.Popen, workers: list[subprocess.Popen], act, timeout: float = 120
) -> tuple[str, str]:
    """``act()`` (a fault injected) while ``watch`` follows a run of hand-started ``workers``,
    then the watch and every worker to their end, killing what is left should that fail:
    the watch's stdout and stderr."""
    try:
        act()
        out, err = watch.communicate(timeout=timeout)
        for p in workers:
            p.communicate(timeout=timeout)
    finally:
        for p in [*workers, watch]:
            if p.poll() is None:
                p.kill()
    return out, err


def wait_for(predicate, timeout: float, what: str):
    """``predicate()``'s first truthy value, polled until ``timeout`` seconds have passed (an
    observable condition another process brings about), or AssertionError naming ``what``."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)  # polling an observable condition, with a deadline
    raise AssertionError(f"timed out waiting for {what}")


def wait_iteration(client, keys, worker: int, at: int, timeout: float = 120) -> None:
    """Until worker ``worker``'s iteration counter in Redis reaches ``at``."""
    wait_for(
        lambda: int(client.get(keys.iter(worker)) or 0) >= at,
        timeout,
        f"worker {worker} to reach iteration {at}",
    )


def metrics_lines(path: Path) -> list[dict]:
    """metrics.jsonl's whole lines (a SIGKILLed writer may leave half of one at the end)."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


def wait_launcher_saw(out: Path, at: int, timeout: float = 120) -> None:
    """Until the launcher writing to the folder ``out`` has read some worker's entry of
    iteration ``at`` (it flushes metrics.jsonl after every read): Redis's counters run ahead
    of what a busy launcher has read."""
    wait_for(
        lambda: any(e["iter"] >= at for e in metrics_lines(out / "metrics.jsonl")),
        timeout,
        f"the launcher to read iteration {at}",
    )


@contextlib.contextmanager
def acl_broker(folder: Path, password: str):
    """redis-server with the broker's own config and ACL file (the password added, the port
    and bind address the test's), as the compose redis service runs it: the hopbus user alone
    may log in. Yields (port, url of the hopbus user)."""
    from hopbus.coord.broker import find_redis_server, free_port
    from hopbus.coord.client import connect

    root = Path(__file__).resolve().parents[2]
    acl = (root / "broker" / "users.acl").read_text().splitlines()
    # the password on the hopbus user's line, where broker/start.sh puts it (hashed there)
    acl = [f"{x} >{password}" if x.startswith("user hopbus ") else x for x in acl]
    assert any(x.startswith("user hopbus ") for x in acl)
    (folder / "users.acl").write_text("\n".join(acl) + "\n")
    port = free_port()
    args = [
        find_redis_server(),
        str(root / "broker" / "redis.conf"),
        *("--aclfile", str(folder / "users.acl"), "--port", str(port), "--bind", "127.0.0.1"),
        *("--dir", str(folder)),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://hopbus:{password}@127.0.0.1:{port}/0"
    try:
        connect(url, timeout=15).close()  # retries until the server answers
        yield port, url
    finally:
        proc.terminate()
        proc.wait(10)
