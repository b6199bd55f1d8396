"""A cluster as docker compose runs it, without docker: ``hopbus create``, then identical
``hopbus worker --run R`` processes (no --id) against a redis-server configured by
broker/redis.conf and broker/users.acl, and ``hopbus watch`` for the summary."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import redis
from cluster import acl_broker, wait_for

from hopbus.coord.client import redact
from hopbus.coord.keys import RunKeys

PASSWORD = "t3st-pa55"


def _hopbus(*args: str) -> list[str]:
    return [sys.executable, "-m", "hopbus", *args]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("HOPBUS_")}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """redis-server with broker/redis.conf and broker/users.acl (cluster.acl_broker)."""
    with acl_broker(tmp_path_factory.mktemp("broker"), PASSWORD) as got:
        yield got


def test_compose_style_run_trains_with_joined_ids(broker, tmp_path):
    _, url = broker
    run = f"join{os.getpid()}"
    n = 4
    p = subprocess.run(
        _hopbus("create", "--run", run, "-n", str(n), "--iterations", "300", "--redis", url),
        capture_output=True, text=True, env=_env(), timeout=60, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == run
    again = subprocess.run(
        _hopbus("create", "--run", run, "--redis", url),
        capture_output=True, text=True, env=_env(), timeout=60, check=False,
    )  # fmt: skip
    assert again.returncode == 2 and "already exists" in again.stderr
    # train refused the same way leaves no results folder behind (it wrote nothing there)
    out = tmp_path / "refused"
    again = subprocess.run(
        _hopbus("train", "--run", run, "--redis", url, "--out", str(out)),
        capture_output=True, text=True, env=_env(), timeout=60, check=False,
    )  # fmt: skip
    assert again.returncode == 2 and "already exists" in again.stderr
    assert "HOPBUS_RUN" not in again.stderr
    assert not out.exists()
    # a HOPBUS_RUN exported for hopbus top or inspect is --run's variable: the refusal says so
    again = subprocess.run(
        _hopbus("train", "--redis", url, "--out", str(out)),
        capture_output=True, text=True, env={**_env(), "HOPBUS_RUN": run}, timeout=60,
        check=False,
    )  # fmt: skip
    assert again.returncode == 2 and "HOPBUS_RUN in your environment names it" in again.stderr
    assert not out.exists()

    worker = ["worker", "--run", run, "--redis", url, "--bind", "tcp://0.0.0.0:0"]
    worker += ["--advertise", "auto"]
    procs = [
        subprocess.Popen(
            _hopbus(*worker), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
        )
        for _ in range(n)
    ]
    try:
        w = subprocess.run(
            _hopbus("watch", "--run", run, "--redis", url, "--out", str(tmp_path), "--json"),
            capture_output=True, text=True, env=_env(), timeout=180, check=False,
        )  # fmt: skip
        outs = [proc.communicate(timeout=60) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert w.returncode == 0, w.stderr
    assert all(proc.returncode == 0 for proc in procs), [e for _, e in outs]
    s = json.loads(w.stdout)
    assert s["finished"] and s["violations"] == 0
    assert s["final_accuracy"] >= 0.90
    assert min(x["final_accuracy"] for x in s["per_worker"]) >= 0.85
    assert s["iterations"]["min"] == s["iterations"]["max"] == 300
    assert json.loads((tmp_path / "summary.json").read_text()) == s
    ids = sorted(int(out.split("hopbus: worker ")[1].split()[0]) for out, _ in outs)
    assert ids == list(range(n))  # unique and contiguous

    extra = subprocess.run(
        _hopbus(*worker), capture_output=True, text=True, env=_env(), timeout=60, check=False
    )
    assert extra.returncode == 2
    # one error line; a warning about this host's own name (loopback here) may come first
    lines = [
        ln for ln in extra.stderr.strip().splitlines() if not ln.startswith("hopbus: warning:")
    ]
    assert lines == [
        f"hopbus: error: run {run} already has its {n} workers (each id is given once, to a "
        f"worker that failed too: hopbus inspect --run {run} --redis {redact(url)} shows them)"
    ], extra.stderr

    client = redis.Redis.from_url(url)
    assert int(client.get(RunKeys(run).joined)) == n + 1
    client.close()

    # hopbus top as the broker's hopbus user: every command it sends is allowed by the ACL
    top = subprocess.run(
        _hopbus("top", "--run", run, "--redis", url, "--once"),
        capture_output=True, text=True, env=_env(), timeout=60, check=False,
    )  # fmt: skip
    assert top.returncode == 0 and "Traceback" not in top.stderr, top.stderr
    rows = [x.split() for x in top.stdout.splitlines() if x.split()[:1] in (["0"], ["1"])]
    assert rows and all(r[1] == "300" for r in rows), top.stdout


def test_broker_refuses_clients_without_the_password(broker):
    port, url = broker
    anonymous = redis.Redis(host="127.0.0.1", port=port)
    with pytest.raises(redis.AuthenticationError):  # NOAUTH: the default user is off
        anonymous.ping()
    wrong = redis.Redis(host="127.0.0.1", port=port, username="hopbus", password="wrong")
    with pytest.raises(redis.AuthenticationError):
        wrong.ping()
    p = subprocess.run(
        _hopbus("inspect", "--list", "--redis", f"redis://127.0.0.1:{port}/0"),
        capture_output=True, text=True, env=_env(), timeout=60, check=False,
    )  # fmt: skip
    assert p.returncode == 1 and "refused" in p.stderr
    hopbus_user = redis.Redis.from_url(url)
    with pytest.raises(redis.exceptions.NoPermissionError):  # outside hop:* keys
        hopbus_user.set("other:key", 1)
    with pytest.raises(redis.exceptions.NoPermissionError):
        hopbus_user.flushall()
    hopbus_user.close()


def test_a_plain_worker_passes_over_an_id_another_was_started_with(redis_url, tmp_path):
    """Fault ``id_then_plain``: worker 0 started with --id 0, then one without --id. The join
    counter's 0 is passed over, held already, and the plain worker takes 1 (it took 0, was
    refused for an --id it was never given, and used that id up)."""
    run = f"mixed{os.getpid()}"
    create = ["create", "--run", run, "-n", "2", "--topology", "ring", "--iterations", "60"]
    p = subprocess.run(_hopbus(*create, "--redis", redis_url), capture_output=True, text=True,
                       env=_env(), timeout=60, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(run)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "env": _env()}
    worker = ["worker", "--run", run, "--redis", redis_url]
    first = subprocess.Popen(_hopbus(*worker, "--id", "0"), **pipes)
    try:
        wait_for(lambda: client.exists(keys.hb(0)), 60, "worker 0 to take its place")
        plain = subprocess.run(_hopbus(*worker), **pipes, timeout=120, check=False)
        _, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert plain.returncode == 0, plain.stderr
    assert "hopbus: worker 1 finished 60 iterations" in plain.stdout
    assert first.returncode == 0, err
    client.close()


@pytest.mark.parametrize("bind", ["ipc:///tmp/hopbus-join-test.sock", "inproc://x"])
def test_a_worker_bound_to_another_transport_than_tcp_is_one_line(redis_url, bind):
    """Fault ``ipc_bind``: hopbus worker --bind ipc://PATH hung forever, saying nothing (its
    socket bound, then its port read from the path, and never closed)."""
    run = f"ipc{os.getpid()}{len(bind)}"
    create = ["create", "--run", run, "-n", "2", "--iterations", "20"]
    p = subprocess.run(_hopbus(*create, "--redis", redis_url), capture_output=True, text=True,
                       env=_env(), timeout=60, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    worker = _hopbus("worker", "--run", run, "--redis", redis_url, "--id", "1", "--bind", bind)
    p = subprocess.run(worker, capture_output=True, text=True, env=_env(), timeout=60, check=False)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "an inbox listens on tcp://HOST:PORT" in line, line


def test_a_worker_waiting_in_vain_quotes_why_the_other_never_appeared(redis_url):
    """Fault ``script_exits_at_once``: worker 0's command (``hopbus worker -- COMMAND``)
    exited 0 without joining, which it told the run's events; worker 1 waited out --timeout
    and blamed a slow start-up. It now quotes worker 0's own failure instead."""
    run = f"gone{os.getpid()}"
    create = ["create", "--run", run, "-n", "2", "--iterations", "20", "--timeout", "4"]
    joins = "import hopbus, numpy; hopbus.join().start({'w': numpy.zeros(3, 'float32')})"
    worker = ["worker", "--run", run, "--redis", redis_url, "--id"]

    def hopbus(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(_hopbus(*args), capture_output=True, text=True, env=_env(),
                              timeout=60, check=False)  # fmt: skip

    p = hopbus(*create, "--model", "script", "--redis", redis_url)
    assert p.returncode == 0, p.stderr
    gone = hopbus(*worker, "0", "--", sys.executable, "-c", "pass")
    assert gone.returncode == 1, gone.stderr
    p = hopbus(*worker, "1", "--", sys.executable, "-c", joins)
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "never appeared; the run's events: worker 0: " in last, last
    assert "slow start-up" not in last, last
    assert "exited 0 without finishing its part of the run" in last, last


@pytest.mark.parametrize("mistake", ["curve_not_asked", "bind_held", "command_typo"])
def test_a_process_refused_before_it_joins_takes_no_id(redis_url, tmp_path, mistake):
    """Faults ``curve_not_asked``, ``bind_held``, ``command_typo``: a worker started without
    --id with a mistake of its own machine (--curve for a run without it, a --bind port another
    process holds, a command that names no program) took an id from the join counter and then
    failed, so the run could never fill: its peers waited for that id in vain. Each is now
    refused, one line, before it takes one; the correct workers then fill the run."""
    run = f"early{os.getpid()}-{mistake}"
    script = mistake == "command_typo"
    create = ["create", "--run", run, "-n", "2", "--iterations", "20", "--redis", redis_url]
    create += ["--model", "script"] if script else []
    p = subprocess.run(_hopbus(*create), capture_output=True, text=True, env=_env(), timeout=60,
                       check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    worker = ["worker", "--run", run, "--redis", redis_url]
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        wrong = {
            "curve_not_asked": ["--curve", str(tmp_path)],
            "bind_held": ["--bind", f"tcp://127.0.0.1:{held.getsockname()[1]}"],
            "command_typo": ["--", "pyhton-no-such-program", "train.py"],
        }[mistake]
        p = subprocess.run(_hopbus(*worker, *wrong), capture_output=True, text=True,
                           env=_env(), timeout=60, check=False)  # fmt: skip
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert {"curve_not_asked": "created without --curve", "bind_held": "cannot bind",
            "command_typo": "no such program on PATH"}[mistake] in line, line  # fmt: skip
    r = redis.Redis.from_url(redis_url)
    assert r.get(RunKeys(run).joined) is None  # no id taken
    assert r.xlen(RunKeys(run).events) == 0  # nothing said to the run
    if script:
        return
    workers = [subprocess.Popen(_hopbus(*worker), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=_env()) for _ in range(2)]  # fmt: skip
    for w in workers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
        assert "finished 20 iterations" in out


def test_a_command_that_cannot_start_after_its_place_was_given_says_so(redis_url, tmp_path):
    """Fault ``bad_shebang``: a script whose #! line names no interpreter passes the check
    that COMMAND names a program, takes an id, and then cannot start: it said 'No such file
    or directory' of a file that exists, and the run heard nothing (its place lost in
    silence). It now names the #! line and tells the run, as a built-in worker that failed
    before taking its place does (join_failed): a process started with --id takes it."""
    run = f"shebang{os.getpid()}"

    def hopbus(command: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(_hopbus(command, "--redis", redis_url, *args), capture_output=True,
                              text=True, env=_env(), timeout=120, check=False)  # fmt: skip

    p = hopbus("create", "--run", run, "-n", "2", "--model", "script", "--iterations", "20")
    assert p.returncode == 0, p.stderr
    script = tmp_path / "train.py"
    script.write_text("#!/no/such/python\nprint(1)\n")
    script.chmod(0o755)
    p = hopbus("worker", "--run", run, "--", str(script))
    assert p.returncode == 1, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "cannot start" in line and "(the interpreter its #! line names?)" in line, line
    kinds = [f[b"kind"] for _, f in redis.Redis.from_url(redis_url).xrange(RunKeys(run).events)]
    assert kinds == [b"join_failed"], kinds
    # the place is taken again by a process started for it; the run trains to its end
    joins = ("import hopbus, numpy\nwith hopbus.join() as ctx:\n"
             "    x = ctx.start({'w': numpy.zeros(3, 'float32')})\n"
             "    while ctx.begin() is not None:\n        ctx.end(x)\n")  # fmt: skip
    good = tmp_path / "good.py"
    good.write_text(joins)
    workers = [subprocess.Popen(_hopbus("worker", "--redis", redis_url, "--run", run, "--id",
                                        str(i), "--", sys.executable, str(good)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
               for i in range(2)]  # fmt: skip
    for w in workers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err.decode()
