"""A replacement for a dead worker (``hopbus worker --rejoin``), with real processes and a real
redis-server: worker 3 of 8 is killed with SIGKILL in a backup run, the others go on without it,
and a new process takes its place, with the newest parameters an in-neighbour sends it and that
update's iteration. The run then finishes with all 8, within Table 1 of the whole graph."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest
from cluster import (
    clean_env,
    hopbus,
    processes_mentioning,
    redis_commands_of,
    train_args,
    wait_for,
    wait_iteration,
)

from hopbus.coord.control import RunControl
from hopbus.coord.keys import RunKeys
from hopbus.coord.snapshot import snapshot
from hopbus.runtime.progress import parse_entry

# 600 iterations of at least 50 ms: about 30 s, room for two replacements to start up (a few
# seconds each on a busy machine) before the others finish
N, VICTIM, KILL_AT, ITERATIONS = 8, 3, 40, 600
FLAGS = ["-n", str(N), "--topology", "ring-based", "--iterations", str(ITERATIONS)]
FLAGS += ["--iter-time", "0.05", "--heartbeat", "2", "--timeout", "30", "--eval-every", "0"]
BACKUP = ("--mode", "backup", "--backup", "1")


def _rejoin(redis_url: str, run: str, worker: int, **env: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "hopbus", "worker", "--run", run, "--id", str(worker)]
    return subprocess.Popen(
        [*args, "--redis", redis_url, "--rejoin"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(**env),
    )


@contextlib.contextmanager
def _training(redis_url: str, tmp_path, *flags: str):
    """``hopbus train`` of a run with ``flags``, in the background: (its process, the run id,
    its keys); whatever of the run still runs at the end is killed, a failed test's too."""
    args, run = train_args(redis_url, tmp_path / "run", *flags)
    train = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env()
    )
    try:
        yield train, run, RunKeys(run)
    finally:
        for p in processes_mentioning(f"--run {run}"):
            os.kill(p, signal.SIGKILL)


def _events(client, keys: RunKeys, kind: str) -> list[dict]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in client.xrange(keys.events)
        if fields.get(b"kind") == kind.encode()
    ]


def test_a_replacement_takes_a_killed_workers_place(redis_url, redis_client, tmp_path):
    """Also: a live worker cannot be replaced, and a replacement that dies while joining
    neither blocks its neighbours nor keeps the next one out."""
    with _training(redis_url, tmp_path, *FLAGS, *BACKUP) as (train, run, keys):
        wait_iteration(redis_client, keys, 2, 1)
        refused = _rejoin(redis_url, run, 2)  # a live worker cannot be replaced
        wait_iteration(redis_client, keys, VICTIM, KILL_AT)
        (pid,) = processes_mentioning(f"--run {run} --id {VICTIM}")
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: redis_client.sismember(keys.dead, VICTIM), 30, "the victim declared dead")
        assert snapshot(redis_client, keys)["workers"][VICTIM]["state"] == "dead"  # inspect
        # a first replacement dies once it has announced itself: its in-neighbours, which send
        # to it without waiting, must not block on it, and it must leave room for the next
        crashed = _rejoin(redis_url, run, VICTIM, HOPBUS_FAULTS=f"{VICTIM}:crash_joining")
        assert crashed.wait(timeout=60) == 70
        assert _events(redis_client, keys, "rejoining")
        wait_for(
            lambda: not redis_client.sismember(keys.joining, VICTIM),
            30,
            "the crashed replacement forgotten (its heartbeat lapsed)",
        )
        replacement = _rejoin(redis_url, run, VICTIM)
        rep_out, rep_err = replacement.communicate(timeout=240)
        out, err = train.communicate(timeout=240)
        _, refused_err = refused.communicate(timeout=60)
    assert refused.returncode == 1
    assert refused_err.strip().splitlines()[-1] == (
        f"hopbus: error: --rejoin: worker 2 of run {run} cannot be replaced: it is not dead "
        "(its heartbeat is live, or the run has not declared it dead yet)"
    )
    assert not _events(redis_client, keys, "error")  # the refusal left the run alone
    assert replacement.returncode == 0, rep_err
    assert f"worker {VICTIM} finished {ITERATIONS} iterations" in rep_out
    assert train.returncode == 0, err
    s = json.loads(out)
    assert s["finished"] and s["failure"] is None
    assert [w["worker"] for w in s["lost_workers"]] == [VICTIM]
    (back,) = s["rejoined_workers"]
    assert back["worker"] == VICTIM and back["iteration"] > s["lost_workers"][0]["iteration"]
    assert f"worker {VICTIM} rejoined in iteration {back['iteration']}" in err
    assert all(w["iterations"] == ITERATIONS for w in s["per_worker"])
    assert min(w["final_accuracy"] for w in s["per_worker"]) >= 0.9
    # the whole graph's Table 1 held from the moment it was back, and every queue is right
    assert s["violations"] == 0 and s["checks"]["token_invariant_violations"] == 0
    # it took the iteration of an update an in-neighbour sent it, and went on from there
    entries = [parse_entry(f) for _, f in redis_client.xrange(keys.progress)]
    mine = [e["iter"] for e in entries if e["worker"] == VICTIM and not e.get("dead")]
    after = mine[mine.index(back["iteration"]) :]
    assert after[0] == back["iteration"] and after[-1] == ITERATIONS
    assert after == sorted(after)
    assert "rejoined run" in rep_err and "parameters" in rep_err
    assert not processes_mentioning(f"--run {run}")


