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
receiver thread holds each valid message for ``delay(message)`` seconds before handing it over
(``link_hold``: its link's latency, its bytes over the link's bandwidth, and with
``--slowdown-scope iteration`` the sender's slowdown in the message's iteration), delivering
held messages in the order they fall due, so the callback still runs on this one thread only.

CURVE (``curve``, ``--curve``): the socket serves with the run's server keypair and a ZAP
authenticator admits only the run's client key, so a peer without the run's keys never
completes a handshake and none of its frames is ever received. Such refusals are counted under
``UNAUTHENTICATED``, once per refused handshake (its frames never arrive to be counted).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, ClassVar

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from hopbus.transport.codec import DROP_REASONS, FrameError, Message, Validator
from hopbus.transport.curve import CurveKeys
from hopbus.transport.errors import TransportError

if TYPE_CHECKING:
    from hopbus.heterogeneity import SlowdownModel, SlowdownScope
from hopbus.transport.outbox import COPY_BYTES

_NOBLOCK = int(zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)
_POLLIN = int(zmq.POLLIN)
POLL_MS = 100  # how long close() may wait for the receiver thread to notice
DRAIN_BATCH = 64  # messages taken per wake-up before checking for close() again
UNAUTHENTICATED = "unauthenticated"
"""A CURVE inbox's extra drop reason: a connection refused at its handshake (no keys, or not
the run's). Counted per refused handshake, not per frame."""
CURVE_FRAME_OVERHEAD = 64
"""Bytes CURVE adds to a frame on the wire, rounded up: a MESSAGE command is its name (8),
a nonce (8), a flags byte and the 16-byte MAC around the payload (33 in libzmq 4.3)."""
REFUSED_EVENTS = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
"""Monitor events of a refused peer: ZAP said no (a wrong client key), or the handshake
itself failed (a peer without CURVE, or one that does not know the server key)."""


def payload_bytes(msg: Message) -> int:
    """The bytes of the parameters a message carries (0 for an ACK and the other tensorless
    kinds): what a link with a bandwidth charges it."""
    return 0 if msg.payload is None else sum(int(a.nbytes) for a in msg.payload.values())


def link_hold(
    het: SlowdownModel,
    receiver: int,
    scope: SlowdownScope,
    message_bytes: int | None = None,
) -> Callable[[Message], float] | None:
    """How long ``receiver``'s inbox holds each message: ``heterogeneity.message_delay``, the
    simulator's rule, for the message's sender, iteration and bytes (``message_bytes`` instead
    of the real ones for a message with parameters, when given: ``--message-bytes``). None
    where the run has no emulated link."""
    if not het.has_link_delays:
        return None
    from hopbus.heterogeneity import message_delay

    def hold(msg: Message) -> float:
        nbytes = payload_bytes(msg)
        if nbytes and message_bytes is not None:
            nbytes = message_bytes
        return message_delay(het, msg.src, receiver, msg.iteration, nbytes, scope=scope)

    return hold


def hwm_for(outstanding: int, *, acks: bool = False, slack: int = 2) -> int:
    """A high-water mark no correct run reaches on one connection: the most updates a peer can
    have outstanding towards a receiver (the receiver's store slots, from Table 1), as many ACKs
    again in notify-ack mode, plus slack for the message in flight."""
    return (outstanding + slack) * (2 if acks else 1)


def _check_port(bind: str) -> None:
    """A TCP port beyond 65535, which libzmq would take modulo 65536 and bind elsewhere
    without a word (tcp://0.0.0.0:99999 bound port 34463), raised as a bind error; so too
    another transport than TCP (ipc://, inproc://): a worker's endpoint is a host and a port
    its peers connect to (an ipc:// bind left a worker hung, its socket never closed)."""
    if not bind.startswith("tcp://"):
        raise zmq.ZMQError(errno.EINVAL, "an inbox listens on tcp://HOST:PORT (port * = any)")
    port = bind.rsplit(":", 1)[-1]
    if port != "*" and not (port.isascii() and port.isdigit() and int(port) <= 65535):
        # -1 was taken too, as 65535
        raise zmq.ZMQError(errno.EINVAL, "no such TCP port (0..65535, or *)")


