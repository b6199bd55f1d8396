"""Recv requirements, Reduce weights (eq. 1, Fig. 8, eq. 2), the send-side check and the
skipping rule, each on its own."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopbus.modes import HOP_MODES, Mode
from hopbus.protocol.policy import Policy
from hopbus.protocol.requirements import AcksFrom, Fresh, SameIteration
from hopbus.protocol.skipping import jump_length, lag_behind
from hopbus.protocol.store import Mailbox, Update, UpdateStore

PEERS = (1, 2, 3)


def policy(mode: Mode, need: int = 3, s: int = 0) -> Policy:
    return Policy(
        mode,
        worker=0,
        in_peers=PEERS,
        need=need,
        staleness=s,
        self_weight=0.25,
        in_weights={1: 0.25, 2: 0.25, 3: 0.25},
    )


def box(slots: int = 8, supersede: bool = False) -> Mailbox:
    return Mailbox(UpdateStore(slots, supersede=supersede))


def test_standard_waits_for_every_in_neighbour_of_this_iteration():
    b = box()
    req = policy(Mode.STANDARD).requirement(0)
    assert isinstance(req, SameIteration)
    b.deliver_update(1, 0)
    b.deliver_update(2, 0)
    b.deliver_update(3, 1)  # next iteration's: does not count
    assert not req.ready(b) and req.missing(b) == (3,)
    b.deliver_update(3, 0)
    assert req.ready(b)
    assert sorted(u.src for u in req.take(b)) == [1, 2, 3]
    assert b.updates.floor == 1  # iteration 0 is done with


def test_backup_takes_the_first_n_minus_b_and_any_extra_already_there():
    b = box()
    req = policy(Mode.BACKUP, need=2).requirement(4)
    b.updates.advance(4)
    b.deliver_update(3, 4)
    assert not req.ready(b)
    b.deliver_update(1, 4)
    b.deliver_update(2, 4)
    assert req.ready(b)
    assert len(req.take(b)) == 3  # Fig. 8 line 5: the extra one joins the Reduce


def test_staleness_uses_each_neighbours_newest_and_remembers_what_it_took():
    b = box(supersede=True)
    pol = policy(Mode.STALENESS, s=2)
    req = pol.requirement(5)
    assert isinstance(req, Fresh) and req.oldest == 3
    b.updates.advance(pol.floor(5))
    b.deliver_update(1, 3)
    b.deliver_update(1, 6)  # ahead of us: newest wins
    b.deliver_update(2, 4)
    assert req.missing(b) == (3,)
    b.deliver_update(3, 2)  # too old for k = 5, s = 2
    assert b.updates.stale_dropped == 2 and not req.ready(b)
    b.deliver_update(3, 5)
    got = {u.src: u.iteration for u in req.take(b)}
    assert got == {1: 6, 2: 4, 3: 5}
    # Next iteration: nothing new arrived, but what was taken is still fresh (6, 4 >= 4; 5).
    assert pol.requirement(6).ready(b)
    assert pol.requirement(6).take(b) == []


def test_staleness_start_counts_as_iteration_minus_one():
    """Fig. 9 initialises iter_rcv to -1: the common start p0 is fresh for k <= s - 1."""
    b = box(supersede=True)
    pol = policy(Mode.STALENESS, s=3)
    assert pol.requirement(2).ready(b)
    assert not pol.requirement(3).ready(b)


def test_hybrid_needs_fresh_updates_from_all_but_backup():
    b = box(supersede=True)
    req = policy(Mode.HYBRID, need=2, s=1).requirement(3)
    b.updates.advance(2)
    b.deliver_update(1, 2)
    assert not req.ready(b)
    b.deliver_update(2, 3)
    assert req.ready(b) and req.missing(b) == (3,)


def test_acks_requirement():
    b = box()
    req = AcksFrom(2, (1, 2))
    b.deliver_ack(1, 3)
    assert not req.ready(b) and req.missing(b) == (2,)
    b.deliver_ack(2, 2)
    assert req.ready(b) and req.take(b) == []


def test_reduce_weights_standard_is_w():
    own, terms = policy(Mode.STANDARD).reduction(0, [Update(j, 0) for j in PEERS])
    assert own == pytest.approx(0.25) and [w for _, w in terms] == pytest.approx([0.25] * 3)


def test_reduce_weights_backup_is_a_plain_average_of_what_arrived():
    own, terms = policy(Mode.BACKUP, need=2).reduction(0, [Update(1, 0), Update(3, 0)])
    assert own == pytest.approx(1 / 3) and [w for _, w in terms] == pytest.approx([1 / 3] * 2)


def test_reduce_weights_staleness_follow_eq_2():
    """eq. (2): weight Iter(u) - (k - s) + 1; k = 10, s = 3 -> own 4, iter 7 -> 1, iter 9 -> 3."""
    own, terms = policy(Mode.STALENESS, s=3).reduction(10, [Update(1, 7), Update(2, 9)])
    total = 4 + 1 + 3
    assert own == pytest.approx(4 / total)
    assert [w for _, w in terms] == pytest.approx([1 / total, 3 / total])


@given(
    st.sampled_from(HOP_MODES),
    st.integers(0, 5),
    st.integers(0, 30),
    st.lists(
        st.tuples(st.sampled_from(PEERS), st.integers(0, 40)), max_size=3, unique_by=lambda t: t[0]
    ),
)
def test_reduce_weights_are_a_convex_combination(mode, s, k, ups):
    ups = [(j, max(it, k - s)) for j, it in ups]
    own, terms = policy(mode, s=s).reduction(k, [Update(j, it) for j, it in ups])
    weights = [own] + [w for _, w in terms]
    assert all(w > 0 for w in weights)
    assert sum(weights) == pytest.approx(1.0)
    own, terms = policy(mode, s=s).reduction(k, [Update(j, it) for j, it in ups], k - 2 * s - 2)
    weights = [own] + [w for _, w in terms]
    assert all(w >= 0 for w in weights)
    assert sum(weights) == pytest.approx(1.0)


def test_floor_is_what_a_receiver_still_accepts():
    """Sec. 6.2's send check compares against this: done with iteration k means k + 1, or
    k + 1 - s when updates up to s old are still of use."""
    assert policy(Mode.BACKUP).floor(5) == 5
    assert policy(Mode.STALENESS, s=2).floor(5) == 3


def test_own_parameters_older_than_k_minus_s_weigh_nothing():
    pol = policy(Mode.STALENESS, s=1)
    own, terms = pol.reduction(10, [Update(1, 9)], own_iteration=7)
    assert own == 0.0 and [w for _, w in terms] == [1.0]
    assert pol.reduction(10, [], own_iteration=7) == (1.0, ())  # nothing else: keep own


def test_lag_behind_reads_the_token_invariant():
    # TokenQ(j->i).size = Iter(j) - Iter(i) + max_ig; out-neighbours 7 and 3 ahead, max_ig 5
    assert lag_behind([12, 8], 5) == 3


@pytest.mark.parametrize(
    ("behind", "kw", "expected"),
    [
        (6, {"skip_max": 0, "trigger": 1, "max_ig": 10, "remaining": 50}, 1),  # skipping off
        (6, {"skip_max": 1, "trigger": 1, "max_ig": 10, "remaining": 50}, 1),  # 1 = a normal step
        (
            1,
            {"skip_max": 10, "trigger": 1, "max_ig": 10, "remaining": 50},
            1,
        ),  # not over the trigger
        (6, {"skip_max": 10, "trigger": 1, "max_ig": 10, "remaining": 50}, 6),  # catch up exactly
        (6, {"skip_max": 2, "trigger": 1, "max_ig": 10, "remaining": 50}, 2),  # at most skip_max
        (6, {"skip_max": 10, "trigger": 1, "max_ig": 4, "remaining": 50}, 4),  # at most max_ig
        (6, {"skip_max": 10, "trigger": 1, "max_ig": 10, "remaining": 3}, 3),  # never past the end
    ],
)
def test_jump_length(behind, kw, expected):
    assert jump_length(behind, **kw) == expected
