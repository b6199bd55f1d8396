"""The real cluster end to end: real redis-server, real worker processes, real sockets.

Each mode trains softmax regression on digits with 8 workers on the ring-based graph; the gaps
replayed from the Redis progress stream must stay within Table 1 and every check must be 0.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
import redis
from cluster import clean_env, hopbus, processes_mentioning, train, train_args, wait_for

from hopbus.coord.keys import RunKeys
from hopbus.runtime.checkpoint import newest_complete

MODES = {
    "standard": ["--mode", "standard"],
    "notify-ack": ["--mode", "notify-ack"],
    "backup": ["--mode", "backup", "--backup", "1"],
    "staleness": ["--mode", "staleness", "--staleness", "3"],
    "hybrid": ["--mode", "hybrid", "--staleness", "3"],
    # a worker 8x slower every iteration makes the jumps of Sec. 5 happen for real
    "skipping": [
        "--mode", "backup", "--skip-max", "4", "--slowdown", "fixed:8@0", "--iter-time", "0.002",
    ],
}  # fmt: skip


@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_trains_digits_within_table1(redis_url, tmp_path, mode):
    flags = ["-n", "8", "--topology", "ring-based", "--iterations", "300", *MODES[mode]]
    p, s = train(redis_url, tmp_path / "run", *flags)
    assert p.returncode == 0, p.stderr
    assert s["finished"] and not s["virtual"]
    per_worker = [w["final_accuracy"] for w in s["per_worker"]]
    assert s["final_accuracy"] >= 0.90, per_worker
    assert min(per_worker) >= 0.85
    assert s["violations"] == 0, s["first_violation"]
    assert s["max_gap"]["any_pair"] <= (s["gap_bound"]["any_pair"] or 10**9)
    assert s["iterations"]["min"] == s["iterations"]["max"] == 300
    assert all(v == 0 for v in s["checks"].values()), s["checks"]
    if s["update_queue_bound"] is not None:
        assert s["max_update_queue"] <= s["update_queue_bound"]
    if mode == "skipping":
        assert s["jumps"] >= 1 and s["skipped_iterations"] >= s["jumps"]
    if mode == "notify-ack":
        assert s["acks"] > 0
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 8 * 300 - s["skipped_iterations"]  # a jump of J is one entry
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == s


TENSORBOARD_TAGS = {
    "train/loss", "test/loss", "test/accuracy", "time/iteration_s", "time/blocked_s",
    "behind_slowest_in_neighbour",
}  # fmt: skip


def test_tensorboard_reads_every_workers_scalars(redis_url, tmp_path):
    """``tensorboard --logdir runs/RUN``: each worker's event file holds every scalar the docs
    list, read back by TensorFlow's own parsers (the writer needs no TensorFlow)."""
    tf = pytest.importorskip("tensorflow", reason="TensorFlow reads the event files back")
    from tensorflow.core.util import event_pb2

    flags = ["-n", "3", "--topology", "ring", "--iterations", "40", "--eval-every", "10"]
    p, s = train(redis_url, tmp_path / "run", *flags, "--iter-time", "0.02")
    assert p.returncode == 0, p.stderr
    for i in range(3):
        (path,) = (tmp_path / "run" / "tensorboard" / f"worker-{i}").glob("events.out.tfevents.*")
        events = [event_pb2.Event.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))]
        scalars = {(v.tag, e.step): v.simple_value for e in events for v in e.summary.value}
        assert {tag for tag, _ in scalars} == TENSORBOARD_TAGS, scalars
        # the last evaluation is the final report's
        w = s["per_worker"][i]
        assert scalars[("test/accuracy", 40)] == pytest.approx(w["final_accuracy"], abs=1e-6)


def test_default_path_embedded_redis(tmp_path):
    """What a new user types first: no flags at all (4 workers, digits, a private Redis)."""
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "hopbus", "train"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert "final test accuracy" in p.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["workers"] == 4 and s["final_accuracy"] >= 0.9
    assert {f.name for f in run_dir.iterdir()} >= {"config.toml", "metrics.jsonl", "summary.json"}
    assert not processes_mentioning(run_dir.name)