@pytest.mark.parametrize("mode", ["standard", "staleness"])
def test_a_mode_without_backup_workers_takes_no_replacement(redis_url, mode):
    run = f"rejoin{os.getpid()}-{mode}"
    p = hopbus("create", "--run", run, "--redis", redis_url, *FLAGS, "--mode", mode)
    assert p.returncode == 0, p.stderr
    rep = _rejoin(redis_url, run, 1)
    _, err = rep.communicate(timeout=60)
    assert rep.returncode == 1
    assert err.strip().splitlines()[-1] == (
        f"hopbus: error: --rejoin: run {run} is --mode {mode}, which stops when a worker dies; "
        "only backup and hybrid runs go on without one and take a replacement"
    )


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("wake", ["before", "after"])
def test_a_worker_declared_dead_while_frozen_leaves_when_it_wakes(
    redis_url, redis_client, tmp_path, wake
):
    """A worker frozen (SIGSTOP) past its heartbeat is declared dead and the run goes on.
    Woken, before a replacement came in or after one took its id, it must not come back as a
    stranger to token queues that no longer count it: it neither advances nor beats again,
    leaves with one line, posts no error to the run, and leaves the replacement alone."""
    with _training(redis_url, tmp_path, *FLAGS, *BACKUP) as (train, run, keys):
        wait_iteration(redis_client, keys, VICTIM, KILL_AT)
        (pid,) = processes_mentioning(f"--run {run} --id {VICTIM}")
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: redis_client.sismember(keys.dead, VICTIM), 30, "the frozen one dead")
        if wake == "after":
            replacement = _rejoin(redis_url, run, VICTIM)
            wait_for(lambda: _events(redis_client, keys, "rejoin"), 60, "the replacement in")
        os.kill(pid, signal.SIGCONT)
        wait_for(lambda: not _running(pid), 30, "the woken worker to leave")
        if wake == "before":
            assert not redis_client.exists(keys.hb(VICTIM))  # it did not beat again
            replacement = _rejoin(redis_url, run, VICTIM)
        _, rep_err = replacement.communicate(timeout=240)
        out, err = train.communicate(timeout=240)
    assert replacement.returncode == 0, rep_err
    assert train.returncode == 0, err
    assert f"worker {VICTIM} of run {run} was declared dead (its heartbeat lapsed" in err
    assert not _events(redis_client, keys, "error")
    s = json.loads(out)
    assert s["finished"] and [w["worker"] for w in s["lost_workers"]] == [VICTIM]
    assert [w["worker"] for w in s["rejoined_workers"]] == [VICTIM]
    assert all(w["iterations"] == ITERATIONS for w in s["per_worker"])
    # no progress entry of the old process after its death, and every queue is right
    assert s["checks"]["progress_out_of_order"] == 0 and s["violations"] == 0
    assert s["checks"]["token_invariant_violations"] == 0


