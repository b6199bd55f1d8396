"""A run as a whole in Redis: its configuration, status, listing and cleanup."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection
from itertools import islice
from typing import Any

import redis

from hopbus.coord.client import redis_flag
from hopbus.coord.keys import RunKeys, run_of_key
from hopbus.errors import UserError
from hopbus.runtime import env


class RunStateError(UserError):
    """The run's state in Redis does not allow what was asked."""


def create_run(
    client: redis.Redis,
    keys: RunKeys,
    config: dict[str, Any],
    version: str,
    url: str | None = None,
) -> None:
    """Record a new run's configuration; refuses a run id that already has state (``url``:
    the Redis named, for the command the refusal suggests)."""
    if client.exists(keys.meta) or client.exists(keys.progress):
        exported = os.environ.get(env.RUN, "").strip() == keys.run  # --run's variable
        said = " (HOPBUS_RUN in your environment names it: unset it, or give --run)"
        raise RunStateError(
            f"run {keys.run!r} already exists in this Redis: pick another --run"
            f"{said if exported else ''}, or remove it with: hopbus clean --run "
            f"{keys.run}{redis_flag(url)}"
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


SAY_AFTER_S = 2.0  # a run still missing after this long is said to be waited for


def recorded_config(raw: dict[str, Any], keys: RunKeys) -> Any:
    """A run's config as recorded in Redis (``raw``: its JSON object), validated as a
    TrainConfig. A value no hopbus wrote is named with the key it was read from, never taken
    for a flag of the command reading it: one line, RunStateError."""
    from hopbus.config import TrainConfig, make_config
    from hopbus.coord import read
    from hopbus.errors import ConfigError, SlowdownSpecError

    where = f"{keys.meta} config"  # named as a file's key is, not as a flag
    try:
        return make_config(raw, dict.fromkeys(raw, where), TrainConfig)
    except (ConfigError, SlowdownSpecError) as exc:
        why = str(exc).removeprefix(f"{where}: ")
        raise RunStateError(
            f"run {keys.run!r}: {keys.meta} holds a config no hopbus wrote ({read.text(why, 300)})"
        ) from None


def _where(client: redis.Redis) -> str:
    """Which Redis ``client`` talks to, without its credentials: host:port, or its socket."""
    kw = client.connection_pool.connection_kwargs
    return str(kw.get("path") or f"{kw.get('host')}:{kw.get('port')}")


def load_config(
    client: redis.Redis, keys: RunKeys, *, timeout: float, say: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The run's configuration, waiting up to ``timeout`` seconds for it to be created (a
    container may start before the one that creates the run); after SAY_AFTER_S, ``say`` is
    told once what is waited for and which runs this Redis holds."""
    from hopbus.coord import read

    t0 = time.monotonic()
    said = False
    while True:
        raw = client.hget(keys.meta, "config")
        if raw is not None:
            cfg = read.json_object(raw)
            if cfg is None:
                raise RunStateError(f"run {keys.run!r}: {keys.meta} holds no readable config")
            return cfg
        waited = time.monotonic() - t0
        if say is not None and not said and waited >= SAY_AFTER_S:
            said = True
            others = ", ".join(list_runs(client)[:10]) or "none"
            say(
                f"run {keys.run!r} is not in the Redis at {_where(client)} yet: waiting up to "
                f"{timeout:g} s for it to be created (hopbus create, train or launch); runs "
                f"there: {others}"
            )
        if waited >= timeout:
            raise RunStateError(
                f"run {keys.run!r} has no configuration in the Redis at {_where(client)} "
                f"({keys.meta}) after {timeout:g} s: start it with hopbus train, launch or "
                "create, or check --run and --redis (HOPBUS_RUN, HOPBUS_REDIS)"
            )
        time.sleep(0.1)  # polling for a run another process is creating


def join_worker(client: redis.Redis, keys: RunKeys, workers: int, url: str | None = None) -> int:
    """A fresh worker id for a process started without ``--id`` (a compose replica): one
    atomic INCR, so concurrent joiners get 0..N-1 exactly once each; the N+1th is refused.
    An id a process started with ``--id`` holds or held is passed over, so plain workers
    fill the places those left. ``url``: the Redis the refusal's suggested command names."""
    from hopbus.coord.control import taken

    while True:
        try:
            worker = int(client.incr(keys.joined)) - 1
        except redis.ResponseError:  # not an integer, or not a string: something else wrote it
            worker = -1
        if worker < 0:  # INCR counts up from 0
            raise RunStateError(
                f"run {keys.run}: its join counter ({keys.joined}) holds what no hopbus "
                f"process writes (not a count from 0); start this worker with --id, or delete "
                f"{keys.joined} if no worker has joined without one yet"
            )
        if worker >= workers:
            raise RunStateError(
                f"run {keys.run} already has its {workers} workers (each id is given once, to "
                f"a worker that failed too: hopbus inspect --run {keys.run}{redis_flag(url)} "
                "shows them)"
            )
        if taken(client, keys, worker) is None:
            return worker


def set_status(client: redis.Redis, keys: RunKeys, status: str) -> None:
    client.hset(keys.meta, "status", status)


def status_of(client: redis.Redis, keys: RunKeys) -> str:
    """``run_status`` with the run's size read from its recorded config ("unknown" without
    one: a run some other tool left half-made)."""
    from hopbus.coord import read

    cfg = read.json_object(client.hget(keys.meta, "config")) or {}
    workers = read.integer(cfg.get("workers"), 1, 100_000)
    iterations = read.integer(cfg.get("iterations"), 1)
    if workers is None or iterations is None:
        return read.text(client.hget(keys.meta, "status"), 40) or "unknown"
    return run_status(client, keys, workers, iterations)


def run_status(client: redis.Redis, keys: RunKeys, workers: int, iterations: int) -> str:
    """What the run's own keys say it is, whatever its recorded ``status`` says (a launcher
    killed with the laptop lid never wrote "finished"; a run followed by nobody has nobody
    to write it): ``finished`` when every worker's final report counts (coord/read.py),
    those declared dead aside (a backup run goes on without them), ``failed`` when the run
    was stopped, ``running`` while some node's heartbeat is alive, or, before any of them
    started, the heartbeat of the hopbus train or launch that starts them (``keys.launcher``:
    its workers may be loading),
    ``failed`` too when it started but nothing beats any more and a node said it failed
    (``said_why``: a worker that gave up waiting for one that never came), ``abandoned``
    when it started (a counter, or a registered endpoint) and nothing beats any more and no
    node failed (a killed launcher's workers, interrupted with it), otherwise the recorded
    status (``starting``: created, no worker came yet; or ``stopped`` after Ctrl-C)."""
    from hopbus.coord import read

    recorded = read.text(client.hget(keys.meta, "status"), 40) or "unknown"
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.result)
    pipe.mget([keys.iter(i) for i in range(workers)])
    pipe.hgetall(keys.incarnation)
    pipe.exists(keys.stop)
    pipe.mget([keys.hb(i) for i in range(workers + 1)])  # and a parameter server's, node N
    pipe.smembers(keys.dead)
    pipe.hlen(keys.addr)
    pipe.get(keys.launcher).pttl(keys.launcher)
    for i in range(workers + 1):
        pipe.pttl(keys.hb(i))
    replies = pipe.execute()
    results, counters, incarnations, stopped, beats, dead, registered = replies[:7]
    launcher = read.beating(*replies[7:9])  # hopbus train or launch, its workers still loading
    ttls = replies[9:]
    reported = {
        i
        for i in range(workers)
        if read.result(
            results.get(str(i).encode()), counter=counters[i],
            incarnation=incarnations.get(str(i).encode()), iterations=iterations, beat=beats[i],
        ) is not None
    }  # fmt: skip
    # a backup run goes on without its dead: every other worker's report finishes it
    if reported and len(reported | read.ids(dead, workers)) == workers and not stopped:
        return "finished"
    if stopped:
        return "failed"
    started = any(c is not None for c in counters) or bool(registered)
    # the launcher's beat counts while its workers load (nothing of theirs is there yet); once
    # they started, theirs tell: a launcher killed with its workers beats on for a TTL
    if (launcher and not started) or any(
        read.beating(b, t) for b, t in zip(beats, ttls, strict=True)
    ):
        return "running"
    if recorded == "stopped":
        return recorded
    if started or recorded == "running":
        said = said_why(client, keys, workers + 1).values()
        return "failed" if any(kind == "error" for kind, _ in said) else "abandoned"
    return recorded


