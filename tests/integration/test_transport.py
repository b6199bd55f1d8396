"""Inboxes and outboxes over real TCP sockets on 127.0.0.1.

Every wait is on a condition with a deadline, never a fixed sleep: the deadline only decides how
long a broken build takes to fail.
"""

from __future__ import annotations

import random
import socket
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq
from cluster import Collector, wait_for
from zmq.utils.monitor import recv_monitor_message

from hopbus.transport import (
    DROP_REASONS,
    KIND_ACK,
    KIND_UPDATE,
    Inbox,
    Message,
    Outbox,
    Params,
    TransportError,
    Validator,
    encode_ack,
    encode_update,
    hwm_for,
    layout_of,
)

RUN = "it-run"
N = 4
DEADLINE_S = 20.0
LOCAL = "tcp://127.0.0.1:*"


def snapshot(iteration: int = 0) -> Params:
    return {
        "w": np.full((64, 32), iteration, dtype=np.float32),
        "b": np.arange(32, dtype=np.float64) + iteration,
    }


LAYOUT = layout_of(snapshot())


def inbox_for(
    ctx: zmq.Context,
    me: int,
    update_from=(),
    ack_from=(),
    collector: Collector | None = None,
    layout=LAYOUT,
    hwm: int = 1000,
    delay=None,
) -> tuple[Inbox, Collector]:
    collector = collector or Collector()
    v = Validator(RUN, N, update_from, ack_from, layout, max_iteration=10_000)
    inbox = Inbox(ctx, LOCAL, v, collector, hwm=hwm, delay=delay)
    inbox.start()
    return inbox, collector


def test_updates_go_forward_and_acks_come_back(ctx):
    # worker 0 -> worker 1 (update), worker 1 -> worker 0 (ack), as in notify-ack
    in0, got0 = inbox_for(ctx, 0, ack_from=[1])
    in1, got1 = inbox_for(ctx, 1, update_from=[0])
    out0 = Outbox(ctx, {1: in1.endpoint}, hwm=hwm_for(2), send_timeout_s=5)
    out1 = Outbox(ctx, {0: in0.endpoint}, hwm=hwm_for(2), send_timeout_s=5)
    try:
        for k in range(5):
            out0.send([1], encode_update(RUN, 0, k, snapshot(k)))
            got1.wait_for(lambda ms, k=k: len(ms) == k + 1)
            msg = got1.messages[-1]
            assert (msg.kind, msg.src, msg.iteration) == (KIND_UPDATE, 0, k)
            np.testing.assert_array_equal(msg.payload["w"], snapshot(k)["w"])
            out1.send([0], encode_ack(RUN, 1, k))
            got0.wait_for(lambda ms, k=k: len(ms) == k + 1)
            assert got0.messages[-1] == Message(KIND_ACK, 1, k, None)
        assert in0.drops() == dict.fromkeys(DROP_REASONS, 0) == in1.drops()
        assert (in0.received, in1.received) == (5, 5)
    finally:
        out0.close()
        out1.close()
        in0.close()
        in1.close()


