"""A worker killed with SIGKILL mid-run, with real processes and a real redis-server.

With backup workers the others go on without it (Sec. 3.4) and reach the accuracy bar; in
standard mode the run stops, naming it, and no process is left behind. Both through ``hopbus
train`` (whose launcher sees the process end) and through separately started ``hopbus worker``
processes (as docker compose runs them: only the heartbeats tell).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from cluster import (
    clean_env,
    follow_through,
    hopbus,
    processes_mentioning,
    train,
    train_args,
    wait_iteration,
)

from hopbus.coord.keys import RunKeys
from hopbus.runtime.progress import parse_entry

N, VICTIM, KILL_AT = 8, 3, 40
HEARTBEAT = 2.0
FLAGS = ["-n", str(N), "--topology", "ring-based", "--iterations", "250", "--iter-time", "0.02"]
FLAGS += ["--heartbeat", str(HEARTBEAT), "--timeout", "30", "--eval-every", "0"]


def _hopbus(*args: str) -> list[str]:
    return [sys.executable, "-m", "hopbus", *args]


def _kill_worker(run: str, worker: int) -> float:
    pids = processes_mentioning(f"--run {run} --id {worker}")
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    return time.time()


def _longest_stall(client: redis.Redis, keys: RunKeys, after: float) -> float:
    """The longest time any live worker went without entering an iteration after ``after``
    (its last iteration's end counts, so a worker that stopped for good shows up too)."""
    last: dict[int, float] = {}
    stall = 0.0
    for _, fields in client.xrange(keys.progress):
        rec = parse_entry(fields)
        if rec.get("dead"):
            continue
        w, t = rec["worker"], rec["t"]
        if t > after:
            stall = max(stall, t - max(last.get(w, after), after))
        last[w] = t
    return stall


def _start_run(
    redis_url: str, tmp_path: Path, mode_flags: list[str]
) -> tuple[subprocess.Popen, str]:
    args, run = train_args(redis_url, tmp_path / "run", *FLAGS, *mode_flags)
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
    )
    return proc, run


