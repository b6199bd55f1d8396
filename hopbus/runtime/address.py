"""Where peers reach a process: the endpoint it advertises for its inbox."""

from __future__ import annotations

import ipaddress
import re
import socket
import warnings
from collections.abc import Callable
from urllib.parse import urlsplit

from hopbus.coord import read
from hopbus.errors import ConfigError

DEFAULT_BIND = "tcp://127.0.0.1:*"
"""An inbox on this machine's loopback, any free port: every worker of a local run."""


def advertised(bound: str, advertise: str | None) -> str:
    """The endpoint peers should connect to: the bound port at ``advertise`` (a host name or
    address), or at this host's name when bound to every interface."""
    parts = urlsplit(bound)
    host, port = parts.hostname or "", parts.port
    if advertise:
        host = advertise
    elif host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"tcp://{host}:{port}"


_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOST = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")
"""A host name: dot-separated labels of letters, digits, inner hyphens (RFC 1123) and
underscores (Docker's DNS names services ``stack_service``)."""


def _host(value: str) -> str:
    """``--advertise HOST``: a host name or an IPv4 address, nothing more (peers put
    ``tcp://`` before it and the bound port after it), or one line."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        ip = None
    if ip is not None and ip.version == 6:
        raise ConfigError(
            f"--advertise {value!r}: IPv6 addresses are not supported; give an IPv4 address or "
            "a host name"
        )
    if ip is None and not _HOST.fullmatch(value):
        raise ConfigError(
            f"--advertise {read.text(value, 100)!r}: expected a host name or an IPv4 address (no "
            "tcp://, no port: the port is the bound one), or auto"
        )
    return value


def resolve_advertise(value: str | None, redis_url: str) -> str | None:
    """``--advertise auto``: this host's own address (a container's IP on its compose network),
    so identical replicas each advertise an endpoint their peers can reach (``auto_address``)."""
    if value != "auto":
        return _host(value) if value else None  # none (or empty): the bound address

    def route(host: str) -> str:  # the local address of the interface that routes to host
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(host), 9))  # sends nothing: picks the route
            return str(probe.getsockname()[0])

    try:
        found = auto_address(
            socket.gethostbyname(socket.gethostname()),
            urlsplit(redis_url).hostname or "127.0.0.1",
            route,
        )
    except OSError as exc:
        raise ConfigError(f"--advertise auto: cannot find this host's address: {exc}") from None
    if ipaddress.ip_address(found).is_loopback:  # said, not silently advertised
        warnings.warn(
            f"--advertise auto: this host's name resolves to {found}, a loopback address: only "
            "processes on this machine can reach this one; give --advertise HOST for peers "
            "elsewhere",
            UserWarning,
            stacklevel=2,
        )
    return found


def auto_address(own: str, redis_host: str, route: Callable[[str], str]) -> str:
    """What ``--advertise auto`` advertises: the address this host's name resolves to, unless
    that is loopback (Debian's 127.0.1.1 line) while Redis is elsewhere; then the address of
    the interface that routes to Redis, which peers on Redis's network can reach."""
    local = redis_host in ("localhost", "::1") or redis_host.startswith("127.")
    if ipaddress.ip_address(own).is_loopback and not local:
        return route(redis_host)
    return own
