"""A requirement is ``settled`` when taking its updates as soon as it is ready takes the very
updates a take after more arrivals would: only then may a driver receive beside Compute
(runtime/session.py's overlap) without changing what the paper's Recv-after-Compute reduces."""

from hypothesis import given
from hypothesis import strategies as st

from hopbus.protocol.requirements import AcksFrom, Fresh, SameIteration
from hopbus.protocol.store import Mailbox, UpdateStore

K = 5  # the iteration received
SLOTS = 8


def _box(arrivals: list[tuple[int, int]], *, supersede: bool) -> Mailbox:
    box = Mailbox(UpdateStore(SLOTS, supersede=supersede))
    box.updates.advance(K - 3)  # the floor an earlier Recv left
    for src, it in arrivals:
        box.deliver_update(src, it)
    return box


def _taken(req, box: Mailbox) -> set[tuple[int, int]]:
    return {(u.src, u.iteration) for u in req.take(box)}


arrival = st.tuples(st.integers(0, 3), st.integers(K - 3, K + 2))  # (source, iteration)


@st.composite
def scenarios(draw):
    """A requirement of either kind over sources 0..3, what had arrived when it became ready,
    and what arrives after (each source sends one update per iteration)."""
    sources = (0, 1, 2, 3)
    need = draw(st.integers(1, 4))
    if draw(st.booleans()):
        req = SameIteration(K, sources, need, next_floor=K + 1)
    else:
        stale = draw(st.integers(0, 3))
        req = Fresh(K, sources, need, oldest=K - stale, next_floor=K - stale + 1)
    pairs = draw(st.lists(arrival, unique=True, max_size=16))
    cut = draw(st.integers(0, len(pairs)))
    return req, pairs[:cut], pairs[cut:]


@given(scenarios())
def test_a_settled_requirement_takes_the_same_early_or_late(scenario):
    req, early, late = scenario
    supersede = isinstance(req, Fresh)
    now = _box(early, supersede=supersede)
    if not req.ready(now):
        return
    later = _box(early + late, supersede=supersede)
    assert req.ready(later)  # nothing that arrives undoes readiness
    if req.settled:
        assert _taken(req, now) == _taken(req, later)


def test_backup_and_staleness_are_not_settled():
    """Counterexamples: a late in-neighbour's update of iteration k (backup: need 1 of 2)
    and a fresher update of the same neighbour (staleness) join a take after Compute."""
    backup = SameIteration(K, (0, 1), 1, next_floor=K + 1)
    assert not backup.settled
    assert _taken(backup, _box([(0, K)], supersede=False)) == {(0, K)}
    assert _taken(backup, _box([(0, K), (1, K)], supersede=False)) == {(0, K), (1, K)}
    stale = Fresh(K, (0,), 1, oldest=K - 2, next_floor=K - 1)
    assert not stale.settled
    assert _taken(stale, _box([(0, K - 1)], supersede=True)) == {(0, K - 1)}
    assert _taken(stale, _box([(0, K - 1), (0, K)], supersede=True)) == {(0, K)}
    assert SameIteration(K, (0, 1), 2, next_floor=K + 1).settled  # standard: all of them
    assert AcksFrom(K, (0, 1)).settled  # takes nothing


def test_the_session_receives_beside_compute_only_what_is_settled():
    from hopbus.protocol.effects import Recv, Reduce
    from hopbus.runtime.session import _may_overlap

    assert _may_overlap(Recv(SameIteration(K, (0, 1), 2, next_floor=K + 1)))
    assert not _may_overlap(Recv(SameIteration(K, (0, 1), 1, next_floor=K + 1)))
    assert not _may_overlap(Recv(Fresh(K, (0, 1), 2, oldest=K - 1, next_floor=K)))
    assert _may_overlap(Reduce(K, 1.0, ()))
