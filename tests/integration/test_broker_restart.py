"""redis-server killed and started again at the same address mid-run (empty: it keeps nothing
on disk): the workers reconnect, put back their counters and rebuild their token queues from
the invariant, and the run completes; with no Redis coming back, the run stops with one line
and no process is left. Real processes, a real redis-server."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
import redis
from cluster import (
    clean_env,
    hopbus_args,
    processes_mentioning,
    train_args,
    wait_iteration,
    wait_launcher_saw,
)

from hopbus.coord.broker import EmbeddedRedis
from hopbus.coord.keys import RunKeys

FLAGS = ["-n", "4", "--iterations", "200", "--iter-time", "0.02", "--timeout", "20"]
FLAGS += ["--heartbeat", "3", "--eval-every", "0"]


@pytest.fixture
def broker():
    server = EmbeddedRedis(port=0).start()
    yield server
    server.stop()


@pytest.mark.parametrize("mode", ["standard", "backup"])
def test_a_restarted_redis_is_ridden_out(broker, tmp_path, mode):
    """By the workers, by ``hopbus train``, and by a ``hopbus watch`` following the same run
    (as compose's watch service does)."""
    args, run = train_args(broker.url, tmp_path / "run", *FLAGS, "--mode", mode)
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = subprocess.Popen(args, **popen, env=clean_env())
    keys = RunKeys(run)
    with redis.Redis.from_url(broker.url) as client:
        wait_iteration(client, keys, 0, 1)
        watch_args = ["--run", run, "--redis", broker.url, "--out", str(tmp_path / "w"), "--json"]
        watch = subprocess.Popen(hopbus_args("watch", *watch_args), **popen, env=clean_env())
        wait_iteration(client, keys, 0, 50)
    broker.proc.send_signal(signal.SIGKILL)  # everything the run had in Redis is gone
    broker.proc.wait()
    broker.restart()
    out, err = proc.communicate(timeout=180)
    watch_out, watch_err = watch.communicate(timeout=60)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and s["final_accuracy"] >= 0.9
    assert s["checks"]["token_invariant_violations"] == 0
    assert s["violations"] == 0
    assert all(w["iterations"] == 200 for w in s["per_worker"])
    assert sum(w.get("broker_restores", 0) for w in s["per_worker"]) == 4
    assert "Redis is back" in err
    with redis.Redis.from_url(broker.url) as client:  # where each was, for readers that lost
        stream = client.xrange(keys.progress)  # entries with the old stream
    assert sorted(int(f[b"worker"]) for _, f in stream if f.get(b"restore")) == [0, 1, 2, 3]
    assert watch.returncode == 0, watch_err
    w = json.loads(watch_out)
    assert w["finished"] and w["violations"] == 0, watch_err  # (it may not even notice)
    assert not processes_mentioning(run)


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_redis_that_does_not_come_back_stops_the_run(broker, tmp_path, fault):
    """Fault ``killed`` (SIGKILL: connections refused) or ``frozen`` (SIGSTOP: connections
    accepted, nothing answered; each call waits out its socket timeout): either way the run
    stops about --timeout after Redis went (frozen took 80 s with --timeout 8 when every
    end-of-run read waited out redis-py's 5 s)."""
    flags = [*FLAGS[:-4], "--timeout", "5", "--heartbeat", "3", "--eval-every", "0"]
    args, run = train_args(broker.url, tmp_path / "run", *flags)
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
    )
    # the summary has what the launcher had read when Redis went, which may be far behind
    # Redis's counters on a busy machine (CI once saw none read at worker 0's 45th)
    wait_launcher_saw(tmp_path / "run", 30)
    if fault == "killed":
        broker.proc.send_signal(signal.SIGKILL)
        broker.proc.wait()
    else:
        broker.proc.send_signal(signal.SIGSTOP)  # the fixture's stop wakes it to end it
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert time.monotonic() - t0 < 45  # --timeout 5, plus a detection and the ending
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"hopbus: error: run {run}")
    assert "lost Redis" in last and "Traceback" not in err
    assert "--resume" not in err  # no checkpoints: nothing to resume from, none suggested
    assert not processes_mentioning(run)
    # what the progress stream showed before Redis went is kept: metrics and a summary
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert not s["finished"] and "did not come back" in s["failure"]
    # the workers' reports went with Redis: their counts are unknown, not 0
    assert s["messages"] is None and s["checks"]["token_invariant_violations"] is None
    assert s["iterations"]["max"] >= 30
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") >= 30


