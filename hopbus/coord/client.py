"""Connecting to Redis, with one clear line when it cannot be reached."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

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
    at = url.rfind("@")
    if at != -1:  # what comes before the last @ is credentials, whatever the parser made of it
        userinfo = _userinfo(url, at)
        colon = ":" in parts.netloc.rpartition("@")[0]
        if "@" not in parts.netloc or parts.netloc.rpartition("@")[0] != userinfo or not colon:
            scheme = url.partition(":")[0]
            return f"{scheme}://***@{url[at + 1 :]}"  # a / ? # in it, or a bare password
    try:
        parts.port  # noqa: B018 (raises for a port that is not a number)
    except ValueError:
        return urlunsplit(parts._replace(netloc="***"))
    pairs = parse_qsl(parts.query, keep_blank_values=True)  # names decoded: ?pass%77ord= too
    if any("password" in k.lower() for k, _ in pairs):  # ?password=... (redis-py takes it)
        query = [f"{k}=***" if "password" in k.lower() else f"{k}={v}" for k, v in pairs]
        url = url.partition("?")[0] + "?" + "&".join(query)
        parts = parts._replace(query="&".join(query))
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]  # as written (its port checked above): [::1]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def redis_flag(url: str | None) -> str:
    """`` --redis URL`` (its password hidden) for a command a message suggests, so that it acts
    on the Redis the user named; '' for the default one, or none given."""
    return "" if url is None or url == DEFAULT_URL else f" --redis {redact(url)}"


def _userinfo(url: str, at: int) -> str:
    """What stands between a URL's scheme (``redis://``, or a mistyped ``redis:``) and its
    ``at``: its credentials, as the user meant them."""
    scheme, sep, _ = url.partition("://")
    if not sep:
        scheme, sep, _ = url.partition(":")
    return url[len(scheme) + len(sep) : at]


_URL_SECRET = re.compile(r"(rediss?://[^:/@\s]*:)[^@\s]+@")


def scrub(text: str, *urls: str) -> str:
    """``text`` fit for a log, an event or a terminal: the password of any Redis URL in it,
    and of ``urls`` (and HOPBUS_REDIS) wherever it appears, replaced by ***. A line about a
    file may carry whatever the file held; this is the last line of defence, after every
    message was written not to quote such content."""
    text = _URL_SECRET.sub(r"\1***@", text)
    text = _URL_BARE_SECRET.sub(r"\1***@", text)
    for url in (*urls, os.environ.get("HOPBUS_REDIS", "")):
        for secret in _secrets(url):
            text = text.replace(secret, "***")
            text = text.replace(unquote(secret), "***")
    return text


_URL_BARE_SECRET = re.compile(r"(rediss?://)[^:/@\s]+@")
"""A URL's user part without a colon: most likely a password given without its ':'."""


def _secrets(url: str) -> list[str]:
    """What in ``url`` is secret: its password as parsed, and what stands before its last @
    (after the ':' there is one; all of it without one), however the parser took it."""
    found = []
    with contextlib.suppress(ValueError):
        found.append(urlsplit(url).password or "")
    at = url.rfind("@")
    if at != -1:
        user, colon, password = _userinfo(url, at).lstrip("/").partition(":")
        found.append(password if colon else user)
    with contextlib.suppress(ValueError):  # redis-py also takes ?password=
        query = parse_qsl(urlsplit(url).query, keep_blank_values=True)
        found += [v for n, v in query if n == "password"]
    return [s for s in found if len(s) >= 4]


def check_url(url: str) -> None:
    """Refuse what is not a Redis URL, before anything is started."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(
            f"--redis {redact(url)!r}: expected redis://[user:password@]host:port/db, "
            "rediss://... (TLS) or unix:///path/to/socket"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018
    except ValueError:  # never quote the "port": without @host it is the password
        raise ConfigError(
            f"--redis {redact(url)!r}: the host part does not parse (expected "
            "[user:password@]host:port)"
        ) from None
    query = parse_qsl(parts.query, keep_blank_values=True)
    shown_url = redact(url.partition("?")[0])  # the query may say what is wrong: left out
    if parts.scheme != "unix":
        db = parts.path.lstrip("/")
        # not quoted: it may be a password typed in its place
        if db and not (db.isascii() and db.isdigit()):
            shown_host = redact(f"{parts.scheme}://{parts.netloc}")
            raise ConfigError(
                f"--redis '{shown_host}/...': what follows the port must be a database number "
                "(redis://host:port/0); it is not shown, in case it is a password"
            )
        if db and any(n == "db" and v != db for n, v in query):
            raise ConfigError(
                f"--redis {shown_url!r}: the path says database {db} and ?db= another: give it once"
            )
    names = [n for n, _ in query]
    twice = sorted({n for n in names if names.count(n) > 1 and n in URL_SETTINGS})
    if twice:
        raise ConfigError(f"--redis {shown_url!r}: ?{twice[0]}= is given more than once")
    allowed = URL_SETTINGS | (TLS_URL_SETTINGS if parts.scheme == "rediss" else frozenset())
    shown = (re.sub(r"[^\w.-]", "?", n[:40]) for n, _ in query)  # never a control character
    bad = [n for n in dict.fromkeys(shown) if n not in allowed]
    if bad:
        one = len(bad) == 1
        if all(n in TLS_URL_SETTINGS for n in bad):
            why = "TLS settings" if not one else "a TLS setting"
            why += ": the URL must start with rediss://"
        elif all("timeout" in n for n in bad):
            why = "not for the URL: hopbus sets its own timeouts"
        else:
            why = "not a setting" if one else "not settings"
            why += " hopbus takes in the URL"
        raise ConfigError(
            f"--redis {shown_url!r}: {', '.join(f'?{n}=' for n in bad)} "
            f"{'is' if one else 'are'} {why} (it takes {', '.join(sorted(allowed))})"
        )


URL_SETTINGS = frozenset({"db", "username", "password", "client_name"})
"""What a --redis URL's query may set; everything else about the connection is hopbus's own
(its timeouts, bytes replies): redis-py would take anything, and fail later."""
TLS_URL_SETTINGS = frozenset(
    {"ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile",
     "ssl_check_hostname"}
)  # fmt: skip


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


QUICK_S = 1.0
"""Seconds a ``quick`` client gives each call: enough for a healthy broker's answer."""


