"""Your own training loop as Hop workers: ``hopbus launch -- COMMAND``, ``hopbus worker --
COMMAND`` and ``hopbus.join()``, with real scripts, a real redis-server and real processes.

The scripts are plain numpy loops written into the test's folder; faults are injected by name
(``crash_at``, ``never_joins``, ``hangs_before_join``, ``other_model``, ``stops_early``,
``alone_in_the_run``, ``forked_child``) through the script's argument or the run's settings,
as a user's bug would happen, not through hopbus.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from cluster import (
    clean_env,
    follow_through,
    hopbus,
    hopbus_args,
    processes_mentioning,
    script_workers,
    wait_for,
)

from hopbus.coord.keys import RunKeys

ROOT = Path(__file__).resolve().parents[2]
RUNS = itertools.count()

SCRIPT = """
import os
import sys
import numpy as np
import hopbus

fault, who = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else -1
if fault in ("daemon", "deaf_daemon") and os.fork() == 0:  # it leaves its session, forks
    os.setsid()
    if fault == "deaf_daemon":  # and ignores SIGTERM (kept across exec)
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        sleep = [sys.executable, "-c", "import time; time.sleep(600)", sys.argv[3]]
        os.execv(sys.executable, sleep)
    os._exit(0)
if fault == "never_joins" and os.environ["HOPBUS_ID"] == str(who):
    sys.exit(0)  # a script that forgot hopbus.join(), as seen from the run
if fault == "joins_on_cue":  # a twin whose check passed, joining once told (file argv[3])
    print("waiting", flush=True)
    while not os.path.exists(sys.argv[3]):
        import time
        time.sleep(0.02)  # the test's cue: the other twin has claimed the place
if fault == "hangs_before_join":  # every copy: e.g. a download that never ends
    import time
    time.sleep(600)
if fault == "joins_twice":  # a second join() of the run is the same worker; another is not
    first = hopbus.join()
    print("same", hopbus.join() is first, flush=True)
    try:
        hopbus.join(id=1 - first.worker)
    except Exception as exc:
        print("refused:", exc, flush=True)
with hopbus.join() as ctx:
    me = ctx.worker
    if fault == "deaf":  # to the stop's SIGTERM and SIGINT: it goes on to its end
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    rows = np.arange(1000)
    mine = ctx.shard(rows) if fault != "ragged_shard" or me != who else ctx.shard(rows, rows[1:])
    print("shard", me, ",".join(map(str, mine[:5])), len(mine), flush=True)
    print("threads", os.environ.get("OMP_NUM_THREADS"), flush=True)
    shape = (8, 4) if fault == "other_model" and me == who else (8, 3)
    rng = np.random.default_rng()  # no seed: every worker draws its own start
    target = np.full(shape, me, np.float32)  # each worker pulls toward its own id
    w0 = rng.normal(size=shape).astype(np.float32)
    if fault == "nan_start" and me == who:
        w0[1, 2] = np.nan
    params = ctx.start({"W": w0}, overlap=fault in ("overlap", "leaves_mid_step"))
    print("start", me, float(params["W"].sum()), flush=True)
    while not ctx.done:
        if fault == "leaves_mid_step" and me != who and ctx.iteration == 4:
            import time  # step 4 done: its update of iteration 5 (begin sends it) comes late
            time.sleep(3)
        p = ctx.begin()
        if fault == "leaves_mid_step" and me == who and ctx.iteration == 5:
            import threading  # it leaves in the middle of its step, its thread in Recv
            def waiting():
                return [t.name for t in threading.enumerate() if t.name == "hop-reduce"]
            print("waiting", waiting(), flush=True)
            ctx.close()
            print("after close", waiting(), type(ctx.session._bg_error).__name__, flush=True)
            sys.exit(1)
        if fault == "end_interrupted" and me == who and ctx.iteration == 5:
            def interrupted(part):  # a Ctrl-C in the middle of end(), which the script catches
                raise KeyboardInterrupt
            try:
                ctx.end(apply=interrupted)
            except KeyboardInterrupt:
                print("caught", flush=True)
            ctx.begin()  # and goes on as if nothing had happened
        if fault == "crash_at" and me == who and ctx.iteration >= 20:
            # brackets as a path or an index holds them: text to every printer, not markup
            raise ZeroDivisionError("worker %d gave up on [/data/shard-%d]" % (me, me))
        if fault in ("said_then_crash", "flood_then_crash") and me == who and ctx.iteration >= 5:
            if fault == "said_then_crash":  # a line of a hopbus command the script ran
                print("hopbus: error: no run 'x' in this Redis", file=sys.stderr, flush=True)
            else:  # 20 MB without a newline, as a progress bar gone wrong writes
                sys.stderr.write("#" * 20_000_000)
                sys.stderr.flush()
            raise ValueError("the real cause")
        if fault == "stops_early" and me == who and ctx.iteration >= 10:
            break  # leaving the with block early: the run hears why
        if fault == "exits_early" and me == who and ctx.iteration >= 10:
            os._exit(0)  # past the with block's exit: only the run's keys say how far it got
        if fault == "slow_step" and me == who and ctx.iteration == 10:
            import time
            time.sleep(600)  # its step outlasts --timeout
        new = {"W": p["W"] - 0.1 * (p["W"] - target)}
        if me == who and ctx.iteration == 5 and fault in ("bad_accuracy", "text_loss"):
            ctx.log(eval_accuracy=7.0) if fault == "bad_accuracy" else ctx.end(new, loss="abc")
        if me == who and ctx.iteration == 5 and fault in ("ragged_end", "none_end"):
            ctx.end({"W": [[1.0, 2.0], [3.0]]} if fault == "ragged_end" else None)
        p = ctx.end(new, loss=float(((p["W"] - target) ** 2).mean()))
        if ctx.iteration % 10 == 0:
            ctx.log(eval_loss=float(((p["W"] - 1.5) ** 2).mean()), eval_accuracy=0.5)
    if ctx.done:
        ctx.finish(loss=float(((p["W"] - 1.5) ** 2).mean()), accuracy=0.5)
        if fault == "finishes_twice" and me == who:  # its first report stands
            print("again", ctx.finish(loss=9.0, accuracy=0.9)["final_accuracy"], flush=True)
        print("finished", me, float(p["W"].mean()), flush=True)