def test_ctrl_c_stops_everything(redis_url, tmp_path):
    out = tmp_path / "run"
    flags = ["-n", "4", "--iterations", "100000", "--checkpoint-every", "20", "--json"]
    args, run = train_args(redis_url, out, *flags)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(run)
    wait_for(lambda: newest_complete(out / "checkpoints", 4) is not None, 60, "a checkpoint set")
    proc.send_signal(signal.SIGINT)
    printed, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, repr(err)
    *_, hint, last = err.decode().strip().splitlines()
    assert last == "hopbus: interrupted"
    # how to go on: the set it names is one --resume takes
    stopped = f"hopbus: run {run} stopped; its metrics, summary and logs so far are in {out};"
    assert hint.startswith(f"{stopped} its checkpoints reach iteration "), hint
    assert hint.endswith(f"hopbus train --resume {out} goes on from there")
    # how far it got, said as for any end: strict JSON, not finished, the stop its failure
    s = json.loads((out / "summary.json").read_text(), parse_constant=float.__call__)
    assert not s["finished"] and "interrupted (Ctrl-C or SIGTERM)" in s["failure"]
    assert json.loads(printed) == s  # --json: the same object on stdout, however the run ended
    reached = newest_complete(out / "checkpoints", 4)
    assert reached is not None and s["iterations"]["min"] >= reached - 1, s["iterations"]
    assert not processes_mentioning(run)
    assert client.hget(keys.meta, "status") == b"stopped"
    # its workers' heartbeats went with them: inspect says stopped and clean takes it now,
    # not once the heartbeats have expired
    p = hopbus("inspect", "--run", run, "--redis", redis_url)
    assert p.returncode == 0 and f"run {run} (stopped)" in p.stdout, p.stdout
    p = hopbus("clean", "--run", run, "--redis", redis_url)
    assert p.returncode == 0, p.stderr


def test_a_stop_once_every_worker_is_done_ends_the_run_finished(redis_url, tmp_path):
    """Fault ``late_stop``: SIGTERM reaches hopbus train after every worker reported its
    result and exited 0, before the launcher looked (it is frozen meanwhile, as a busy
    machine might hold it). The run is complete: it ends as finished, with its summary, not
    as stopped."""
    out = tmp_path / "run"
    flags = ["-n", "3", "--iterations", "60", "--iter-time", "0.02", "--eval-every", "0"]
    args, run = train_args(redis_url, out, *flags)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(run)
    wait_for(lambda: client.get(keys.iter(0)) is not None, 60, "worker 0 under way")
    proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: client.hlen(keys.result) == 3, 60, "every result")
        wait_for(lambda: not processes_mentioning(f"--run {run} --id"), 60, "the workers gone")
        proc.send_signal(signal.SIGTERM)
    finally:
        proc.send_signal(signal.SIGCONT)
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    s = json.loads(stdout)
    assert s["finished"] and s["failure"] is None and s["iterations"]["min"] == 60
    assert json.loads((out / "summary.json").read_text())["finished"]
    assert client.hget(keys.meta, "status") == b"finished"


def test_a_worker_that_never_appears_stops_the_run(redis_url, tmp_path):
    env = clean_env(HOPBUS_FAULTS="2:never_register")
    flags = ["-n", "4", "--timeout", "3"]
    args, run = train_args(redis_url, tmp_path / "run", *flags)
    t0 = time.monotonic()
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"hopbus: error: run {run} failed: worker ")
    assert "waited 3 s for worker 2 to register an endpoint" in last
    assert time.monotonic() - t0 < 30
    assert not processes_mentioning(run)


def test_a_crashed_worker_is_named(redis_url, tmp_path):
    env = clean_env(HOPBUS_FAULTS="1:crash_at=20")
    args, run = train_args(redis_url, tmp_path / "run", "-n", "4", "--iterations", "200")
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert p.returncode == 1
    assert "worker 1 exited with status 70" in p.stderr.strip().splitlines()[-1]
    assert not processes_mentioning(run)
    # the survivors' counters as they left (not the zeros of their first heartbeat): each
    # sent its updates of about 20 iterations to its out-neighbours
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert not s["finished"]
    survivors = [w for w in s["per_worker"] if w["worker"] != 1]
    assert all(w["messages"] >= 20 and w["received"] >= 20 for w in survivors), survivors
    assert s["messages"] == sum(w.get("messages", 0) for w in s["per_worker"])
