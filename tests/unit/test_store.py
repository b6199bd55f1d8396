"""UpdateQ (Sec. 4.1) with rotating per-iteration slots (Sec. 6.1)."""

from hypothesis import given
from hypothesis import strategies as st

from hopbus.protocol.store import Mailbox, Outcome, UpdateStore


def test_enqueue_size_dequeue_by_iteration_and_sender():
    q = UpdateStore(4)
    for src, it in [(1, 0), (2, 0), (1, 1), (3, 0)]:
        assert q.enqueue(src, it, f"x{src}{it}") is Outcome.ACCEPTED
    assert q.size() == 4
    assert q.size(0) == 3 and q.size(1) == 1
    assert q.size(w_id=1) == 2 and q.size(0, 1) == 1 and q.size(2, 1) == 0
    assert q.dequeue(4, iteration=0) is None  # blocks in the paper; takes nothing here
    got = q.dequeue(2, iteration=0)
    assert [(u.src, u.payload) for u in got] == [(1, "x10"), (2, "x20")]  # first in, first out
    assert q.size(0) == 1 and q.held == 2


def test_dequeue_without_tags_is_fifo_across_iterations():
    q = UpdateStore(3)
    q.enqueue(5, 2)
    q.enqueue(6, 0)
    q.enqueue(7, 1)
    assert [u.src for u in q.dequeue(3)] == [5, 6, 7]


def test_stale_updates_are_dropped_and_counted():
    q = UpdateStore(2)
    q.enqueue(1, 0)
    q.enqueue(1, 1)
    q.advance(1)  # the worker is done with iteration 0
    assert q.stale_dropped == 1 and q.size() == 1
    assert q.enqueue(2, 0) is Outcome.STALE  # arrives late, never stored
    assert q.stale_dropped == 2


def test_slots_rotate_and_a_too_new_update_overflows():
    q = UpdateStore(2)  # max_ig = 1: iterations floor and floor + 1
    assert q.enqueue(1, 1) is Outcome.ACCEPTED
    assert q.enqueue(1, 2) is Outcome.OVERFLOW  # would need a third slot
    q.advance(1)
    assert q.enqueue(1, 2) is Outcome.ACCEPTED  # slot 0 reused for iteration 2
    assert q.size(2) == 1 and q.size(0) == 0 and q.overflow == 1


def test_duplicate_sender_iteration_is_dropped():
    q = UpdateStore(2)
    q.enqueue(1, 0, "a")
    assert q.enqueue(1, 0, "b") is Outcome.DUPLICATE
    assert q.dequeue(1, iteration=0)[0].payload == "a"


def test_supersede_keeps_only_each_senders_newest():
    q = UpdateStore(8, supersede=True)
    q.enqueue(1, 0)
    q.enqueue(1, 2)
    assert q.size(w_id=1) == 1 and q.newest_held(1) == 2 and q.stale_dropped == 1
    assert q.enqueue(1, 1) is Outcome.STALE  # older than what we already have
    q.dequeue(1, w_id=1)
    assert q.newest_held(1) is None and q.newest_taken[1] == 2
    assert q.enqueue(1, 2) is Outcome.DUPLICATE


def test_mailbox_acks_are_cumulative():
    box = Mailbox(UpdateStore(1))
    box.deliver_ack(3, 2)
    box.deliver_ack(3, 1)  # a late, older ACK changes nothing
    assert box.acks[3] == 2


@given(
    st.lists(st.tuples(st.integers(0, 4), st.integers(0, 12), st.booleans()), max_size=60),
    st.integers(1, 6),
)
def test_held_count_matches_contents_and_window(ops, slots):
    """Whatever arrives in whatever order, ``held`` is exactly what size() reports, every held
    update lies in [floor, floor + n_slots), and each arrival is counted exactly once."""
    q = UpdateStore(slots)
    floor = 0
    counted = 0
    for src, it, advance in ops:
        if advance:
            floor += 1
            q.advance(floor)
        out = q.enqueue(src, it)
        counted += 1
        assert q.size() == q.held == sum(q.size(i) for i in range(floor, floor + slots))
        if out is Outcome.ACCEPTED:
            assert floor <= it < floor + slots
    taken = len(q.dequeue(q.held) or [])
    assert taken + q.stale_dropped + q.duplicates + q.overflow == counted