class Stamped(Collector):
    """A collector that also notes when each message was handed over, and on which thread."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []
        self.threads: set[int] = set()

    def __call__(self, msg: Message) -> None:
        self.at.append(time.monotonic())
        self.threads.add(threading.get_ident())
        super().__call__(msg)


def test_a_slow_link_holds_its_messages_and_keeps_their_order(ctx):
    # emulated link latency: worker 1's messages are held 1 s, worker 2's go straight through
    got = Stamped()
    inbox, _ = inbox_for(ctx, 3, update_from=[1, 2], collector=got,
                         delay=lambda msg: 1.0 if msg.src == 1 else 0.0)  # fmt: skip
    slow = Outbox(ctx, {3: inbox.endpoint}, hwm=10, send_timeout_s=5)
    fast = Outbox(ctx, {3: inbox.endpoint}, hwm=10, send_timeout_s=5)
    try:
        sent = time.monotonic()
        for k in range(3):
            slow.send([3], encode_update(RUN, 1, k, snapshot(k)))
        wait_for(lambda: inbox.received == 3, DEADLINE_S, "3 arrivals")  # and held
        fast.send([3], encode_update(RUN, 2, 0, snapshot(0)))
        got.wait_for(lambda ms: len(ms) == 4)
        order = [(m.src, m.iteration) for m in got.messages]
        assert order == [(2, 0), (1, 0), (1, 1), (1, 2)]  # the fast one overtook, FIFO per link
        assert all(t - sent >= 1.0 for t in got.at[1:])  # held at least the link's delay
        assert len(got.threads) == 1  # delivered on the receiver thread only
        assert inbox.received == 4
    finally:
        slow.close()
        fast.close()
        inbox.close()


def test_one_send_reaches_every_peer_once(ctx):
    boxes = [inbox_for(ctx, me, update_from=[0]) for me in (1, 2, 3)]
    out = Outbox(ctx, {me: box.endpoint for me, (box, _) in zip((1, 2, 3), boxes, strict=True)},
                 hwm=4, send_timeout_s=5)  # fmt: skip
    try:
        for k in range(3):
            out.send([1, 2, 3], encode_update(RUN, 0, k, snapshot(k)))
        for _, got in boxes:
            got.wait_for(lambda ms: len(ms) == 3)
            assert [m.iteration for m in got.messages] == [0, 1, 2]
    finally:
        out.close()
        for box, _ in boxes:
            box.close()


def _bad(kind: str, rng: random.Random) -> tuple[str, list]:
    """One bad message of ``kind`` and the reason it must be counted under."""
    good = encode_update(RUN, 1, 3, snapshot(3))
    if kind == "wrong_run":
        return kind, encode_update("other-run", 1, 3, snapshot(3))
    if kind == "unknown_sender":
        return kind, encode_update(RUN, N + rng.randrange(5), 3, snapshot(3))
    if kind == "not_neighbour":
        return kind, encode_update(RUN, 0, 3, snapshot(3))  # worker 0 is not an in-neighbour
    if kind == "wrong_length":
        return kind, [good[0], bytes(good[1])[: -rng.randrange(1, 9)], good[2]]
    if kind == "garbage":
        return kind, [bytes([0xC1]) + rng.randbytes(rng.randrange(0, 40))]
    if kind == "bad_iteration":
        return kind, encode_update(RUN, 1, 10_001, snapshot(3))
    if kind == "bad_layout":
        return kind, good[:2]
    if kind == "wrong_version":
        h = msgpack.unpackb(good[0])
        return kind, [msgpack.packb({**h, "v": 9}), *good[1:]]
    raise AssertionError(kind)


BAD_KINDS = (
    "wrong_run",
    "unknown_sender",
    "wrong_length",
    "garbage",
    "not_neighbour",
    "bad_iteration",
    "bad_layout",
    "wrong_version",
)


def _mixed(rng: random.Random, bad: int, valid: int) -> tuple[list[list], dict[str, int]]:
    """``bad`` frames of every bad kind and ``valid`` updates from worker 1, shuffled, and the
    drops the bad ones must be counted as."""
    mix: list[tuple[str | None, list]] = [
        _bad(BAD_KINDS[i % len(BAD_KINDS)], rng) for i in range(bad)
    ]
    mix += [(None, encode_update(RUN, 1, k, snapshot(k))) for k in range(valid)]
    rng.shuffle(mix)
    expected = dict.fromkeys(DROP_REASONS, 0)
    for reason, _ in mix:
        if reason is not None:
            expected[reason] += 1
    return [frames for _, frames in mix], expected


def test_bad_frames_are_counted_and_never_cost_a_valid_update(ctx):
    inbox, got = inbox_for(ctx, 2, update_from=[1])
    mix, expected = _mixed(random.Random(7), 1000, 200)

    # one raw socket, so bad and valid frames are truly interleaved on one connection
    hostile = ctx.socket(zmq.PUSH)
    hostile.connect(inbox.endpoint)
    try:
        for frames in mix:
            hostile.send_multipart(frames, copy=False)
        got.wait_for(lambda ms: len(ms) == 200)
        wait_for(lambda: sum(inbox.drops().values()) == 1000, DEADLINE_S, "1000 drops")
        assert inbox.drops() == expected
        assert sorted(m.iteration for m in got.messages) == list(range(200))
        for m in got.messages:
            np.testing.assert_array_equal(m.payload["b"], snapshot(m.iteration)["b"])
        assert inbox.received == 200 and inbox.error is None and inbox.running
    finally:
        hostile.close(linger=0)
        inbox.close()


def test_an_inline_inbox_receives_checks_and_delivers_on_the_callers_thread(ctx):
    # the small-model path (Node._open): no receiver thread, the owner pumps while it waits
    got = Stamped()
    v = Validator(RUN, N, [1], [], LAYOUT, max_iteration=10_000)
    inbox = Inbox(ctx, LOCAL, v, got, hwm=1000, inline=True)
    inbox.start()
    assert not inbox.running  # nothing was started
    mix, expected = _mixed(random.Random(11), 300, 50)
    hostile = ctx.socket(zmq.PUSH)
    hostile.connect(inbox.endpoint)
    try:
        for frames in mix:
            hostile.send_multipart(frames, copy=False)
        deadline = time.monotonic() + DEADLINE_S
        while len(got.messages) < 50 or sum(inbox.drops().values()) < 300:
            assert time.monotonic() < deadline, "the pumped inbox did not take every frame"
            inbox.pump(0.1)
        assert inbox.drops() == expected
        assert sorted(m.iteration for m in got.messages) == list(range(50))
        for m in got.messages:
            np.testing.assert_array_equal(m.payload["w"], snapshot(m.iteration)["w"])
        assert got.threads == {threading.get_ident()}  # delivered here, by pump
    finally:
        hostile.close(linger=0)
        inbox.close()


@pytest.mark.parametrize("inline", [False, True])
def test_a_message_of_a_million_frames_is_one_drop_and_is_never_kept(ctx, inline):
    # each frame is tiny (under MAXMSGSIZE) and the message counts once against RCVHWM: only
    # the receiver can refuse it, after the frames a valid message has
    got = Collector()
    v = Validator(RUN, N, [1], [], LAYOUT, max_iteration=10_000)
    inbox = Inbox(ctx, LOCAL, v, got, hwm=1000, inline=inline)
    inbox.start()
    hostile = ctx.socket(zmq.PUSH)
    hostile.connect(inbox.endpoint)
    try:
        hostile.send_multipart([b"x"] * 1_000_000)
        hostile.send_multipart(encode_update(RUN, 1, 0, snapshot(0)), copy=False)
        deadline = time.monotonic() + DEADLINE_S
        while not got.messages:
            assert time.monotonic() < deadline, "the valid update never arrived"
            if inline:
                inbox.pump(0.1)
            else:
                got.wait_for(lambda ms: len(ms) == 1)
        assert inbox.drops()["bad_layout"] == 1
        assert sum(inbox.drops().values()) == 1
        assert got.messages[0].iteration == 0
    finally:
        hostile.close(linger=0)
        inbox.close()


def test_an_inline_inbox_refuses_a_held_link_or_curve(ctx):
    v = Validator(RUN, N, [1], [], LAYOUT, max_iteration=10_000)
    with pytest.raises(ValueError, match="inline"):
        Inbox(ctx, LOCAL, v, Collector(), hwm=10, delay=lambda msg: 1.0, inline=True)


def test_a_frame_beyond_maxmsgsize_never_reaches_the_callback(ctx):
    inbox, got = inbox_for(ctx, 2, update_from=[1])
    hostile = ctx.socket(zmq.PUSH)
    monitor = hostile.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
    out = Outbox(ctx, {2: inbox.endpoint}, hwm=4, send_timeout_s=5)
    try:
        hostile.connect(inbox.endpoint)
        good = encode_update(RUN, 1, 5, snapshot(5))
        # a valid header, then a tensor frame one byte past the largest a valid message has
        too_big = b"\x00" * (inbox.validator.max_frame_bytes + 1)
        hostile.send_multipart([good[0], too_big, good[2]], copy=False)
        assert monitor.poll(DEADLINE_S * 1000), "no monitor event"
        events = []
        while not events or events[-1] != zmq.EVENT_DISCONNECTED:
            assert monitor.poll(DEADLINE_S * 1000), "the inbox never cut the oversized sender off"
            events.append(recv_monitor_message(monitor)["event"])
        out.send([2], good)
        got.wait_for(lambda ms: len(ms) == 1)
        assert inbox.received == 1 and got.messages[0].iteration == 5
        assert sum(inbox.drops().values()) == 0  # rejected by libzmq, before any decoding
    finally:
        hostile.disable_monitor()
        monitor.close(linger=0)
        hostile.close(linger=0)
        out.close()
        inbox.close()


def test_a_callback_exception_stops_the_inbox_and_is_kept_for_the_owner(ctx):
    failed = threading.Event()

    def on_message(msg: Message) -> None:
        failed.set()
        raise RuntimeError("bug in the owner")

    v = Validator(RUN, N, [1], [], LAYOUT, 100)
    inbox = Inbox(ctx, LOCAL, v, on_message, hwm=4)
    inbox.start()
    out = Outbox(ctx, {2: inbox.endpoint}, hwm=4, send_timeout_s=5)
    try:
        out.send([2], encode_update(RUN, 1, 0, snapshot()))
        assert failed.wait(DEADLINE_S)
        wait_for(lambda: not inbox.running, DEADLINE_S, "the inbox thread to exit")
        with pytest.raises(RuntimeError, match="bug in the owner"):
            inbox.check()
    finally:
        out.close()
        inbox.close()


def test_close_returns_promptly_and_leaves_no_thread(ctx):
    before = set(threading.enumerate())
    inboxes = [inbox_for(ctx, me, update_from=[0])[0] for me in (1, 2, 3)]
    assert all(box.running for box in inboxes)
    closer = threading.Thread(target=lambda: [box.close() for box in inboxes])
    closer.start()
    closer.join(DEADLINE_S)
    assert not closer.is_alive(), "close() hung"
    assert not any(box.running for box in inboxes)
    assert set(threading.enumerate()) <= before


def test_wildcard_host_reports_the_port_it_bound(ctx):
    v = Validator(RUN, N, [], [], LAYOUT, 10)
    with Inbox(ctx, "tcp://*:*", v, Collector(), hwm=4) as inbox:
        assert inbox.endpoint == f"tcp://0.0.0.0:{inbox.port}" and inbox.port > 0


def test_binding_a_taken_port_is_a_one_line_transport_error(ctx):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        v = Validator(RUN, N, [], [], LAYOUT, 10)
        with pytest.raises(TransportError, match=f"inbox: cannot bind tcp://127.0.0.1:{port}"):
            Inbox(ctx, f"tcp://127.0.0.1:{port}", v, Collector(), hwm=4)


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_beyond_65535_is_refused_not_wrapped(ctx, port):
    """libzmq would bind 99999 modulo 65536 (34463) without a word, and -1 as 65535."""
    v = Validator(RUN, N, [], [], LAYOUT, 10)
    with pytest.raises(TransportError, match="no such TCP port"):
        Inbox(ctx, f"tcp://127.0.0.1:{port}", v, Collector(), hwm=4)


@pytest.mark.parametrize("bind", ["ipc:///tmp/hopbus-inbox-test.sock", "inproc://x"])
def test_a_bind_of_another_transport_than_tcp_is_refused(ctx, bind):
    """Fault ``ipc_bind``: an ipc:// inbox bound, then its port read as a number: a ValueError
    that left the socket open and the worker hung in the context's term()."""
    v = Validator(RUN, N, [], [], LAYOUT, 10)
    with pytest.raises(TransportError, match=r"an inbox listens on tcp://HOST:PORT"):
        Inbox(ctx, bind, v, Collector(), hwm=4)