def test_a_token_wait_ends_when_its_owner_is_declared_dead_though_a_replacement_beats(
    redis_url, redis_client, tmp_path
):
    """Worker 4 waits for a token from worker 3, which froze. Someone else declares 3 dead and
    a replacement announces itself in the same instant, so 3's heartbeat key is never missing
    while 4 looks: 4 must still see 3 dead (the dead set says so) and go on without its queue,
    not wait on it until --timeout. (Before, the replacement, which needs 4 to advance before
    it finds an iteration to enter, and 4 waited on each other: the race docs/faults.md told.)"""
    its = 100
    flags = ["-n", str(N), "--topology", "ring-based", "--iterations", str(its)]
    flags += ["--iter-time", "0.05", "--heartbeat", "20", "--timeout", "60", "--eval-every", "0"]
    with _training(redis_url, tmp_path, *flags, *BACKUP) as (train, run, keys):
        wait_iteration(redis_client, keys, VICTIM, KILL_AT)
        (pid,) = processes_mentioning(f"--run {run} --id {VICTIM}")
        os.kill(pid, signal.SIGSTOP)
        frozen_at = int(redis_client.get(keys.iter(VICTIM)))
        # 4 runs max_ig (5) iterations ahead of 3 and waits for its token; its heartbeat lives
        # 20 s, so no one has seen it lapse
        blocked = frozen_at + 5
        wait_iteration(redis_client, keys, 4, blocked, timeout=30)
        assert redis_client.llen(keys.tok(VICTIM, 4)) == 0
        (waiter,) = processes_mentioning(f"--run {run} --id 4")
        # in BLPOP, and on 3's queue: 0's and 5's hold tokens
        wait_for(
            lambda: (
                "blpop" in redis_commands_of(redis_client, waiter)
                and redis_client.llen(keys.tok(0, 4)) > 0
                and redis_client.llen(keys.tok(5, 4)) > 0
            ),
            30,
            "worker 4 waiting for worker 3's token",
        )
        fake = RunControl(redis_client, keys, VICTIM, iterations=its)
        assert fake.declare_dead(VICTIM, force=True)
        assert fake.begin_rejoin("tcp://127.0.0.1:9", 120_000) is None
        wait_iteration(redis_client, keys, 4, blocked + 10, timeout=20)
        fake.abort_rejoin()  # the run goes on without 3
        os.kill(pid, signal.SIGKILL)
        out, err = train.communicate(timeout=120)
    assert train.returncode == 0, err
    assert not _events(redis_client, keys, "error")
    s = json.loads(out)
    assert [w["worker"] for w in s["lost_workers"]] == [VICTIM]
    assert all(w["iterations"] == its for w in s["per_worker"] if w["worker"] != VICTIM)
    assert s["violations"] == 0 and s["checks"]["token_invariant_violations"] == 0


def test_a_worker_busy_through_a_death_and_its_replacement_sends_to_the_replacement(
    redis_url, redis_client, tmp_path
):
    """Worker 4 is frozen (think: one very long iteration) while its neighbour 3 is killed,
    declared dead, and replaced: it never sees 3 dead, yet when it goes on it must know 3 for a
    new process at a new address (the incarnation its next Advance reads), not send to the dead
    one's until that queue fills and it waits there until --timeout (before: the replacement,
    counting on 4, gave up after its --timeout, or 4 never sent to it)."""
    # the others must still run, not yet held back by the frozen 4, when the replacement
    # announces itself (seconds, on a busy machine): they stop max_ig iterations ahead of 4,
    # and would then send it nothing to join by; the widest bound gives them 20 s at least
    its, max_ig = 1100, 1000
    flags = ["-n", str(N), "--topology", "ring-based", "--iterations", str(its)]
    flags += ["--iter-time", "0.02", "--heartbeat", "20", "--timeout", "60", "--eval-every", "0"]
    flags += ["--max-ig", str(max_ig), *BACKUP]
    with _training(redis_url, tmp_path, *flags) as (train, run, keys):
        wait_iteration(redis_client, keys, VICTIM, KILL_AT)
        (busy,) = processes_mentioning(f"--run {run} --id 4")
        (victim,) = processes_mentioning(f"--run {run} --id {VICTIM}")
        os.kill(busy, signal.SIGSTOP)
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: redis_client.sismember(keys.dead, VICTIM), 30, "the victim dead")
        replacement = _rejoin(redis_url, run, VICTIM)
        wait_for(lambda: _events(redis_client, keys, "rejoin"), 60, "the replacement in")
        os.kill(busy, signal.SIGCONT)
        _, rep_err = replacement.communicate(timeout=120)
        out, err = train.communicate(timeout=120)
    assert replacement.returncode == 0, rep_err
    assert train.returncode == 0, err
    assert not _events(redis_client, keys, "error")
    s = json.loads(out)
    assert s["finished"] and all(w["iterations"] == its for w in s["per_worker"])
    # it learned of the new process at its first Advance; whether it then sent to it depends
    # on how far behind it was (an update older than the replacement still takes is not sent)
    log = (tmp_path / "run" / "logs" / "worker-4.log").read_text()
    assert f"worker 4: worker {VICTIM} is a new process (replacement 1)" in log, log
    assert "its address is looked up before the next send to it" in log
