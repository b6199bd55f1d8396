"""What the container tests need from this machine: a Docker engine that answers, the compose
plugin, and the images' base (python:3.11-slim and redis:7 from a registry, or the local base
compose/base-image.sh makes). Each check says why not, for the skip message.

Where CI set the engine up (``HOPBUS_REQUIRE_DOCKER=1``, .ci/run), a missing piece fails the
test instead of skipping it: a green CI that skipped the container tests would prove nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = "compose/docker-compose.yml"  # as the README's commands name it, from ROOT
LOCAL_BASE = "hopbus-base:bookworm"  # compose/base-image.sh's default tag


def docker(*args: str, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 120)
    check = kw.pop("check", False)
    return subprocess.run(["docker", *args], check=check, **kw)


@functools.cache
def _problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker command (a Docker engine: .ci/run installs Debian's docker.io)"
    p = docker("version", "--format", "{{.Server.Version}}", timeout=30)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no answer"])[-1]
        return f"the Docker engine does not answer ({last}): start dockerd"
    p = docker("compose", "version", timeout=30)
    if p.returncode != 0:
        return "no `docker compose` (the Compose v2 plugin; .ci/run installs it)"
    return None


def _image(tag: str) -> bool:
    return docker("image", "inspect", tag, timeout=30).returncode == 0


@functools.cache
def _base() -> dict[str, str] | str:
    """The settings that pick the images' base: none where the defaults are here, the local
    base where compose/base-image.sh made it; else why there is none."""
    if _image("python:3.11-slim") and _image("redis:7"):
        return {}
    if _image(LOCAL_BASE):
        return {"BASE_IMAGE": LOCAL_BASE, "REDIS_IMAGE": LOCAL_BASE}
    return (
        "no base image: neither python:3.11-slim and redis:7 nor "
        f"{LOCAL_BASE} (sudo compose/base-image.sh makes it from Debian packages)"
    )


def unavailable(why: str) -> None:
    if os.environ.get("HOPBUS_REQUIRE_DOCKER") == "1":
        pytest.fail(f"HOPBUS_REQUIRE_DOCKER=1 but {why}")
    pytest.skip(why)


def stack_settings() -> dict[str, str]:
    """The environment a stack runs with here (the base images); skips, saying why, where no
    stack can run."""
    why = _problem()
    if why is not None:
        unavailable(why)
    base = _base()
    if isinstance(base, str):
        unavailable(base)
    return dict(base)  # type: ignore[arg-type]


@contextlib.contextmanager
def one_stack_at_a_time() -> Iterator[None]:
    """Hold the engine for one test's stack: the suite runs its files in parallel
    (``pytest -n 3``), and the compose and swarm tests build the same images and would
    otherwise share the engine's CPU, and a swarm init, with each other. An flock, so that a
    test killed midway releases it."""
    path = Path(tempfile.gettempdir()) / "hopbus-tests-docker-engine.lock"
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def swarm_state() -> str:
    """This engine's Swarm state: inactive, active, pending, error, locked."""
    p = docker("info", "--format", "{{.Swarm.LocalNodeState}}", timeout=30)
    return p.stdout.strip() if p.returncode == 0 else "error"