def said_why(client: redis.Redis, keys: RunKeys, nodes: int) -> dict[int, tuple[str, str]]:
    """Per node (ids below ``nodes``) that posted an ``error`` or ``interrupted`` event, the
    first one's kind and message since the last replacement of that id came in: why a node
    is gone once its heartbeat is (the rule hopbus watch follows; anything that can write the
    stream can write one, so it never makes a live node gone). A refused process writes
    none."""
    from hopbus.coord import read
    from hopbus.coord.control import EVENTS_MAXLEN
    from hopbus.coord.keys import SAYS_WHY_GONE

    try:
        entries = client.xrange(keys.events, count=EVENTS_MAXLEN)
    except redis.ResponseError:  # another type there: nothing said
        return {}
    said: dict[int, tuple[str, str]] = {}
    for _, fields in entries:
        kind = read.text(fields.get(b"kind"), 40)
        who = read.integer(fields.get(b"worker"), 0, nodes - 1)
        if kind in SAYS_WHY_GONE and who is not None:
            said.setdefault(who, (kind, read.text(fields.get(b"message"), 300) or kind))
        elif kind in ("rejoining", "rejoin") and who is not None:  # a replacement: what the
            said.pop(who, None)  # process it replaces said is not its own
    return said


MISPLACED_LOOKED = 100_000
"""``misplaced`` looks at this many of a run's keys at most (a run of 1,000 workers on a
ring-based graph has some 10,000)."""


