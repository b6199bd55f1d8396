"""Whatever is written into a live run's keys, no reader prints a traceback.

Hypothesis writes random and malformed values into every key type of a run that
``hopbus train`` is running (strings where lists belong, garbage fields in its streams,
numbers out of range, NaN, broken JSON, binary): after each write ``hopbus top``'s and
``hopbus inspect``'s readers take a frame in this process, and may only refuse with a
one-line error (a UserError or a Redis error the CLI prints as one line). At the end ``train``
itself, ``hopbus watch``, ``top --once`` and ``inspect --json`` must end without a traceback.
"""

from __future__ import annotations

import contextlib
import subprocess

import pytest
import redis
from cluster import clean_env, hopbus, train_args, wait_iteration
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hopbus.coord.keys import RunKeys
from hopbus.coord.snapshot import snapshot
from hopbus.coord.top import TopReader
from hopbus.errors import UserError

N = 3

garbage = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"nan", b"inf", b"-1", b"99999999999999999999999", b"1e400", b"{", b"[]",
                     b'{"iterations": "x"}', b"null", b"\xff\xfe", b"0" * 300]),
    st.integers(-(2**70), 2**70).map(lambda i: str(i).encode()),
)  # fmt: skip
worker = st.integers(-1, N + 2).map(str)
field_names = st.sampled_from(
    ["worker", "iter", "jump", "t", "loss", "wait_s", "blocked_on", "dead", "restore", "kind",
     "message", "eval_loss", "x"]
)  # fmt: skip


def _write(client: redis.Redis, keys: RunKeys, kind: str, who: str, value: bytes, fields) -> None:
    """One corruption of the run's keys: ``kind`` names the key type."""
    if kind == "string":  # counters, floors, heartbeats, the stop key: a value
        key = {"iter": keys.iter(who), "floor": keys.floor(who), "hb": keys.hb(who)}.get(
            fields[0][0], keys.stop
        )
        client.set(key, value)
    elif kind == "hash":  # meta, addr, results, stats, incarnations, marks, initial, sketch
        key = [keys.meta, keys.addr, keys.result, keys.stats(who), keys.incarnation,
               keys.marks, keys.initial, keys.sketch][len(value) % 8]  # fmt: skip
        field = "config" if key == keys.meta and len(value) % 2 else who
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


@pytest.fixture(scope="module")
def live_run(redis_url, tmp_path_factory):
    out = tmp_path_factory.mktemp("malformed") / "run"
    flags = ["-n", str(N), "--topology", "complete", "--iterations", "100000"]
    flags += ["--iter-time", "0.005", "--timeout", "10", "--heartbeat", "2"]
    args, run = train_args(redis_url, out, *flags)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env())  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    wait_iteration(client, RunKeys(run), 0, 5)
    yield client, RunKeys(run), proc
    proc.terminate()
    proc.communicate(timeout=60)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    kind=st.sampled_from(["string", "hash", "set", "stream", "wrong_type", "list"]),
    who=worker,
    value=garbage,
    fields=st.lists(st.tuples(field_names, garbage), max_size=4),
)
def test_any_value_in_any_key_gets_a_line_never_a_traceback(live_run, kind, who, value, fields):
    client, keys, _ = live_run
    if kind == "list" and not who.lstrip("-").isdigit():
        who = "0"
    with contextlib.suppress(redis.ResponseError):  # an earlier example changed the key's type
        _write(client, keys, kind, who if kind != "list" else str(abs(int(who))), value,
               fields or [("iter", value)])  # fmt: skip
    for read in (lambda: snapshot(client, keys, last=5), lambda: TopReader(client, keys).frame()):
        with contextlib.suppress(UserError, redis.RedisError):  # the CLI prints one line
            read()


def test_the_corrupted_run_ends_without_a_traceback(live_run, redis_url, tmp_path):
    client, keys, proc = live_run
    for args in (
        ["top", "--run", keys.run, "--redis", redis_url, "--once"],
        ["inspect", "--run", keys.run, "--redis", redis_url, "--json"],
        ["watch", "--run", keys.run, "--redis", redis_url, "--out", str(tmp_path / "w")],
        ["clean", "--run", keys.run, "--redis", redis_url, "--force"],
    ):
        if args[0] == "watch":
            client.set(keys.stop, "stopped by the test")  # so that it ends
        p = hopbus(*args, timeout=120)
        assert "Traceback" not in p.stderr, (args, p.stderr)
        assert p.returncode == 0 or p.stderr.strip().splitlines()[-1].startswith("hopbus: "), (
            args,
            p.stderr,
        )
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
