#!/usr/bin/env python3
"""The hopbus images' entrypoint: ``hopbus-entry COMMAND ARGS...`` runs ``hopbus COMMAND
ARGS...`` once the container's settings have said which Redis and which run.

Redis: ``HOPBUS_REDIS`` as it is when set. Otherwise the URL is made here from ``REDIS_HOST``
(default ``redis``), ``REDIS_PORT`` (6379), ``REDIS_USER`` (``hopbus``) and the password, read
from the file ``REDIS_PASSWORD_FILE`` (default ``/run/secrets/redis_password``, a Docker
secret, where it exists) or from ``REDIS_PASSWORD``, URL-encoded: any password works, and it
is set in one place (the broker hashes the same one into its ACL, broker/start.sh).

The run: ``HOPBUS_RUN`` when set and not empty (``RUN_ID`` in compose/.env). When it is empty,
every ``up`` of a stack is a new run: ``create`` lets ``hopbus create`` make a fresh run id
and records it in Redis at ``hop:stack:run``; every other command (``worker``, ``watch``,
``ps``) waits for that key (a Swarm starts services in any order) and takes the run from it.

``HOPBUS_RESULTS`` (a folder, the results volume): the workers write their TensorBoard
scalars to ``HOPBUS_RESULTS/RUN/tensorboard/worker-I``, where ``hopbus watch --out
HOPBUS_RESULTS/RUN`` writes the run's other results.

Bad settings print one line, ``hopbus-entry: error: ...``, and exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from urllib.parse import quote

STACK_RUN = "hop:stack:run"  # the run the stack's init recorded last (within the ACL's hop:*)
SECRET = "/run/secrets/redis_password"


def fail(message: str, status: int = 2) -> None:
    print(f"hopbus-entry: error: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


def redis_url() -> str:
    if os.environ.get("HOPBUS_REDIS"):
        return os.environ["HOPBUS_REDIS"]
    path = os.environ.get("REDIS_PASSWORD_FILE") or (SECRET if os.path.exists(SECRET) else "")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                password = f.read().rstrip("\n")  # as $(cat FILE) in broker/password.sh
        except OSError as exc:
            fail(f"REDIS_PASSWORD_FILE {path}: {exc.strerror}")
    else:
        password = os.environ.get("REDIS_PASSWORD", "")
    if not password:
        fail("no Redis password: set REDIS_PASSWORD (compose/.env) or a redis_password secret")
    user = quote(os.environ.get("REDIS_USER", "hopbus"), safe="")
    host = os.environ.get("REDIS_HOST", "redis")
    port = os.environ.get("REDIS_PORT", "6379")
    return f"redis://{user}:{quote(password, safe='')}@{host}:{port}/0"


def client(url: str):  # redis-py: the image's hopbus installed it
    import redis

    return redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)


def wait_for_run(url: str, limit: float) -> str:
    """The run id the stack's init recorded, waiting up to ``limit`` seconds for Redis and the
    key (a Swarm starts the services in no order)."""
    import redis

    deadline, last = time.monotonic() + limit, "no answer"
    while True:
        try:
            run = client(url).get(STACK_RUN)
            if run:
                return run.decode()
            last = f"{STACK_RUN} not set yet (init has not recorded the run)"
        except redis.AuthenticationError:
            fail("Redis refused the password (REDIS_PASSWORD differs from the broker's)")
        except redis.RedisError as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            fail(f"no run to join after {limit:.0f} s: {last}", 1)
        time.sleep(0.5)


def create(args: list[str], env: dict[str, str]) -> int:
    """``hopbus create`` with a fresh run id, then the id at hop:stack:run."""
    p = subprocess.run(
        ["hopbus", "create", *args], env=env, stdout=subprocess.PIPE, text=True, check=False
    )
    sys.stdout.write(p.stdout)
    sys.stdout.flush()
    if p.returncode != 0:
        return p.returncode
    run = p.stdout.strip().splitlines()[-1]
    client(env["HOPBUS_REDIS"]).set(STACK_RUN, run)
    return 0


def main(argv: list[str]) -> None:
    if not argv:
        fail("usage: hopbus-entry COMMAND [ARGS]... (a hopbus command: worker, create, ...)")
    command, args = argv[0], argv[1:]
    env = dict(os.environ)
    env["HOPBUS_REDIS"] = redis_url()
    if not env.get("HOPBUS_RUN"):
        env.pop("HOPBUS_RUN", None)  # empty: a fresh run per stack (module docstring)
        if command == "create":
            sys.exit(create(args, env))
        if command in ("worker", "watch", "ps"):
            limit = float(env.get("HOPBUS_JOIN_WAIT", "300"))
            env["HOPBUS_RUN"] = wait_for_run(env["HOPBUS_REDIS"], limit)
    results, run = env.get("HOPBUS_RESULTS"), env.get("HOPBUS_RUN")
    if results and run:
        if command == "worker":
            env.setdefault("HOPBUS_TENSORBOARD", os.path.join(results, run, "tensorboard"))
        if command == "watch" and "--out" not in args and "-o" not in args:
            args = ["--out", os.path.join(results, run), *args]
    os.execvpe("hopbus", ["hopbus", command, *args], env)


if __name__ == "__main__":
    main(sys.argv[1:])
