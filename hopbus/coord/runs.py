"""A run as a whole in Redis: its configuration, status, listing and cleanup."""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from hopbus.coord.keys import RunKeys, run_of_key
from hopbus.errors import UserError


class RunStateError(UserError):
    """The run's state in Redis does not allow what was asked."""


def create_run(client: redis.Redis, keys: RunKeys, config: dict[str, Any], version: str) -> None:
    """Record a new run's configuration; refuses a run id that already has state."""
    if client.exists(keys.meta) or client.exists(keys.progress):
        raise RunStateError(
            f"run {keys.run!r} already exists in this Redis: pick another --run, or remove it "
            f"with: hopbus clean --run {keys.run}"
        )
    sec, usec = client.time()  # Redis's clock: every reader of the run shares it
    client.hset(
        keys.meta,
        mapping={
            "config": json.dumps(config),
            "status": "starting",
            "created": sec + usec / 1e6,
            "version": version,
        },
    )


def restore_run(client: redis.Redis, keys: RunKeys, config: dict[str, Any], version: str) -> None:
    """Put a running run's record back after Redis lost it (a restart without persistence);
    fields a worker already put back are kept."""
    for name, value in (
        ("config", json.dumps(config)),
        ("status", "running"),
        ("created", time.time()),
        ("version", version),
    ):
        client.hsetnx(keys.meta, name, value)


def load_config(client: redis.Redis, keys: RunKeys, *, timeout: float) -> dict[str, Any]:
    """The run's configuration, waiting up to ``timeout`` seconds for it to be created."""
    deadline = time.monotonic() + timeout
    while True:
        raw = client.hget(keys.meta, "config")
        if raw is not None:
            return json.loads(raw)
        if time.monotonic() >= deadline:
            raise RunStateError(
                f"run {keys.run!r} has no configuration in Redis ({keys.meta}) after "
                f"{timeout:g} s: start it with hopbus train, or check --run and --redis"
            )
        time.sleep(0.1)  # polling for a run another process is creating


def join_worker(client: redis.Redis, keys: RunKeys, workers: int) -> int:
    """A fresh worker id for a process started without ``--id`` (a compose replica): one
    atomic INCR, so concurrent joiners get 0..N-1 exactly once each; the N+1th is refused."""
    worker = int(client.incr(keys.joined)) - 1
    if worker >= workers:
        raise RunStateError(f"run {keys.run} already has its {workers} workers")
    return worker


def set_status(client: redis.Redis, keys: RunKeys, status: str) -> None:
    client.hset(keys.meta, "status", status)


def list_runs(client: redis.Redis) -> list[str]:
    runs = {run_of_key(k.decode()) for k in client.scan_iter(match="hop:{*}:meta", count=1000)}
    return sorted(r for r in runs if r)


def clean_run(client: redis.Redis, keys: RunKeys) -> int:
    """Delete every key of the run; returns how many there were."""
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=keys.pattern, count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += client.unlink(*batch)
            batch.clear()
    if batch:
        deleted += client.unlink(*batch)
    return deleted