def of_another_type(
    client: redis.Redis, keys: RunKeys, names: list[str], most: int = 5
) -> list[str]:
    """Those of ``names`` (keys of the run) that hold another type than hopbus keeps there
    (``KEPT_TYPES``), at most ``most``, each as ``KEY (a hash; hopbus keeps a string there)``."""
    found: list[str] = []
    for start in range(0, len(names), 1000):
        chunk = names[start : start + 1000]
        pipe = client.pipeline(transaction=False)
        for name in chunk:
            pipe.type(name)
        for name, got in zip(chunk, pipe.execute(), strict=True):
            kept = keys.kept_type(name)
            held = got.decode(errors="replace") if isinstance(got, bytes) else str(got)
            if kept is not None and held not in (kept, "none"):  # none: gone meanwhile
                found.append(f"{name} (a {held}; hopbus keeps a {kept} there)")
                if len(found) >= most:
                    return found
    return found


def misplaced(client: redis.Redis, keys: RunKeys, most: int = 5) -> list[str]:
    """The run's keys that hold another type than hopbus keeps there, at most ``most`` of
    them (``of_another_type``): what a WRONGTYPE refusal, which names no key, was about.
    Empty if Redis cannot say."""
    try:
        scanned = (
            k.decode(errors="replace") for k in client.scan_iter(match=keys.pattern, count=1000)
        )
        # names of the schema only (no TYPE asked of others), the keys every run has first
        # (meta, result, ...), then those of each worker: look-alikes (hb:junk, ...) cannot
        # push them off the list
        ours = islice((k for k in scanned if keys.kept_type(k) is not None), MISPLACED_LOOKED)
        names = sorted(
            ours, key=lambda name: (any(c.isdigit() for c in name[len(keys.prefix) :]), name)
        )
        return of_another_type(client, keys, names, most)
    except redis.RedisError:
        return []


def list_runs(client: redis.Redis) -> list[str]:
    """The runs this Redis holds: those whose meta key names a run id hopbus could have made
    (a key written by something else, with escape sequences in it, say, is left out)."""
    from hopbus.coord.keys import RUN_ID

    keys = client.scan_iter(match="hop:{*}:meta", count=1000)
    runs = {run_of_key(k.decode(errors="replace")) for k in keys}
    return sorted(r for r in runs if r and RUN_ID.fullmatch(r))


def stop_for_removal(client: redis.Redis, keys: RunKeys, patience_s: float) -> int:
    """Stop a running run before its keys are removed (``hopbus clean --force``): removed
    under live workers, its keys would come back, put back by workers that take an empty
    Redis for a restarted one. Sets the stop key, then waits up to ``patience_s`` for every
    heartbeat to lapse (a node sees the stop within a third of its heartbeat and exits; its
    key then expires); returns how many still beat after that."""
    from hopbus.coord import read
    from hopbus.coord.control import RunControl

    RunControl(client, keys, -1).stop_run("its keys were removed by hopbus clean --force")
    deadline = time.monotonic() + patience_s
    while True:  # the nodes', and the launcher's: it would write the run's end
        names = [*client.scan_iter(match=f"{keys.hb_prefix}*", count=1000), keys.launcher]
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.get(name).pttl(name)
        # a key under hb: of another type (written by something else) beats for nobody
        got = [
            None if isinstance(x, redis.ResponseError) else x
            for x in (pipe.execute(raise_on_error=False) if names else [])
        ]
        beating = sum(read.beating(v, t) for v, t in zip(got[::2], got[1::2], strict=True))
        if not beating or time.monotonic() >= deadline:
            return beating
        time.sleep(0.2)  # polling for heartbeats to lapse: their processes are elsewhere


def clean_run(client: redis.Redis, keys: RunKeys, keep: Collection[str] = ()) -> int:
    """Delete every key of the run but those named in ``keep``; returns how many went."""
    deleted = 0
    batch: list[bytes] = []
    kept = {k.encode() for k in keep}
    for key in client.scan_iter(match=keys.pattern, count=1000):
        if key in kept:
            continue
        batch.append(key)
        if len(batch) >= 500:
            deleted += client.unlink(*batch)
            batch.clear()
    if batch:
        deleted += client.unlink(*batch)
    return deleted
