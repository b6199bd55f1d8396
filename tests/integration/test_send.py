"""A send that meets a full queue waits like every other wait: it looks at the peer's heartbeat
every LOOK_S, against a real redis-server and a real socket with nobody draining it.

A peer that died never drains what it had not read, so right after a neighbour's death a send
can find its queue full (fault: a worker killed while its sender's queue held unread updates).
The sender must notice the death within a look, not block until --timeout.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator

import pytest

from hopbus.coord.control import RunControl
from hopbus.coord.keys import RunKeys
from hopbus.errors import RunFailure
from hopbus.runtime.node import LOOK_S, Node
from hopbus.transport import Outbox, encode_ack

TIMEOUT_S = 30.0  # --timeout: a send that blocked until it would take this long
PEER = 3


class GoesOn(Node):
    """A node with spare capacity (as a backup-mode worker): it goes on without the dead."""

    def _lose(self, dead, what) -> bool:
        self.lost = list(dead)
        return True


def _nobody() -> str:
    with socket.socket() as s:  # a port with nobody behind it: the peer's inbox is gone
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def node_for(redis_url, redis_client, ctx) -> Iterator:
    made: list[Node] = []

    def make(cls: type[Node] = Node, timeout: float = TIMEOUT_S) -> Node:
        """Node 0 of a fresh run whose queue to PEER is already full (the mark is 1)."""
        keys = RunKeys(f"send{os.getpid()}-{uuid.uuid4().hex[:12]}")
        node = cls(keys.run, 0, redis_url, client=redis_client, timeout=timeout)
        node.control = RunControl(redis_client, keys, 0)
        node.outbox = Outbox(ctx, {PEER: _nobody()}, hwm=1, send_timeout_s=timeout)
        assert node.send([PEER], encode_ack(keys.run, 0, 0)) == []  # queued: now at the mark
        made.append(node)
        return node

    yield make
    for node in made:
        assert node.outbox is not None
        node.outbox.close(linger_s=0)


def test_a_send_to_a_dead_peers_full_queue_stops_within_a_look(node_for, redis_client):
    node = node_for()  # no heartbeat key for PEER: it died
    t0 = time.monotonic()
    said = f"worker 0 waited for room in its queue from worker {PEER}, whose heartbeat"
    with pytest.raises(RunFailure, match=said):
        node.send([PEER], encode_ack(node.keys.run, 0, 1))
    assert time.monotonic() - t0 < TIMEOUT_S / 2  # it looked; it did not wait out --timeout
    assert redis_client.get(node.keys.stop) == f"worker {PEER} died (heartbeat gone)".encode()


def test_with_spare_capacity_the_send_goes_on_without_the_dead_peer(node_for, redis_client):
    node = node_for(GoesOn)
    t0 = time.monotonic()
    assert node.send([PEER], encode_ack(node.keys.run, 0, 1)) == [PEER]  # given up, not sent
    assert time.monotonic() - t0 < TIMEOUT_S / 2
    assert node.lost == [PEER]
    assert redis_client.get(node.keys.stop) is None


def test_a_live_peer_that_does_not_drain_is_waited_for_until_the_timeout(node_for, redis_client):
    node = node_for(GoesOn, timeout=3 * LOOK_S)
    redis_client.set(node.keys.hb(PEER), "1", px=60_000)  # alive, but not reading
    t0 = time.monotonic()
    with pytest.raises(RunFailure, match=f"send to worker {PEER} at .* stayed blocked") as info:
        node.send([PEER], encode_ack(node.keys.run, 0, 1))
    assert time.monotonic() - t0 >= 3 * LOOK_S
    assert "heartbeat alive" in str(info.value) and "\n" not in str(info.value)
    assert not hasattr(node, "lost")


def test_an_offer_waits_for_room_at_most_its_slice(ctx):
    out = Outbox(ctx, {PEER: _nobody()}, hwm=1, send_timeout_s=TIMEOUT_S)
    try:
        assert out.offer([PEER], encode_ack("r", 0, 0), 0.05) == []
        t0 = time.monotonic()
        assert out.offer([PEER], encode_ack("r", 0, 1), 0.2) == [PEER]
        assert time.monotonic() - t0 >= 0.2
    finally:
        out.close(linger_s=0)
