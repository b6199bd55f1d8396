"""The Swarm stack on a one-node swarm, with the README's "Across machines" commands: the
worker image built, the password as a Docker secret, ``hopbus compose generate --swarm``,
``docker stack deploy``, watch followed to its summary, the results copied out of its
container, and the stack, its volume and the secret removed. A swarm this test started
(``docker swarm init``) is left again; one that was there already is left as it was.

Skipped, saying why, where no engine or base image can be had (engine.py), or where this
engine is in a swarm it does not manage.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from engine import (
    COMPOSE_FILE,
    ROOT,
    docker,
    one_stack_at_a_time,
    stack_settings,
    swarm_state,
    unavailable,
)
from test_cli import hopbus

WORKERS = 3
ITERATIONS = 300


@pytest.fixture
def swarm():
    env = {**os.environ, **stack_settings()}
    with one_stack_at_a_time():
        state = swarm_state()
        started = False
        if state == "inactive":
            p = docker("swarm", "init", timeout=60)
            if p.returncode != 0 and "advertise" in p.stderr:  # several addresses: loopback
                p = docker("swarm", "init", "--advertise-addr", "127.0.0.1", timeout=60)
            assert p.returncode == 0, p.stderr
            started = True
        elif state != "active" or docker("node", "ls", timeout=30).returncode != 0:
            unavailable(f"this engine is in swarm state {state!r}, not a manager")
        yield env
        if started:
            left = docker("swarm", "leave", "--force", timeout=60)
            assert left.returncode == 0, left.stderr


def _wait_removed(stack: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        p = docker("ps", "-aq", "--filter", f"label=com.docker.stack.namespace={stack}")
        if not p.stdout.strip():
            return
        time.sleep(0.5)
    pytest.fail(f"stack {stack}'s containers still there a minute after docker stack rm")


def test_a_stack_runs_to_its_end_on_a_one_node_swarm(swarm, tmp_path):
    tag = str(os.getpid())
    stack, secret = f"hopswarm{tag}", f"hoptest-redis-{tag}"
    env = {**swarm, "REDIS_SECRET": secret}
    stack_file = ROOT / "compose" / f".test-stack-{tag}.yml"  # its paths are relative to compose/
    built = docker(
        "compose", "-f", COMPOSE_FILE, "build",
        cwd=ROOT, env={**env, "REDIS_PASSWORD": "-"}, timeout=900,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    made = docker("secret", "create", secret, "-", input="sw@rm pass/word", env=env)
    assert made.returncode == 0, made.stderr
    try:
        gen = hopbus(
            "compose", "generate", "--swarm",
            "--cpu", str(WORKERS), "--iterations", str(ITERATIONS),
        )  # fmt: skip
        assert gen.returncode == 0, gen.stderr
        stack_file.write_text(gen.stdout)
        deploy = docker(
            "stack", "deploy", "--resolve-image", "never", "-c", str(stack_file), stack,
            cwd=ROOT, env=env,
        )  # fmt: skip
        assert deploy.returncode == 0, deploy.stderr
        deadline, state = time.monotonic() + 600, ""
        while time.monotonic() < deadline:
            state = docker(
                "service", "ps", f"{stack}_watch", "--format", "{{.CurrentState}}|{{.Error}}"
            ).stdout.strip()
            if state.startswith(("Complete", "Failed", "Rejected", "Shutdown")):
                break
            time.sleep(1)
        logs = docker("service", "logs", "--raw", f"{stack}_watch").stdout
        assert state.startswith("Complete"), (state, logs[-3000:])
        summary = json.loads([x for x in logs.splitlines() if x.startswith("{")][-1])
        assert summary["finished"] and summary["violations"] == 0, summary
        assert summary["config"]["workers"] == WORKERS
        assert sorted(w["worker"] for w in summary["per_worker"]) == list(range(WORKERS))
        assert summary["final_accuracy"] >= 0.9
        # the results, from watch's container on this (manager) node
        (container,) = docker(
            "ps", "-aq", "--filter", f"label=com.docker.swarm.service.name={stack}_watch"
        ).stdout.split()
        got = docker("cp", f"{container}:/home/hopbus/runs", str(tmp_path))
        assert got.returncode == 0, got.stderr
        (run,) = (tmp_path / "runs").iterdir()
        assert json.loads((run / "summary.json").read_text())["violations"] == 0
    finally:
        stack_file.unlink(missing_ok=True)
        docker("stack", "rm", stack, timeout=60)
        _wait_removed(stack)
        docker("volume", "rm", f"{stack}_results")
        docker("secret", "rm", secret)
    assert docker("volume", "inspect", f"{stack}_results").returncode != 0
