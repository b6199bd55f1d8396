"""A worker's outbox: one PUSH socket per peer it sends to.

One socket per peer, never one PUSH connected to many: PUSH round-robins among its peers, so a
shared socket would hand each update to one neighbour instead of all of them.

Sizing ``hwm``: the protocol bounds how many updates a worker can have outstanding towards one
neighbour (at most the receiver's store slots, by Table 1; acks are one per iteration and just
as bounded), so the runtime passes that plus a small slack (``inbox.hwm_for``). While the peer
lives and drains its inbox, a full queue is rare and brief. A peer that died never drains, and
what it had not read still counts against the mark, so a sender can meet a full queue right
after a neighbour's death: ``offer`` waits a bounded slice and says which peers are still full,
so the caller can look at their heartbeats in between (runtime/node.py: ``Node.send``) rather
than block for the whole timeout. ``send`` waits up to ``send_timeout_s`` and then raises
``TransportError``, never a silent drop (PUSH never drops).

CURVE (``curve``): each socket connects as the run's client and checks that the peer holds the
run's server key, so a send reaches only an inbox of the run, encrypted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

import zmq

from hopbus.transport.curve import CurveKeys
from hopbus.transport.errors import TransportError

__all__ = ["Outbox", "TransportError"]


COPY_BYTES = 1 << 16
_MORE = int(zmq.SNDMORE | zmq.DONTWAIT)  # ints: enum arithmetic per frame costs a microsecond
_LAST = int(zmq.DONTWAIT)
"""Frames smaller than this are copied rather than sent by reference (pyzmq's own threshold)."""


class Outbox:
    """PUSH sockets to ``endpoints`` (peer id -> address), connected now: ZeroMQ queues what is
    sent before a peer is up and delivers it when it comes.

    Used from one thread (ZeroMQ sockets are not thread-safe). ``curve``: connect with the
    run's CURVE client keys (the peers must be CURVE inboxes of the same key set).
    """

    def __init__(
        self,
        ctx: zmq.Context,
        endpoints: Mapping[int, str],
        *,
        hwm: int,
        send_timeout_s: float,
        curve: CurveKeys | None = None,
    ) -> None:
        self.endpoints: dict[int, str] = {}
        self.curve = curve is not None
        self._ctx, self._hwm, self._curve = ctx, hwm, curve
        self._timeout_s = max(0.0, send_timeout_s)
        self._socks: dict[int, zmq.Socket] = {}
        try:
            for peer, endpoint in endpoints.items():
                self._connect(peer, endpoint)
        except BaseException:
            self.close(0)
            raise

    def _connect(self, peer: int, endpoint: str) -> None:
        sock = self._ctx.socket(zmq.PUSH)
        self._socks[peer] = sock
        self.endpoints[peer] = endpoint
        sock.setsockopt(zmq.SNDHWM, self._hwm)
        if self._curve is not None:
            sock.setsockopt(zmq.CURVE_SERVERKEY, self._curve.server_public)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, self._curve.client_public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, self._curve.client_secret)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError as exc:
            raise TransportError(
                f"peer {peer}: cannot connect to {endpoint}: {exc.strerror}"
            ) from None

    def replace(self, peer: int, endpoint: str) -> None:
        """Point ``peer``'s socket at ``endpoint`` (a replacement of a dead peer, started
        elsewhere): what was queued for the old process is dropped, not delivered."""
        old = self._socks.pop(peer, None)
        if old is not None:
            old.close(linger=0)
        self._connect(peer, endpoint)

    def send(self, to: Iterable[int], frames: list) -> None:
        """Send the same message to every peer in ``to``, waiting up to ``send_timeout_s`` for
        full queues; ``TransportError`` names a peer still full then (the others have it).

        Buffers are wrapped in ``zmq.Frame`` once and shared by all peers (libzmq reference
        counts them), so a snapshot is never copied, whatever the fan-out; frames under
        ``COPY_BYTES`` (the header, a small model's tensors) are copied, which is cheaper than
        tracking them. The buffers must not be written to afterwards: libzmq reads them later,
        from its I/O thread.
        """
        full = self.offer(to, frames, self._timeout_s)
        if full:
            raise TransportError(
                f"peer {full[0]}: send to {self.endpoints[full[0]]} blocked past its timeout "
                f"({self.why_full()})"
            )

    def why_full(self) -> str:
        """What a queue that stays full may mean, for an error line."""
        keys = "; with --curve, does it hold the same key set?" if self.curve else ""
        return f"peer down or not draining its inbox{keys}"

    def offer(self, to: Iterable[int], frames: list, wait_s: float = 0.0) -> list[int]:
        """Send to every peer in ``to`` whose queue has room; wait up to ``wait_s`` (all of the
        full ones at once) for room in the others. Returns the peers still full, which were not
        sent the message. ``wait_s=0``: for peers the protocol does not bound yet (a
        replacement still joining), whose queue may fill if they die."""
        parts = self._frames(frames)
        full = [peer for peer in to if not self._put(peer, parts)]
        if not full or wait_s <= 0:
            return full
        deadline = time.monotonic() + wait_s
        poller = zmq.Poller()
        for peer in full:
            poller.register(self._socks[peer], zmq.POLLOUT)
        while full:
            left_ms = (deadline - time.monotonic()) * 1000
            if left_ms <= 0:
                break
            room = dict(poller.poll(max(1, round(left_ms))))
            for peer in [p for p in full if self._socks[p] in room]:
                if self._put(peer, parts):
                    full.remove(peer)
                    poller.unregister(self._socks[peer])
        return full

    def _put(self, peer: int, parts: list[zmq.Frame]) -> bool:
        """Queue ``parts`` for ``peer`` unless its queue is at the mark (False). Frame by frame
        with int flags: pyzmq's send_multipart does the same with enum arithmetic and type
        checks per frame, 3x the CPU for a small update. ZeroMQ queues a multipart message
        whole or not at all: only its first frame can meet a full queue."""
        send = self._sock(peer).send
        try:
            send(parts[0], _MORE if len(parts) > 1 else _LAST, copy=False)
        except zmq.Again:
            return False
        for i in range(1, len(parts) - 1):
            send(parts[i], _MORE, copy=False)
        if len(parts) > 1:
            send(parts[-1], _LAST, copy=False)
        return True

    @staticmethod
    def _frames(frames: list) -> list[zmq.Frame]:
        """One ``zmq.Frame`` per buffer, shared by every peer: a large buffer by reference
        (zero-copy), a small one copied into its frame, which costs less than the reference
        tracking zero-copy needs (half the CPU of a small model's send)."""
        return [
            f if isinstance(f, zmq.Frame) else zmq.Frame(f, copy=memoryview(f).nbytes < COPY_BYTES)
            for f in frames
        ]

    def _sock(self, peer: int) -> zmq.Socket:
        sock = self._socks.get(peer)
        if sock is None:
            raise TransportError(f"peer {peer}: no endpoint known")
        return sock

    def close(self, linger_s: float = 1.0) -> None:
        """Close every socket, letting queued messages drain for up to ``linger_s``."""
        linger_ms = max(0, round(linger_s * 1000))
        for sock in self._socks.values():
            sock.close(linger=linger_ms)

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
