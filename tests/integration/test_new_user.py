"""What a new user met, each a fault by its name: ``target_at_the_end``, ``deleted_token_queue``,
``missing_run``, ``unreachable_inbox``, ``rediss_to_plaintext``, ``hang_before_report``; and the
CLI's small refusals."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

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

from hopbus.coord.keys import RunKeys


def test_a_target_reached_by_the_final_evaluation_counts(redis_url, tmp_path):
    """Fault ``target_at_the_end``: no periodic evaluation reaches --target-loss, the final
    one does: time_to_target is the end of the run, not "never"."""
    p, s = train(redis_url, tmp_path / "run", "--iterations", "60", "--eval-every", "1000",
                 "--target-loss", "0.5")  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert s["final_loss"] <= 0.5
    assert s["time_to_target"] == s["wall_s"]


def test_a_deleted_token_queue_is_named_not_blamed_on_a_timeout(redis_url, tmp_path):
    """Fault ``deleted_token_queue``: TokenQ(0->1) deleted while it holds tokens (worker 1 is
    the slow one; max_ig 5). Worker 1 sees the queue hold fewer tokens than worker 0's counter
    says and stops the run naming it, long before --timeout."""
    flags = ["-n", "3", "--topology", "complete", "--iterations", "400", "--timeout", "60"]
    flags += ["--iter-time", "0.02", "--slowdown", "fixed:6@1", "--eval-every", "0"]
    args, run = train_args(redis_url, tmp_path / "run", *flags)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env())  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    keys = RunKeys(run)
    wait_iteration(client, keys, 1, 10)
    # Delete it while worker 0 is one iteration ahead (it holds max_ig + 1 tokens), in one
    # step: deleted at the instant both stand level, it would only ever hold more tokens than
    # worker 1 needs, and the run would end at the invariant check instead (exit 3).
    only_when = "if redis.call('LLEN', KEYS[1]) == tonumber(ARGV[1]) then "
    only_when += "return redis.call('DEL', KEYS[1]) end return 0"
    deadline = time.monotonic() + 30
    while not client.eval(only_when, 1, keys.tok(0, 1), 5 + 1):
        assert time.monotonic() < deadline, "worker 0 never stood one iteration ahead"
        time.sleep(0.002)  # polling Redis for that moment, not standing in for a sync
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert time.monotonic() - t0 < 30
    last = err.strip().splitlines()[-1]
    assert f"{keys.tok(0, 1)} holds 0 tokens where worker 0's counter" in last, last
    assert "raise --timeout" not in last


def test_a_run_that_is_not_there_is_said_to_be_waited_for(redis_url):
    """Fault ``missing_run``: hopbus worker of a run nobody created says what it waits for
    within seconds, then gives up after --timeout with one line."""
    p = hopbus("worker", "--run", f"nosuch{os.getpid()}", "--redis", redis_url, "--timeout", "4")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    where = redis_url.removeprefix("redis://").split("/")[0]  # the Redis it looked in
    assert f"is not in the Redis at {where} yet: waiting up to 4 s" in lines[0], lines[0]
    assert lines[-1].startswith("hopbus: error: run ") and "after 4 s" in lines[-1]
    assert "hopbus train, launch or create" in lines[-1]


def test_an_inbox_its_peers_cannot_reach_is_named(redis_url, tmp_path):
    """Fault ``unreachable_inbox``: worker 0 advertises an address nobody can reach (TEST-NET
    192.0.2.1): its wait for updates ends naming that address."""
    run = f"unreach{os.getpid()}"
    created = hopbus("create", "--run", run, "-n", "2", "--topology", "ring", "--iterations",
                     "20", "--redis", redis_url, "--timeout", "5")  # fmt: skip
    assert created.returncode == 0, created.stderr
    env = clean_env(HOPBUS_REDIS=redis_url)
    args0 = ["worker", "--run", run, "--id", "0", "--bind", "tcp://127.0.0.1:*"]
    w0 = subprocess.Popen(hopbus_args(*args0, "--advertise", "192.0.2.1"), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    w1 = subprocess.Popen(hopbus_args("worker", "--run", run, "--id", "1"), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    _, err0 = w0.communicate(timeout=120)
    w1.communicate(timeout=120)
    assert w0.returncode == 1
    assert "nothing arrived at this node's inbox, tcp://192.0.2.1:" in err0, err0


def test_small_refusals_of_the_cli(tmp_path):
    (tmp_path / "afile").write_text("x")
    linked = tmp_path / "linked"
    linked.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (linked / "tensorboard").symlink_to(tmp_path / "elsewhere")  # scalars would go there
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("mine")
    for args, expected in (
        (["train", "--out", str(tmp_path / "afile")], "is not a folder"),
        (["train", "--out", str(linked)], "its tensorboard is not a folder of its own"),
        (["train", "--out", str(tmp_path / "notes")], "already holds files"),
        (["train", "--run", ""], "--run '': a run id is 1 to 64 letters"),
        (["train", "-n", "5000", "--data", "synthetic:10000,8,2"], "more than 256 is not"),
        (["launch", "-n", "300", "--", "true"], "hopbus launch starts one process per worker"),
    ):
        p = hopbus(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert expected in p.stderr, (args, p.stderr)
    for command in ("train", "launch", "worker", "watch", "sim", "inspect"):
        p = hopbus(command, "--help")
        assert p.returncode == 0 and "<bool>" not in p.stdout, command


def test_a_tls_url_for_a_plaintext_redis_says_so(redis_url):
    """Fault ``rediss_to_plaintext``: rediss:// against a Redis that does not speak TLS, which
    never answers the handshake. The error says what the timeout most likely means."""
    from hopbus.coord.client import connect
    from hopbus.errors import UserError

    tls = redis_url.replace("redis://", "rediss://", 1)
    try:
        connect(tls, timeout=1.0)
    except UserError as exc:
        assert "rediss:// speaks TLS" in str(exc), exc
    else:
        raise AssertionError(f"{tls} answered PING")


def test_a_worker_that_hangs_before_its_report_is_named(redis_url, tmp_path):
    """Fault ``hang_before_report``: worker 0 enters the run's last iteration and hangs there,
    its heartbeat beating on. hopbus train waits (a final evaluation may be slow) but says,
    --timeout later, which worker it waits for and that Ctrl-C stops it; Ctrl-C then does."""
    import signal
    import threading

    flags = ["-n", "2", "--topology", "ring", "--iterations", "20", "--iter-time", "0.01"]
    args, _ = train_args(redis_url, tmp_path / "run", *flags, "--eval-every", "0", "--timeout", "2")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(HOPBUS_FAULTS="0:hang_before_report"))  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        said = "worker 0 entered the run's last iteration"
        wait_for(lambda: any(said in line for line in lines), 60, "the note on worker 0")
        assert proc.poll() is None  # still waiting: a slow final evaluation is not a failure
        assert not any("worker 1 entered" in line for line in lines)  # it reported
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(timeout=10)
    assert proc.returncode == 130, lines[-5:]
    note = next(line for line in lines if said in line)
    assert "Ctrl-C stops it" in note, note


NUMPY_MODELS = '''
import numpy as np


class Softmax:
    """Softmax regression on flattened rows, as a user writes one."""

    name = "mine"

    def __init__(self, n_features, n_classes):
        self.shape = (n_features, n_classes)

    def init_params(self, seed):
        return {"w": np.zeros(self.shape, np.float32), "b": np.zeros(self.shape[1], np.float32)}

    def loss_and_grad(self, p, x, y):
        x = x.reshape(len(x), -1)
        z = x @ p["w"] + p["b"]
        e = np.exp(z - z.max(1, keepdims=True))
        pr = e / e.sum(1, keepdims=True)
        loss = float(-np.log(pr[np.arange(len(y)), y] + 1e-9).mean())
        pr[np.arange(len(y)), y] -= 1
        pr /= len(y)
        return loss, {"w": (x.T @ pr).astype(np.float32), "b": pr.sum(0).astype(np.float32)}

    def evaluate(self, p, x, y):
        x = x.reshape(len(x), -1)
        return 0.0, float(((x @ p["w"] + p["b"]).argmax(1) == y).mean())


class Renamed(Softmax):
    def loss_and_grad(self, p, x, y):
        loss, g = super().loss_and_grad(p, x, y)
        return loss, {"W": g["w"], "b": g["b"]}


class Percent(Softmax):
    """Right at the start (the check before the run), a percentage once trained."""

    def evaluate(self, p, x, y):
        loss, accuracy = super().evaluate(p, x, y)
        return loss, accuracy * 100 if p["w"].any() else accuracy


class Quitter(Softmax):
    """Trains 20 steps in a worker, then ends the program as a script's code might."""

    steps = 0

    def loss_and_grad(self, p, x, y):
        Quitter.steps += 1
        if Quitter.steps > 20:
            import sys

            sys.exit(0)
        return super().loss_and_grad(p, x, y)