def quick(url: str) -> redis.Redis:
    """A client whose every call gives up after ``QUICK_S`` (not redis-py's 5 s): for probing a
    broker that may be frozen or gone, and for best-effort writes, so that a handful of calls
    cannot add up to minutes. Not checked: the first call finds out."""
    return redis.Redis.from_url(url, socket_connect_timeout=QUICK_S, socket_timeout=QUICK_S)


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
        f"cannot reach Redis at {redact(url)} within {timeout:g} s: {last}{_tls_hint(url, last)}"
    ) from None


def _tls_hint(url: str, error: BaseException | None) -> str:
    """What a TLS mismatch looks like from here: a plaintext Redis never answers a rediss://
    handshake (a timeout), and a TLS-only one drops a plain redis:// client (connection
    closed, or reset)."""
    if url.startswith("rediss://") and isinstance(error, redis.TimeoutError):
        return " (rediss:// speaks TLS: does that port take TLS? A plaintext Redis never answers)"
    if url.startswith("redis://") and isinstance(error, redis.ConnectionError):
        text = str(error).lower()
        if "closed by server" in text or "reset by peer" in text:
            return " (if that port takes TLS only, use rediss://)"
    return ""


class Lua:
    """A Lua script no SCRIPT FLUSH can fail, whoever sends it (a broker restart neither):
    called with EVALSHA, and with EVAL of its source when Redis no longer holds it; queued in a
    pipeline as EVAL, since a pipeline's SCRIPT LOAD and its EVALSHA are two round trips a
    flush can fall between (redis-py's ``Script`` retries once, and lost that race to a
    client flushing every 20 ms). Called like ``Script``: ``(keys=..., args=..., client=...)``."""

    def __init__(self, client: redis.Redis, source: str) -> None:
        self.script = client.register_script(source)  # its sha, and PinnedScript's fallback
        self.client = client

    def __call__(
        self, keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None
    ) -> Any:
        source, sha = self.script.script, self.script.sha
        if isinstance(client, redis.client.Pipeline):
            return client.eval(source, len(keys), *keys, *args)
        target = self.client if client is None else client
        try:
            return target.evalsha(sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return target.eval(source, len(keys), *keys, *args)


class PinnedScript:
    """A Lua script called on a connection of its own, its command packed in one C call:
    about half the client CPU of ``Script.__call__`` (which takes a pooled connection, packs
    argument by argument and runs retry and observability hooks each time). For the one
    script every worker runs every iteration (the Advance), where that CPU is most of the
    protocol's cost on Redis's side.

    Errors are the client's: a refusal (``ResponseError``) as it is, a broken connection
    (``ConnectionError``, ``TimeoutError``) once, with the connection dropped and no blind
    retry (the caller checks whether the call went through, as after any lost reply); a
    script Redis no longer holds (a restart, SCRIPT FLUSH) is sent whole with EVAL, which
    no flush in between can make fail, and which caches it again for the next EVALSHA. The
    connection is the pool's, closed with the client."""

    def __init__(self, client: redis.Redis, lua: Lua) -> None:
        self.client = client
        self.lua = lua
        self.sha = lua.script.sha
        self._conn: Any = None

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        conn = self._conn
        if conn is None:  # first call: as any Lua call; later ones straight to EVALSHA
            result = self.lua(keys=keys, args=args)
            self._conn = self.client.connection_pool.get_connection()
            return result
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            conn.send_packed_command(_pack(conn, command), check_health=False)
            return conn.read_response()
        except redis.exceptions.NoScriptError:  # SCRIPT FLUSH, or a restart: the source itself
            return self.client.eval(self.lua.script.script, len(keys), *keys, *args)
        except (redis.ConnectionError, redis.TimeoutError):
            conn.disconnect()  # connected again by the next call
            raise
        except OSError as exc:  # redis-py wraps socket errors; anything it missed, as it would
            conn.disconnect()
            raise redis.ConnectionError(f"Error while talking to Redis: {exc}") from exc


def _pack(conn: Any, command: tuple) -> list[bytes]:
    if _hiredis_pack is not None:
        return [_hiredis_pack(command)]
    return conn.pack_command(*command)


try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis comes with redis[hiredis], a dependency
    _hiredis_pack = None