def test_backup_mode_goes_on_without_a_killed_worker(redis_url, redis_client, tmp_path):
    import json

    proc, run = _start_run(redis_url, tmp_path, ["--mode", "backup", "--backup", "1"])
    keys = RunKeys(run)
    wait_iteration(redis_client, keys, VICTIM, KILL_AT)
    killed = _kill_worker(run, VICTIM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and s["failure"] is None
    assert [w["worker"] for w in s["lost_workers"]] == [VICTIM]
    assert s["lost_workers"][0]["iteration"] >= KILL_AT
    # its iterations count where it died, however late its entries were read
    assert s["iterations"]["per_worker"][VICTIM] == s["lost_workers"][0]["iteration"]
    assert s["iter_time_s"]["per_worker"][VICTIM] is not None
    survivors = [w for i, w in enumerate(s["per_worker"]) if i != VICTIM]
    assert all(w["iterations"] == 250 for w in survivors)
    assert min(w["final_accuracy"] for w in survivors) >= 0.9
    assert s["violations"] == 0 and s["checks"]["token_invariant_violations"] == 0
    assert f"worker {VICTIM} was killed by SIGKILL; the run goes on without it" in err
    assert _longest_stall(redis_client, keys, killed) < HEARTBEAT
    assert not processes_mentioning(run)
    # once it is dead, nobody waits on it: each survivor's entries say so, but for a wait
    # that had begun before the death and ended after it (the 288 of 330 of a trial did)
    after: dict[int, int] = {}
    dead_seen = False
    for _, fields in redis_client.xrange(keys.progress):
        rec = parse_entry(fields)
        dead_seen = dead_seen or bool(rec.get("dead"))
        if dead_seen and VICTIM in rec.get("blocked_on", []):
            after[rec["worker"]] = after.get(rec["worker"], 0) + 1
    assert dead_seen and all(n <= 1 for n in after.values()), after
    # inspect and top read the gaps among the live workers: the dead one, left behind at its
    # iteration, broke no bound (both counted it, 200 behind, as a broken bound)
    p = hopbus("inspect", "--run", run, "--redis", redis_url, "--json")
    gaps = json.loads(p.stdout)["gaps"]
    assert gaps["dead"] == [VICTIM] and gaps["over_bound"] == 0, gaps
    assert gaps["max_adjacent"] <= gaps["bound"]["adjacent"], gaps
    top = hopbus("top", "--run", run, "--redis", redis_url, "--once")
    assert top.returncode == 0 and "ABOVE" not in top.stdout, top.stdout


def test_standard_mode_stops_and_names_the_killed_worker(redis_url, redis_client, tmp_path):
    proc, run = _start_run(redis_url, tmp_path, ["--mode", "standard"])
    keys = RunKeys(run)
    wait_iteration(redis_client, keys, VICTIM, KILL_AT)
    killed = time.monotonic()
    _kill_worker(run, VICTIM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert time.monotonic() - killed < 30  # --timeout
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        f"hopbus: error: run {run} failed: worker {VICTIM} was killed by SIGKILL;"
    )
    assert "--mode standard cannot go on without a worker" in last
    assert "Traceback" not in err
    assert redis_client.get(keys.stop) is not None
    assert not processes_mentioning(run)


def _start_workers(
    redis_url: str, mode_flags: list[str], tag: str = ""
) -> tuple[str, list[subprocess.Popen]]:
    """``hopbus create`` and N ``hopbus worker`` processes: no launcher watches them."""
    run = f"faults{os.getpid()}-{mode_flags[1]}{tag}"
    env = clean_env()
    p = hopbus("create", "--run", run, "--redis", redis_url, *FLAGS, *mode_flags)
    assert p.returncode == 0, p.stderr
    procs = [
        subprocess.Popen(
            _hopbus("worker", "--run", run, "--id", str(i), "--redis", redis_url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(N)
    ]
    return run, procs


@pytest.mark.parametrize("mode", ["backup", "standard"])
def test_without_a_launcher_the_heartbeats_tell(redis_url, redis_client, mode):
    """Workers started on their own (compose): only the victim's expired heartbeat tells the
    others. Backup: the others finish. Standard: every other worker exits 1 within the
    heartbeat's life plus a look, saying the run stopped because of the victim."""
    extra = ["--mode", mode] + (["--backup", "1"] if mode == "backup" else [])
    run, procs = _start_workers(redis_url, extra)
    keys = RunKeys(run)
    try:
        wait_iteration(redis_client, keys, VICTIM, KILL_AT)
        procs[VICTIM].kill()
        killed, t_kill = time.time(), time.monotonic()
        outs = [p.communicate(timeout=120) for p in procs]
        ended = time.monotonic() - t_kill
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    others = [
        (p.returncode, err)
        for i, (p, (_, err)) in enumerate(zip(procs, outs, strict=True))
        if i != VICTIM
    ]
    said = "\n".join(
        f"worker {i} exit {p.returncode}: {e}"
        for i, (p, (_, e)) in enumerate(zip(procs, outs, strict=True))
    )
    if mode == "backup":
        assert all(code == 0 for code, _ in others), said
        assert _longest_stall(redis_client, keys, killed) < HEARTBEAT + 1.5  # TTL + a look
        assert redis_client.smembers(keys.dead) == {str(VICTIM).encode()}
    else:
        assert ended < 30  # --timeout
        for code, err in others:
            assert code == 1, err
            assert "Traceback" not in err
            last = err.strip().splitlines()[-1]
            assert f"worker {VICTIM}" in last and "heartbeat" in last, last
        assert redis_client.get(keys.stop).decode() == f"worker {VICTIM} died (heartbeat gone)"
    assert not processes_mentioning(run)


def test_a_broken_token_invariant_fails_the_run_with_status_3(redis_url, tmp_path):
    """HOPBUS_FAULTS leak_token: worker 1 puts one token too many into a queue as it ends. The
    run's iterations all complete, but Theorem 2's invariant no longer holds at the end: the
    summary counts it, the line names it, and the run fails with exit 3 (not 0)."""
    import json

    env = clean_env(HOPBUS_FAULTS="1:leak_token")
    p, s = train(
        redis_url, tmp_path / "run", "-n", "3", "--topology", "complete", "--iterations", "20",
        env=env,
    )  # fmt: skip
    assert p.returncode == 3, p.stderr
    assert s is not None and s["finished"] and s["violations"] == 0
    assert s["checks"]["token_invariant_violations"] == 1
    last = p.stderr.splitlines()[-1]
    assert "invariant check failed: token_invariant_violations 1" in last
    # which queue: worker 1's to the first it puts to, one token over max_ig's 5 at the end
    assert re.search(r"first TokenQ\(1->[02]\) holds 6 tokens where Theorem 2 gives 5", last)
    assert "Traceback" not in p.stderr
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["checks"]["token_invariant_violations"] == 1
    queue = on_disk["first_token_violation"]
    assert queue["from"] == 1 and queue["size"] == queue["expected"] + 1, queue


def test_a_token_queue_of_another_type_is_named_at_the_end(redis_url, redis_client, tmp_path):
    """Fault ``garbled_token_queue``: a finished run's TokenQ(1->0) made a string, then a
    watch of the run. Its invariant check counts the queue, and the line says it is no list
    ('holds None tokens', before) and names the key, exit 3."""
    args, run = train_args(redis_url, tmp_path / "run", "-n", "3", "--topology", "complete",
                           "--iterations", "20")  # fmt: skip
    p = subprocess.run(args, capture_output=True, text=True, env=clean_env(), timeout=240,
                       check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    keys = RunKeys(run)
    redis_client.delete(keys.tok(1, 0))
    redis_client.set(keys.tok(1, 0), "not a queue")
    w = hopbus("watch", "--run", run, "--redis", redis_url, "--out", str(tmp_path / "w"))
    assert w.returncode == 3, w.stderr
    assert "first TokenQ(1->0) is not a list (something else wrote it)" in w.stderr, w.stderr
    assert f"{keys.tok(1, 0)} (a string; hopbus keeps a list there)" in w.stderr, w.stderr


def test_a_worker_that_dies_after_its_report_fails_nothing(redis_url, tmp_path):
    """HOPBUS_FAULTS crash_after_report: worker 1 is killed (SIGKILL) just after it published
    its final report, in standard mode, which stops for a dead worker. Its part was done: the
    run ends finished (status 0), and a note says how the process ended."""
    env = clean_env(HOPBUS_FAULTS="1:crash_after_report")
    p, s = train(
        redis_url, tmp_path / "run", "-n", "3", "--topology", "complete", "--iterations", "20",
        "--eval-every", "0", env=env,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert s is not None and s["finished"] and s["failure"] is None and s["violations"] == 0
    assert s["lost_workers"] == [] and [w["iterations"] for w in s["per_worker"]] == [20] * 3
    assert "worker 1 was killed by SIGKILL, after reporting its result" in p.stderr, p.stderr
    assert "after reporting its result: its part of the run was complete" in p.stderr


def test_a_worker_stopped_by_hand_says_why(redis_url, redis_client, tmp_path):
    """Fault ``interrupted_worker``: Ctrl-C (SIGINT) of one hand-started worker of a standard
    run. It exits 130 and posts why it is gone, so hopbus watch and the stop key (written by
    whoever saw it gone first: watch, or a peer, which adds what it said to 'died (heartbeat
    gone)') name the interruption, not only a heartbeat gone without a result."""
    run, procs = _start_workers(redis_url, ["--mode", "standard"], "-by-hand")
    args = _hopbus("watch", "--run", run, "--redis", redis_url, "--out", str(tmp_path / "w"))
    watch = subprocess.Popen(
        args, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_iteration(redis_client, RunKeys(run), VICTIM, KILL_AT)
        procs[VICTIM].send_signal(signal.SIGINT)
        _, victim_err = procs[VICTIM].communicate(timeout=60)
        _, said = watch.communicate(timeout=120)
        peers = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in [*procs, watch]:
            if p.poll() is None:
                p.kill()
    assert procs[VICTIM].returncode == 130, victim_err
    assert watch.returncode == 1, said
    *_, results, last = said.strip().splitlines()
    assert f"worker {VICTIM}" in last and "interrupted (Ctrl-C or SIGTERM)" in last, last
    # a watch has no logs folder to point at: the workers' logs stay where they ran
    assert results == f"hopbus: results in {tmp_path / 'w'}", results
    stop = redis_client.get(RunKeys(run).stop).decode()
    assert f"worker {VICTIM}" in stop and "interrupted (Ctrl-C or SIGTERM)" in stop, stop
    # every other worker's last line says why too, the one that saw the heartbeat go first
    # included (it said only 'the process died or lost Redis')
    for i, err in enumerate(peers):
        last = err.strip().splitlines()[-1] if i != VICTIM and err.strip() else ""
        assert i == VICTIM or "interrupted (Ctrl-C or SIGTERM)" in last, (i, err[-600:])
    assert not processes_mentioning(run)


def test_a_frozen_worker_is_lost_not_waited_out_when_its_heartbeat_is_the_timeout(
    redis_url, redis_client, tmp_path
):
    """Fault ``frozen_worker`` (SIGSTOP) in a backup run whose --timeout is below --heartbeat,
    which caps the heartbeat at it: the frozen worker's heartbeat runs out about when a
    neighbour's wait on its token does. The neighbour waits the renewal period out, in which
    the worker is declared dead, and the run goes on without it; it failed, calling the frozen
    worker 'alive, but it did not advance'."""
    args, run = train_args(
        redis_url, tmp_path / "run", "-n", "4", "--topology", "complete", "--mode", "backup",
        "--backup", "1", "--max-ig", "2", "--iterations", "150", "--iter-time", "0.02",
        "--eval-every", "0", "--timeout", "5",
    )  # fmt: skip
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
    )
    pid = 0
    try:
        wait_iteration(redis_client, RunKeys(run), VICTIM % 4, 20)
        (pid,) = processes_mentioning(f"--run {run} --id {VICTIM % 4}")
        os.kill(pid, signal.SIGSTOP)
        out, err = proc.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            if pid:
                os.kill(pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and [w["worker"] for w in s["lost_workers"]] == [VICTIM % 4]
    assert "did not advance" not in err
    assert not processes_mentioning(run)


def test_a_watch_counts_the_steps_taken_after_the_stop(redis_url, redis_client, tmp_path):
    """Fault ``forged_stop``: the run's stop key written from outside while hand-started
    workers run. They learn of it within a heartbeat period and step on meanwhile; hopbus
    watch's summary counts those steps (it wrote the iterations where it saw the stop)."""
    run, procs = _start_workers(redis_url, ["--mode", "standard"], "-stopped")
    keys = RunKeys(run)
    args = _hopbus("watch", "--run", run, "--redis", redis_url, "--out", str(tmp_path / "w"),
                   "--json")  # fmt: skip
    watch = subprocess.Popen(
        args, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def stop() -> None:
        wait_iteration(redis_client, keys, 0, KILL_AT)
        redis_client.set(keys.stop, "stopped from outside")

    out, err = follow_through(watch, procs, stop)
    assert watch.returncode == 1, err
    s = json.loads(out)
    assert not s["finished"] and "stopped from outside" in s["failure"]
    reached = [int(redis_client.get(keys.iter(i))) for i in range(N)]
    assert s["iterations"]["per_worker"] == reached, (s["iterations"], reached)
    assert not processes_mentioning(run)
