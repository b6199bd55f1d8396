"""The deployment folders hold together: every compose service runs a real hopbus command
with real flags, the images' entrypoint is ``hopbus worker``, and the broker wants a password."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from test_cli import hopbus

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"


@functools.cache
def _help(command: str) -> str:
    p = hopbus(*command.split(), "--help", env={"COLUMNS": "200"})
    assert p.returncode == 0, (command, p.stderr)
    return p.stdout


def _generated() -> dict:
    p = hopbus("compose", "generate", "--cpu", "2", "--gpu", "1", "--mode", "backup")
    assert p.returncode == 0, p.stderr
    return yaml.safe_load(p.stdout)


def _entrypoint(dockerfile: str) -> list[str]:
    text = (ROOT / dockerfile).read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("ENTRYPOINT")]
    return yaml.safe_load(line.split(None, 1)[1])  # the exec form is a JSON list


def _check_services(compose: dict) -> None:
    services = compose["services"]
    assert {"redis", "init", "worker-cpu", "watch"} <= set(services)
    for name, svc in services.items():
        if name == "redis":
            continue
        if "entrypoint" in svc:
            program, command = svc["entrypoint"][0], svc["entrypoint"][1]
        else:
            program, command = _entrypoint(svc["build"]["dockerfile"])
        assert program == "hopbus", name
        text = _help(command)
        for flag in (a for a in svc["command"] if a.startswith("-")):
            assert re.search(rf"{re.escape(flag)}\b", text), (name, command, flag)
        assert svc["environment"]["HOPBUS_REDIS"].startswith("redis://hopbus:${REDIS_PASSWORD")
    assert services["init"]["entrypoint"] == ["hopbus", "create"]
    for kind in ("cpu", "gpu"):
        if f"worker-{kind}" in services:
            svc = services[f"worker-{kind}"]
            assert svc["build"]["dockerfile"] == f"workers/Dockerfile.{kind}"
            assert svc["depends_on"]["init"]["condition"] == "service_completed_successfully"
            assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
            assert "--id" not in svc["command"]  # replicas take their ids on joining
    gpu = services.get("worker-gpu")
    if gpu is not None:
        (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    redis_svc = services["redis"]
    assert any("users.acl" in v for v in redis_svc["volumes"])
    assert "--user hopbus" in " ".join(redis_svc["healthcheck"]["test"])


def test_the_compose_file_runs_real_commands():
    compose = yaml.safe_load(COMPOSE.read_text())
    _check_services(compose)
    assert compose["services"]["worker-gpu"]["profiles"] == ["gpu"]
    env = (ROOT / "compose" / ".env.example").read_text()
    for name in ("REDIS_PASSWORD", "RUN_ID", "WORKERS", "TOPOLOGY", "MODE", "MODEL", "ITERATIONS"):
        assert re.search(rf"^{name}=", env, re.M), name


def test_generate_mixes_cpu_and_gpu_workers():
    compose = _generated()
    _check_services(compose)
    services = compose["services"]
    assert services["worker-cpu"]["deploy"]["replicas"] == 2
    assert services["worker-gpu"]["deploy"]["replicas"] == 1
    init = services["init"]["command"]
    assert init[init.index("--workers") + 1] == "3"
    assert init[init.index("--mode") + 1] == "backup"
    # the broker is one definition: the generated file's is the hand-written file's
    assert services["redis"] == yaml.safe_load(COMPOSE.read_text())["services"]["redis"]


def test_a_parameter_server_run_gets_its_server():
    ps = json.loads(hopbus("compose", "generate", "--cpu", "3", "--mode", "ps-bsp").stdout)
    assert ps["services"]["ps"]["entrypoint"] == ["hopbus", "ps"]
    assert ps["services"]["ps"]["command"][:2] == ["--run", "hop-1"]
    assert "ps" not in _generated()["services"]  # a Hop run has none
    static = yaml.safe_load(COMPOSE.read_text())["services"]["ps"]
    assert static["profiles"] == ["ps"] and static["entrypoint"] == ["hopbus", "ps"]


def test_generate_refuses_what_train_refuses():
    p = hopbus("compose", "generate", "--cpu", "2", "--model", "resnet")
    assert p.returncode == 2 and "unknown model" in p.stderr
    p = hopbus("compose", "generate", "--cpu", "1")
    assert p.returncode == 2 and "at least 2" in p.stderr


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_worker_images_run_hopbus_worker(kind):
    assert _entrypoint(f"workers/Dockerfile.{kind}") == ["hopbus", "worker"]


def test_broker_requires_a_password():
    acl = [x.split() for x in (ROOT / "broker" / "users.acl").read_text().splitlines()]
    acl = [x for x in acl if x and not x[0].startswith("#")]
    assert ["user", "default", "off"] in acl
    (hopbus_user,) = [x for x in acl if x[:2] == ["user", "hopbus"]]
    assert "on" in hopbus_user and any(t.startswith(">") for t in hopbus_user)
    assert "nopass" not in hopbus_user and "~hop:*" in hopbus_user
    conf = (ROOT / "broker" / "redis.conf").read_text()
    assert re.search(r"^aclfile /usr/local/etc/redis/users.acl$", conf, re.M)
    assert re.search(r"^protected-mode yes$", conf, re.M)
    assert re.search(r"^maxmemory-policy noeviction$", conf, re.M)


def _docker_compose() -> bool:
    if shutil.which("docker") is None:
        return False
    p = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    return p.returncode == 0


@pytest.mark.skipif(not _docker_compose(), reason="`docker compose version` fails here")
def test_docker_compose_accepts_the_files(tmp_path):
    env = {"REDIS_PASSWORD": "x"}
    generated = tmp_path / "generated.yml"
    generated.write_text(hopbus("compose", "generate", "--cpu", "2", "--gpu", "1").stdout)
    for f in (COMPOSE, generated):
        p = subprocess.run(
            ["docker", "compose", "-f", str(f), "--project-directory", str(COMPOSE.parent),
             "config", "--quiet"],
            capture_output=True, text=True, env={**os.environ, **env}, check=False,
        )  # fmt: skip
        assert p.returncode == 0, (f, p.stderr)


def test_advertise_auto_uses_the_route_to_redis_when_the_host_name_is_loopback():
    from hopbus.cli.cluster import auto_address

    def route(host: str) -> str:
        return {"10.0.0.5": "10.0.0.7", "redis": "172.18.0.4"}[host]

    assert auto_address("172.18.0.3", "redis", route) == "172.18.0.3"  # a container's own IP
    assert auto_address("127.0.1.1", "10.0.0.5", route) == "10.0.0.7"  # Debian's hosts line
    assert auto_address("127.0.1.1", "redis", route) == "172.18.0.4"
    assert auto_address("127.0.0.1", "127.0.0.1", route) == "127.0.0.1"  # all on one machine
    assert auto_address("127.0.1.1", "localhost", route) == "127.0.1.1"
