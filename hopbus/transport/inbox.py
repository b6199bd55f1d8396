"""A worker's inbox: one PULL socket drained by a background thread.

The thread receives zero-copy, validates, counts drops and hands each valid message to the
owner's callback, so a worker's Compute never waits on the network and a peer's bad frame is
never fatal. Every in-neighbour's PUSH connects here; ZeroMQ fair-queues among them.

Sizing (see ``hwm_for``): ZeroMQ's high-water mark is per connected peer, so ``hwm`` bounds
each in-neighbour's queue, not the inbox's total. The protocol never lets a sender have more
updates outstanding towards one receiver than the receiver's store has slots (Table 1), so with
``hwm`` at least that (plus ACKs and slack) the mark is never reached under correct operation
and no valid update waits.

Emulated slow links (``--slowdown link:...`` or ``machines:...``): given ``delay``, the
receiver thread holds each valid message for ``delay(src)`` seconds before handing it over, in
arrival order per sender, so the callback still runs on this one thread only.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable

import zmq

from hopbus.transport.codec import DROP_REASONS, FrameError, Message, Validator
from hopbus.transport.errors import TransportError

POLL_MS = 100  # how long close() may wait for the receiver thread to notice
DRAIN_BATCH = 64  # messages taken per wake-up before checking for close() again


def hwm_for(outstanding: int, *, acks: bool = False, slack: int = 2) -> int:
    """A high-water mark no correct run reaches on one connection: the most updates a peer can
    have outstanding towards a receiver (the receiver's store slots, from Table 1), as many ACKs
    again in notify-ack mode, plus slack for the message in flight."""
    return (outstanding + slack) * (2 if acks else 1)


class Inbox:
    """Binds a PULL socket at ``bind`` now; ``start()`` begins delivering to ``on_message``.

    ``on_message`` runs on the receiver thread and does its own locking. If it raises, that is
    a bug in the owner: the exception is kept in ``error`` and the thread stops, so the owner can
    re-raise it (``check()``) rather than have it vanish in a thread.

    ``delay(src)``: seconds a message from ``src`` is held before delivery (emulated link
    latency); None or 0 delivers at once.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        bind: str,
        validator: Validator,
        on_message: Callable[[Message], None],
        *,
        hwm: int,
        delay: Callable[[int], float] | None = None,
    ) -> None:
        self.validator = validator
        self._on_message = on_message
        self._delay = delay
        self._held: list[tuple[float, int, Message]] = []  # (due, arrival order, message)
        self._order = itertools.count()
        self._drops = dict.fromkeys(DROP_REASONS, 0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.received = 0
        self.error: BaseException | None = None
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, hwm)
        # libzmq checks each frame against this before allocating it and disconnects the peer
        # that exceeds it: the largest frame a valid message has (header bound or biggest tensor)
        sock.setsockopt(zmq.MAXMSGSIZE, validator.max_frame_bytes)
        try:
            sock.bind(bind)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise TransportError(f"inbox: cannot bind {bind}: {exc.strerror}") from None
        self._sock = sock
        self.endpoint: str = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port: int = int(self.endpoint.rsplit(":", 1)[1])

    def start(self) -> None:
        """Launch the receiver thread (a daemon: it never keeps a process alive)."""
        if self._thread is not None:
            raise RuntimeError("inbox already started")
        self._thread = threading.Thread(
            target=self._run, name=f"hopbus-inbox-{self.port}", daemon=True
        )
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def drops(self) -> dict[str, int]:
        """Dropped messages so far, per reason in ``DROP_REASONS``."""
        with self._lock:
            return dict(self._drops)

    def check(self) -> None:
        """Re-raise, in the owner's thread, what stopped the receiver thread, if anything did."""
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Stop the thread (within about ``POLL_MS``) and close the socket, dropping anything
        still queued."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._sock.close(linger=0)

    def __enter__(self) -> Inbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        sock = self._sock
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if poller.poll(self._poll_ms()):
                    for _ in range(DRAIN_BATCH):
                        if not self._receive_one(sock):
                            break
                self._deliver_due()
        except zmq.ContextTerminated:
            sock.close(linger=0)  # the owner is tearing down: let ctx.term() finish
        except BaseException as exc:
            self.error = exc

    def _receive_one(self, sock: zmq.Socket) -> bool:
        """Receive and handle one message if one is waiting. Its frames die with this call
        (or, on an emulated slow link, when it is delivered), so the inbox never holds a
        snapshot the owner has let go of."""
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        self._handle(frames)
        return True

    def _handle(self, frames: list[zmq.Frame]) -> None:
        try:
            msg = self.validator.decode(frames)
        except FrameError as exc:
            with self._lock:
                self._drops[exc.reason] += 1
            return
        self.received += 1
        hold = self._delay(msg.src) if self._delay is not None else 0.0
        if hold > 0:
            heapq.heappush(self._held, (time.monotonic() + hold, next(self._order), msg))
        else:
            self._on_message(msg)

    def _poll_ms(self) -> int:
        """Wait for a message no longer than until the first held one is due."""
        if not self._held:
            return POLL_MS
        wait = self._held[0][0] - time.monotonic()
        return max(0, min(POLL_MS, int(wait * 1000) + 1))

    def _deliver_due(self) -> None:
        now = time.monotonic()
        while self._held and self._held[0][0] <= now:
            self._on_message(heapq.heappop(self._held)[2])
