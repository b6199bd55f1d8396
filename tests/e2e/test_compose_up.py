"""The compose stack on a real Docker engine, run with the README's commands: built, brought up
with 4 CPU workers by ``docker compose -f compose/docker-compose.yml run --build --rm watch``,
read live with ``docker compose exec redis ...`` while it trains, followed to watch's summary
and exit status, run a second time (a fresh run id, nothing to clean first), its results
copied out, and taken down with its volumes.

Skipped, saying why, where no engine, compose plugin or base image can be had (engine.py); CI
sets them up (.ci/run) and then requires them. The Redis password has the characters a URL
must encode: it is set once, in REDIS_PASSWORD, and works.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest
from engine import COMPOSE_FILE, ROOT, docker, one_stack_at_a_time, stack_settings

ITERATIONS = 1500  # softmax on digits: seconds, long enough to be seen while it runs
PASSWORD = "p@ss w/rd:#%?&+"  # every character here means something in a URL


@pytest.fixture
def stack(tmp_path):
    """The settings of a stack of the test's own (its project name), taken down with its
    volumes afterwards."""
    env = {
        **os.environ,
        **stack_settings(),
        "COMPOSE_PROJECT_NAME": f"hoptest{os.getpid()}",
        "REDIS_PASSWORD": PASSWORD,
        "WORKERS": "4",
        "ITERATIONS": str(ITERATIONS),
        "RUN_ID": "",  # a fresh run id per run: the default
    }
    env.pop("COMPOSE_FILE", None)
    with one_stack_at_a_time():
        yield env
        down = compose(env, "down", "--volumes")
    assert down.returncode == 0, down.stderr
    left = docker("volume", "ls", "-q", "--filter", f"name={env['COMPOSE_PROJECT_NAME']}_")
    assert left.stdout.strip() == "", left.stdout  # the results volume went with it


def compose(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", "compose", "-f", COMPOSE_FILE, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=timeout,
    )  # fmt: skip


def redis_cli(env: dict[str, str], *args: str) -> str:
    """redis-cli in the redis service, logged in as the hopbus user (broker/cli.sh)."""
    p = compose(env, "exec", "redis", "sh", "/usr/local/etc/redis/cli.sh", *args)
    return p.stdout.strip() if p.returncode == 0 else ""


def run_stack(env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[int]]:
    """The README's one command, with the live progress seen meanwhile: the iterations of the
    newest progress entries read through redis-cli while the command runs."""
    seen: list[int] = []
    proc = subprocess.Popen(
        ["docker", "compose", "-f", COMPOSE_FILE, "run", "--build", "--rm", "watch"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out: dict[str, str] = {}
    reader = threading.Thread(
        target=lambda: out.update(zip(("stdout", "stderr"), proc.communicate(), strict=True))
    )
    reader.start()
    tick, run = threading.Event(), ""
    while reader.is_alive():
        run = run or redis_cli(env, "GET", "hop:stack:run")
        if run:
            entry = redis_cli(env, "XREVRANGE", f"hop:{{{run}}}:progress", "+", "-", "COUNT", "1")
            lines = entry.splitlines()
            if "iter" in lines:
                seen.append(int(lines[lines.index("iter") + 1]))
        tick.wait(0.2)
    reader.join(timeout=900)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out["stdout"], out["stderr"])
    return done, seen


def summary_of(p: subprocess.CompletedProcess) -> dict:
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    assert lines, (p.stdout[-2000:], p.stderr[-3000:])
    return json.loads(lines[-1])


def test_the_stack_trains_live_and_again_and_comes_down(stack, tmp_path):
    t0 = time.monotonic()
    first, seen = run_stack(stack)
    assert first.returncode == 0, first.stderr[-3000:]
    s = summary_of(first)
    assert s["finished"] and s["violations"] == 0 and not s["failure"], s
    assert s["config"]["workers"] == 4 and s["iterations"]["min"] == ITERATIONS
    assert s["final_accuracy"] >= 0.9
    assert any(0 < k < ITERATIONS for k in seen), seen  # progress read while it trained
    run1 = redis_cli(stack, "GET", "hop:stack:run")
    print(f"first run {run1}: {time.monotonic() - t0:.1f} s with the build")

    # (a) the same command again just works: a fresh run id, the old results kept (a shorter
    # run: nothing in it is read while it trains)
    t1 = time.monotonic()
    second, _ = run_stack({**stack, "ITERATIONS": "300"})
    assert second.returncode == 0, second.stderr[-3000:]
    assert summary_of(second)["finished"]
    run2 = redis_cli(stack, "GET", "hop:stack:run")
    assert run2 and run2 != run1
    print(f"second run {run2}: {time.monotonic() - t1:.1f} s")

    # the results, as the README collects them
    got = compose(stack, "cp", "init:/home/hopbus/runs", str(tmp_path))
    assert got.returncode == 0, got.stderr
    runs = tmp_path / "runs"
    assert {p.name for p in runs.iterdir()} == {run1, run2}
    for run in (run1, run2):
        on_disk = json.loads((runs / run / "summary.json").read_text())
        assert on_disk["violations"] == 0 and on_disk["finished"]
        assert (runs / run / "metrics.jsonl").stat().st_size > 0
        assert sorted(p.name for p in (runs / run / "tensorboard").iterdir()) == [
            f"worker-{i}" for i in range(4)
        ]


def test_a_wrong_password_is_one_line(stack):
    """A worker whose password differs from the broker's says so in one line and exits 2."""
    built = compose(stack, "build", timeout=900)  # the image, where the test above did not run
    assert built.returncode == 0, built.stderr[-3000:]
    up = compose(stack, "up", "--detach", "--wait", "redis", timeout=300)
    assert up.returncode == 0, up.stderr
    p = compose(
        {**stack, "REDIS_PASSWORD": "not-the-password"},
        "run", "--rm", "--no-deps", "-T", "worker-cpu",
        timeout=300,
    )  # fmt: skip
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "hopbus-entry: error: Redis refused the password" in p.stderr
    assert "Traceback" not in p.stderr
