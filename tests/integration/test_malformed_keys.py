"""Whatever is written into a live run's keys, no reader prints a traceback.

Hypothesis writes random and malformed values into every key type of a run that ``hopbus
train`` is running and ``hopbus watch`` is following (strings where lists belong, garbage
fields in its streams, numbers out of range, NaN, broken JSON, binary). After each write
``hopbus top``'s and ``hopbus inspect``'s readers take a frame in this process and render it as
the commands would (inspect's table and its JSON, top's view), and may only refuse with a
one-line error (a UserError or a Redis error the CLI prints as one line). A write that ends
the run (garbage in its stop key, a counter of the wrong type) ends ``train`` and ``watch``:
both must have ended with a ``hopbus:`` line, not a traceback, and the next write meets a new
run, so that every write meets a live launcher and a live watcher. At the end ``top --once``,
``inspect`` and ``clean`` run on the corrupted run as a user types them.
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
from pathlib import Path

import pytest
import redis
from cluster import clean_env, hopbus, hopbus_args, train_args, wait_for, wait_iteration
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from hopbus.cli import render
from hopbus.cli.top import view
from hopbus.coord.keys import RunKeys
from hopbus.coord.snapshot import snapshot
from hopbus.coord.top import TopReader
from hopbus.errors import UserError
from hopbus.jsonout import dumps

N = 3

garbage = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"nan", b"inf", b"-1", b"99999999999999999999999", b"1e400", b"{", b"[]",
                     b'{"iterations": "x"}', b"null", b"\xff\xfe", b"0" * 300,
                     # digits Python's int() reads (or raises on) and Redis's Lua does not
                     "²".encode(), "１".encode(), "٣".encode(),
                     # rich's markup: a closing tag of nothing raised, a link linked
                     b"[/x]", b"[link=https://evil.example/x][blink]gpu[/][/link]",
                     b'{"iterations": 30, "messages": 1' + b"0" * 400 + b"}"]),
    st.integers(-(2**70), 2**70).map(lambda i: str(i).encode()),
)  # fmt: skip
worker = st.one_of(st.integers(-1, N + 2).map(str), st.sampled_from(["²", "１"]))
field_names = st.sampled_from(
    ["worker", "iter", "jump", "t", "loss", "wait_s", "blocked_on", "dead", "restore", "kind",
     "message", "eval_loss", "x"]
)  # fmt: skip


def _write(client: redis.Redis, keys: RunKeys, kind: str, who: str, value: bytes, fields) -> None:
    """One corruption of the run's keys: ``kind`` names the key type."""
    if kind == "string":  # counters, floors, heartbeats, the stop key: a value
        key = [keys.iter(who), keys.floor(who), keys.hb(who), keys.stop][len(fields) % 4]
        client.set(key, value)
    elif kind == "hash":  # meta, addr, results, stats, incarnations, marks, initial, sketch
        key = [keys.meta, keys.addr, keys.result, keys.stats(who), keys.incarnation,
               keys.marks, keys.initial, keys.sketch][len(value) % 8]  # fmt: skip
        field = ("config", "status")[len(value) % 2] if key == keys.meta else who
        client.hset(key, field, value)
    elif kind == "set":
        client.sadd([keys.dead, keys.joining][len(value) % 2], value or b"x")
    elif kind == "stream":
        key = [keys.progress, keys.events][len(value) % 2]
        client.xadd(key, {name: v for name, v in fields} or {"x": value})
    elif kind == "wrong_type":  # a key of the run holding another type than its readers expect
        key = [keys.tok(0, 1), keys.iter(who), keys.addr, keys.progress][len(value) % 4]
        client.delete(key)
        client.set(key, value) if key != keys.iter(who) else client.rpush(key, value or b"x")
    elif kind == "list":
        client.rpush(keys.tok(int(who) % N, (int(who) + 1) % N), value or b"x")


