"""Per-run credentials: a Redis user that can touch only one run's keys.

The broker's shared ``hopbus`` user may read, change and delete every run's keys. A run made
with ``hopbus create --acl FILE`` gets a user of its own, ``hop-RUN``, with a random password,
allowed the commands hopbus needs and no key but ``hop:{RUN}:*``; FILE receives the Redis URL
with that user (mode 0600), which the run's workers, ``hopbus watch`` and ``inspect`` then use.
``hopbus clean`` removes the user with the run. Making or removing users needs an ACL
administrator's URL (the broker's admin user, not ``hopbus``).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import redis

from hopbus.coord.keys import RunKeys
from hopbus.errors import ConfigError, RunFailure

COMMANDS = (
    "-@all +@read +@write +@keyspace +@string +@hash +@list +@stream +@scripting +@transaction "
    "+@connection -@dangerous +ping +info +time"
)
"""What a run's processes call (the broker's users.acl gives its ``hopbus`` user the same)."""


def user_of(run: str) -> str:
    return f"hop-{run}"


def create_user(client: redis.Redis, keys: RunKeys, url: str) -> str:
    """Make (or remake, with a new password) run ``keys.run``'s user; returns the URL that
    logs in as it (``url`` with the user and password put in, URL-encoded)."""
    password = secrets.token_urlsafe(24)
    user = user_of(keys.run)
    rules = ["reset", "on", f">{password}", f"~hop:{{{keys.run}}}:*", "resetchannels"]
    rules += COMMANDS.split()
    try:
        client.execute_command("ACL", "SETUSER", user, *rules)
    except redis.ResponseError as exc:
        raise RunFailure(
            f"--acl: Redis refused to make user {user} ({str(exc)[:120]}): give --redis the URL "
            "of a user that may administer ACLs (not the broker's hopbus user)"
        ) from None
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit(
        parts._replace(netloc=f"{quote(user, safe='')}:{quote(password, safe='')}@{host}")
    )


def delete_user(client: redis.Redis, keys: RunKeys) -> bool | None:
    """Remove the run's user if there is one: whether it was removed, or None where this
    client may not remove users (the run's own user, or hopbus): it is left as it is."""
    try:
        return bool(client.execute_command("ACL", "DELUSER", user_of(keys.run)))
    except redis.ResponseError:
        return None


def open_secret(path: Path) -> int:
    """A new file only its owner may read, opened for the run's URL (refusing to overwrite
    one): made before anything is recorded in Redis, so that a path that cannot be written
    is refused with nothing to undo."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise ConfigError(f"--acl {str(path)!r} already exists: choose a new file") from None
    except OSError as exc:
        raise ConfigError(f"--acl {str(path)!r}: {exc.strerror or exc}") from None


def write_secret(fd: int, text: str) -> None:
    """The run's URL into the file ``open_secret`` made, which it closes."""
    with os.fdopen(fd, "w") as fh:
        fh.write(text + "\n")


__all__ = ["COMMANDS", "create_user", "delete_user", "open_secret", "user_of", "write_secret"]
