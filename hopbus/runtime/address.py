"""Where peers reach a process: the endpoint it advertises for its inbox."""

from __future__ import annotations

import ipaddress
import socket
import warnings
from collections.abc import Callable
from urllib.parse import urlsplit

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


def resolve_advertise(value: str | None, redis_url: str) -> str | None:
    """``--advertise auto``: this host's own address (a container's IP on its compose network),
    so identical replicas each advertise an endpoint their peers can reach (``auto_address``)."""
    if value != "auto":
        return value

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
