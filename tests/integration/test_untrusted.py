"""Nothing read from Redis, the data or the wire is trusted, and a run's status tells the truth.

Each test injects one fault by its name, with real processes and a real redis-server:
``diverging_lr``, ``nan_in_svmlight``, ``nan_in_checkpoint``, ``forged_progress``,
``forged_report``, ``secret_in_a_data_error``, ``stray_worker``, ``killed_launcher``,
``never_started``, ``gave_up_alone``, ``late_watch``, ``interrupted_watch``, ``forged_endpoint``,
``escape_in_a_run_id``, ``immortal_heartbeat``, ``per_run_user``, ``code_named_in_redis``,
``garbled_incarnation``, ``clean_under_workers``, ``forged_floor``, ``deleted_progress``,
``deleted_stream``, ``forged_dead``, ``garbled_meta``, ``garbled_sketch``, ``garbled_before_join``,
``hang_before_report`` with a freeze, ``unicode_digits``, ``escape_in_an_entry``,
``unmarked_dead``, ``negative_join_counter``, ``forged_start``, ``lost_mark``, ``rewritten_config``,
``starting_run``, ``forged_created``, ``forged_stats``, ``forged_beat``,
``broker_out_of_memory``, ``output_refused``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import redis
from cluster import (
    clean_env,
    hopbus,
    hopbus_args,
    processes_mentioning,
    train,
    train_args,
    wait_for,
    wait_iteration,
)

from hopbus.coord.broker import EmbeddedRedis
from hopbus.coord.keys import RunKeys
from hopbus.runtime import checkpoint


def strict(text: str):
    """JSON as a strict reader takes it: NaN, Infinity and -Infinity refused."""

    def refuse(name: str):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def error_lines(stderr: str) -> list[str]:
    return [x for x in stderr.splitlines() if x.startswith("hopbus: error:")]


def test_diverging_lr_stops_the_run_and_the_results_stay_strict_json(redis_url, tmp_path):
    """Fault ``diverging_lr``: --lr 1000000 makes every model NaN within a few iterations."""
    out = tmp_path / "run"
    p, s = train(redis_url, out, "-n", "4", "--iterations", "100", "--lr", "1000000")
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    (line,) = error_lines(p.stderr)
    assert "diverged in iteration" in line and "(lower --lr, now 1e+06)" in line, line
    summary = strict((out / "summary.json").read_text())
    assert summary == s or s is None
    d = summary["diverged"]
    assert d is not None and f"worker {d['worker']} diverged in iteration {d['iteration']}" in line
    assert not summary["finished"]
    for row in (out / "metrics.jsonl").read_text().splitlines():
        strict(row)
    strict(p.stdout)  # the --json summary on stdout too


def test_inspect_and_watch_of_a_diverged_run_stay_strict(redis_url, tmp_path):
    args, run = train_args(redis_url, tmp_path / "run", "-n", "3", "--topology", "ring")
    args += ["--iterations", "60", "--lr", "1e6"]
    subprocess.run(args, capture_output=True, text=True, env=clean_env(), timeout=120, check=False)
    inspect = hopbus("inspect", "--run", run, "--redis", redis_url, "--json")
    assert inspect.returncode == 0, inspect.stderr
    snap = strict(inspect.stdout)
    assert snap["status"] == "failed"
    watch = hopbus("watch", "--run", run, "--redis", redis_url, "--out", str(tmp_path / "w"))
    assert watch.returncode == 1 and "Traceback" not in watch.stderr, watch.stderr
    strict((tmp_path / "w" / "summary.json").read_text())


def test_nan_in_an_svmlight_file_is_refused_with_file_and_line(tmp_path):
    """Fault ``nan_in_svmlight``."""
    data = tmp_path / "train.svm"
    data.write_text("1 1:0.5 2:1\n# a comment\n0 1:1 2:nan\n1 1:2 2:0\n")
    p = hopbus("train", "-n", "2", "--data", f"svmlight:{data}", "--iterations", "5")
    assert p.returncode == 2
    assert error_lines(p.stderr) == [
        f"hopbus: error: svmlight file '{data}', line 3: field 3 has a value that is not finite"
    ]


def test_a_data_file_that_holds_secrets_is_never_quoted(tmp_path):
    """Fault ``secret_in_a_data_error``: a run's config rewritten in Redis to read
    /proc/self/environ, whose first line holds the Redis URL with its password."""
    with EmbeddedRedis(port=0) as server:
        password = "HopSecret-4242"
        server_url = server.url
        admin = redis.Redis.from_url(server_url)
        admin.config_set("requirepass", password)
        url = server_url.replace("redis://", f"redis://:{password}@")
        run = f"leak{os.getpid()}"
        assert hopbus("create", "--run", run, "-n", "2", "--redis", url).returncode == 0
        client = redis.Redis.from_url(url)
        keys = RunKeys(run)
        cfg = json.loads(client.hget(keys.meta, "config"))
        cfg["data"] = "svmlight:/proc/self/environ"
        client.hset(keys.meta, "config", json.dumps(cfg))
        p = subprocess.run(
            hopbus_args("worker", "--run", run, "--id", "0"),
            capture_output=True, text=True, timeout=120, check=False,
            env=clean_env(HOPBUS_REDIS=url),
        )  # fmt: skip
        assert p.returncode != 0
        assert password not in p.stdout + p.stderr
        (line,) = error_lines(p.stderr)
        assert "/proc/self/environ', line 1: its label is not a number" in line
        events = [f for _, f in client.xrange(keys.events)]
        assert password.encode() not in b"".join(v for f in events for v in f.values())


def test_a_corrupt_cifar10_batch_is_one_short_line(tmp_path):
    """A pickle asking for a 2 KB 'global', and labels that do not fit 64 bits."""
    import pickle

    from hopbus.data import DataError
    from hopbus.data.cifar10 import load_cifar10

    folder = tmp_path / "cifar"
    folder.mkdir()
    name = "A" * 2048
    (folder / "data_batch_1").write_bytes(b"\x80\x02c" + name.encode() + b"\nx\n.")
    (folder / "test_batch").write_bytes(b"")
    with pytest.raises(DataError) as info:
        load_cifar10(str(folder))
    assert len(str(info.value)) < 300 and "AAAA" not in str(info.value)
    batch = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [2**70, 1]}
    (folder / "data_batch_1").write_bytes(pickle.dumps(batch, protocol=2))
    with pytest.raises(DataError, match=r"labels are not all in 0\.\.9"):
        load_cifar10(str(folder))


def test_a_checkpoint_that_holds_nan_is_skipped_saying_so(redis_url, tmp_path):
    """Fault ``nan_in_checkpoint``: the newest set holds a NaN; --resume says so and takes the
    set before it."""
    out = tmp_path / "run"
    p, _ = train(redis_url, out, "-n", "2", "--topology", "ring", "--iterations", "60",
                 "--checkpoint-every", "20")  # fmt: skip
    assert p.returncode == 0, p.stderr
    folder = out / "checkpoints"
    assert checkpoint.newest_complete(folder, 2) == 40
    got = checkpoint.load(folder, 1, 40)
    bad = {k: v.copy() for k, v in got.state.params.items()}
    bad["W"].reshape(-1)[3] = np.nan
    got.state.params = bad
    checkpoint.save(folder, 1, 40, got.state, run=got.run)
    for record in ("summary.json", "metrics.jsonl"):  # as if killed before its end: a
        (out / record).unlink()  # finished run is refused
    p = subprocess.run(
        hopbus_args("train", "--resume", str(out), "--redis", redis_url, "--json"),
        capture_output=True, text=True, env=clean_env(), timeout=180, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "skips a newer checkpoint set" in p.stderr and "not all finite numbers" in p.stderr
    assert json.loads(p.stdout)["resumed_from"] == 20


def _start(redis_url: str, tmp_path: Path, *flags: str):
    args, run = train_args(redis_url, tmp_path / "run", *flags)
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
    )
    return proc, run, RunKeys(run)


def _two_workers(redis_url: str, run: str, *flags: str) -> list[subprocess.Popen]:
    """``hopbus create`` of a 2-worker ring run, and its two ``hopbus worker`` processes (no
    launcher: what the run's keys say is all anyone goes by)."""
    created = hopbus("create", "--run", run, "-n", "2", "--topology", "ring", "--eval-every",
                     "0", *flags, "--redis", redis_url)  # fmt: skip
    assert created.returncode == 0, created.stderr
    return _workers(redis_url, run, 2)


def _workers(redis_url: str, run: str, n: int) -> list[subprocess.Popen]:
    """One ``hopbus worker`` process for each of a created run's ``n`` ids."""
    env = clean_env(HOPBUS_REDIS=redis_url)
    return [
        subprocess.Popen(hopbus_args("worker", "--run", run, "--id", str(i)), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(n)
    ]  # fmt: skip


def test_forged_progress_entries_and_reports_fool_no_reader(redis_url, redis_client, tmp_path):
    """Faults ``forged_progress`` and ``forged_report``: entries that no worker wrote (a
    malformed one, one far ahead, one claiming the future, a death and a rejoin of workers
    that never died), a final report for every worker at the last iteration, while the run
    is at a third of it, and a divergence event no worker posted."""
    flags = ["-n", "4", "--iterations", "900", "--iter-time", "0.01", "--eval-every", "0"]
    proc, run, keys = _start(redis_url, tmp_path, *flags)
    wait_iteration(redis_client, keys, 0, 300)
    forged = {"worker": 0, "iterations": 900, "final_accuracy": 0.999, "final_loss": 0.001}
    for i in range(4):
        redis_client.hset(keys.result, str(i), json.dumps({**forged, "worker": i}))
    redis_client.xadd(keys.progress, {"worker": 0, "iter": "abc"})
    redis_client.xadd(keys.progress, {"worker": 1, "iter": 890, "jump": 5})
    redis_client.xadd(keys.progress, {"worker": 2, "iter": 899})
    redis_client.xadd(keys.progress, {"worker": 9, "iter": 2})
    # markers only the death and rejoin scripts write, for workers that never died
    redis_client.xadd(keys.progress, {"worker": 1, "iter": 5, "dead": 1, "t": time.time()})
    redis_client.xadd(keys.progress, {"worker": 3, "iter": 1, "rejoin": 1, "t": time.time()})
    # and a divergence no worker had (fault ``forged_diverged``)
    redis_client.xadd(keys.events, {"kind": "diverged", "worker": 1, "iteration": 5, "what": "x"})
    watch = subprocess.Popen(
        hopbus_args("watch", "--run", run, "--redis", redis_url, "--out", str(tmp_path / "w"),
                    "--json"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip
    top = hopbus("top", "--run", run, "--redis", redis_url, "--once")
    assert top.returncode == 0 and "Traceback" not in top.stderr, top.stderr
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and s["violations"] == 0, s["first_violation"]
    assert all(v == 0 for v in s["checks"].values()), s["checks"]
    assert s["refused"]["progress_entries"] == 6
    assert "refused 6 progress entries" in err
    assert s["lost_workers"] == [] and not s.get("rejoined_workers"), s["lost_workers"]
    assert s["diverged"] is None
    w_out, w_err = watch.communicate(timeout=60)
    assert watch.returncode == 0, w_err
    w = json.loads(w_out)
    assert w["finished"] and w["iterations"]["min"] == 900 and w["violations"] == 0
    assert w["diverged"] is None


def test_garbled_incarnations_evict_no_live_worker(redis_url, redis_client, tmp_path):
    """Fault ``garbled_incarnation``: entries in the incarnation hash that no replacement
    wrote (not a number, negative, beyond any count) for live workers of a backup run. A
    worker is outdated only by a replacement's number above its own: these are left out, the
    workers beat on and finish, and their reports count."""
    flags = ["-n", "4", "--mode", "backup", "--iterations", "300", "--iter-time", "0.01"]
    proc, _, keys = _start(redis_url, tmp_path, *flags, "--heartbeat", "2")
    wait_iteration(redis_client, keys, 0, 50)
    redis_client.hset(keys.incarnation, mapping={"1": "abc", "2": "-1", "3": "9" * 20})
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and s["lost_workers"] == [], s["lost_workers"]
    assert s["iterations"]["min"] == 300 and s["refused"]["final_reports"] == 0


def test_digits_of_other_scripts_are_no_numbers_to_any_reader(redis_url, redis_client, tmp_path):
    """Fault ``unicode_digits``: values that Python's int() reads ('１' is 1) or raises on ('²')
    and Redis's Lua scripts take for no number, in the incarnation hash, the dead set and both
    streams of a live backup run, then in a counter and a stats hash of the finished one. They
    crashed the workers, train, watch, inspect, top and clean; each is now no number to all of
    them alike: the run finishes with nobody lost, and the CLI reads what is left."""
    flags = ["-n", "4", "--mode", "backup", "--iterations", "300", "--iter-time", "0.01"]
    proc, run, keys = _start(redis_url, tmp_path, *flags, "--heartbeat", "2")
    wait_iteration(redis_client, keys, 0, 50)
    redis_client.hset(keys.incarnation, mapping={"1": "²", "2": "１"})
    redis_client.sadd(keys.dead, "１", "²")
    redis_client.xadd(keys.progress, {"worker": 0, "iter": "²", "jump": 0, "t": 1})
    redis_client.xadd(keys.events, {"kind": "error", "worker": "²", "message": "boom"})
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    s = json.loads(out)
    assert s["finished"] and s["lost_workers"] == [] and s["iterations"]["min"] == 300, s
    assert s["refused"]["progress_entries"] >= 1
    redis_client.set(keys.iter(0), "²")
    redis_client.hset(keys.stats(0), "messages", "²")
    for args in (["inspect"], ["inspect", "--json"], ["top", "--once"], ["clean", "--force"]):
        p = hopbus(*args, "--run", run, "--redis", redis_url)
        assert p.returncode == 0 and "Traceback" not in p.stderr, (args, p.stderr)
    assert not redis_client.exists(keys.meta)  # clean --force took it


def test_a_start_event_from_far_away_sets_no_time_zero(redis_url, redis_client, tmp_path):
    """Fault ``forged_start``: a ``start`` event written first, under the stream's smallest id,
    claiming a time in 2255. Taken as time zero it made every progress entry 'before the
    start': all 120 refused, no gap judged, a finished run of 'iterations max 0'. It is passed
    over: the watch replays every entry."""
    run = f"farstart{os.getpid()}"
    flags = ["-n", "2", "--topology", "ring", "--iterations", "60", "--iter-time", "0.01"]
    created = hopbus("create", "--run", run, *flags, "--eval-every", "0", "--redis", redis_url)
    assert created.returncode == 0, created.stderr
    keys = RunKeys(run)
    redis_client.xadd(keys.events, {"kind": "start", "worker": 0, "t": 9e9}, id="1-1")
    workers = _workers(redis_url, run, 2)
    watch = hopbus("watch", "--run", run, "--redis", redis_url, "--out", str(tmp_path / "w"),
                   "--json", timeout=120)  # fmt: skip
    for w in workers:
        w.communicate(timeout=60)
    assert watch.returncode == 0, watch.stderr
    s = json.loads(watch.stdout)
    assert s["finished"] and s["iterations"]["max"] == 60 and s["violations"] == 0, s
    assert s["refused"]["progress_entries"] == 0 and s["wall_s"] > 0
    assert hopbus("clean", "--run", run, "--redis", redis_url).returncode == 0


def test_a_peer_whose_broker_mark_is_gone_is_still_judged_by_its_heartbeat(
    redis_url, redis_client, tmp_path
):
    """Fault ``lost_mark``: worker 3's entry in the broker marks deleted (its state then reads
    as not put back into this Redis, as after a restart), then worker 3 frozen. Redis would
    not judge it, and its neighbours waited on it forever, saying nothing; past any grace
    they judge it by its heartbeat, and the backup run goes on without it."""
    flags = ["-n", "4", "--mode", "backup", "--iterations", "300", "--iter-time", "0.02",
             "--heartbeat", "2", "--timeout", "8", "--eval-every", "0"]  # fmt: skip
    proc, run, keys = _start(redis_url, tmp_path, *flags)
    wait_iteration(redis_client, keys, 3, 40)
    redis_client.hdel(keys.marks, "3")
    (pid,) = processes_mentioning(f"--run {run} --id 3")
    os.kill(pid, signal.SIGSTOP)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        if proc.poll() is None:  # it hung, as it did: its workers go with it
            proc.kill()
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and [w["worker"] for w in s["lost_workers"]] == [3], s["lost_workers"]
    assert s["violations"] == 0
    assert not processes_mentioning(run)


def test_a_forged_floor_holds_back_no_update(redis_url, redis_client, tmp_path):
    """Fault ``forged_floor``: worker 1's store floor (the oldest update it still takes,
    Sec. 6.2) rewritten far beyond its counter, again and again for a hundred iterations, in
    standard mode, where worker 1 waits for every in-neighbour. Believed, it would keep them
    from sending to worker 1, which would wait for those updates until its timeout. A floor
    above its owner's counter is not believed: the run finishes, and the refusals are counted."""
    flags = ["-n", "4", "--iterations", "400", "--iter-time", "0.01", "--eval-every", "0"]
    proc, _, keys = _start(redis_url, tmp_path, *flags, "--timeout", "20")
    wait_iteration(redis_client, keys, 0, 20)
    start = int(redis_client.get(keys.iter(0)))
    while int(redis_client.get(keys.iter(0)) or 0) < start + 100 and proc.poll() is None:
        redis_client.set(keys.floor(1), 10**9)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and s["violations"] == 0 and s["lost_workers"] == []
    assert sum(w.get("floors_refused", 0) for w in s["per_worker"]) > 0, s["per_worker"]


def test_deleted_progress_entries_fake_no_broken_bound(redis_url, redis_client, tmp_path):
    """Fault ``deleted_progress``: entries deleted from a finished run's progress stream
    (XDEL of worker 1's entry of iteration 10, and of worker 2's of 20) before hopbus watch
    reads it. Redis tells the reader that entries were deleted; the workers they belonged to
    are placed where their next entries put them, with no gap judged meanwhile: no broken
    bound, no refused entry, every worker at the run's end, the losses counted."""
    version = redis_client.info("server")["redis_version"]
    if int(version.split(".")[0]) < 7:
        pytest.skip(f"Redis {version} does not say which entries were deleted (7 does)")
    proc, run, keys = _start(redis_url, tmp_path, "-n", "3", "--topology", "complete",
                             "--iterations", "60", "--eval-every", "0")  # fmt: skip
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0 and json.loads(out)["violations"] == 0, err
    for worker, it in ((1, 10), (2, 20)):
        (entry_id,) = [
            i for i, f in redis_client.xrange(keys.progress)
            if f.get(b"worker") == str(worker).encode() and f.get(b"iter") == str(it).encode()
        ]  # fmt: skip
        redis_client.xdel(keys.progress, entry_id)
    watch = hopbus("watch", "--run", run, "--redis", redis_url, "--out",
                   str(tmp_path / "w"), "--json", timeout=120)  # fmt: skip
    assert watch.returncode == 0, watch.stderr
    w = json.loads(watch.stdout)
    assert w["finished"] and w["violations"] == 0 and w["iterations"]["min"] == 60
    assert w["refused"]["progress_entries"] == 0 and w["progress_missed"] == 2
    assert "were deleted from the stream before this reader read them" in watch.stderr


@pytest.mark.parametrize("regrown", [False, True])
def test_a_progress_stream_deleted_under_a_live_run_fakes_nothing(
    redis_url, redis_client, tmp_path, regrown
):
    """Fault ``deleted_stream``: the progress stream DELeted while the launcher is not
    looking (frozen with SIGSTOP, so that entries it never read go with it), and begun again
    by the workers' next entries. Its entries-added count starts over (``regrown``: and has
    passed the old one by the launcher's next look; its first entry is then newer than any
    the launcher read): the reader takes the loss as a trim, places each worker where its
    next entry puts it, and neither refuses the later entries as forged nor judges the gap
    as a broken bound."""
    flags = ["-n", "3", "--iterations", "200", "--iter-time", "0.02", "--eval-every", "0"]
    proc, _, keys = _start(redis_url, tmp_path, *flags)
    wait_iteration(redis_client, keys, 0, 20)
    metrics = tmp_path / "run" / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and metrics.stat().st_size, 30, "the launcher reading")
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        wait_iteration(redis_client, keys, 0, 60)
        old = redis_client.xlen(keys.progress)
        redis_client.delete(keys.progress)
        if regrown:
            wait_for(lambda: redis_client.xlen(keys.progress) > old, 30, "the stream regrown")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and s["violations"] == 0 and s["iterations"]["min"] == 200, s
    assert s["refused"]["progress_entries"] == 0 and s["progress_missed"] > 0, s
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    last = {w: max(json.loads(x)["iter"] for x in lines if json.loads(x)["worker"] == w)
            for w in range(3)}  # fmt: skip
    assert last == {0: 200, 1: 200, 2: 200}, last


def test_clean_force_stops_the_run_before_its_keys_go(redis_url, redis_client):
    """Fault ``clean_under_workers``: hopbus clean --force of a run whose workers are alive.
    Removed under them, its keys came back within seconds (the workers took the empty Redis
    for a restarted one and put their state back); now the run is stopped first, the
    workers exit 1 saying why, and once their heartbeats lapse the keys go for good."""
    run = f"cleanforce{os.getpid()}"
    workers = _two_workers(redis_url, run, "--iterations", "100000", "--iter-time", "0.01",
                           "--heartbeat", "2")  # fmt: skip
    keys = RunKeys(run)
    wait_iteration(redis_client, keys, 0, 20)
    # fault ``junk_heartbeat_key``: a key under hb: of another type beats for nobody (the
    # stop's look at the heartbeats failed on it, WRONGTYPE, and left every key in place)
    redis_client.hset(keys.hb_prefix + "junk", "not", "a heartbeat")
    p = hopbus("clean", "--run", run, "--redis", redis_url, "--force")
    assert p.returncode == 0, p.stderr
    assert f"stopping run {run} first" in p.stderr and f"of run {run}" in p.stdout
    for w in workers:
        _, err = w.communicate(timeout=60)
        assert w.returncode == 1 and "removed by hopbus clean --force" in err, err
    assert list(redis_client.scan_iter(match=keys.pattern)) == []


def test_ctrl_c_with_redis_frozen_stops_the_run_and_says_how_far_it_got(tmp_path):
    """Fault ``frozen_at_ctrl_c``: Redis stops answering (SIGSTOP), then Ctrl-C. The launcher
    stops every process, asks Redis no more than a second at a time, and writes the summary
    of the progress it had read: exit 130, strict JSON, the stop as its failure."""
    out = tmp_path / "run"
    with EmbeddedRedis(port=0) as server:
        assert server.proc is not None
        args, run = train_args(server.url, out, "-n", "3", "--iterations", "100000",
                               "--iter-time", "0.01")  # fmt: skip
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=clean_env())  # fmt: skip
        try:
            metrics = out / "metrics.jsonl"  # the launcher has read progress: some to tell
            wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, 60, "progress")
            server.proc.send_signal(signal.SIGSTOP)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            server.proc.send_signal(signal.SIGCONT)
            proc.kill()
        assert proc.returncode == 130, err
        assert not processes_mentioning(run)
    s = strict((out / "summary.json").read_text())
    assert not s["finished"] and "interrupted (Ctrl-C or SIGTERM)" in s["failure"]
    read = [strict(line)["iter"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert s["iterations"]["max"] == max(read) >= 1, (s["iterations"], max(read))


def test_ctrl_c_before_any_worker_starts_is_no_watch(tmp_path):
    """Fault ``early_interrupt``: Ctrl-C while hopbus train still waits for its Redis (here
    frozen from the start). It said 'the watch stopped, run R goes on' of a run that never
    began: it now says only that it was interrupted, and leaves no folder behind."""
    out = tmp_path / "run"
    with EmbeddedRedis(port=0) as server:
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        try:
            args, run = train_args(server.url, out, "-n", "2", "--iterations", "50")
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=clean_env(), text=True)  # fmt: skip
            try:
                # its results folder is held: it is connecting now (retrying for --timeout),
                # and no worker can start before Redis answers
                wait_for(out.exists, 30, "the launcher to take its folder")
                proc.send_signal(signal.SIGINT)
                _, err = proc.communicate(timeout=60)
            finally:
                proc.kill()
        finally:
            server.proc.send_signal(signal.SIGCONT)
    assert proc.returncode == 130, err
    assert "watch" not in err and err.strip().splitlines()[-1] == "hopbus: interrupted", err
    assert not processes_mentioning(run) and not out.exists()


def test_a_run_whose_meta_changed_type_is_cleaned_with_force(redis_url, redis_client):
    """Its status cannot be read (WRONGTYPE): clean says so in one line and takes it with
    --force, where it failed with Redis's error and left the key."""
    run = f"wrongtype{os.getpid()}"
    assert hopbus("create", "--run", run, "-n", "2", "--redis", redis_url).returncode == 0
    keys = RunKeys(run)
    redis_client.delete(keys.meta)
    redis_client.set(keys.meta, "x")
    p = hopbus("clean", "--run", run, "--redis", redis_url)
    assert p.returncode == 2 and error_lines(p.stderr) == [
        f"hopbus: error: run {run} has keys that hold another type than hopbus keeps there: "
        f"{keys.meta} (a string; hopbus keeps a hash there), so whether it runs is unknown: "
        "pass --force to delete its keys anyway"
    ], p.stderr
    p = hopbus("clean", "--run", run, "--redis", redis_url, "--force")
    assert p.returncode == 0, p.stderr
    assert list(redis_client.scan_iter(match=keys.pattern)) == []


def test_a_forged_report_does_not_keep_a_dead_worker_alive(redis_url, redis_client, tmp_path):
    """A forged final report for worker 3, then worker 3 killed: in backup mode the others
    declare it dead and go on."""
    flags = ["-n", "4", "--mode", "backup", "--iterations", "400", "--iter-time", "0.01"]
    flags += ["--heartbeat", "2", "--eval-every", "0"]
    proc, run, keys = _start(redis_url, tmp_path, *flags)
    wait_iteration(redis_client, keys, 3, 50)
    redis_client.hset(keys.result, "3", json.dumps({"iterations": 400, "final_accuracy": 1.0}))
    for pid in processes_mentioning(f"--run {run} --id 3"):
        os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and [w["worker"] for w in s["lost_workers"]] == [3]
    assert s["refused"]["final_reports"] == 1
    # its own keys say so too: the dead worker aside, every report counts
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["status"] == "finished"


def test_stray_workers_write_nothing_and_watch_keeps_a_finished_run(redis_url, tmp_path):
    """Fault ``stray_worker``: a --id 7 on a 2-worker run and a second --id 0, started while
    it runs and after it finished, are refused (exit 2) without a word in the run; watch of
    the finished run reads every entry, reports it finished and leaves its status alone."""
    run = f"stray{os.getpid()}"
    assert hopbus("create", "--run", run, "-n", "2", "--topology", "ring", "--iterations",
                  "700", "--eval-every", "0", "--redis", redis_url).returncode == 0  # fmt: skip
    workers = _workers(redis_url, run, 2)
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(run)
    wait_iteration(client, keys, 0, 10)
    for _ in range(2):  # while it runs, and once it finished
        for stray in ("7", "0"):
            p = subprocess.run(hopbus_args("worker", "--run", run, "--id", stray),
                               env=clean_env(HOPBUS_REDIS=redis_url),
                               capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
            assert p.returncode == 2, p.stderr
            assert len(error_lines(p.stderr)) == 1
        if workers[0].poll() is None:
            for w in workers:
                w.communicate(timeout=120)
            assert all(w.returncode == 0 for w in workers)
    assert not [f for _, f in client.xrange(keys.events) if f.get(b"kind") == b"error"]
    inspect = hopbus("inspect", "--run", run, "--redis", redis_url, "--json")
    snap = json.loads(inspect.stdout)  # nobody watched it: its own keys say it finished
    assert snap["status"] == "finished" and snap["recorded_status"] == "starting"
    watch = hopbus("watch", "--run", run, "--redis", redis_url, "--out", str(tmp_path / "w"),
                   "--json")  # fmt: skip
    assert watch.returncode == 0, watch.stderr
    s = json.loads(watch.stdout)
    assert s["finished"] and s["iterations"]["min"] == 700
    assert (tmp_path / "w" / "metrics.jsonl").read_text().count("\n") == 2 * 700  # > 1,000
    assert client.hget(keys.meta, "status") == b"finished"


def _finished_by_hand(redis_url: str, run: str) -> RunKeys:
    """A 2-worker run of 40 iterations, created and run to its end by two ``hopbus worker``
    processes, with nobody watching: the keys it left, for a watch to meet."""
    assert hopbus("create", "--run", run, "-n", "2", "--iterations", "40", "--eval-every", "0",
                  "--heartbeat", "1.5", "--redis", redis_url).returncode == 0  # fmt: skip
    workers = _workers(redis_url, run, 2)
    for w in workers:
        w.communicate(timeout=120)
    assert all(w.returncode == 0 for w in workers)
    return RunKeys(run)


def test_a_run_whose_recorded_iterations_were_rewritten_is_no_endless_watch(
    redis_url, redis_client, tmp_path
):
    """Fault ``rewritten_config``: the run's recorded config says ten times the iterations its
    workers ran (rewritten after they started). Their reports then count for nothing, and
    a watch that waited for ones that do would wait forever: it fails, saying so."""
    run = f"rewrite{os.getpid()}"
    keys = _finished_by_hand(redis_url, run)
    cfg = json.loads(redis_client.hget(keys.meta, "config"))
    redis_client.hset(keys.meta, "config", json.dumps({**cfg, "iterations": 400}))
    watch = hopbus("watch", "--run", run, "--redis", redis_url, "--out", str(tmp_path / "w"),
                   timeout=60)  # fmt: skip
    assert watch.returncode == 1, watch.stderr
    (line,) = error_lines(watch.stderr)
    assert "says it finished, but its final report does not count" in line


def test_a_forged_counter_finishes_no_run(redis_url, redis_client, tmp_path):
    """Fault ``forged_stats``: a finished run whose worker 1's report went missing, and whose
    counters hash claims the report's fields. A watch shows its counters but never takes
    them for a report: the run is not finished, and no figure of it comes from them."""
    run = f"stats{os.getpid()}"
    keys = _finished_by_hand(redis_url, run)
    redis_client.hdel(keys.result, "1")
    redis_client.hset(keys.stats(1), mapping={"final_accuracy": 1, "t": 1, "iterations": 40})
    watch = hopbus("watch", "--run", run, "--redis", redis_url, "--out", str(tmp_path / "w"),
                   "--json", timeout=60)  # fmt: skip
    assert watch.returncode == 1, watch.stderr
    s = json.loads(watch.stdout)
    assert not s["finished"]
    assert "its final report does not count" in s["failure"], s["failure"]
    row = s["per_worker"][1]  # its counters, without what only a report may say
    assert row["messages"] == 40 and not {"final_accuracy", "t", "iterations"} & set(row), row
    assert s["final_accuracy"] == s["per_worker"][0]["final_accuracy"]


def test_a_worker_whose_model_does_not_load_here_is_heard_by_the_run(redis_url, tmp_path):
    """Fault ``model_file_elsewhere``: a run created with --model FILE.py:FUNCTION in one
    folder and its worker started in another, where no such file is. With --id it may be a
    stray beside a real worker still loading: one line, nothing in the run. Without --id
    (a compose replica) the join counter gave it its place, free then: it posts a
    join_failed event, which hopbus watch shows at once and fails the run on once no
    process took that place within --timeout, naming worker and file (it waited for ever;
    an error event would have failed a run whose --id worker was still loading)."""
    code, other = tmp_path / "code", tmp_path / "other"
    code.mkdir()
    other.mkdir()
    (code / "models.py").write_text(
        "from hopbus.models.linear import LogReg\n\n\ndef build(n_features):\n"
        "    return LogReg(n_features)\n"
    )
    run = f"elsewhere{os.getpid()}"
    # the workers are given the run's code (as hopbus train, launch and compose give it)
    env = clean_env(HOPBUS_REDIS=redis_url, HOPBUS_MODEL="models.py:build")

    def in_folder(folder: Path, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(hopbus_args(*args), cwd=folder, env=env, capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip

    created = in_folder(code, "create", "--run", run, "-n", "2", "--model", "models.py:build",
                        "--data", "synthetic:200,4,2", "--iterations", "20",
                        "--timeout", "3")  # fmt: skip
    assert created.returncode == 0, created.stderr
    client = redis.Redis.from_url(redis_url)
    p = in_folder(other, "worker", "--run", run, "--id", "0")
    assert p.returncode == 2 and len(error_lines(p.stderr)) == 1, p.stderr
    assert f"--model 'models.py:build': no such file 'models.py' in {other} (each" in p.stderr
    assert not client.exists(RunKeys(run).events)
    p = in_folder(other, "worker", "--run", run)
    assert p.returncode == 2 and len(error_lines(p.stderr)) == 1, p.stderr
    (event,) = [f for _, f in client.xrange(RunKeys(run).events)]
    assert event[b"kind"] == b"join_failed" and event[b"worker"] == b"0", event
    watch = hopbus("watch", "--run", run, "--redis", redis_url, "--out", str(tmp_path / "w"))
    assert watch.returncode == 1, watch.stderr
    assert "worker 0's process failed before taking its place: --model" in watch.stderr
    assert (
        f"run {run} failed: worker 0: --model 'models.py:build': no such file 'models.py' in "
        f"{other} (each worker's own folder) (no process took its place within 3 s)"
    ) in watch.stderr

    # the same failure, while the real workers (--id) are yet to take their places: they
    # take them within --timeout, and the run goes on and finishes
    again = f"{run}-b"
    created = in_folder(code, "create", "--run", again, "-n", "2", "--model", "models.py:build",
                        "--data", "synthetic:200,4,2", "--iterations", "200",
                        "--iter-time", "0.02", "--timeout", "30")  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert in_folder(other, "worker", "--run", again).returncode == 2
    args = hopbus_args("watch", "--run", again, "--out", str(tmp_path / "w2"))
    watch = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)  # fmt: skip
    real = [subprocess.Popen(hopbus_args("worker", "--run", again, "--id", str(i)), cwd=code,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(2)]  # fmt: skip
    for w in real:
        w.communicate(timeout=120)
    _, said = watch.communicate(timeout=120)
    assert watch.returncode == 0 and all(w.returncode == 0 for w in real), said


def test_code_named_only_in_redis_is_never_run(redis_url, redis_client, tmp_path):
    """Fault ``code_named_in_redis``: whoever has the broker's password rewrites a run's
    config to name code on the workers' host (a file another user left, or a function such
    as os:abort). A node imports a user's function only when its own command line (or
    environment) names the same spec: otherwise one line, exit 2, nothing written into the
    run and the code not imported."""
    evil = tmp_path / "evil.py"
    marker = tmp_path / "RAN"
    evil.write_text(f"open({str(marker)!r}, 'w').write('ran')\n\ndef build():\n    return 1\n")
    run = f"redis-code{os.getpid()}"
    created = hopbus("create", "--run", run, "-n", "2", "--redis", redis_url)
    assert created.returncode == 0, created.stderr
    keys = RunKeys(run)
    cfg = json.loads(redis_client.hget(keys.meta, "config"))
    env = clean_env(HOPBUS_REDIS=redis_url)

    def join(*flags: str, **more: str) -> subprocess.CompletedProcess:
        return subprocess.run(hopbus_args("worker", "--run", run, *flags), capture_output=True,
                              text=True, env={**env, **more}, timeout=60, check=False)  # fmt: skip

    for field, spec in (("model", f"{evil}:build"), ("data", "os:abort")):
        redis_client.hset(keys.meta, "config", json.dumps({**cfg, field: spec}))
        for flags in ([], ["--id", "0"]):
            p = join(*flags)
            assert p.returncode == 2, p.stderr
            (line,) = error_lines(p.stderr)
            assert f"run {run} has --{field} {spec!r}, code not given to it. A worker" in line
            assert f"its own --{field} (or HOPBUS_{field.upper()}) names" in line
            assert "someone changed the run's config" in line
    # both at once: one line names both, so that the fix is one command
    both = {**cfg, "model": f"{evil}:build", "data": "os:abort"}
    redis_client.hset(keys.meta, "config", json.dumps(both))
    p = join("--id", "0")
    (line,) = error_lines(p.stderr)
    assert p.returncode == 2 and (
        f"has --model {str(evil) + ':build'!r}, code not given to it and --data 'os:abort', "
        "code not given to it." in line
    ), line
    assert "give the worker --model and --data with it" in line
    redis_client.hset(keys.meta, "config", json.dumps({**cfg, "model": f"{evil}:build"}))
    p = join("--id", "0", HOPBUS_MODEL="mine:build")  # given other code than the run names
    (line,) = error_lines(p.stderr)
    assert p.returncode == 2 and "code not the 'mine:build' this process was given" in line, line
    # the parameter server's process obeys the same rule
    p = subprocess.run(hopbus_args("ps", "--run", run), capture_output=True, text=True, env=env,
                       timeout=60, check=False)  # fmt: skip
    assert p.returncode == 2 and "code not given to it" in p.stderr, p.stderr
    assert not marker.exists()
    assert redis_client.get(keys.joined) is None and not redis_client.exists(keys.events)
    # a built-in kind whose file name reads like a module (LIBSVM's a9a) is no code: the
    # worker goes on to read it (and says it is not there)
    redis_client.hset(keys.meta, "config", json.dumps({**cfg, "data": "svmlight:a9a"}))
    p = join("--id", "0")
    assert p.returncode == 2 and "given" not in p.stderr and "a9a" in p.stderr, p.stderr
    assert not redis_client.exists(keys.addr)


def test_a_killed_launcher_leaves_an_abandoned_run_that_clean_takes(redis_url, tmp_path):
    """Fault ``killed_launcher``: kill -9 of hopbus train; its workers die with it. The run's
    recorded status stays "running"; what its keys say is "abandoned", and clean takes it."""
    flags = ["-n", "3", "--topology", "ring", "--iterations", "100000", "--iter-time", "0.01"]
    proc, run, keys = _start(redis_url, tmp_path, *flags, "--heartbeat", "2")
    client = redis.Redis.from_url(redis_url)
    wait_iteration(client, keys, 0, 20)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    wait_for(lambda: not processes_mentioning(run), 30, "the workers to die with the launcher")
    assert client.hget(keys.meta, "status") == b"running"
    beats = [keys.hb(i) for i in range(3)]
    wait_for(lambda: not client.exists(*beats), 30, "the dead workers' heartbeats to expire")
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["status"] == "abandoned" and snap["recorded_status"] == "running"
    cleaned = hopbus("clean", "--run", run, "--redis", redis_url)
    assert cleaned.returncode == 0, cleaned.stderr
    assert not client.exists(keys.meta)


def test_a_run_whose_workers_are_still_loading_is_running(redis_url, redis_client, tmp_path):
    """Fault ``starting_run``: between hopbus train recording a run and its first worker's
    heartbeat (TensorFlow loading: seconds), nothing beat, inspect called the run
    "abandoned" and clean deleted it under the starting workers. The launcher beats too
    (``hop:{RUN}:launcher``), while it runs and no longer: a launcher's beat alone is enough."""
    run = f"loading{os.getpid()}"
    keys = RunKeys(run)
    assert hopbus("create", "--run", run, "-n", "2", "--redis", redis_url).returncode == 0
    redis_client.hset(keys.meta, "status", "running")  # as hopbus train records it
    redis_client.set(keys.launcher, 1, px=30_000)  # its workers not yet beating
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["status"] == "running", snap["status"]
    refused = hopbus("clean", "--run", run, "--redis", redis_url)
    assert refused.returncode == 2 and "its launcher's, is alive" in refused.stderr
    redis_client.set(keys.iter(0), 7)  # a worker started, and its heartbeat is gone: the
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["status"] == "abandoned", snap["status"]  # launcher's beat no longer tells
    redis_client.delete(keys.iter(0), keys.launcher)  # the launcher gone, before any worker
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["status"] == "abandoned", snap["status"]
    assert hopbus("clean", "--run", run, "--redis", redis_url).returncode == 0
    # a real launcher: its beat while it runs, gone with it
    proc, run, keys = _start(redis_url, tmp_path, "-n", "2", "--iterations", "100000",
                             "--iter-time", "0.01", "--heartbeat", "3")  # fmt: skip
    wait_for(lambda: redis_client.pttl(keys.launcher) > 0, 60, "the launcher's heartbeat")
    wait_iteration(redis_client, keys, 0, 5)
    ttl = redis_client.pttl(keys.launcher)
    assert 0 < ttl <= 3000, ttl
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130 and not redis_client.exists(keys.launcher)


def test_a_created_run_nobody_runs_is_cleaned_without_force(redis_url, redis_client):
    """Fault ``never_started``: a run created and never started is "starting" and clean takes
    it (create itself says to); fault ``gave_up_alone``: its one worker registered, waited
    for the others and gave up, saying so; with its heartbeat gone the run is "failed" (not
    starting, and not "abandoned" as by a killed launcher that said nothing), and so is the
    worker, not "not started"."""
    run = f"unstarted{os.getpid()}"
    made = hopbus("create", "--run", run, "-n", "3", "--redis", redis_url)
    assert made.returncode == 0, made.stderr
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["status"] == "starting"
    cleaned = hopbus("clean", "--run", run, "--redis", redis_url)
    assert cleaned.returncode == 0, cleaned.stderr
    assert not redis_client.exists(RunKeys(run).meta)

    made = hopbus("create", "--run", run, "-n", "3", "--timeout", "2", "--heartbeat", "1",
                  "--redis", redis_url)  # fmt: skip
    assert made.returncode == 0, made.stderr
    alone = hopbus("worker", "--run", run, "--redis", redis_url)
    assert alone.returncode == 1 and "register" in alone.stderr, alone.stderr
    wait_for(lambda: not redis_client.exists(RunKeys(run).hb(0)), 30, "its heartbeat to expire")
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["status"] == "failed", snap["status"]
    assert [w["state"] for w in snap["workers"]] == ["failed", "not started", "not started"]
    cleaned = hopbus("clean", "--run", run, "--redis", redis_url)
    assert cleaned.returncode == 0, cleaned.stderr


def test_a_heartbeat_or_creation_from_the_far_future_is_no_time(redis_url, redis_client):
    """Faults ``forged_created`` and ``forged_beat``: 1e306 as the run's creation time and as a
    heartbeat's. top's milliseconds of it overflowed (a traceback), inspect printed a
    300-digit age; both are read as no time."""
    run = f"farbeat{os.getpid()}"
    assert hopbus("create", "--run", run, "-n", "2", "--redis", redis_url).returncode == 0
    keys = RunKeys(run)
    redis_client.hset(keys.meta, "created", "1e306")
    redis_client.set(keys.hb(0), "1e306", px=60_000)
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["created"] is None and snap["workers"][0]["state"] == "?", snap["workers"]
    for command in (["inspect"], ["top", "--once"]):
        p = hopbus(*command, "--run", run, "--redis", redis_url)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        assert "0" * 30 not in p.stdout, p.stdout
    assert hopbus("clean", "--run", run, "--redis", redis_url, "--force").returncode == 0


def test_a_watch_stopped_with_ctrl_c_can_be_started_again(redis_url, redis_client, tmp_path):
    """Fault ``interrupted_watch``: hopbus watch stopped by Ctrl-C leaves its folder without a
    summary; the same watch again takes that folder, reads the run from the start and writes
    it whole. A folder that holds anything else is still refused."""
    run = f"rewatch{os.getpid()}"
    workers = _two_workers(redis_url, run, "--iterations", "200", "--iter-time", "0.02")
    out = tmp_path / "w"
    args = hopbus_args("watch", "--run", run, "--out", str(out), "--json")
    env = clean_env(HOPBUS_REDIS=redis_url)
    first = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_iteration(redis_client, RunKeys(run), 0, 20)
    wait_for((out / "config.toml").exists, 30, "the first watch's folder")
    first.send_signal(signal.SIGINT)
    _, said = first.communicate(timeout=60)
    assert first.returncode == 130 and not (out / "summary.json").exists()
    assert f"the watch stopped, run {run} goes on; the same hopbus watch follows it again" in (
        said.decode()
    )
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stderr
    s = strict(again.stdout)
    assert s["finished"] and s["iterations"]["max"] == 200, s["iterations"]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len({(json.loads(x)["worker"], json.loads(x)["iter"]) for x in lines})
    for w in workers:
        w.communicate(timeout=60)
    done = hopbus("watch", "--run", run, "--out", str(out), "--redis", redis_url)
    assert done.returncode == 2, done.stderr
    assert "already holds a run's results (its summary.json: the run ended)" in done.stderr
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    refused = hopbus("watch", "--run", run, "--out", str(tmp_path / "other"), "--redis", redis_url)
    assert refused.returncode == 2, refused.stderr
    assert "already holds files: choose another --out, or remove it" in refused.stderr
    assert not (out / ".hopbus.lock").exists()  # the folder's lock went with its watch


def test_a_watch_stopped_before_any_worker_came_leaves_the_run_starting(redis_url, tmp_path):
    """Fault ``watch_before_workers``: a watch recorded the run it follows as "running" when
    it began; stopped before any worker came, it left a run that never started
    "abandoned" (and watch starts nothing). The status is now the workers' to change."""
    run = f"early{os.getpid()}"
    assert hopbus("create", "--run", run, "-n", "2", "--redis", redis_url).returncode == 0
    out = tmp_path / "w"
    watch = subprocess.Popen(hopbus_args("watch", "--run", run, "--out", str(out)),
                             env=clean_env(HOPBUS_REDIS=redis_url), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)  # fmt: skip
    wait_for((out / "config.toml").exists, 30, "the watch to follow the run")
    watch.send_signal(signal.SIGINT)
    watch.communicate(timeout=60)
    assert watch.returncode == 130
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["status"] == "starting" and snap["recorded_status"] == "starting", snap


def test_a_forged_endpoint_is_one_line(redis_url, redis_client):
    """Fault ``forged_endpoint``: worker 1's endpoint in the registry rewritten to something
    ZeroMQ cannot connect to, with a terminal escape in it. Worker 0, connecting to it,
    fails with one line naming the registry: no traceback, no escape reaching the terminal."""
    run = f"forgedaddr{os.getpid()}"
    created = hopbus("create", "--run", run, "-n", "2", "--topology", "ring", "--iterations",
                     "20", "--timeout", "5", "--redis", redis_url)  # fmt: skip
    assert created.returncode == 0, created.stderr
    keys = RunKeys(run)
    env = clean_env(HOPBUS_REDIS=redis_url)
    one = subprocess.Popen(hopbus_args("worker", "--run", run, "--id", "1"), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_for(lambda: redis_client.hget(keys.addr, "1"), 30, "worker 1's endpoint")
        redis_client.hset(keys.addr, "1", "tcp://[:::\x1b[2J")
        zero = hopbus("worker", "--run", run, "--id", "0", env=env)
    finally:
        one.kill()
        one.communicate(timeout=30)
    assert zero.returncode == 1, zero.stderr
    assert "Traceback" not in zero.stderr and "\x1b" not in zero.stderr, zero.stderr
    assert error_lines(zero.stderr) and "hop:{" in error_lines(zero.stderr)[-1], zero.stderr


def test_a_key_named_with_escapes_reaches_no_terminal(redis_url, redis_client):
    """Fault ``escape_in_a_run_id``: a meta key whose "run id" holds terminal escapes (and one
    that is not UTF-8): inspect --list and top --once leave them out, they are no runs."""
    redis_client.hset("hop:{evil\x1b]0;TITLE\x07\x1b[2J}:meta", "status", "running")
    redis_client.hset(b"hop:{bad\xff}:meta", "status", "running")
    for args in (("inspect", "--list"), ("top", "--once")):
        p = hopbus(*args, "--redis", redis_url)
        assert "\x1b" not in p.stdout + p.stderr and "Traceback" not in p.stderr, p.stderr
        assert "evil" not in p.stdout, p.stdout
    redis_client.delete("hop:{evil\x1b]0;TITLE\x07\x1b[2J}:meta", b"hop:{bad\xff}:meta")


def test_entries_with_escapes_reach_no_terminal_through_inspect(redis_url, redis_client):
    """Fault ``escape_in_an_entry``: progress and event entries whose fields hold terminal
    escapes and a bidi override, as redis-cli can write them: inspect shows the entries with
    those characters blanked (it printed them raw: a retitled, cleared terminal)."""
    run = f"esc{os.getpid()}"
    assert hopbus("create", "--run", run, "--redis", redis_url, "-n", "2").returncode == 0
    keys = RunKeys(run)
    redis_client.xadd(keys.events, {"kind": "error\x1b]0;PWNED\x07\x1b[2J", "worker": 0})
    redis_client.xadd(keys.progress, {"worker": 0, "iter": 1, "loss": "\x1b[5mBLINK\u202e"})
    p = hopbus("inspect", "--run", run, "--redis", redis_url)
    assert p.returncode == 0, p.stderr
    assert "BLINK" in p.stdout and "PWNED" in p.stdout, p.stdout
    assert not any(c in p.stdout for c in "\x1b\x07\u202e"), repr(p.stdout)
    assert hopbus("clean", "--run", run, "--redis", redis_url, "--force").returncode == 0


def test_a_join_counter_below_zero_gives_no_negative_id(redis_url, redis_client):
    """Fault ``negative_join_counter``: the counter that hands out ids to workers started
    without --id set to -5. A worker took id -5 from it and was told '--id -5: run has
    workers 0..1', an --id its user never gave; it is now refused naming the counter, as it
    is when the counter holds no integer or is no string at all."""
    run = f"negjoin{os.getpid()}"
    assert hopbus("create", "--run", run, "--redis", redis_url, "-n", "2").returncode == 0
    keys = RunKeys(run)
    for value in (-5, "abc", {1}):
        redis_client.delete(keys.joined)
        if isinstance(value, set):
            redis_client.sadd(keys.joined, *value)
        else:
            redis_client.set(keys.joined, value)
        p = hopbus("worker", "--run", run, "--redis", redis_url, "--timeout", "5")
        assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
        (line,) = error_lines(p.stderr)
        assert f"its join counter ({keys.joined}) holds what no hopbus process writes" in line
        assert "--id -" not in line
    assert hopbus("clean", "--run", run, "--redis", redis_url, "--force").returncode == 0


def test_a_heartbeat_without_a_ttl_keeps_no_dead_worker_alive(redis_url, redis_client, tmp_path):
    """Fault ``immortal_heartbeat``: both workers of a run killed, their heartbeat keys then
    written without a TTL (hopbus writes a live one only with its TTL, a finished marker
    only as such). hopbus watch still sees them gone and ends the run, status failed; clean
    then takes it without --force."""
    run = f"immortal{os.getpid()}"
    workers = _two_workers(redis_url, run, "--iterations", "100000", "--iter-time", "0.02",
                           "--heartbeat", "2")  # fmt: skip
    keys = RunKeys(run)
    wait_iteration(redis_client, keys, 0, 10)
    for w in workers:
        w.kill()
        w.communicate(timeout=30)
    for i in range(2):
        redis_client.set(keys.hb(i), "1795562000.5")  # no TTL
    watch = hopbus("watch", "--run", run, "--redis", redis_url, "--out", str(tmp_path / "w"),
                   timeout=120)  # fmt: skip
    assert watch.returncode == 1, watch.stderr
    assert "heartbeat gone" in watch.stderr, watch.stderr
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["status"] != "running", snap["status"]
    assert hopbus("clean", "--run", run, "--redis", redis_url).returncode == 0


def test_a_run_with_a_user_of_its_own_touches_only_its_keys(tmp_path):
    """Fault ``per_run_user``: hopbus create --acl makes a user that may touch only its run's
    keys; the run trains with it; another run's keys are out of its reach; clean removes it."""
    with EmbeddedRedis(port=0) as server:
        admin = redis.Redis.from_url(server.url)
        admin.set("hop:{other}:meta", "x")
        run = f"own{os.getpid()}"
        secret = tmp_path / "run.url"
        # a file that cannot be written is refused before anything is made in Redis, and the
        # same command with a good file then works
        bad = hopbus("create", "--run", run, "-n", "2", "--acl", str(tmp_path / "no" / "f"),
                     "--redis", server.url)  # fmt: skip
        assert bad.returncode == 2 and "--acl" in bad.stderr, bad.stderr
        assert not admin.exists(RunKeys(run).meta)
        assert admin.execute_command("ACL", "GETUSER", f"hop-{run}") is None
        p = hopbus("create", "--run", run, "-n", "2", "--topology", "ring", "--iterations",
                   "50", "--acl", str(secret), "--redis", server.url)  # fmt: skip
        assert p.returncode == 0, p.stderr
        assert secret.stat().st_mode & 0o777 == 0o600
        url = secret.read_text().strip()
        assert url.startswith(f"redis://hop-{run}:")
        own = redis.Redis.from_url(url)
        with pytest.raises(redis.exceptions.NoPermissionError):
            own.get("hop:{other}:meta")
        # the run's URL given for another run (a copied .env): why Redis refused it, whatever
        # the command (they said only what Redis said, or that a key had another type)
        other = f"{run}b"
        assert hopbus("create", "--run", other, "--redis", server.url).returncode == 0
        for command in (["create", "--run", f"{run}c"], ["worker", "--run", other],
                        ["watch", "--run", other, "--out", str(tmp_path / "wb")],
                        ["clean", "--run", other], ["inspect", "--run", other]):  # fmt: skip
            refused = hopbus(*command, "--redis", url)
            assert refused.returncode in (1, 2), refused.stderr
            line = refused.stderr.strip().splitlines()[-1]
            assert "the user in the URL may not touch this run's keys (a per-run" in line, line
            assert url.split(":")[2].split("@")[0] not in refused.stderr  # no password
        env = clean_env(HOPBUS_REDIS=url)
        workers = [
            subprocess.Popen(hopbus_args("worker", "--run", run), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]  # fmt: skip
        watch = subprocess.run(
            hopbus_args("watch", "--run", run, "--out", str(tmp_path / "w"), "--json"),
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert watch.returncode == 0, watch.stderr
        assert json.loads(watch.stdout)["finished"]
        for w in workers:
            w.communicate(timeout=60)
        # with the run's own URL: its keys go, and it says the user stays
        cleaned = hopbus("clean", "--run", run, "--redis", url)
        assert cleaned.returncode == 0 and "Redis user" not in cleaned.stdout, cleaned.stderr
        assert f"the run's Redis user hop-{run} stays" in cleaned.stderr
        assert admin.execute_command("ACL", "GETUSER", f"hop-{run}") is not None
        cleaned = hopbus("clean", "--run", run, "--redis", server.url)
        assert f"removed 0 keys of run {run} and its Redis user hop-{run}" in cleaned.stdout, (
            cleaned.stderr
        )
        assert admin.execute_command("ACL", "GETUSER", f"hop-{run}") is None


@pytest.mark.parametrize("key", ["progress", "result", "events", "iter:1"])
def test_a_run_whose_keys_change_type_under_it_is_recorded_failed(redis_url, tmp_path, key):
    """The launcher's reads meet WRONGTYPE (the progress stream, the reports' hash or the
    events stream replaced by a string), or a worker's script does (a counter replaced by a
    hash): one line, exit 1, the record says failed, not running, and summary.json keeps
    what was read, as for any failed run. The stop key's text reaches the terminal without
    its control characters. Redis's refusal names no key: a note, and inspect, name it."""
    args, run = train_args(redis_url, tmp_path / "run", "-n", "3", "--iterations", "300",
                           "--iter-time", "0.01")  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(run)
    try:
        wait_for(lambda: client.xlen(keys.progress) > 10, 60, "training to start")
        name, kept = keys.prefix + key, keys.kept_type(keys.prefix + key)
        swap = client.pipeline(transaction=True)  # in one step: no worker sees the key missing
        swap.delete(name)  # (it would put a lost counter back, as after a broker restart)
        if kept == "string":
            swap.hset(name, "not", "a counter")
        else:
            swap.set(name, "not a stream")
        swap.execute()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    last = err.decode().strip().splitlines()[-1]
    # the launcher's read, or a worker's script, meets it first: either says Redis refused
    said = ("refused a command on the run's keys", "WRONGTYPE")
    assert last.startswith("hopbus: error:") and any(x in last for x in said), last
    assert client.hget(keys.meta, "status") == b"failed"
    assert not processes_mentioning(run)
    s = strict((tmp_path / "run" / "summary.json").read_text())  # what was read is kept
    assert any(x in s["failure"] for x in said) and not s["finished"]
    held = "hash" if kept == "string" else "string"
    named = f"{name} (a {held}; hopbus keeps a {kept} there)"
    # in the failed run's line (a worker's refusal), or a note beside it (the launcher's read)
    assert named in err.decode().splitlines()[-1] or (
        f"hopbus: run {run}: keys that hold another type than hopbus keeps there: {named}"
        in err.decode()
    ), err.decode()
    shown = hopbus("inspect", "--run", run, "--redis", redis_url)
    assert named in shown.stdout + shown.stderr, (shown.stdout, shown.stderr)


def test_a_broker_out_of_memory_is_said_so_not_blamed_on_its_keys(tmp_path):
    """Fault ``broker_out_of_memory``: maxmemory reached with no eviction, mid-run. Every
    write is refused ("OOM command not allowed"): the run fails in one line that says Redis
    is out of memory, where it said a key held what hopbus did not write there."""
    with EmbeddedRedis(port=0) as server:
        client = redis.Redis.from_url(server.url)
        args, run = train_args(server.url, tmp_path / "run", "-n", "3", "--iterations",
                               "100000", "--iter-time", "0.01", "--heartbeat", "1")  # fmt: skip
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=clean_env(), text=True)  # fmt: skip
        try:
            wait_iteration(client, RunKeys(run), 0, 20)
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", 1)
            _, err = proc.communicate(timeout=90)
        finally:
            proc.kill()
    assert proc.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("hopbus: error:") and "Redis is out of memory" in last, last
    assert "did not write there" not in err and "did something else write" not in err, err
    assert not processes_mentioning(run)


def test_a_launcher_whose_output_fails_stops_the_run_recorded_failed(
    redis_url, redis_client, tmp_path
):
    """Fault ``output_refused``: hopbus train's stderr refuses every write (2>/dev/full, as a
    disk full refuses metrics.jsonl, or a pipe closed by head). Nobody follows the run any
    more: it is stopped and recorded failed, with the reason, where it was left "running"
    (then "abandoned") with its workers killed."""
    args, run = train_args(redis_url, tmp_path / "run", "-n", "3", "--iterations", "100000",
                           "--iter-time", "0.01")  # fmt: skip
    with open("/dev/full", "w") as full:
        p = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=full, env=clean_env(),
                           timeout=120, check=False)  # fmt: skip
    assert p.returncode == 1
    keys = RunKeys(run)
    assert redis_client.hget(keys.meta, "status") == b"failed"
    assert b"its output failed (No space left on device)" in redis_client.get(keys.stop)
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["status"] == "failed"
    assert not processes_mentioning(run)


def test_workers_whose_keys_something_else_wrote_name_them(redis_url, redis_client):
    """Fault ``garbled_before_join``: a created run whose counter of worker 1 was made a hash
    and whose stats of worker 2 a string. Worker 1 was refused as if another process had
    started it ('is taken: it started already'), worker 2 failed on WRONGTYPE naming no key:
    each now names the keys of another type, and no refused process writes into the run."""
    run = f"garbled{os.getpid()}"
    created = hopbus("create", "--run", run, "-n", "3", "--iterations", "50", "--redis", redis_url)
    assert created.returncode == 0, created.stderr
    keys = RunKeys(run)
    redis_client.hset(keys.iter(1), "not", "a counter")
    redis_client.set(keys.stats(2), "not a hash")
    flags = ["--run", run, "--redis", redis_url, "--timeout", "20"]
    p = hopbus("worker", *flags, "--id", "1")
    assert p.returncode == 2 and error_lines(p.stderr) == [
        f"hopbus: error: worker 1 of run {run} cannot take its place: keys that hold another "
        f"type than hopbus keeps there: {keys.iter(1)} (a hash; hopbus keeps a string there)"
    ], p.stderr
    assert redis_client.hget(keys.addr, "1") is None  # refused: wrote nothing
    p = hopbus("worker", *flags, "--id", "2")
    (last,) = error_lines(p.stderr)
    assert p.returncode == 1 and "WRONGTYPE" in last, p.stderr
    assert f"{keys.stats(2)} (a string; hopbus keeps a hash there)" in last, last
    assert f"{keys.iter(1)} (a hash; hopbus keeps a string there)" in last, last


def test_a_report_forged_before_the_real_one_counts_for_nobody(redis_url, redis_client, tmp_path):
    """Fault ``forged_final_report``: worker 0 has entered the last iteration and hangs before
    its final report (``hang_before_report``): its counter says the last iteration and its
    heartbeat beats on, the gap a report forged early would slip through. The forged report
    is nobody's: inspect neither shows it nor calls the run finished, and hopbus train does
    not end the run with it."""
    flags = ["-n", "2", "--topology", "ring", "--iterations", "30", "--iter-time", "0.01"]
    args, run = train_args(redis_url, tmp_path / "run", *flags, "--eval-every", "0")
    env = clean_env(HOPBUS_FAULTS="0:hang_before_report")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    keys = RunKeys(run)
    try:
        wait_iteration(redis_client, keys, 0, 30)
        wait_for(lambda: redis_client.get(keys.hb(1)) == b"finished", 60, "worker 1's report")
        forged = {"worker": 0, "iterations": 30, "final_accuracy": 0.123, "final_loss": 9.99}
        redis_client.hset(keys.result, "0", json.dumps(forged))
        p = hopbus("inspect", "--run", run, "--redis", redis_url, "--json")
        snap = json.loads(p.stdout)
        assert snap["status"] == "running" and set(snap["results"]) == {"1"}, snap["results"]
        assert proc.poll() is None  # the launcher, looking every 0.2 s, did not take it either
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 130


def test_workers_that_never_wait_still_stop_with_the_run(redis_url, redis_client):
    """Fault ``stop_key``: the run's stop key set by hand while its workers (no launcher, two
    of them at the same pace) rarely wait for anything: each sees it within a heartbeat
    period at its next iteration, not only in a wait, and exits 1 saying why."""
    run = f"stopkey{os.getpid()}"
    flags = ["--iterations", "3000", "--iter-time", "0.005", "--heartbeat", "2"]
    workers = _two_workers(redis_url, run, *flags)
    keys = RunKeys(run)
    wait_iteration(redis_client, keys, 1, 50)
    redis_client.set(keys.stop, "stopped by hand")
    for w in workers:
        _, err = w.communicate(timeout=60)
        assert w.returncode == 1, err
        assert "stopped with the run: stopped by hand" in err, err
    assert max(int(redis_client.get(keys.iter(i))) for i in range(2)) < 3000


def test_watch_is_not_fooled_by_a_forged_error_or_a_deleted_heartbeat(
    redis_url, redis_client, tmp_path
):
    """Faults ``forged_error_event`` and ``deleted_heartbeat``: an error event that no worker
    posted, and a live worker's heartbeat deleted (it puts it back within a renewal period).
    hopbus watch of that standard run, where a lost worker would end it, sees it finish."""
    run = f"forgederr{os.getpid()}"
    flags = ["--iterations", "150", "--iter-time", "0.02", "--heartbeat", "2"]
    workers = _two_workers(redis_url, run, *flags)
    watch = subprocess.Popen(
        hopbus_args("watch", "--run", run, "--out", str(tmp_path / "w"), "--json"),
        env=clean_env(HOPBUS_REDIS=redis_url), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    keys = RunKeys(run)
    wait_iteration(redis_client, keys, 0, 20)
    redis_client.xadd(keys.events, {"kind": "error", "worker": 0, "message": "boom"})
    redis_client.delete(keys.hb(1))
    for w in workers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    out, err = watch.communicate(timeout=60)
    assert watch.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and s["lost_workers"] == [] and s["iterations"]["min"] == 150
    assert redis_client.hget(keys.meta, "status") == b"finished"


def test_a_dead_set_written_by_hand_is_named_by_the_worker_left_waiting(redis_url, redis_client):
    """Fault ``forged_dead``: worker 0 put in the run's dead set by hand, in a standard run.
    Worker 0 leaves (it is declared dead); worker 1, left waiting for what only a dead worker
    could send, says so after --timeout instead of blaming "alive" workers it does not name."""
    run = f"forgeddead{os.getpid()}"
    flags = ["--iterations", "3000", "--iter-time", "0.01", "--timeout", "4"]
    workers = _two_workers(redis_url, run, *flags)
    keys = RunKeys(run)
    wait_iteration(redis_client, keys, 1, 20)
    redis_client.sadd(keys.dead, 0)
    errs = [w.communicate(timeout=60)[1] for w in workers]
    assert workers[1].returncode == 1, errs[1]
    (line,) = error_lines(errs[1])
    assert f"which only workers declared dead ({keys.dead}) could send" in line, line


def test_a_death_written_into_the_dead_set_by_hand_fakes_no_broken_bound(
    redis_url, redis_client, tmp_path
):
    """Fault ``unmarked_dead``: worker 1 of a backup run put in the dead set by hand (SADD),
    with no death marker in the progress stream (only the declaring script writes one). The
    workers and the scripts go on without it, and so does the follower's replay: the run
    ends finished with worker 1 among the lost, not with a Table 1 bound 'broken' hundreds of
    times against a worker that had left (exit 3)."""
    flags = ["-n", "3", "--topology", "ring", "--mode", "backup", "--backup", "1",
             "--iterations", "250", "--iter-time", "0.02", "--heartbeat", "3"]  # fmt: skip
    proc, _, keys = _start(redis_url, tmp_path, *flags)
    wait_iteration(redis_client, keys, 1, 30)
    redis_client.sadd(keys.dead, 1)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and s["violations"] == 0, s["first_violation"]
    assert [w["worker"] for w in s["lost_workers"]] == [1], s["lost_workers"]
    assert s["lost_workers"][0]["iteration"] >= 30
    assert s["per_worker"][0]["iterations"] == s["per_worker"][2]["iterations"] == 250


def test_a_worker_waiting_on_a_peer_whose_heartbeat_was_deleted_waits_on(redis_url, redis_client):
    """Fault ``deleted_heartbeat`` as a waiting worker meets it: worker 1 waits on slow worker 0
    (40x) when worker 0's heartbeat is deleted; worker 0 puts it back within a renewal period,
    so worker 1 does not take it for dead, and the standard run finishes."""
    run = f"delhb{os.getpid()}"
    flags = ["--iterations", "12", "--iter-time", "0.02", "--heartbeat", "2"]
    workers = _two_workers(redis_url, run, *flags, "--slowdown", "fixed:40@0")
    keys = RunKeys(run)
    wait_iteration(redis_client, keys, 1, 3)
    redis_client.delete(keys.hb(0))
    for w in workers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["status"] == "finished"


def test_a_config_no_hopbus_wrote_is_named_by_its_key_not_a_flag(redis_url, redis_client):
    """Fault ``mistyped_config``: the run's config in Redis rewritten with a setting of the
    wrong type. Every reader says the key holds a config no hopbus wrote, never that the
    reader's own --iterations flag is wrong."""
    run = f"badcfg{os.getpid()}"
    assert hopbus("create", "--run", run, "-n", "3", "--redis", redis_url).returncode == 0
    keys = RunKeys(run)
    redis_client.hset(keys.meta, "config", json.dumps({"workers": 3, "iterations": "x"}))
    for args in (["inspect"], ["top", "--once"], ["worker", "--id", "0", "--timeout", "5"]):
        p = hopbus(*args, "--run", run, "--redis", redis_url)
        (line,) = error_lines(p.stderr)
        assert p.returncode == 2, (args, p.stderr)
        assert f"{keys.meta} holds a config no hopbus wrote (iterations: input should be" in line
        assert "--iterations" not in line


@pytest.mark.parametrize("mode", ["backup", "standard"])
def test_a_dead_set_forged_to_hold_every_worker_fails_the_run(
    redis_url, redis_client, tmp_path, mode
):
    """Fault ``forged_dead``: something SADDs every worker to the run's dead set. Redis then
    refuses each of them, and each leaves as a worker declared dead; no neighbour is left to
    stop the run, so the launcher does, with one line: never a run 'finished' by no one
    (before: exit 0, finished at iteration 52 of 300, no report of any worker)."""
    flags = ["-n", "4", "--mode", mode, "--iterations", "300", "--iter-time", "0.03"]
    proc, _, keys = _start(redis_url, tmp_path, *flags, "--eval-every", "0")
    wait_iteration(redis_client, keys, 0, 30)
    redis_client.sadd(keys.dead, 0, 1, 2, 3)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    s = json.loads(out)
    assert not s["finished"] and "was declared dead (the run's dead set holds it)" in s["failure"]
    assert err.strip().splitlines()[-1].startswith(f"hopbus: error: run {keys.run} failed: ")
    assert redis_client.hget(keys.meta, "status") == b"failed"


def test_a_status_key_of_another_type_at_the_end_loses_no_summary(
    redis_url, redis_client, tmp_path
):
    """Fault ``garbled_meta``: the run's record (a hash) replaced by a string while it trains.
    Recording the run's end then fails, but the run itself finished: its summary is written
    and printed all the same, with a note that Redis could not take the status (before: exit
    1, no summary.json, nothing on stdout)."""
    flags = ["-n", "3", "--iterations", "150", "--iter-time", "0.02", "--eval-every", "0"]
    proc, _, keys = _start(redis_url, tmp_path, *flags)
    wait_iteration(redis_client, keys, 0, 30)
    pipe = redis_client.pipeline(transaction=True)
    pipe.delete(keys.meta).set(keys.meta, "garbage").execute()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and s["iterations"]["min"] == 150, s
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["finished"]
    assert "refused to record the run's end (WRONGTYPE" in err, err


def test_a_sketch_key_of_another_type_loses_only_the_consensus_distance(
    redis_url, redis_client, tmp_path
):
    """Fault ``garbled_sketch``: the hash of the workers' parameter sketches replaced by a
    string while they train. The run finished: it ends so, its consensus distance unknown
    and said to be (before: each worker's report failed on it, exit 1, 'worker 0: Redis
    refused a command', the run's end blamed on a lost worker)."""
    flags = ["-n", "3", "--iterations", "150", "--iter-time", "0.02", "--eval-every", "0"]
    proc, _, keys = _start(redis_url, tmp_path, *flags)
    wait_iteration(redis_client, keys, 0, 30)
    redis_client.set(keys.sketch, "garbage")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and s["iterations"]["min"] == 150 and s["final_accuracy"] > 0.5, s
    assert s["consensus_distance"] is None and s["consensus"] is None, s
    said = "the consensus distance is unknown: Redis refused the workers' sketches in "
    assert f"{said}{keys.sketch} (WRONGTYPE" in err, err


def test_a_worker_frozen_at_the_end_is_judged_by_its_heartbeat(redis_url, redis_client, tmp_path):
    """Faults ``hang_before_report`` and a SIGSTOP: worker 0 reaches the last iteration and
    freezes before its report, once the others have reported theirs. No neighbour waits on it
    any more, so the launcher judges its heartbeat itself, as a neighbour would: gone for a
    renewal period, the standard run fails with one line naming it (before: the launcher
    waited on, past --timeout, for as long as the process stayed frozen)."""
    flags = ["-n", "3", "--topology", "ring", "--iterations", "60", "--iter-time", "0.02"]
    flags += ["--heartbeat", "2", "--timeout", "10", "--eval-every", "0"]
    args, run = train_args(redis_url, tmp_path / "run", *flags)
    keys = RunKeys(run)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(HOPBUS_FAULTS="0:hang_before_report"))  # fmt: skip
    try:
        wait_for(lambda: redis_client.hlen(keys.result) == 2, 60, "workers 1 and 2 reported")
        (frozen,) = processes_mentioning(f"--run {run} --id 0")
        os.kill(frozen, signal.SIGSTOP)
        out, err = proc.communicate(timeout=60)
        left = processes_mentioning(f"--run {run}")  # the launcher stopped the frozen one too
    finally:
        for p in processes_mentioning(f"--run {run}"):
            os.kill(p, signal.SIGKILL)
    assert proc.returncode == 1, err
    s = json.loads(out)
    assert not s["finished"], s
    assert "worker 0: heartbeat gone without a result (its process is still there" in s["failure"]
    assert not left


def test_inspect_says_a_live_heartbeat_is_of_a_worker_that_said_it_left(redis_url, redis_client):
    """A worker that failed or was interrupted leaves its heartbeat to run out its TTL; an
    event says why it left. inspect keeps it alive (an event anyone can write proves
    nothing), but once the heartbeat has gone unrenewed for half its TTL says what it said,
    so a process gone since is not shown as running; a replacement's is its own."""
    from hopbus.coord.snapshot import snapshot

    run = f"leaving{os.getpid()}"
    made = hopbus("create", "--run", run, "-n", "2", "--redis", redis_url)
    assert made.returncode == 0, made.stderr
    keys = RunKeys(run)
    redis_client.set(keys.iter(0), 3)
    redis_client.xadd(keys.events, {"kind": "interrupted", "worker": 0, "message": "Ctrl-C"})
    # renewed a moment ago (TTL 10 s): alive, whatever an event says
    redis_client.set(keys.hb(0), int(time.time() * 1000), px=10_000)
    assert snapshot(redis_client, keys)["workers"][0]["state"].endswith(" s ago)")
    # not renewed for over half its TTL: what it said is shown beside
    redis_client.set(keys.hb(0), int(time.time() * 1000) - 7_000, px=3_000)
    state = snapshot(redis_client, keys)["workers"][0]["state"]
    assert state.startswith("alive (") and state.endswith("; it says it left: interrupted)")
    redis_client.xadd(keys.events, {"kind": "rejoin", "worker": 0})  # a replacement came in
    assert snapshot(redis_client, keys)["workers"][0]["state"].endswith(" s ago)")
    assert hopbus("clean", "--run", run, "--redis", redis_url, "--force").returncode == 0