if fault == "linger":  # its part done, it stays, deaf to SIGTERM
    import signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "loop.py"
    path.write_text(SCRIPT)
    return path


def launch(redis_url: str, out: Path, *flags: str, command: list[str], timeout: float = 240):
    run = f"l{os.getpid()}-{next(RUNS)}"
    args = hopbus_args("launch", "--redis", redis_url, "--run", run, "--out", str(out), "--json")
    p = subprocess.run(
        [*args, *flags, "--", *command],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=timeout,
        check=False,
    )
    summary = json.loads(p.stdout) if p.stdout.strip() else None
    return p, summary, run


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hopbus: error:")]


def one_failure(
    redis_url: str, out: Path, script: Path, fault: str, who: int, *, workers: int,
    iterations: int = 200,
) -> tuple[str, str, str]:  # fmt: skip
    """hopbus launch of the test script on a ring, ``fault`` in worker ``who``: it fails with
    exit status 1 and one error line. That line, the launcher's stderr and the run id."""
    p, _, run = launch(
        redis_url, out, "-n", str(workers), "--topology", "ring", "--iterations", str(iterations),
        command=[sys.executable, str(script), fault, str(who)],
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    (line,) = error_lines(p.stderr)
    return line, p.stderr, run


def test_a_numpy_loop_runs_as_hop_workers(redis_url, tmp_path, script):
    out = tmp_path / "run"
    p, s, run = launch(
        redis_url, out, "-n", "4", "--mode", "backup", "--iterations", "60",
        command=[sys.executable, str(script), "none"],
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert s["finished"] and s["violations"] == 0
    assert all(v == 0 for v in s["checks"].values()), s["checks"]
    assert s["iterations"]["min"] == s["iterations"]["max"] == 60
    assert s["final_accuracy"] == pytest.approx(0.5)
    # every worker pulls toward its own id; averaging keeps them together anyway
    assert s["consensus_distance"] is not None and s["consensus_distance"] < 0.5
    assert s["consensus"]["exact"] is True and s["consensus"]["workers"] == 4
    assert {f.name for f in out.iterdir()} >= {
        "config.toml",
        "metrics.jsonl",
        "summary.json",
        "logs",
        "tensorboard",
    }
    assert 'model = "script"' in (out / "config.toml").read_text()
    # the header names the command that runs these settings again, and train refuses them
    assert "# hopbus launch --config config.toml -- " in (out / "config.toml").read_text()
    p = hopbus("train", "--config", str(out / "config.toml"), "--out", str(out / "again"))
    assert p.returncode == 2 and "these settings are a script's run" in p.stderr, p.stderr
    assert not (out / "again").exists()
    starts, shards = set(), []
    for i in range(4):
        log = (out / "logs" / f"worker-{i}.log").read_text()
        (start,) = [line.split()[2] for line in log.splitlines() if line.startswith("start ")]
        starts.add(start)
        (shard,) = [line.split()[2:] for line in log.splitlines() if line.startswith("shard ")]
        shards.append(shard)
        # its share of the cores for numpy's and PyTorch's thread pools, as torchrun gives
        assert f"threads {max(1, len(os.sched_getaffinity(0)) // 4)}" in log.splitlines()
        assert f"worker {i} finished its part of run {run}" in log
        assert list((out / "tensorboard" / f"worker-{i}").glob("events.out.tfevents.*"))
    assert len(starts) == 1, "every worker starts from worker 0's parameters"
    from hopbus.data import shard_rows

    for i, (head, count) in enumerate(shards):
        rows = shard_rows(1000, i, 4, 0)  # the built-in loaders' rule, seed 0
        assert head == ",".join(map(str, rows[:5])) and int(count) == len(rows)
    entries = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(entries) == 4 * 60
    assert any("eval_loss" in e for e in entries) and all("loss" in e for e in entries)
    assert not processes_mentioning(str(script))


def test_a_second_join_in_a_process_is_the_same_worker(redis_url, tmp_path, script):
    """Fault ``joins_twice``: ``hopbus.join()`` twice in one script (a HopCallback() after a
    join(), say) is the same worker, not a second one that takes itself for a twin of the
    first; a join() as another worker of the run is refused in one line."""
    out = tmp_path / "run"
    p, s, _ = launch(redis_url, out, "-n", "2", "--iterations", "20",
                     command=[sys.executable, str(script), "joins_twice"])  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert s["finished"] and s["iterations"]["min"] == 20
    for i in range(2):
        log = (out / "logs" / f"worker-{i}.log").read_text()
        assert "same True" in log, log
        assert f"refused: hopbus.join(): this process is worker {i} of run " in log, log


@pytest.mark.parametrize("mode", ["standard", "staleness"])
def test_reduce_beside_compute_gives_the_same_protocol(redis_url, tmp_path, script, mode):
    """overlap=True: Recv and Reduce in a thread while the loop computes (big models' path);
    in staleness mode the thread stops at Recv, which takes fresher updates after Compute
    (tests/unit/test_requirements_settled.py)."""
    p, s, _ = launch(
        redis_url, tmp_path / "run", "-n", "4", "--mode", mode, "--iterations", "60",
        command=[sys.executable, str(script), "overlap"],
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert s["finished"] and s["violations"] == 0
    # without averaging every worker would end at its own id: 1.0. Staleness 5 lets a worker
    # take up to 5 steps on its own at the end (0.47 from there), so how near the synchronous
    # 0.1 it ends depends on the machine's load (a loaded CI saw 0.52)
    assert s["consensus_distance"] < 0.8
    assert all(v == 0 for v in s["checks"].values()), s["checks"]


def on_worker_1(redis_url: str, tmp_path: Path, script: Path, fault: str):
    """The loop as 2 workers of 20 iterations, ``fault`` on worker 1: the launcher's process,
    the summary, and worker 1's log."""
    p, s, _ = launch(
        redis_url, tmp_path / "run", "-n", "2", "--iterations", "20",
        command=[sys.executable, str(script), fault, "1"],
    )  # fmt: skip
    return p, s, (tmp_path / "run" / "logs" / "worker-1.log").read_text()


def test_a_step_whose_end_was_interrupted_cannot_go_on(redis_url, tmp_path, script):
    """Fault ``end_interrupted``: the script catches a KeyboardInterrupt from the middle of
    end() and goes on. The protocol is past Recv and Reduce: the next begin() is one line
    (it sent None as Compute's result into a pending Recv: a TypeError from worker_loop)."""
    p, _, log = on_worker_1(redis_url, tmp_path, script, "end_interrupted")
    assert p.returncode == 1, p.stderr
    assert "caught" in log and "Traceback" not in log, log
    assert "the step of iteration 5 did not end: its end() was interrupted" in log, log


def test_a_second_finish_is_said_and_the_first_report_stands(redis_url, tmp_path, script):
    """Fault ``finishes_twice``: a script that reports twice (a callback's report, then its
    own) failed a run whose every iteration was done ("finish() was already called")."""
    p, s, log = on_worker_1(redis_url, tmp_path, script, "finishes_twice")
    assert p.returncode == 0, p.stderr
    assert s["finished"] and all(w["final_accuracy"] == 0.5 for w in s["per_worker"]), s
    assert "finish() was already called: the run has this worker's report" in log, log
    assert "again 0.5" in log, log


def test_a_worker_leaving_mid_step_stops_its_waiting_thread_before_the_sockets_close(
    redis_url, tmp_path, script
):
    """Fault ``leaves_mid_step``: worker 1 closes in the middle of a step while its thread
    waits in Recv for worker 0's late update (as a step that raises leaves a with block).
    The thread is told to leave and is gone before the sockets it polls close (ZeroMQ
    sockets are not thread-safe: it met them closed under it, ZMQError)."""
    p, _, log = on_worker_1(redis_url, tmp_path, script, "leaves_mid_step")
    assert p.returncode == 1, p.stderr
    assert "waiting ['hop-reduce']" in log and "after close [] Leaving" in log, log
    assert "Traceback" not in log, log


@pytest.mark.parametrize("mode", ["standard", "backup"])
def test_a_script_that_crashes_is_named_with_its_last_words(redis_url, tmp_path, script, mode):
    p, s, _ = launch(
        redis_url, tmp_path / "run", "-n", "4", "--mode", mode, "--iterations", "200",
        command=[sys.executable, str(script), "crash_at", "2"],
    )  # fmt: skip
    tail = "ZeroDivisionError: worker 2 gave up on [/data/shard-2] (loop.py, line"
    if mode == "standard":  # it cannot go on without worker 2
        assert p.returncode == 1, p.stderr
        (line,) = error_lines(p.stderr)
        assert "worker 2" in line and tail in line, line
        assert not s["finished"]
        # the others were stopped by the launcher: their logs say so, not "interrupted" as by
        # a Ctrl-C nobody pressed (one may have ended first, waiting on worker 2 in vain)
        ends = [
            (tmp_path / "run" / "logs" / f"worker-{i}.log").read_text().strip().splitlines()[-1]
            for i in (0, 1, 3)
        ]
        assert "hopbus: interrupted by SIGTERM" in ends, ends
        assert "hopbus: interrupted" not in ends, ends
    else:  # backup workers: the others finish without it, as with a crashed built-in worker
        assert p.returncode == 0, p.stderr
        assert s["finished"] and s["violations"] == 0
        assert [w["worker"] for w in s["lost_workers"]] == [2]
        assert tail in p.stderr
    assert not processes_mentioning(str(script))


@pytest.mark.parametrize("fault", ["said_then_crash", "flood_then_crash"])
def test_a_crash_behind_other_words_is_still_its_cause(redis_url, tmp_path, script, fault):
    """Faults ``said_then_crash`` and ``flood_then_crash``: an error line of a hopbus command
    the script ran, or 20 MB of stderr without a newline, before its real crash. The first
    was taken for the script's own account (and the run was never told of the crash); the
    second held the whole line in memory and judged the script's last words before they
    came ('it printed nothing on stderr')."""
    line, _, run = one_failure(redis_url, tmp_path / "run", script, fault, 1, workers=3)
    assert "worker 1" in line and "ValueError: the real cause (loop.py, line" in line, line
    told = [f.get(b"message", b"").decode() for _, f in
            redis.Redis.from_url(redis_url).xrange(RunKeys(run).events)
            if f.get(b"kind") == b"error" and f.get(b"worker") == b"1"]  # fmt: skip
    assert told and "ValueError: the real cause" in told[0], told
    assert not processes_mentioning(str(script))


def test_a_script_that_never_joins_or_stops_early_fails_the_run(redis_url, tmp_path, script):
    for fault, expected in (
        ("never_joins", "exited 0 without finishing its part of the run"),
        ("stops_early", "left the run after iteration 10 of 200"),
        ("exits_early", "without finishing its part of the run (it joined, and stopped in "
                        "iteration 1"),  # 10, or 11 when its last step had gone out
    ):  # fmt: skip
        line, _, _ = one_failure(redis_url, tmp_path / fault, script, fault, 1, workers=3)
        assert "worker 1" in line and expected in line, line
        assert not processes_mentioning(str(script))


def test_a_run_none_of_whose_copies_ever_joins_ends(redis_url, tmp_path, script):
    """Fault ``hangs_before_join``: every copy hangs before hopbus.join(), so no worker waits
    on another and none times out. The launcher ends the run once --timeout, and at least
    JOIN_GRACE_S (30 s), have passed since it started them: one line, exit status 1, nothing
    left running (it waited forever before)."""
    p, s, _ = launch(
        redis_url, tmp_path / "r", "-n", "2", "--topology", "ring", "--iterations", "20",
        "--timeout", "2", command=[sys.executable, str(script), "hangs_before_join"],
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    (line,) = error_lines(p.stderr)
    assert "no worker entered the run within 30 s of its start: every copy of `" in line, line
    assert "hangs_before_join` is still running without having joined" in line, line
    assert s is not None and not s["finished"] and s["failure"] in line
    assert not processes_mentioning(str(script))


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("nan_start", "start(): the parameters hold a NaN or infinity in 'W'; a model must start"),
        (
            "bad_accuracy",
            "log(): eval_accuracy 7 is not a fraction in [0, 1] (a percentage? give 0.07)",
        ),
        ("text_loss", "end(): loss must be a number, not str"),
        ("ragged_end", "parameter 'W' is not an array: setting an array element with a sequence"),
        ("none_end", "end() needs your step's parameters (or apply=)"),
        ("ragged_shard", "ctx.shard(): the arrays have different lengths, 1000, 999 in the order"),
    ],
)
def test_a_script_that_hands_hopbus_bad_values_is_one_line(
    redis_url, tmp_path, script, fault, expected
):
    """Faults ``nan_start``, ``bad_accuracy``, ``text_loss``, ``ragged_end``, ``none_end``,
    ``ragged_shard``: a script's own values refused where hopbus takes them, naming the call,
    before they reach the run (worker 0's NaN start would have been every worker's)."""
    line, stderr, _ = one_failure(
        redis_url, tmp_path / "run", script, fault, 0, workers=2, iterations=20
    )
    assert "worker 0" in line and expected in line, line
    assert "Traceback" not in stderr


def test_workers_whose_models_differ_stop_before_any_training(redis_url, tmp_path, script):
    p, s, _ = launch(
        redis_url, tmp_path / "run", "-n", "3", "--topology", "ring", "--iterations", "50",
        command=[sys.executable, str(script), "other_model", "1"],
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    (line,) = error_lines(p.stderr)
    differs = "tensor 'W' is float32[8, 4] here but float32[8, 3] on worker 0"
    assert "worker 1's model differs from worker 0's: " + differs in line
    assert s["iterations"]["max"] <= 1  # nobody got past its first step
    assert not processes_mentioning(str(script))


def test_bad_launches_are_one_line(redis_url, tmp_path, script):
    shim = tmp_path / "python-elsewhere"  # another Python, one that cannot import hopbus
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -I -S "$@"\n')
    shim.chmod(0o755)
    for flags, command, expected in (
        (["--mode", "ps-bsp"], [sys.executable, str(script)], "trains with the Hop modes only"),
        (["--mode", "wagma"], [sys.executable, str(script)], "--mode wagma moves its bytes"),
        (["--mode", "allreduce"], [sys.executable, str(script)], "--mode allreduce moves its"),
        ([], [], "give the command to run after --"),
        (
            ["--checkpoint-every", "5"],
            [sys.executable, str(script)],
            "hopbus launch takes no --checkpoint-every: a script saves its own state",
        ),
        (
            ["--lr", "0.1"],
            [sys.executable, str(script)],
            "hopbus launch takes no --lr: it is a setting of hopbus's own models (hopbus train)",
        ),
        (["--bogus"], [sys.executable, str(script)], "No such option: --bogus"),
        ([], ["hopbus-no-such-program-xyz"], "cannot run 'hopbus-no-such-program-xyz'"),
        ([], ["-n", "2", sys.executable], "own flags go before the --, the command after it"),
        ([], [str(script)], f"a Python script: put the interpreter first, `-- python {script}`"),
        ([], [str(shim), "-c", "import hopbus"], "hopbus is installed for "),
    ):
        out = tmp_path / f"bad{len(list(tmp_path.iterdir()))}"
        p, _, _ = launch(
            redis_url, out, "-n", "2", "--timeout", "20", *flags, command=command, timeout=120
        )
        assert p.returncode in (1, 2), (flags, p.stderr)
        assert expected in p.stderr, p.stderr
        if not command or command[0] not in (sys.executable, str(shim)):  # refused at once
            assert p.returncode == 2 and not out.exists(), p.stderr
        assert "Traceback" not in p.stderr


def test_the_scripts_flags_are_its_own_with_or_without_a_double_dash(redis_url, tmp_path, script):
    """Parsing stops at the command, as torchrun's does: a flag after it that hopbus launch
    also has (--seed, -n) goes to the script, not to the run, ``--`` or not."""
    wrapper = tmp_path / "args.py"
    wrapper.write_text(
        "import runpy, sys\n"
        "print('argv', sys.argv[1:], flush=True)\n"
        f"sys.argv = [{str(script)!r}, 'none']\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
    )
    for dashes in ([], ["--"]):
        out = tmp_path / f"r{len(dashes)}"
        run = f"a{os.getpid()}-{len(dashes)}"
        args = hopbus_args("launch", "--redis", redis_url, "--run", run, "--out", str(out), "-n",
                           "2", "--topology", "ring", "--iterations", "5", *dashes,
                           sys.executable, str(wrapper), "--seed", "7", "-n", "9")  # fmt: skip
        # a HOPBUS_LR exported for hopbus train: said to be ignored, as --lr is refused
        p = subprocess.run(args, capture_output=True, text=True, env=clean_env(HOPBUS_LR="3"),
                           timeout=240, check=False)  # fmt: skip
        assert p.returncode == 0, p.stderr
        assert "hopbus: warning: hopbus launch ignores HOPBUS_LR: settings of" in p.stderr
        log = (out / "logs" / "worker-0.log").read_text()
        assert "argv ['--seed', '7', '-n', '9']" in log, log
        config = (out / "config.toml").read_text()
        assert "workers = 2" in config and "seed = 7" not in config, config
        # nor does its config.toml record what only hopbus's own models use
        assert "lr = " not in config and 'model = "script"' in config, config


def test_join_outside_a_run_says_how_to_launch(tmp_path):
    p = subprocess.run(
        [sys.executable, "-c", "import hopbus; hopbus.join()"],
        capture_output=True, text=True, env=clean_env(), timeout=60, check=False,
    )  # fmt: skip
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [
        "hopbus: error: hopbus.join(): this process is not a worker of a hopbus run; start it "
        "with `hopbus launch -n 4 -- python SCRIPT` (a local run), or one copy with `hopbus "
        "worker --run RUN --redis URL -- python SCRIPT`"
    ]
    # HOPBUS_RUN exported for hopbus top or inspect does not make a script a worker
    for exported in ({}, {"HOPBUS_RUN": "r1", "HOPBUS_ID": "0"}):
        alone = subprocess.run(
            [sys.executable, "-c", "import hopbus; print(hopbus.launched())"],
            capture_output=True, text=True, env=clean_env(**exported), timeout=60, check=False,
        )  # fmt: skip
        assert alone.stdout.strip() == "False", exported


def test_a_twin_started_in_the_same_instant_is_refused_writing_nothing(
    redis_url, redis_client, tmp_path, script
):
    """Fault ``joins_on_cue``: two ``hopbus worker --id 1`` started in the same instant both
    find the place free; the one whose script claims it second is refused. It exits 2 and
    writes nothing into the run, as a twin started later does (its script's refusal was
    told to the run as worker 1's error)."""
    run = f"twin{os.getpid()}"
    created = hopbus("create", "--run", run, "-n", "2", "--iterations", "20", "--model",
                     "script", "--redis", redis_url)  # fmt: skip
    assert created.returncode == 0, created.stderr
    env, go = clean_env(HOPBUS_REDIS=redis_url), tmp_path / "go"

    def worker(i: int, *how: str) -> subprocess.Popen:
        args = hopbus_args("worker", "--run", run, "--id", str(i), "--", sys.executable,
                           str(script), *how)  # fmt: skip
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, cwd=tmp_path)  # fmt: skip

    late, first = worker(1, "joins_on_cue", "1", str(go)), []
    try:
        assert late.stdout is not None and late.stdout.readline() == "waiting\n"  # checked
        first = [worker(0, "none"), worker(1, "none")]
        wait_for(lambda: redis_client.exists(RunKeys(run).hb(1)), 60, "worker 1's claim")
        go.touch()
        _, err = late.communicate(timeout=60)
        outs = [w.communicate(timeout=120) for w in first]
    finally:
        for p in (late, *first):
            if p.poll() is None:
                p.kill()
    assert late.returncode == 2, err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"hopbus: error: worker 1 of run {run} is taken: "), line
    assert all(w.returncode == 0 for w in first), outs
    kinds = [f[b"kind"] for _, f in redis_client.xrange(RunKeys(run).events)]
    assert b"error" not in kinds, kinds
    assert hopbus("clean", "--run", run, "--redis", redis_url).returncode == 0


def test_copies_on_other_machines_join_with_hopbus_worker(redis_url, tmp_path, script):
    """hopbus create, then hopbus worker -- COMMAND per copy (ids taken on joining), and hopbus
    watch: the multi-machine and container shape of a script's run."""
    run = f"w{os.getpid()}"
    created = hopbus(
        "create",
        "--run",
        run,
        "-n",
        "2",
        "--topology",
        "ring",
        "--iterations",
        "40",
        "--model",
        "script",
        "--redis",
        redis_url,
    )
    assert created.returncode == 0, created.stderr
    env = clean_env(HOPBUS_REDIS=redis_url)
    workers = script_workers(run, [sys.executable, str(script), "none"], env, [None] * 2, tmp_path)
    watch = hopbus(
        "watch",
        "--run",
        run,
        "--redis",
        redis_url,
        "--out",
        str(tmp_path / "w"),
        "--json",
        timeout=180,
    )
    outs = [w.communicate(timeout=120) for w in workers]
    assert watch.returncode == 0, watch.stderr
    s = json.loads(watch.stdout)
    assert s["finished"] and s["violations"] == 0 and s["workers"] == 2
    assert all(w.returncode == 0 for w in workers), outs
    assert sorted(out.split("finished ")[1].split()[0] for out, _ in outs) == ["0", "1"]
    # a run made for scripts is refused by a worker without one, in one line
    lone = hopbus("worker", "--run", run, "--redis", redis_url)
    assert lone.returncode == 2
    assert error_lines(lone.stderr) == [
        f"hopbus: error: run {run} trains a script's model (hopbus launch): start its workers "
        f"with the script, hopbus worker --run {run} -- COMMAND ARGS..."
    ]
    # fault ``stray_script_worker``: a copy for a place another process had is refused before
    # its script starts, and writes nothing into the run
    before = redis.Redis.from_url(redis_url).xlen(RunKeys(run).events)
    stray = hopbus("worker", "--run", run, "--id", "0", "--redis", redis_url, "--",
                   sys.executable, "-c", "import sys; sys.exit(3)")  # fmt: skip
    assert stray.returncode == 2 and error_lines(stray.stderr) == [
        f"hopbus: error: worker 0 of run {run} is taken: it finished already (is `hopbus worker "
        "--id 0` running twice?)"
    ], stray.stderr
    assert redis.Redis.from_url(redis_url).xlen(RunKeys(run).events) == before


def test_a_script_worker_stopped_by_hand_says_why(redis_url, tmp_path, script):
    """Fault ``stopped_script_worker``: SIGTERM (``docker stop``) of one hand-started
    ``hopbus worker -- COMMAND`` of a standard run. Its script is stopped with it, and it
    posts why it is gone, as a built-in worker does: hopbus watch names the interruption, not
    only a heartbeat gone without a result."""
    run = f"t{os.getpid()}"
    created = hopbus("create", "--run", run, "-n", "2", "--topology", "ring", "--iterations",
                     "100000", "--model", "script", "--redis", redis_url)  # fmt: skip
    assert created.returncode == 0, created.stderr
    env = clean_env(HOPBUS_REDIS=redis_url)
    workers = script_workers(run, [sys.executable, str(script), "none"], env, range(2))
    watch = subprocess.Popen(
        hopbus_args("watch", "--run", run, "--redis", redis_url, "--out", str(tmp_path / "w")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip
    client = redis.Redis.from_url(redis_url)

    def interrupt() -> None:
        wait_for(lambda: int(client.get(RunKeys(run).iter(1)) or 0) >= 5, 120, "the run")
        workers[1].send_signal(signal.SIGTERM)

    _, said = follow_through(watch, workers, interrupt)
    assert workers[1].returncode == 130 and watch.returncode == 1, said
    last = said.strip().splitlines()[-1]
    assert "worker 1" in last and "interrupted (Ctrl-C or SIGTERM)" in last, last
    assert not processes_mentioning(str(script))


def test_a_script_killed_with_sigterm_is_said_so(redis_url, tmp_path, script):
    """Fault ``sigterm_to_the_script``: kill -TERM of one copy's script, not of its hopbus
    worker. The script keeps Python's default (hopbus.join() adds no handler): it dies of the
    signal, the run names SIGTERM, and no traceback is printed."""
    run = f"term{os.getpid()}"
    args = hopbus_args("launch", "--redis", redis_url, "--run", run, "--out", str(tmp_path / "r"),
                       "-n", "2", "--topology", "ring", "--iterations", "100000")  # fmt: skip
    proc = subprocess.Popen([*args, "--", sys.executable, str(script), "none"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env())  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    wait_for(lambda: int(client.get(RunKeys(run).iter(1)) or 0) >= 5, 120, "the run")

    def argv(pid: int) -> list[bytes]:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")
        return []

    scripts = [p for p in processes_mentioning(str(script)) if argv(p)[1:2] == [bytes(script)]]
    assert scripts, processes_mentioning(str(script))
    os.kill(scripts[0], signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert "was killed by SIGTERM" in last, last
    logs = "".join(f.read_text() for f in (tmp_path / "r" / "logs").glob("*.log"))
    assert "Traceback" not in logs + err, logs
    assert not processes_mentioning(str(script))


def test_a_script_workers_failure_is_said_once(redis_url, tmp_path, script):
    """Fault ``alone_in_the_run``: one copy of a 2-worker script run, the other never comes.
    Its script says why it gives up (``hopbus: error: ...``); hopbus worker, whose stderr it
    shares, does not say it a second time, and exits 1."""
    run = f"once{os.getpid()}"
    created = hopbus("create", "--run", run, "-n", "2", "--iterations", "20", "--model", "script",
                     "--timeout", "2", "--redis", redis_url)  # fmt: skip
    assert created.returncode == 0, created.stderr
    lone = subprocess.run(
        hopbus_args("worker", "--run", run, "--", sys.executable, str(script), "none"),
        capture_output=True, text=True, env=clean_env(HOPBUS_REDIS=redis_url), cwd=tmp_path,
        timeout=120, check=False,
    )  # fmt: skip
    assert lone.returncode == 1, lone.stderr
    said = error_lines(lone.stderr)
    assert len(said) == 1 and "worker 1" in said[0], lone.stderr


def test_a_created_script_run_says_which_flags_it_ignores(redis_url, tmp_path):
    """``hopbus create --model script --lr 0.5``: hopbus launch refuses --lr, and create, the
    first step of the same run by hand, took it in silence; it now says so, and records the
    run as launch does (its data the script's, no settings of hopbus's own models)."""
    run = f"own{os.getpid()}"
    created = hopbus("create", "--run", run, "--model", "script", "--lr", "0.5", "--device",
                     "cpu", "--redis", redis_url)  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert ("hopbus: warning: --device, --lr have no effect with --model script"
            in created.stderr), created.stderr  # fmt: skip
    cfg = json.loads(redis.Redis.from_url(redis_url).hget(RunKeys(run).meta, "config"))
    assert cfg["model"] == cfg["data"] == "script" and "lr" not in cfg and "device" not in cfg
    assert hopbus("clean", "--run", run, "--redis", redis_url).returncode == 0
    # the same settings from a config file are said too; the file's model = "script" is not
    (tmp_path / "run.toml").write_text('model = "script"\nlr = 0.5\nbatch_size = 8\n')
    created = hopbus("create", "--run", run, "--config", str(tmp_path / "run.toml"), "--redis",
                     redis_url)  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert ("hopbus: warning: --batch-size, --lr have no effect with --model script"
            in created.stderr), created.stderr  # fmt: skip
    assert hopbus("clean", "--run", run, "--redis", redis_url).returncode == 0


def test_a_script_is_refused_by_a_run_of_a_built_in_model(redis_url, tmp_path, script):
    """A run recorded for hopbus's own --model (hopbus create without --model script): its
    config would not say what trained, so a script's worker is refused before it joins."""
    run = f"builtin{os.getpid()}"
    created = hopbus("create", "--run", run, "-n", "2", "--redis", redis_url)
    assert created.returncode == 0, created.stderr
    p = subprocess.run(
        hopbus_args("worker", "--run", run, "--", sys.executable, str(script), "none"),
        capture_output=True, text=True, env=clean_env(HOPBUS_REDIS=redis_url), cwd=tmp_path,
        timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode == 2 and error_lines(p.stderr) == [
        f"hopbus: error: run {run} trains --model softmax, not a script's: start its workers "
        f"without a command (hopbus worker --run {run}), or record a run for your script with "
        "hopbus create --model script (hopbus launch does)"
    ], p.stderr


def test_what_a_script_forks_and_forgets_goes_with_the_run(redis_url, tmp_path, script):
    """Fault ``forked_child``: each copy of the script starts a process it never waits for
    (``sleep``, in the background) and then trains to the end. When hopbus launch is done,
    nothing of them is left running."""
    marker = str(300 + os.getpid() % 600)  # a sleep no other test starts
    wrapper = tmp_path / "forks.py"
    wrapper.write_text(
        "import runpy, subprocess, sys\n"
        f"subprocess.Popen(['sleep', '{marker}.5'])\n"
        f"sys.argv = [{str(script)!r}, 'none']\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
    )
    p, s, _ = launch(redis_url, tmp_path / "run", "-n", "2", "--topology", "ring",
                     "--iterations", "20", command=[sys.executable, str(wrapper)])  # fmt: skip
    assert p.returncode == 0 and s["finished"], p.stderr
    assert not processes_mentioning(f"sleep {marker}.5")


def launch_then_ctrl_c(
    redis_url: str, run: str, out: Path, *flags: str, script: Path, fault: str, watched: int
) -> tuple[str, str]:
    """hopbus launch of the test script in the background, Ctrl-C once worker ``watched``
    has entered iteration 5; its stdout and stderr, the launcher having exited with Ctrl-C's
    130."""
    args = hopbus_args("launch", "--redis", redis_url, "--run", run, "--out", str(out), *flags)
    proc = subprocess.Popen(
        [*args, "--", sys.executable, str(script), fault],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    counter = RunKeys(run).iter(watched)
    wait_for(lambda: int(client.get(counter) or 0) >= 5, 120, "the run to start")
    proc.send_signal(signal.SIGINT)
    printed, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    return printed, err


def test_ctrl_c_stops_every_copy(redis_url, tmp_path, script):
    printed, _ = launch_then_ctrl_c(
        redis_url, f"c{os.getpid()}", tmp_path / "r", "-n", "3", "--topology", "ring",
        "--iterations", "1000000", script=script, fault="none", watched=2,
    )  # fmt: skip
    assert not processes_mentioning(str(script))
    s = json.loads((tmp_path / "r" / "summary.json").read_text())  # how far it got
    assert not s["finished"] and "interrupted" in s["failure"] and s["iterations"]["max"] >= 5
    # and the summary table says so, as at any end
    assert "stopped early" in printed and f"max {s['iterations']['max']}" in printed, printed
    # hopbus keeps no checkpoints of a script's model: a resume says what to do instead
    p = hopbus("train", "--resume", str(tmp_path / "r"))
    assert p.returncode == 2 and "holds a script's run (hopbus launch)" in p.stderr, p.stderr


def test_a_run_that_ends_in_the_stop_grace_is_recorded_finished(redis_url, tmp_path, script):
    """Fault ``deaf_to_the_stop``: Ctrl-C reaches hopbus launch while every copy of a script
    that ignores SIGTERM goes on to its end within the stop's grace. Its summary said
    'interrupted' of a run whose every final report was in (and inspect said finished): the
    run is now recorded finished, summary and all; the exit status stays Ctrl-C's 130."""
    run = f"deafend{os.getpid()}"  # run ids are unique across the suite's tests
    out = tmp_path / "r"
    _, err = launch_then_ctrl_c(
        redis_url, run, out, "-n", "2", "--topology", "ring", "--iterations", "40",
        "--iter-time", "0.05", script=script, fault="deaf", watched=1,
    )  # fmt: skip
    s = json.loads((out / "summary.json").read_text())
    assert s["finished"] and s["failure"] is None and s["iterations"]["min"] == 40, err
    assert redis.Redis.from_url(redis_url).hget(RunKeys(run).meta, "status") == b"finished"
    assert f"run {run} finished as it was stopped" in err
    assert not processes_mentioning(str(script))


def test_nothing_a_script_started_outlives_its_worker(redis_url, tmp_path, script):
    """Faults ``daemon`` and ``wrapped_then_killed``: a script that leaves a daemon behind
    (forked twice, in a session of its own) ends with its run, the daemon stopped and named
    in the worker's log; and a script run through ``sh -c`` (so that the parent-death signal
    reaches only sh) stops when its launcher is killed with SIGKILL."""
    mark = f"hopbus-test-daemon-{os.getpid()}"
    p, s, _ = launch(
        redis_url, tmp_path / "d", "-n", "2", "--topology", "ring", "--iterations", "20",
        command=[sys.executable, str(script), "daemon", "-1", mark],
    )  # fmt: skip
    assert p.returncode == 0 and s["finished"], p.stderr
    assert not processes_mentioning(mark)
    log = (tmp_path / "d" / "logs" / "worker-0.log").read_text()
    said = "stopped 1 process that `"  # named by its own command, not by the script's
    assert said in log and "left running when it exited: pid " in log, log
    assert "time.sleep(600)" in log.split(said)[1], log

    run = f"ksh{os.getpid()}"  # not test_keras.py's k{pid}: one Redis for the session
    args = hopbus_args("launch", "--redis", redis_url, "--run", run, "--out", str(tmp_path / "k"),
                       "-n", "2", "--topology", "ring", "--iterations", "1000000")  # fmt: skip
    wrapped = ["sh", "-c", f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} none; true"]
    proc = subprocess.Popen([*args, "--", *wrapped], env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    wait_for(lambda: int(client.get(f"hop:{{{run}}}:iter:1") or 0) >= 5, 120, "the run to start")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    wait_for(lambda: not processes_mentioning(str(script)), 30, "the scripts to stop")


def test_ctrl_c_while_a_worker_waits_for_what_its_script_left_orphans_nothing(
    redis_url, tmp_path, script
):
    """Fault ``deaf_daemon``: each script leaves a daemon behind that ignores SIGTERM, and
    exits; its hopbus worker gives the daemon its grace before SIGKILL. A Ctrl-C of the
    launcher in that grace (the scripts' results are in: the run ends as finished) stops the
    daemons at once rather than leave them to init."""
    mark = f"hopbus-test-deaf-{os.getpid()}"
    run = f"deaf{os.getpid()}"
    out = tmp_path / "r"
    args = hopbus_args("launch", "--redis", redis_url, "--run", run, "--out", str(out), "-n",
                       "2", "--topology", "ring", "--iterations", "5")  # fmt: skip
    proc = subprocess.Popen([*args, "--", sys.executable, str(script), "deaf_daemon", "-1", mark],
                            env=clean_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    logs = [out / "logs" / f"worker-{i}.log" for i in range(2)]

    def scripts_done() -> bool:  # exited, their hopbus worker processes still there
        said = [p.read_text() if p.exists() else "" for p in logs]
        ours = set(processes_mentioning(f"hopbus worker --run {run}"))
        ours |= set(processes_mentioning(f"hopbus launch --redis {redis_url} --run {run}"))
        return all("finished" in t for t in said) and (
            set(processes_mentioning(str(script))) == ours and len(ours) == 3
        )

    wait_for(scripts_done, 120, "the scripts to finish and exit, leaving their daemons")
    assert processes_mentioning(mark), "the daemons are in their grace"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    wait_for(lambda: not processes_mentioning(mark), 10, "the daemons to be gone")


def test_a_script_that_lingers_after_its_part_is_named(redis_url, tmp_path, script):
    """Fault ``linger``: every copy reports its result, then stays (SIGTERM ignored). The
    launcher says so, naming the worker and the command, --timeout after the last iteration,
    and waits; Ctrl-C then stops it all, SIGKILL for the deaf, and the run, whose results are
    complete, ends as finished, its summary written."""
    run = f"linger{os.getpid()}"
    flags = ["-n", "2", "--topology", "ring", "--iterations", "5", "--timeout", "2"]
    args = hopbus_args("launch", "--redis", redis_url, "--run", run, "--out", str(tmp_path / "r"))
    args += flags
    err = tmp_path / "err"
    with err.open("w") as fh:
        proc = subprocess.Popen([*args, "--", sys.executable, str(script), "linger"],
                                env=clean_env(), stdout=subprocess.DEVNULL, stderr=fh)  # fmt: skip
    said = "reported its result, but its process (`"
    wait_for(lambda: said in err.read_text(), 120, "the launcher to name the lingering copy")
    assert f"(`{sys.executable[:20]}" in err.read_text() and "has not exited" in err.read_text()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0, err.read_text()
    assert not processes_mentioning(str(script))
    assert "Ctrl-C: stopped the processes of workers 0, 1, which had reported" in err.read_text()
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["finished"] and s["iterations"]["min"] == 5 and s["failure"] is None
    snap = json.loads(hopbus("inspect", "--run", run, "--redis", redis_url, "--json").stdout)
    assert snap["status"] == "finished", snap["status"]


def test_the_numpy_example_trains(redis_url, tmp_path):
    p, s, _ = launch(
        redis_url, tmp_path / "run", "-n", "4", "--mode", "backup", "--iterations", "150",
        command=[sys.executable, str(ROOT / "examples" / "numpy_loop.py")],
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert s["finished"] and s["violations"] == 0 and s["final_accuracy"] >= 0.9
    assert s["consensus_distance"] < 0.1


def test_what_a_killed_workers_script_left_is_stopped_with_the_run(redis_url, tmp_path, script):
    """Fault ``daemon``, then a SIGKILL of one ``hopbus worker`` mid-run: the daemon its script
    left (in a session of its own) is below no process that would stop it any more (init has
    it); the launcher finds it by the mark its environment carries, and stops it with the run
    (before: it outlived the run)."""
    mark = f"hopbus-test-orphan-{os.getpid()}"
    daemons = f"time.sleep(600) {mark}"  # the daemons' command line, not the scripts'
    run = f"o{os.getpid()}"
    args = hopbus_args("launch", "--redis", redis_url, "--run", run, "--out", str(tmp_path / "o"),
                       "--json", "-n", "3", "--mode", "backup", "--iterations", "300",
                       "--iter-time", "0.02")  # fmt: skip
    proc = subprocess.Popen([*args, "--", sys.executable, str(script), "daemon", "-1", mark],
                            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    try:
        wait_for(lambda: int(client.get(f"hop:{{{run}}}:iter:1") or 0) >= 5, 120, "the run")
        wait_for(lambda: len(processes_mentioning(daemons)) == 3, 30, "the three daemons")
        (wrapper,) = processes_mentioning(f"--run {run} --id 1")
        os.kill(wrapper, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        left = processes_mentioning(daemons)
    finally:
        for p in processes_mentioning(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert [w["worker"] for w in json.loads(out)["lost_workers"]] == [1]
    assert not left, left


BARE_LOOP = """
import sys
import numpy as np
import hopbus

ctx = hopbus.join()  # no with block
p = ctx.start({"w": np.zeros(3, np.float32)})
while not ctx.done:
    p = ctx.begin()
    p = ctx.end({"w": p["w"] + 1.0}, loss=1.0)
    if ctx.iteration % 10 == 0:
        ctx.log(eval_loss=0.5, eval_accuracy=0.75)
if sys.argv[1] == "close":
    ctx.close()
"""


@pytest.mark.parametrize("end", ["exit", "close"])
def test_a_loop_that_trains_to_the_end_has_done_its_part_without_finish(redis_url, tmp_path, end):
    """A script without a with block that trains until ``ctx.done`` and then ends (``exit``)
    or calls ``ctx.close()`` has done its part, as under torchrun: its report goes with the
    last logged test loss and accuracy (before: exit 1, the run 'stopped early')."""
    script = tmp_path / "bare.py"
    script.write_text(BARE_LOOP)
    p, s, _ = launch(
        redis_url, tmp_path / "r", "-n", "2", "--topology", "ring", "--iterations", "30",
        command=[sys.executable, str(script), end],
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert s["finished"] and [w["iterations"] for w in s["per_worker"]] == [30, 30], s
    assert [w["final_accuracy"] for w in s["per_worker"]] == [0.75, 0.75]


def test_a_step_slower_than_the_timeout_is_named_as_such(redis_url, tmp_path, script):
    """Fault ``slow_step``: worker 1's step in iteration 10 outlasts --timeout. Worker 0, which
    waits for its update of iteration 11, says that worker 1 is still in iteration 10 (its
    counter in Redis tells), not that nothing reached its inbox."""
    p, s, _ = launch(
        redis_url, tmp_path / "r", "-n", "2", "--topology", "ring", "--iterations", "100",
        "--timeout", "5", command=[sys.executable, str(script), "slow_step", "1"],
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    assert (
        "worker 0 waited 5 s for updates of iteration 11 from worker 1 (alive; worker 1 is "
        "still in iteration 10 and has not begun iteration 11: a step slower than --timeout"
        in s["failure"]
    ), s["failure"]