def test_a_send_blocked_past_its_timeout_names_the_peer(ctx):
    with socket.socket() as s:  # a port with nobody behind it
        s.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    out = Outbox(ctx, {3: endpoint}, hwm=1, send_timeout_s=0.05)
    try:
        with pytest.raises(TransportError, match=f"peer 3: send to {endpoint} blocked") as info:
            for k in range(100):  # ZeroMQ queues up to the mark, then blocks
                out.send([3], encode_ack(RUN, 0, k))
        assert "\n" not in str(info.value)
        with pytest.raises(TransportError, match="peer 9: no endpoint"):
            out.send([9], encode_ack(RUN, 0, 0))
    finally:
        out.close(linger_s=0)


def test_an_offer_to_a_full_queue_skips_the_peer_at_once_and_replace_reaches_the_new_one(ctx):
    """A replacement that died while joining must not block its senders (offer), and its
    successor at a new address gets what is sent from then on, not the old queue (replace)."""
    with socket.socket() as s:  # the dead joiner's port: nobody behind it
        s.bind(("127.0.0.1", 0))
        gone = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    out = Outbox(ctx, {3: gone}, hwm=2, send_timeout_s=30)  # a blocking send would take 30 s
    inbox, got = inbox_for(ctx, 3, update_from=[0])
    try:
        t0 = time.monotonic()
        skipped = [out.offer([3], encode_update(RUN, 0, k, snapshot(k))) for k in range(20)]
        assert time.monotonic() - t0 < 5  # never waited for the send timeout
        assert skipped[-1] == [3] and sum(map(len, skipped)) >= 20 - 4  # about the mark queued
        out.replace(3, inbox.endpoint)
        assert out.endpoints[3] == inbox.endpoint
        assert out.offer([3], encode_update(RUN, 0, 100, snapshot(100))) == []
        got.wait_for(lambda ms: len(ms) == 1)
        assert got.messages[0].iteration == 100  # nothing queued for the dead one came along
    finally:
        out.close(linger_s=0)
        inbox.close()