def loud():
    """The digits, with what a shell and C code write to descriptor 1 on the way."""
    import os

    from sklearn.datasets import load_digits

    os.system("echo FROM-SHELL")
    os.write(1, b"RAW-FD1\\n")
    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    return x[:1400], y[:1400], x[1400:], y[1400:]


def spawns():
    """The digits, after starting a daemon that leaves its session (sh exits, sleep stays)."""
    import os

    os.system("setsid sh -c 'sleep 3017 &'")
    return loud()


def good(n_features, n_classes):
    return Softmax(n_features, n_classes)


def quitter(n_features, n_classes):
    return Quitter(n_features, n_classes)


def percent(n_features, n_classes):
    return Percent(n_features, n_classes)


def renamed(n_features, n_classes):
    return Renamed(n_features, n_classes)
'''


@pytest.fixture
def code(tmp_path) -> Path:
    """NUMPY_MODELS as a user's file, mine.py (--model and --data FILE.py:FUNCTION)."""
    path = tmp_path / "mine.py"
    path.write_text(NUMPY_MODELS)
    return path


def test_a_numpy_model_of_ones_own_trains_and_a_wrong_one_is_one_line(redis_url, tmp_path, code):
    """--model FILE.py:F with a numpy model of the user's: it trains in every worker; one
    whose gradients are named unlike its parameters is refused before any worker starts
    (fault ``odd_numpy_model``: it failed in the workers, through hopbus's optimizer)."""
    p, s = train(redis_url, tmp_path / "good", "-n", "2", "--iterations", "40",
                 "--model", f"{code}:good", "--json")  # fmt: skip
    assert p.returncode == 0 and s is not None and s["finished"], p.stderr
    assert s["final_accuracy"] > 0.5, s["final_accuracy"]
    p, s = train(redis_url, tmp_path / "bad", "-n", "2", "--iterations", "40",
                 "--model", f"{code}:renamed", "--json")  # fmt: skip
    assert p.returncode == 2 and s is None, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert line == (
        f"hopbus: error: --model '{code}:renamed': loss_and_grad(params, x, y) returned "
        "gradients ['W', 'b'] for parameters ['b', 'w']: expected one array per parameter, "
        "by its name"
    )
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("mode", ["standard", "ps-bsp", "wagma"])
def test_a_numpy_model_whose_evaluation_goes_wrong_mid_run_is_one_line(
    redis_url, tmp_path, mode, code
):
    """Fault ``implausible_evaluation``: a --model whose evaluate() returned a percentage once
    trained (or labels of the wrong shape gave an accuracy of 39) had its progress entries
    refused as forged from that evaluation on, the summary cut at that iteration, and the run
    failed in finish(). It now fails at that evaluation, naming evaluate(); nothing refused."""
    p, s = train(redis_url, tmp_path / "run", "-n", "2", "--iterations", "40", "--mode", mode,
                 "--eval-every", "10", "--model", f"{code}:percent", "--json")  # fmt: skip
    assert p.returncode == 1, p.stderr
    assert "evaluate(): accuracy" in p.stderr and "is not a fraction in [0, 1]" in p.stderr
    assert "refused" not in p.stderr, p.stderr
    # the steps before it are the run's record (the first evaluation comes on entering 10)
    assert s is not None and not s["finished"] and s["iterations"]["min"] >= 9, s


def test_user_code_that_prints_below_python_or_exits_is_told_apart(redis_url, tmp_path, code):
    """Faults ``fd1_prints`` and ``exit_in_model``: a --data function whose shell child and
    raw writes to descriptor 1 came out on stdout before --json's summary (no longer JSON);
    a --model whose loss_and_grad() called sys.exit(0) mid-run, so its worker exited 0 without
    a report and the launcher blamed a Redis restart. The writes now go to stderr; the exit
    is the worker's failure, naming sys.exit."""
    # train() parses stdout as JSON
    p, s = train(redis_url, tmp_path / "loud", "-n", "2", "--iterations", "20",
                 "--data", f"{code}:loud")  # fmt: skip
    assert p.returncode == 0 and s is not None and s["finished"], p.stderr
    assert "FROM-SHELL" in p.stderr and "RAW-FD1" in p.stderr
    p, s = train(redis_url, tmp_path / "quits", "-n", "2", "--iterations", "60",
                 "--model", f"{code}:quitter")  # fmt: skip
    assert p.returncode == 1, p.stderr
    assert "--model or --data code ended the program in training (sys.exit(0))" in p.stderr
    assert "restart" not in p.stderr, p.stderr


def test_what_user_code_leaves_running_when_train_checks_it_is_stopped(redis_url, tmp_path, code):
    """Fault ``check_leaves_daemon``: hopbus train calls --data once itself, to check it; a
    daemon that function started (one that left its session) outlived the run, re-parented to
    init. The launcher now stops what the check left, naming it; the workers' own copies go
    with their process trees, as before."""
    p, s = train(redis_url, tmp_path / "run", "-n", "2", "--iterations", "20",
                 "--data", f"{code}:spawns")  # fmt: skip
    assert p.returncode == 0 and s is not None and s["finished"], p.stderr
    assert "checked here, left running: pid " in p.stderr and "`sleep 3017`" in p.stderr
    wait_for(lambda: not processes_mentioning("sleep 3017"), 15, "no daemon left")