@pytest.mark.parametrize("mode", ["standard", "backup"])
def test_a_redis_restored_from_a_stale_snapshot_is_ridden_out(broker, tmp_path, mode):
    """Fault ``stale_snapshot``: a stock redis-server saves snapshots and loads the last one
    when it starts. Saved at iteration 50 and killed near 150, it comes back holding every
    counter, token queue and heartbeat 100 iterations old. The workers notice another broker
    instance (Redis's run id), trust nobody's state until its owner has put it back, and the
    run completes with every check at 0."""
    flags = ["-n", "4", "--iterations", "300", "--iter-time", "0.02", "--timeout", "20"]
    flags += ["--heartbeat", "3", "--eval-every", "0", "--mode", mode]
    args, run = train_args(broker.url, tmp_path / "run", *flags)
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = subprocess.Popen(args, **popen, env=clean_env())
    keys = RunKeys(run)
    with redis.Redis.from_url(broker.url) as client:
        wait_iteration(client, keys, 0, 50)
        client.save()  # what a stock server does on its own, every few minutes
        wait_iteration(client, keys, 0, 150)
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait()
    broker.restart()  # loads dump.rdb: the run as it was at iteration 50
    with redis.Redis.from_url(broker.url) as client:
        assert client.exists(keys.meta), "the snapshot was loaded"
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and s["violations"] == 0
    assert all(v == 0 for v in s["checks"].values()), s["checks"]
    assert s["lost_workers"] == []  # nobody was taken for dead at a stale iteration
    assert all(w["iterations"] == 300 for w in s["per_worker"])
    assert sum(w.get("broker_restores", 0) for w in s["per_worker"]) == 4
    assert not processes_mentioning(run)


def test_workers_that_ended_before_an_empty_restart_fail_the_run_in_time(broker, tmp_path):
    """Fault ``restart_after_some_finished``: workers 0 and 1 reach the end and leave, slow
    worker 2 is a few iterations short when Redis restarts empty. Their counters never come
    back, nor their reports; worker 2 cannot rebuild its token queues. The run fails within
    --timeout, saying so, instead of waiting forever."""
    flags = ["-n", "3", "--iterations", "60", "--iter-time", "0.02", "--slowdown", "fixed:10@2"]
    flags += ["--timeout", "5", "--heartbeat", "2", "--eval-every", "0"]
    args, run = train_args(broker.url, tmp_path / "run", *flags)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env())  # fmt: skip
    keys = RunKeys(run)
    with redis.Redis.from_url(broker.url) as client:
        wait_iteration(client, keys, 0, 60)  # worker 2 is then within --max-ig 5 of the end,
        wait_iteration(client, keys, 1, 60)  # 0.2 s an iteration
        assert int(client.get(keys.iter(2))) < 60
    broker.proc.send_signal(signal.SIGKILL)
    broker.proc.wait()
    broker.restart()
    _, err = proc.communicate(timeout=120)
    # the usual end: worker 2 waits --timeout for their counters and fails, naming the cause;
    # where it got through on the queues as they were, the token invariant check fails (3)
    said = {1: "to put its state back in Redis", 3: "invariant check failed"}
    assert proc.returncode in said and said[proc.returncode] in err, (proc.returncode, err)
    assert not processes_mentioning(run)