def probe_bind(bind: str) -> None:
    """TransportError, the line an inbox would raise, if ``bind`` cannot be bound now (a port
    another process holds, an address not on this host); else nothing stays bound. What a
    process looks at before it takes a worker id from the run: an id taken by a process that
    then cannot bind is lost to the run."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        _check_port(bind)
        sock.bind(bind)
    except zmq.ZMQError as exc:
        raise TransportError(f"inbox: cannot bind {bind}: {exc.strerror}") from None
    finally:
        sock.close()
        ctx.term()


class Inbox:
    """Binds a PULL socket at ``bind`` now; ``start()`` begins delivering to ``on_message``.

    ``on_message`` runs on the receiver thread and does its own locking. If it raises, that is
    a bug in the owner: the exception is kept in ``error`` and the thread stops, so the owner can
    re-raise it (``check()``) rather than have it vanish in a thread.

    ``delay(message)``: seconds a message is held before delivery (an emulated link:
    ``link_hold``); None or 0 delivers at once.

    ``curve``: serve with the run's CURVE keys and admit only its client key (see the module
    docstring); None is a plain socket that accepts any peer.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        bind: str,
        validator: Validator,
        on_message: Callable[[Message], None],
        *,
        hwm: int,
        delay: Callable[[Message], float] | None = None,
        curve: CurveKeys | None = None,
        inline: bool = False,
    ) -> None:
        if inline and (delay is not None or curve is not None):
            raise ValueError("an inline inbox holds no messages and serves no CURVE")
        self.inline = inline
        self.validator = validator
        # a small model's messages are received as bytes (copied), cheaper than zero-copy
        # frames; a large one's tensors by reference
        self._copy = validator.max_tensor_bytes < COPY_BYTES
        # a valid message has a header and one frame per tensor; more are not kept in memory
        self._most_frames = 1 + validator.max_tensors
        self._on_message = on_message
        self._delay = delay
        self._held: list[tuple[float, int, Message]] = []  # (due, arrival order, message)
        self.longest_hold = 0.0  # seconds: what a wait that timed out tells (Node.wait_for)
        self._order = itertools.count()
        reasons = (*DROP_REASONS, UNAUTHENTICATED) if curve is not None else DROP_REASONS
        self._drops = dict.fromkeys(reasons, 0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.received = 0
        self.error: BaseException | None = None
        self._ctx = ctx
        self._gate: _Gate | None = None
        self._domain = ""
        self._monitor: zmq.Socket | None = None
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, hwm)
        # libzmq checks each frame against this before allocating it and disconnects the peer
        # that exceeds it: the largest frame a valid message has (header bound or biggest tensor)
        # plus, with CURVE, what encryption adds to it on the wire (it checks the boxed frame)
        slack = CURVE_FRAME_OVERHEAD if curve is not None else 0
        sock.setsockopt(zmq.MAXMSGSIZE, validator.max_frame_bytes + slack)
        self._sock = sock
        # what pump polls: zmq_poll on a list kept here costs half of Socket.poll, which
        # builds a Poller every call; polling before each receive spares the exception that
        # a receive from an empty socket raises (3x the poll's CPU)
        self._waiting = [(sock, _POLLIN)]
        try:
            _check_port(bind)
            if curve is not None:
                self._serve_curve(curve)
            sock.bind(bind)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise TransportError(f"inbox: cannot bind {bind}: {exc.strerror}") from None
        self.endpoint: str = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.port: int = int(self.endpoint.rsplit(":", 1)[1])

    def start(self) -> None:
        """Launch the receiver thread (a daemon: it never keeps a process alive); an inline
        inbox has none: its owner calls ``pump``."""
        if self.inline:
            return
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
        still queued; a CURVE inbox also lets go of its context's authenticator."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._close_sockets()

    def _serve_curve(self, curve: CurveKeys) -> None:
        """Make the socket a CURVE server behind the context's ZAP authenticator, and watch
        its refused handshakes. Before bind: no peer may connect before the gate is up."""
        sock = self._sock
        self._gate, self._domain = _Gate.enter(self._ctx, curve.allowed_clients)
        sock.setsockopt(zmq.ZAP_DOMAIN, self._domain.encode())
        with contextlib.suppress(AttributeError, zmq.ZMQError):  # libzmq >= 4.3 (draft before)
            # without a ZAP handler (it died), refuse every peer rather than admit any
            sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.server_public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, curve.server_secret)
        self._monitor = sock.get_monitor_socket(REFUSED_EVENTS)

    def _close_sockets(self) -> None:
        if self._monitor is not None:
            if not self._sock.closed:
                with contextlib.suppress(zmq.ZMQError):
                    self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        self._sock.close(linger=0)
        if self._gate is not None:
            self._gate.leave(self._domain)
            self._gate = None

    def __enter__(self) -> Inbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        sock, monitor, gate = self._sock, self._monitor, self._gate
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        if monitor is not None:
            poller.register(monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(self._poll_ms()))
                if sock in ready:
                    for _ in range(DRAIN_BATCH):
                        if not self._receive_one(sock):
                            break
                if monitor is not None and monitor in ready:
                    self._count_refusals(monitor)
                if gate is not None and not gate.alive:
                    raise TransportError("inbox: the CURVE authenticator thread stopped")
                self._deliver_due()
        except zmq.ContextTerminated:
            if monitor is not None:
                monitor.close(linger=0)
            sock.close(linger=0)  # the owner is tearing down: let ctx.term() finish
        except BaseException as exc:
            self.error = exc

    def pump(self, timeout_s: float) -> None:
        """An inline inbox, on its owner's thread: wait up to ``timeout_s`` for a message,
        then receive, check and deliver every one waiting (up to DRAIN_BATCH)."""
        sock, waiting = self._sock, self._waiting
        if not zmq.zmq_poll(waiting, max(0, round(timeout_s * 1000))):
            return
        for _ in range(DRAIN_BATCH):
            if not self._receive_one(sock) or not zmq.zmq_poll(waiting, 0):
                return

    def _count_refusals(self, monitor: zmq.Socket) -> None:
        """Count the refused handshakes the monitor reports."""
        for _ in range(DRAIN_BATCH):
            try:
                event = recv_monitor_message(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event["event"] & REFUSED_EVENTS:
                with self._lock:
                    self._drops[UNAUTHENTICATED] += 1

    def _receive_one(self, sock: zmq.Socket) -> bool:
        """Receive and handle one message if one is waiting. Its frames die with this call
        (or, on an emulated slow link, when it is delivered), so the inbox never holds a
        snapshot the owner has let go of."""
        copy = self._copy
        try:
            frames = [sock.recv(_NOBLOCK, copy=copy)]
        except zmq.Again:
            return False
        most = self._most_frames
        while sock.get(_RCVMORE):  # recv_multipart's loop, without its enum conversions
            if len(frames) == most:  # more frames than any valid message: drain, keep none
                while sock.get(_RCVMORE):
                    sock.recv(_NOBLOCK, copy=False)
                with self._lock:
                    self._drops["bad_layout"] += 1
                return True
            frames.append(sock.recv(_NOBLOCK, copy=copy))
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
        hold = self._delay(msg) if self._delay is not None else 0.0
        if hold > 0:
            self.longest_hold = max(self.longest_hold, hold)
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


class _Allowed:
    """The ZAP credentials check of one inbox: is the client's public key one of the run's?"""

    def __init__(self, keys: Collection[bytes]) -> None:
        self._keys = frozenset(keys)

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self._keys


class _Gate:
    """The ZAP authenticator of one context, shared by its CURVE inboxes.

    ZeroMQ takes one ZAP handler per context (it binds a fixed inproc address), so the first
    CURVE inbox of a context starts it and the last one to close stops it; each inbox checks
    its clients under a ZAP domain of its own, so inboxes of different runs sharing a context
    each admit only their own run's key."""

    _open: ClassVar[dict[zmq.Context, _Gate]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()
    _names: ClassVar[itertools.count] = itertools.count()

    def __init__(self, ctx: zmq.Context) -> None:
        self.ctx = ctx
        self.auth = ThreadAuthenticator(ctx)
        self.domains: set[str] = set()

    @classmethod
    def enter(cls, ctx: zmq.Context, allowed: Collection[bytes]) -> tuple[_Gate, str]:
        """The context's gate (started if new) and a new ZAP domain on it admitting
        ``allowed``."""
        with cls._lock:
            gate = cls._open.get(ctx)
            if gate is None:
                gate = cls(ctx)
                gate.auth.start()
                cls._open[ctx] = gate
            domain = f"hopbus-{next(cls._names)}"
            gate.auth.configure_curve_callback(domain, _Allowed(allowed))
            gate.domains.add(domain)
            return gate, domain

    def leave(self, domain: str) -> None:
        """Forget ``domain``; stop the authenticator once no inbox of the context uses it."""
        with self._lock:
            # the domain's check stays with the authenticator (it may be answering a request
            # of it right now); its socket is closed, so no new request can name it
            self.domains.discard(domain)
            if not self.domains and self._open.get(self.ctx) is self:
                del self._open[self.ctx]
                with contextlib.suppress(zmq.ZMQError):  # the context is already gone
                    self.auth.stop()

    @property
    def alive(self) -> bool:
        return self.auth.is_alive()
