"""The parameter server's decisions, driven by random arrival orders (no sockets, no clock).

A tiny driver plays the workers: each computes on the parameters it last got, pushes, and
waits for its reply; hypothesis picks which computing worker pushes next and how much time
passes. Every scheme must finish (no worker left waiting forever) and keep its promise.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopbus.baselines.ps import ElasticCore, StaleCore, SyncCore, make_core
from hopbus.baselines.spec import SchemeSettings
from hopbus.modes import Mode


def drive(core, n: int, order: list[int], gaps: list[float]):
    """Run ``core`` to the end. ``order[k]`` picks which computing worker pushes next (mod the
    number computing). Returns (gap samples, per-worker iteration, applied batches)."""
    it = [0] * n  # iteration each worker is in
    tag = [0] * n  # version its parameters carry
    version = 0
    computing = set(range(n))
    now, step = 0.0, 0
    gaps_seen, applied = [], []
    while computing:
        ready = sorted(computing)
        w = ready[order[step % len(order)] % len(ready)] if order else ready[0]
        now += gaps[step % len(gaps)] if gaps else 1.0
        step += 1
        d = core.push(w, it[w], tag[w], now)
        computing.discard(w)
        if d.apply:
            applied.append(d.apply)
            version += 1
        for v, nxt in d.release:
            assert nxt >= it[v], "a worker never goes back"
            it[v] = nxt
            tag[v] = version
            if nxt < core.iterations:
                computing.add(v)
        gaps_seen.append(max(it) - min(it))
        assert step < 100_000, "runaway"
        if not computing:
            assert core.done, f"deadlock: nobody computes, iterations {it}"
    return gaps_seen, it, applied


orders = st.lists(st.integers(0, 50), min_size=1, max_size=40)
times = st.lists(st.floats(0.001, 5.0), min_size=1, max_size=20)


@given(n=st.integers(2, 6), k=st.integers(1, 12), order=orders, gaps=times)
def test_bsp_applies_every_worker_each_version_and_keeps_gap_one(n, k, order, gaps):
    core = SyncCore(n, k, need=n)
    seen, it, applied = drive(core, n, order, gaps)
    assert it == [k] * n
    assert all(sorted(a) == list(range(n)) for a in applied) and len(applied) == k
    assert max(seen) <= 1
    assert core.counters.dropped_gradients == 0 and core.counters.barriers == k


@given(n=st.integers(2, 6), b=st.integers(0, 5), k=st.integers(1, 12), order=orders, gaps=times)
def test_backup_applies_the_first_n_of_each_version_and_drops_the_rest(n, b, k, order, gaps):
    b = min(b, n - 1)
    core = SyncCore(n, k, need=n - b)
    _, it, applied = drive(core, n, order, gaps)
    assert it == [k] * n  # everyone finishes, the stragglers by jumping
    assert len(applied) == k and all(len(a) == n - b for a in applied)
    c = core.counters
    assert c.applied_gradients == k * (n - b)
    assert c.dropped_gradients >= 0


@given(
    n=st.integers(2, 6),
    s=st.integers(0, 4),
    k=st.integers(1, 12),
    order=orders,
    gaps=times,
)
def test_ssp_keeps_the_fastest_within_s_plus_one_of_the_slowest(n, s, k, order, gaps):
    core = StaleCore(n, k, staleness=s)
    seen, it, applied = drive(core, n, order, gaps)
    assert it == [k] * n
    assert max(seen) <= s + 1  # the Table-1-style bound GapSetting gives ps-ssp
    assert len(applied) == n * k  # every gradient applied on arrival


@given(n=st.integers(2, 6), k=st.integers(1, 12), order=orders, gaps=times)
def test_asp_never_holds_anyone(n, k, order, gaps):
    core = StaleCore(n, k, staleness=None)
    _, it, applied = drive(core, n, order, gaps)
    assert it == [k] * n and len(applied) == n * k and core.counters.held == 0


@given(
    n=st.integers(2, 6),
    r=st.integers(1, 6),
    k=st.integers(1, 30),
    order=orders,
    gaps=times,
)
def test_elastic_finishes_and_every_barrier_holds_its_members(n, r, k, order, gaps):
    core = ElasticCore(n, k, lookahead=r)
    _, it, applied = drive(core, n, order, gaps)
    assert it == [k] * n and len(applied) == n * k
    c = core.counters
    assert c.barrier_waits >= 2 * c.barriers  # a barrier holds at least two workers


def test_elastic_puts_its_barrier_where_zipline_says():
    """Two workers, intervals 1 and 3: after two pushes each, the next barrier is where their
    predicted push times come closest within R = 5: worker 0 at 7 (its 5th push from now),
    worker 1 at 9 (its next)."""
    core = ElasticCore(2, 100, lookahead=5)
    for w, t in ((0, 1.0), (0, 2.0), (1, 3.0)):
        assert core.push(w, core.pushed[w], 0, t).release  # async: answered at once
    d = core.push(1, 1, 0, 6.0)  # worker 1's second push: both monitored, plan
    assert core.target == {0: 2 + 5, 1: 2 + 1}  # 0 predicted at 3..7, 1 at 9, 12, ...
    assert d.release == ((1, 2),)


def test_backup_drops_a_stale_tag_and_sends_the_current_version():
    core = SyncCore(3, 5, need=2)
    assert core.push(0, 0, 0, 1.0).release == ()
    d = core.push(1, 0, 0, 2.0)  # the second of need=2: version 1
    assert d.apply == (0, 1) and d.release == ((0, 1), (1, 1))
    late = core.push(2, 0, 0, 3.0)  # computed on version 0: dropped, jumps to 1
    assert not late.accept and late.release == ((2, 1),)
    assert core.counters.dropped_gradients == 1


def test_pushes_a_scheme_cannot_produce_are_refused():
    core = SyncCore(2, 3, need=2)
    core.push(0, 0, 0, 0.0)
    with pytest.raises(ValueError, match="twice"):
        core.push(0, 0, 0, 0.1)
    with pytest.raises(ValueError, match="not in"):
        core.push(5, 0, 0, 0.1)


@pytest.mark.parametrize(
    ("mode", "cls"),
    [
        (Mode.PS_BSP, SyncCore),
        (Mode.PS_BACKUP, SyncCore),
        (Mode.PS_SSP, StaleCore),
        (Mode.PS_ASP, StaleCore),
        (Mode.PS_ELASTIC, ElasticCore),
    ],
)
def test_make_core_picks_the_scheme(mode, cls):
    core = make_core(SchemeSettings(mode, workers=4, iterations=10, backup=1, staleness=2))
    assert isinstance(core, cls)
    if mode is Mode.PS_BACKUP:
        assert core.need == 3
    if mode is Mode.PS_ASP:
        assert core.staleness is None
