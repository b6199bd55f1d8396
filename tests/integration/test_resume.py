"""Checkpoints for real: kill ``hopbus train`` mid-run with SIGKILL, then ``hopbus train
--resume``. Real redis-server, real worker processes, real files; every wait polls a real
condition against a deadline."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import redis
from cluster import (
    clean_env,
    hopbus,
    hopbus_args,
    metrics_lines,
    processes_mentioning,
    train_args,
    wait_for,
)

from hopbus.coord.keys import RunKeys
from hopbus.runtime.checkpoint import iterations, newest_complete

WORKERS = 4
# long enough that the run is still going when the resume is tried: 10 s after iteration
# 40 at least (the refused resume's imports took over 5 s on a busy machine)
ITERATIONS = 240
EVERY = 10


def test_a_killed_train_resumes_from_its_newest_checkpoint_set(redis_url, tmp_path):
    out = tmp_path / "run"
    flags = [
        "-n", str(WORKERS), "--topology", "ring-based", "--mode", "backup", "--backup", "1",
        "--iterations", str(ITERATIONS), "--checkpoint-every", str(EVERY), "--iter-time", "0.05",
    ]  # fmt: skip
    args, run = train_args(redis_url, out, *flags)
    folder = out / "checkpoints"
    with (tmp_path / "first.err").open("wb") as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, env=clean_env())
    try:
        wait_for(
            lambda: (newest_complete(folder, WORKERS) or 0) >= 40 or proc.poll() is not None,
            120,
            "a complete checkpoint set of iteration 40",
        )
        assert proc.poll() is None, (tmp_path / "first.err").read_text()
        # fault ``resume_while_running``: the folder is the running launcher's; a resume of
        # it is refused before it starts anything, naming that process
        p = hopbus("train", "--resume", str(out), "--redis", redis_url, timeout=60)
        assert p.returncode == 2, p.stderr
        assert f"being written by another hopbus process (pid {proc.pid})" in p.stderr
        assert proc.poll() is None, (tmp_path / "first.err").read_text()
        os.kill(proc.pid, signal.SIGKILL)  # no handler, no cleanup: as a crash
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the workers die with their parent (PR_SET_PDEATHSIG): no orphan, and then no new file
    wait_for(lambda: not processes_mentioning(run), 15, "the workers to exit")
    c = newest_complete(folder, WORKERS)
    assert c is not None and c >= 40 and c % EVERY == 0 and c < ITERATIONS
    before = metrics_lines(out / "metrics.jsonl")
    assert not (out / "summary.json").exists()
    assert redis.Redis.from_url(redis_url).hget(RunKeys(run).meta, "status") == b"running"

    # faults ``summary_not_writable`` and ``linked_metrics``: found before anything runs, not
    # after the last iteration, and nothing is written through a link
    (out / "summary.json").mkdir()
    p = hopbus("train", "--resume", str(out), "--redis", redis_url, timeout=60)
    assert p.returncode == 2 and "summary.json is not a regular file" in p.stderr, p.stderr
    (out / "summary.json").rmdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("not hopbus's\n")
    (out / "metrics.jsonl").rename(tmp_path / "metrics.jsonl")
    (out / "metrics.jsonl").symlink_to(victim)
    p = hopbus("train", "--resume", str(out), "--redis", redis_url, timeout=60)
    assert p.returncode == 2 and "metrics.jsonl is not a regular file" in p.stderr, p.stderr
    assert victim.read_text() == "not hopbus's\n"
    (out / "metrics.jsonl").unlink()
    (tmp_path / "metrics.jsonl").rename(out / "metrics.jsonl")
    assert metrics_lines(out / "metrics.jsonl") == before
    # fault ``linked_checkpoints``: a worker's checkpoint folder linked to another run's. The
    # resume took that run's checkpoints, pruned them and wrote its own beside them
    other = tmp_path / "other-run-worker-0"
    worker_0 = folder / "worker-0"
    worker_0.rename(other)
    worker_0.symlink_to(other)
    p = hopbus("train", "--resume", str(out), "--redis", redis_url, timeout=60)
    assert p.returncode == 2 and "worker-0 is not a folder (a link" in p.stderr, p.stderr
    worker_0.unlink()
    other.rename(worker_0)

    # fault ``two_resumes``: a copy of the folder resumed into the same Redis while the first
    # resume's workers load. It deleted the first's keys, and both failed; now the first
    # holds the run (its launcher's heartbeat, claimed before anything is cleaned) and the
    # second waits for it to end: refused, naming it, after the longest heartbeat TTL, or,
    # should the first have finished by then, resumed after it
    twin = tmp_path / "twin"
    shutil.copytree(out, twin)
    client, launcher = redis.Redis.from_url(redis_url), RunKeys(run).launcher
    client.set(launcher, "another-launcher", px=60_000)  # one that holds it all along
    p = hopbus("train", "--resume", str(twin), "--redis", redis_url, timeout=120)
    assert p.returncode == 2 and f"is held by another launcher in this Redis ({launcher} " in (
        p.stderr
    ), p.stderr
    assert client.get(launcher) == b"another-launcher"  # its claim left as it was
    client.delete(launcher)
    stale = client.get(launcher)  # the killed launcher's, until its TTL runs out
    first = subprocess.Popen(
        hopbus_args("train", "--resume", str(out), "--redis", redis_url),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip
    wait_for(lambda: client.get(launcher) not in (None, stale), 120, "the first resume's claim")
    second = hopbus("train", "--resume", str(twin), "--redis", redis_url, timeout=120)
    printed, said = first.communicate(timeout=240)
    p = subprocess.CompletedProcess(first.args, first.returncode, printed, said)
    assert second.returncode == 0 or (
        second.returncode == 2
        and f"is held by another launcher in this Redis ({launcher} keeps beating" in second.stderr
    ), second.stderr
    assert p.returncode == 0, p.stderr
    assert (
        f"hopbus: resuming run {run} from iteration {c} (checkpoint set of {WORKERS} workers)"
        in p.stderr
    )
    assert f"resumed from iteration {c}: times and traffic count from it" in " ".join(
        (p.stdout + p.stderr).split()
    )
    s = json.loads((out / "summary.json").read_text())
    assert s["finished"] and s["failure"] is None
    assert s["resumed_from"] == c
    assert s["config"]["checkpoint_every"] == EVERY
    per_worker = [w["final_accuracy"] for w in s["per_worker"]]
    assert s["final_accuracy"] >= 0.90, per_worker  # test_train.py's bar
    assert min(per_worker) >= 0.85
    assert s["iterations"]["min"] == s["iterations"]["max"] == ITERATIONS
    assert s["violations"] == 0, s["first_violation"]
    assert all(v == 0 for v in s["checks"].values()), s["checks"]

    # metrics.jsonl kept the first part up to c, lost the abandoned continuation beyond it
    # (as the checkpoints did), and grew by the resumed part, which starts at c + 1 and whose
    # time goes on from the kept part's: one timeline, for hopbus plot
    after = metrics_lines(out / "metrics.jsonl")
    kept = [e for e in before if e["iter"] <= c]
    assert after[: len(kept)] == kept
    resumed = after[len(kept) :]
    assert len(resumed) == WORKERS * (ITERATIONS - c)
    assert min(e["t"] for e in resumed) >= max(e["t"] for e in kept) == s["resumed_at_s"]
    before_log, mark, after_log = (
        (out / "logs" / "worker-0.log")
        .read_text()
        .partition(f"hopbus: --- resumed from iteration {c} ---\n")
    )  # the stopped run's part kept, the resumed one after it
    assert mark and before_log.strip() and after_log.strip()
    assert max(e["t"] for e in resumed) <= s["resumed_at_s"] + s["wall_s"]  # plot's end point
    for w in range(WORKERS):
        mine = [e["iter"] for e in resumed if e["worker"] == w]
        assert mine == list(range(c + 1, ITERATIONS + 1)), w
    # the resumed run went on writing checkpoints after c; none from the killed run beyond c
    # joins them (they were discarded), and disk use stays bounded
    for w in range(WORKERS):
        kept = iterations(folder, w)
        assert kept and kept[-1] == ITERATIONS - EVERY and len(kept) <= 3, kept
    assert not processes_mentioning(run)
    meta = redis.Redis.from_url(redis_url).hgetall(RunKeys(run).meta)
    assert meta[b"status"] == b"finished" and meta[b"resumed_from"] == str(c).encode()

    # a finished run has nothing to resume: refused, and its files stay as they are
    p = hopbus("train", "--resume", str(out), "--redis", redis_url, timeout=60)
    assert p.returncode == 2 and "finished" in p.stderr and "nothing to resume" in p.stderr
    assert metrics_lines(out / "metrics.jsonl") == after
    # Ctrl-C between the workers' end and the summary: metrics.jsonl tells it finished
    (out / "summary.json").unlink()
    p = hopbus("train", "--resume", str(out), "--redis", redis_url, timeout=60)
    assert p.returncode == 2 and "nothing to resume" in p.stderr, p.stderr


def test_a_run_started_by_hand_resumes_and_watch_takes_its_checkpoints(redis_url, tmp_path):
    """The flow docs/checkpoints.md gives for runs started without a launcher (create,
    workers, watch; compose's): workers write their checkpoints to their default folder,
    runs/RUN/checkpoints, inside watch's default --out, runs/RUN. Fault
    ``watch_after_checkpoints``: a watch started once a checkpoint was written refused that
    folder ('already holds files'); it now takes it. Killed, the run is made again with the
    same flags, and its workers resume from the newest complete set (--resume-from c)."""
    run = f"byhand{os.getpid()}"
    flags = ["-n", "2", "--topology", "ring", "--iterations", "400", "--iter-time", "0.02",
             "--checkpoint-every", "10", "--eval-every", "0", "--heartbeat", "2"]  # fmt: skip
    env = clean_env(HOPBUS_REDIS=redis_url)
    folder = tmp_path / "runs" / run / "checkpoints"

    def start(*extra: str) -> list[subprocess.Popen]:
        created = hopbus("create", "--run", run, *flags, "--redis", redis_url)
        assert created.returncode == 0, created.stderr
        return [
            subprocess.Popen(hopbus_args("worker", "--run", run, "--id", str(i), *extra),
                             env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
            for i in range(2)
        ]  # fmt: skip

    workers = start()
    wait_for(lambda: (newest_complete(folder, 2) or 0) >= 30, 60, "a checkpoint set of 30")
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    watch = subprocess.Popen(hopbus_args("watch", "--run", run, "--json"), env=env,
                             cwd=tmp_path, **pipes)  # fmt: skip
    wait_for(lambda: (tmp_path / "runs" / run / "config.toml").exists() or watch.poll(), 30,
             "the watch to take runs/RUN")  # fmt: skip
    assert watch.poll() is None, watch.communicate()[1].decode()
    for w in workers:  # the machine goes down
        w.kill()
        w.wait(timeout=10)
    _, said = watch.communicate(timeout=60)
    assert watch.returncode == 1, said.decode()  # the run failed: its workers are gone
    c = newest_complete(folder, 2)
    assert c is not None and c >= 30
    cleaned = hopbus("clean", "--run", run, "--force", "--redis", redis_url, timeout=60)
    assert cleaned.returncode == 0, cleaned.stderr
    workers = start("--resume-from", str(c))
    # fault ``resume_points_differ``: a worker resuming from another checkpoint set waited
    # for updates nobody sends until --timeout; it is refused, one line, before its place
    meta = RunKeys(run).meta
    r = redis.Redis.from_url(redis_url)
    wait_for(lambda: r.hget(meta, "resumed_from") == str(c).encode(), 30, "the resume point")
    stray = hopbus("worker", "--run", run, "--id", "1", "--resume-from", str(c - 10),
                   env=env, timeout=60)  # fmt: skip
    assert stray.returncode == 2, stray.stderr
    assert f"workers resume from iteration {c} (its first to resume" in stray.stderr
    out = tmp_path / "resumed"
    p = subprocess.run(hopbus_args("watch", "--run", run, "--out", str(out), "--json"), env=env,
                       capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["finished"] and s["violations"] == 0 and s["iterations"]["min"] == 400, s
    # fault ``watch_of_resumed_workers``: the watch took their first entries, at c+1, as
    # forged ('ahead of their worker'), and said finished with iterations 0 and no metrics
    assert s["resumed_from"] == c
    first = min(json.loads(x)["iter"] for x in (out / "metrics.jsonl").read_text().splitlines())
    assert first == c + 1  # it went on from the checkpoints, not from 0
    for w in workers:
        assert w.wait(timeout=30) == 0
