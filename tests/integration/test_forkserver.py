"""The fork server that starts a run's nodes (hopbus/runtime/forkserver.py), with real processes:
a forked node looks, logs and ends as one started the plain way, dies with its server, and a
server that cannot start leaves the launcher to start the nodes itself."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis
from cluster import clean_env, processes_mentioning, train, train_args, wait_for, wait_iteration

from hopbus.coord.keys import RunKeys
from hopbus.runtime import forkserver


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [w.decode() for w in raw.rstrip(b"\0").split(b"\0")]


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _server(nodes: list[tuple[list[str], Path, str]], run: str):
    server, forked = forkserver.ForkServer.launch(clean_env(), run, nodes)
    assert server is not None
    return server, forked


def test_a_forked_node_looks_logs_and_ends_as_a_started_one(redis_url, tmp_path):
    run = f"fork{os.getpid()}"
    waits = ["watch", "--run", f"{run}-none", "--redis", redis_url, "--out", str(tmp_path / "w")]
    nodes = [
        (waits, tmp_path / "waits.log", "hop-watch"),
        (["--help"], tmp_path / "help.log", "hop-help"),
        (["worker", "--run", run, "--id", "x"], tmp_path / "bad.log", "hop-bad"),
    ]
    server, forked = _server(nodes, run)
    assert forked is not None
    watch, helps, bad = forked
    assert helps.wait(60) == 0 and "Usage" in (tmp_path / "help.log").read_text()
    assert bad.wait(60) == 2 and "--id" in (tmp_path / "bad.log").read_text()
    # ps, pgrep -f and /proc show each node's own command line and a short name
    wait_for(lambda: _cmdline(watch.pid) == forkserver.command_line(waits), 30, "its title")
    assert _comm(watch.pid) == "hop-watch"
    assert os.getpgid(watch.pid) == watch.pid  # a session of its own, as start_new_session
    with pytest.raises(subprocess.TimeoutExpired):
        watch.wait(0.2)
    watch.send_signal(signal.SIGTERM)  # as Ctrl-C forwarded: it stops as interrupted
    assert watch.wait(60) == 130
    server.close()
    assert server.proc.returncode == 0 and server.died() is None
    assert not processes_mentioning(run)


def test_a_killed_server_takes_its_nodes_with_it(redis_url, tmp_path):
    run = f"forkkill{os.getpid()}"
    waits = ["watch", "--run", f"{run}-none", "--redis", redis_url, "--out", str(tmp_path / "w")]
    nodes = [(waits, tmp_path / f"{i}.log", f"hop-w{i}") for i in range(2)]
    server, forked = _server(nodes, run)
    assert forked is not None
    wait_for(lambda: all(_cmdline(f.pid) == forkserver.command_line(waits) for f in forked),
             30, "both nodes")  # fmt: skip
    os.kill(server.proc.pid, signal.SIGKILL)
    assert [f.wait(60) for f in forked] == [forkserver.GONE_CODE] * 2
    assert server.died() == "was killed by SIGKILL"
    assert set(server.orphaned) == {f.pid for f in forked}
    assert not processes_mentioning(run)


def test_a_run_whose_server_is_killed_stops_and_says_why(redis_url, tmp_path):
    """Fault ``forkserver_killed``: kill -9 of the process the workers were forked from."""
    args, run = train_args(redis_url, tmp_path / "r", "-n", "3", "--iterations", "100000",
                           "--iter-time", "0.01")  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True,
                                       env=clean_env())  # fmt: skip
    wait_iteration(redis.Redis.from_url(redis_url), RunKeys(run), 0, 5)
    servers = [p for p in processes_mentioning(run) if "hopbus.runtime.forkserver" in _cmdline(p)]
    assert len(servers) == 1, servers
    os.kill(servers[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert "was stopped with hopbus's fork server" in last, last
    assert "which started it and was killed by SIGKILL" in last, last
    assert "Traceback" not in err
    assert not processes_mentioning(run)


def test_without_a_server_the_nodes_start_the_plain_way(redis_url, tmp_path):
    """HOPBUS_FORKSERVER=0; a server that dies as it starts (a sitecustomize that ends it,
    and only it); fault ``forkserver_stopped_at_start``: one stopped (kill -STOP) before it
    answers, which the launcher waited out for two minutes. Each way the run trains as it
    would have, and the two failures are said in a note."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, signal\n"
        "with open('/proc/self/cmdline', 'rb') as fh:\n"
        "    if b'hopbus.runtime.forkserver' in fh.read():\n"
        "        if os.environ.get('FORKSERVER_FAULT') == 'exit':\n"
        "            raise SystemExit(3)\n"
        "        os.kill(os.getpid(), signal.SIGSTOP)\n"
    )
    ways = [clean_env(HOPBUS_FORKSERVER="0")]
    ways += [clean_env(PYTHONPATH=str(site), FORKSERVER_FAULT=f) for f in ("exit", "stop")]
    for i, env in enumerate(ways):
        started = time.monotonic()
        p, s = train(redis_url, tmp_path / f"r{i}", "-n", "2", "--iterations", "30", env=env)
        assert p.returncode == 0, p.stderr
        assert s is not None and s["finished"] and s["iterations"]["min"] == 30, s
        said = "hopbus's fork server did not answer: the workers were started one by one"
        assert (said in p.stderr) == (i > 0), p.stderr
        assert time.monotonic() - started < forkserver.ANSWER_S, "it waited the server out"


def test_ctrl_c_with_a_stopped_server_still_ends_the_run(redis_url, tmp_path):
    """Fault ``forkserver_stopped``: kill -STOP of the fork server, then Ctrl-C. Its nodes
    end but it cannot collect them: the launcher waited forever. Now it kills the server,
    sees its nodes gone, and ends as stopped; nothing is left, zombies included."""
    args, run = train_args(redis_url, tmp_path / "r", "-n", "3", "--iterations", "100000",
                           "--iter-time", "0.01")  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env())  # fmt: skip
    wait_iteration(redis.Redis.from_url(redis_url), RunKeys(run), 0, 5)
    servers = [p for p in processes_mentioning(run) if "hopbus.runtime.forkserver" in _cmdline(p)]
    assert len(servers) == 1, servers
    os.kill(servers[0], signal.SIGSTOP)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not processes_mentioning(run)
    wait_for(lambda: not Path(f"/proc/{servers[0]}").exists(), 30, "the server to go")


def test_a_node_with_a_very_long_command_line_still_forks(redis_url, tmp_path):
    """Room for a node's command line of 300 kB (a script given every file of a folder):
    one blank argument that long was refused by Linux (E2BIG), and the run stopped."""
    run = f"forklong{os.getpid()}"
    waits = ["watch", "--run", f"{run}-none", "--redis", redis_url, "--out", str(tmp_path / "w")]
    server = forkserver.ForkServer(clean_env(), run, 300_000)
    (watch,) = server.start([(waits, tmp_path / "w.log", "hop-watch")]) or [None]
    assert watch is not None
    assert len(Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()) >= 300_000
    wait_for(lambda: _cmdline(watch.pid) == forkserver.command_line(waits), 30, "its title")
    watch.send_signal(signal.SIGTERM)
    assert watch.wait(60) == 130
    server.close()
    assert server.proc.returncode == 0
