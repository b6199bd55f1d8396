"""Multi-host without Docker: Redis and every worker in a network namespace of its own, each
with its own address on one bridge, so nothing can work through 127.0.0.1 by accident.

The run is recorded with ``hopbus create`` from the host; each worker is ``hopbus worker`` in its
namespace, joining by the run's INCR counter, binding and advertising its namespace's address.
Needs root (CAP_NET_ADMIN) and ``ip netns``; skipped, saying why, where they cannot be made.

A host where dockerd runs has its iptables FORWARD policy at DROP, and with
``net.bridge.bridge-nf-call-iptables = 1`` that filter sees frames between two ports of any
bridge: the fixture lets its own bridge forward (one rule, removed afterwards), as a host
with Docker must for any bridge of its own (docs/containers.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from cluster import clean_env

from hopbus.coord.keys import RunKeys

WORKERS = 3
ACCURACY_BAR = 0.90


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, "ip", *args]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


@dataclass
class Hosts:
    """One bridge on the host (``gateway``) and one namespace per host; ``addr[i]`` is host
    i's address (host 0 runs Redis)."""

    bridge: str
    namespaces: list[str]
    addr: list[str]
    gateway: str

    def run(self, i: int, *cmd: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.namespaces[i], *cmd], **kw)


def _forward_rule(bridge: str) -> list[str] | None:
    """The iptables rule that lets ``bridge`` forward between its own ports, or None where
    there is no iptables (then nothing filters bridged frames that it could open)."""
    if shutil.which("iptables") is None:
        return None
    return ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]


def _iptables(action: str, rule: list[str]) -> None:
    subprocess.run(
        ["iptables", "-w", action, *rule], check=True, capture_output=True, text=True, timeout=30
    )


def _cannot_make_namespaces() -> str | None:
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    probe = f"hopprobe{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        return f"`ip netns add` failed: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    why = _cannot_make_namespaces()
    if why is not None:
        pytest.skip(f"multi-host test: {why}")
    tag = f"{os.getpid() % 100000}"
    net = f"10.{70 + os.getpid() % 50}.{os.getpid() % 250}"
    h = Hosts(f"hb{tag}", [], [], f"{net}.254")
    rule = _forward_rule(h.bridge)
    opened = False
    try:
        if rule is not None:  # a Docker host's FORWARD policy is DROP (module docstring)
            _iptables("-I", rule)
            opened = True
        _ip("link", "add", h.bridge, "type", "bridge")
        _ip("addr", "add", f"{h.gateway}/24", "dev", h.bridge)
        _ip("link", "set", h.bridge, "up")
        for i in range(WORKERS + 1):
            ns, veth, peer = f"hn{tag}x{i}", f"hv{tag}x{i}", f"hp{tag}x{i}"
            _ip("netns", "add", ns)
            h.namespaces.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns)
            _ip("addr", "add", f"{net}.{i + 1}/24", "dev", peer, ns=ns)
            _ip("link", "set", peer, "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("link", "set", veth, "master", h.bridge)
            _ip("link", "set", veth, "up")
            h.addr.append(f"{net}.{i + 1}")
        yield h
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"multi-host test: cannot build the namespaces: {exc.stderr.strip()}")
    finally:
        for i, ns in enumerate(h.namespaces):  # the pair first: a dying namespace may keep it
            subprocess.run(["ip", "link", "del", f"hv{tag}x{i}"], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", h.bridge], capture_output=True, check=False)
        if opened:
            subprocess.run(["iptables", "-w", "-D", *rule], capture_output=True, check=False)


def _redis_server() -> str:
    from hopbus.coord.broker import find_redis_server

    return find_redis_server()


def test_a_run_across_hosts_with_their_own_addresses(hosts, tmp_path):
    server = hosts.run(
        0, _redis_server(), "--bind", hosts.addr[0], "--port", "6379", "--save", "",
        "--appendonly", "no", "--protected-mode", "no",
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    workers: list[subprocess.Popen] = []
    url = f"redis://{hosts.addr[0]}:6379/0"
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2)
        deadline, tick = time.monotonic() + 30, threading.Event()
        while True:  # redis-server starting in its namespace: poll until it answers
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert server.poll() is None, "redis-server exited in its namespace"
                assert time.monotonic() < deadline, "redis-server never answered"
                tick.wait(0.05)
        run = f"mh{os.getpid()}"
        hopbus = [sys.executable, "-m", "hopbus"]
        created = subprocess.run(
            [*hopbus, "create", "--run", run, "--redis", url, "-n", str(WORKERS),
             "--topology", "ring", "--iterations", "150", "--iter-time", "0.01"],
            capture_output=True, text=True, env=clean_env(), timeout=60, check=False,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        for i in range(1, WORKERS + 1):  # each in its own namespace, at its own address
            workers.append(
                hosts.run(
                    i,
                    *hopbus,
                    "worker",
                    "--run",
                    run,
                    "--redis",
                    url,
                    "--bind",
                    f"tcp://{hosts.addr[i]}:*",
                    "--timeout",
                    "60",
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=clean_env(),
                )
            )
        outs = [w.communicate(timeout=240) for w in workers]
        for w, (_, err) in zip(workers, outs, strict=True):
            assert w.returncode == 0, err
        keys = RunKeys(run)
        endpoints = {int(k): v.decode() for k, v in client.hgetall(keys.addr).items()}
        ids = sorted(endpoints)
        assert ids == list(range(WORKERS))  # joined by INCR: unique and contiguous
        hosts_seen = {e.split("//")[1].rsplit(":", 1)[0] for e in endpoints.values()}
        assert hosts_seen == set(hosts.addr[1:])  # every worker advertised its own address
        results = {int(k): json.loads(v) for k, v in client.hgetall(keys.result).items()}
        assert sorted(results) == ids
        assert all(r["final_accuracy"] >= ACCURACY_BAR for r in results.values()), results
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        server.terminate()
        server.wait(timeout=10)