class LiveRun:
    """A ``hopbus train`` run and a ``hopbus watch`` of it, started again when a write has ended
    them, after checking how they ended. Their output goes to files (a full pipe would stall
    them)."""

    def __init__(self, redis_url: str, folder: Path) -> None:
        self.url, self.folder, self.runs = redis_url, folder, 0
        self.client = redis.Redis.from_url(redis_url)
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []
        self.keys = RunKeys("none")

    def _popen(self, name: str, args: list[str]) -> None:
        err = self.folder / f"{name}-{self.runs}.err"
        with open(err, "w") as fh:
            p = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=fh, text=True, env=clean_env()
            )
        self.procs.append((name, p, err))

    def start(self) -> None:
        self.runs += 1
        out = self.folder / f"run-{self.runs}"
        flags = ["-n", str(N), "--topology", "complete", "--iterations", "100000"]
        flags += ["--iter-time", "0.005", "--timeout", "10", "--heartbeat", "2"]
        args, run = train_args(self.url, out, *flags)
        self.keys = RunKeys(run)
        self.procs = []
        self._popen("train", args)
        wait_iteration(self.client, self.keys, 0, 5)
        watch = ["watch", "--run", run, "--redis", self.url, "--out", f"{out}-watch"]
        self._popen("watch", hopbus_args(*watch))

    def _newest_entry(self) -> bytes | None:
        """The progress stream's newest id (None while it is not a stream)."""
        try:
            newest = self.client.xrevrange(self.keys.progress, count=1)
        except redis.ResponseError:
            return None
        return newest[0][0] if newest else b"0-0"

    def settle(self) -> None:
        """Until the run has taken a write in: workers entered iterations after it (3 progress
        entries), or the launcher ended. The next write then meets a run that went on, or a
        new one; a write that froze the run without ending it fails here."""
        after = self._newest_entry()

        def moved_or_ended() -> bool:
            if self.procs[0][1].poll() is not None:
                return True
            if after is None:
                return False
            with contextlib.suppress(redis.ResponseError):  # the stream replaced meanwhile
                return len(self.client.xrange(self.keys.progress, b"(" + after, count=3)) == 3
            return False

        wait_for(moved_or_ended, 90, f"run {self.keys.run} to go on or end after a write")

    def ensure(self) -> None:
        """A live run for the next write: if the last write ended this one, check how."""
        if self.procs[0][1].poll() is not None:
            self.end(stopped_by_us=False)
            self.start()

    def end(self, *, stopped_by_us: bool) -> None:
        """Stop what still runs and check both ended without a traceback: after a write ended
        the run, each with status 0 or a last line of its own (``hopbus: ...``)."""
        for _, p, _ in self.procs:
            if stopped_by_us and p.poll() is None:
                p.terminate()
        for name, p, err in self.procs:
            try:
                code = p.wait(timeout=90)  # watch: a run that ended is seen ended
            except subprocess.TimeoutExpired:
                p.kill()
                pytest.fail(f"{name} of run {self.keys.run} did not end after the run ended")
            text = err.read_text()
            assert "Traceback" not in text, (name, text)
            if not stopped_by_us:
                lines = text.strip().splitlines()
                assert code == 0 or (lines and lines[-1].startswith("hopbus: ")), (name, text)


@pytest.fixture(scope="module")
def live_run(redis_url, tmp_path_factory):
    live = LiveRun(redis_url, tmp_path_factory.mktemp("malformed"))
    live.start()
    yield live
    live.end(stopped_by_us=True)


def _read_as_the_cli_does(client: redis.Redis, keys: RunKeys) -> None:
    """inspect's snapshot as a table and as JSON, and top's view, rendered off-screen."""
    console = Console(file=io.StringIO(), width=120)
    snap = snapshot(client, keys, last=5)
    render.inspect(console, snap)
    dumps(snap)
    console.print(view(TopReader(client, keys).frame()))


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    kind=st.sampled_from(["string", "hash", "set", "stream", "wrong_type", "list"]),
    who=worker,
    value=garbage,
    fields=st.lists(st.tuples(field_names, garbage), max_size=4),
)
def test_any_value_in_any_key_gets_a_line_never_a_traceback(live_run, kind, who, value, fields):
    live_run.ensure()
    client, keys = live_run.client, live_run.keys
    if kind == "list" and not re.fullmatch(r"-?[0-9]+", who):
        who = "0"
    with contextlib.suppress(redis.ResponseError):  # an earlier example changed the key's type
        _write(client, keys, kind, who if kind != "list" else str(abs(int(who))), value,
               fields or [("iter", value)])  # fmt: skip
    with contextlib.suppress(UserError, redis.RedisError):  # the CLI prints one line
        _read_as_the_cli_does(client, keys)
    live_run.settle()


def test_the_corrupted_run_ends_without_a_traceback(live_run, redis_url):
    """At the end, one write that surely ends the run (garbage with control characters in its
    stop key): train and watch end with a line of their own; then the CLI on what is left."""
    live_run.ensure()
    live_run.client.set(live_run.keys.stop, b"\x1b[31mgarbage\xff\n")
    live_run.end(stopped_by_us=False)
    run = live_run.keys.run
    for args in (
        ["top", "--run", run, "--redis", redis_url, "--once"],
        ["inspect", "--run", run, "--redis", redis_url],
        ["inspect", "--run", run, "--redis", redis_url, "--json"],
        ["clean", "--run", run, "--redis", redis_url, "--force"],
    ):
        p = hopbus(*args, timeout=120)
        assert "Traceback" not in p.stderr, (args, p.stderr)
        assert p.returncode == 0 or p.stderr.strip().splitlines()[-1].startswith("hopbus: "), (
            args,
            p.stderr,
        )
