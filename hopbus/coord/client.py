"""Connecting to Redis, with one clear line when it cannot be reached."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import redis

from hopbus.errors import ConfigError, RunFailure

DEFAULT_URL = "redis://127.0.0.1:6379/0"


class BrokerUnreachableError(RunFailure):
    """Redis could not be reached (or refused us) within the timeout."""


def redact(url: str) -> str:
    """The URL with any password replaced by ***, for messages and logs. A host part that does
    not parse is hidden whole: ``redis://user:PASSWORD/0`` (the @host forgotten) reads as a
    host and a port, and that "port" is the password."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    try:
        parts.port  # noqa: B018 (raises for a port that is not a number)
    except ValueError:
        return urlunsplit(parts._replace(netloc="***"))
    if parts.query and "password" in parts.query.lower():  # ?password=... (redis-py takes it)
        query = [
            f"{k}=***" if "password" in k.lower() else f"{k}={v}"
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ]
        url = url.partition("?")[0] + "?" + "&".join(query)
        parts = parts._replace(query="&".join(query))
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def check_url(url: str) -> None:
    """Refuse what is not a Redis URL, before anything is started."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(
            f"--redis {redact(url)!r}: expected redis://[user:password@]host:port/db, "
            "rediss://... (TLS) or unix:///path/to/socket"
        )
    try:
        urlsplit(url).port  # noqa: B018
    except ValueError:  # never quote the "port": without @host it is the password
        raise ConfigError(
            f"--redis {redact(url)!r}: the host part does not parse (expected "
            "[user:password@]host:port)"
        ) from None


def attempts(timeout: float) -> Iterator[None]:
    """One step per attempt at something that may come back (a broker starting or
    restarting): the first at once, then after waits of 50 ms doubling to 1 s, ending once
    the next wait would end more than ``timeout`` seconds after the first attempt."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        yield
        if time.monotonic() + delay > deadline:
            return
        time.sleep(delay)  # backoff between attempts
        delay = min(delay * 2, 1.0)


def connect(url: str, *, timeout: float = 10.0) -> redis.Redis:
    """A client for ``url`` that has answered PING, retrying with backoff for up to ``timeout``
    seconds (the broker may still be starting, e.g. in docker compose)."""
    check_url(url)
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=min(5.0, timeout), health_check_interval=30
        )
    except (ValueError, redis.RedisError) as exc:  # a bad query parameter, e.g. ssl_cert_reqs
        raise ConfigError(f"--redis {redact(url)!r}: {exc}") from None
    last: BaseException | None = None
    for _ in attempts(timeout):
        try:
            client.ping()
            return client
        except redis.AuthenticationError as exc:
            raise BrokerUnreachableError(
                f"Redis at {redact(url)} refused the credentials: {exc}"
            ) from None
        except redis.ResponseError as exc:  # e.g. NOAUTH
            raise BrokerUnreachableError(f"Redis at {redact(url)} refused us: {exc}") from None
        except redis.InvalidResponse as exc:
            raise BrokerUnreachableError(
                f"{redact(url)} does not answer as Redis ({exc}): check the host and port"
            ) from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            last = exc
        except redis.RedisError as exc:  # e.g. a TLS query parameter redis-py refuses
            raise ConfigError(f"--redis {redact(url)!r}: {exc}") from None
    raise BrokerUnreachableError(
        f"cannot reach Redis at {redact(url)} within {timeout:g} s: {last}"
    ) from None
