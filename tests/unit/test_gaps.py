"""The gap monitor replays iteration changes and checks every pair against Table 1."""

from helpers import topology_of
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import graphs

from hopbus.gaps import GapMonitor, Violation
from hopbus.modes import HOP_MODES, Mode
from hopbus.protocol.membership import bounds_without
from hopbus.topology import GapSetting, Topology


def test_tracks_largest_gaps_and_flags_the_first_violation():
    """Directed ring 0 -> 1 -> 2 -> 3 -> 0, standard: Iter(i) - Iter(j) <= length(Path j->i)."""
    topo = topology_of([(0, 1), (1, 2), (2, 3), (3, 0)])
    m = GapMonitor(topo, GapSetting(Mode.STANDARD))
    for w, it in [(0, 1), (1, 1), (2, 1), (3, 1), (0, 2), (1, 2), (1, 3)]:
        m.enter(w, it)
    # now [2, 3, 1, 1]: worker 1 is 2 ahead of 2 (bound 3) and of 3 (bound 2): legal
    assert (m.max_adjacent, m.max_any, m.violations) == (2, 2, 0)
    m.enter(1, 4)  # 2 ahead of its in-neighbour 0 (bound 1), 3 ahead of 3 (bound 2)
    assert m.violations == 1
    v = m.first_violation
    assert (v.ahead, v.behind, v.gap, v.bound) == (1, 0, 2, 1)
    assert m.iteration_of(1) == 4


def test_min_iteration_tracking_survives_jumps():
    topo = topology_of([(0, 1), (1, 0), (1, 2), (2, 1)])
    m = GapMonitor(topo, GapSetting(Mode.BACKUP, max_ig=10))
    m.enter(0, 5)
    m.enter(1, 3)
    m.enter(2, 9)  # [5, 3, 9]
    assert (m.max_any, m.max_adjacent) == (6, 6)
    m.enter(1, 8)
    m.enter(0, 12)  # [12, 8, 9]: the minimum moved from 0 to 3 to 5 to 8
    assert m.max_any == 6
    m.enter(2, 30)
    assert m.max_any == 22 and m.max_adjacent == 22
    assert m.violations == 1  # 22 > max_ig x path = 10 for the neighbours 2 and 1


@given(
    st.integers(2, 7).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.lists(st.tuples(st.integers(0, n - 1), st.integers(1, 4)), max_size=60),
            st.sampled_from(HOP_MODES),
            st.integers(0, 3),
        )
    )
)
def test_monitor_agrees_with_brute_force(case):
    """Incremental bookkeeping (running minimum, per-row fast path) against recomputing every
    pair after every change."""
    n, moves, mode, max_ig = case
    topo = topology_of([(i, (i + 1) % n) for i in range(n)] + [(0, n - 1)])
    setting = GapSetting(mode, staleness=1, max_ig=max_ig)
    bounds = topo.bounds(setting)
    adjacent = {(a, b) for a, b in topo.graph.edges if a != b}
    adjacent |= {(b, a) for a, b in adjacent}
    m = GapMonitor(topo, setting)
    it = [0] * n
    max_adj = max_any = violations = 0
    for w, step in moves:
        it[w] += step
        m.enter(w, it[w])
        max_any = max(max_any, max(it) - min(it))
        max_adj = max(max_adj, *(it[a] - it[b] for a, b in adjacent))
        violations += any(it[a] - it[b] > bounds[a, b] for a in range(n) for b in range(n))
    assert (m.max_any, m.max_adjacent, m.violations) == (max_any, max_adj, violations)


# -- every pair through the edges (issue 18): no n x n matrix, the same answers -------------------


def brute_first(it, bounds, live, w):
    """The first violation as the n x n check names it: the mover's lowest j over its bound."""
    for j in sorted(live):
        if j != w and it[w] - it[j] > bounds[w, j]:
            return (w, j, it[w] - it[j], int(bounds[w, j]))
    return None


@settings(max_examples=150, deadline=None)
@given(
    graphs(),
    st.sampled_from(HOP_MODES),
    st.integers(0, 3),
    st.integers(0, 2),
    st.lists(st.tuples(st.integers(0, 8), st.integers(1, 4), st.integers(0, 12)), max_size=50),
)
def test_edges_find_every_pair_over_its_bound(topo, mode, max_ig, staleness, events):
    """Random strongly connected graphs, directed or two-way, random moves, and now and then a
    worker dying or a replacement rejoining: the per-edge check counts the same violations and
    names the same first pair as checking every pair of live workers against Table 1 in the
    graph without the dead (``membership.bounds_without``)."""
    n = topo.n
    setting = GapSetting(mode, staleness=staleness, max_ig=max_ig)
    m = GapMonitor(topo, setting)
    it = [0] * n
    gone: set[int] = set()
    bounds = bounds_without(topo, setting, gone)
    violations, first = 0, None
    for pick, step, what in events:
        w = pick % n
        if what == 0 and w not in gone and len(gone) < n - 1:  # dies
            gone.add(w)
            bounds = bounds_without(topo, setting, gone)
            m.remove(w)
            continue
        if what == 1 and w in gone:  # a replacement rejoins a little behind its old place
            gone.discard(w)
            it[w] = max(0, it[w] - step)
            bounds = bounds_without(topo, setting, gone)
            m.rejoin(w, it[w])
            continue
        if w in gone:
            continue
        it[w] += step
        m.enter(w, it[w])
        live = [i for i in range(n) if i not in gone]
        if any(it[a] - it[b] > bounds[a, b] for a in live for b in live):
            violations += 1
            if first is None:
                first = brute_first(it, bounds, live, w)
    assert m.violations == violations
    v = m.first_violation
    assert (None if v is None else (v.ahead, v.behind, v.gap, v.bound)) == first


def test_no_matrix_for_ten_thousand_workers():
    """A 10,000-worker graph's monitor holds per-edge limits only; a straggler is caught."""
    topo = Topology.named("ring-based", 10_000)
    m = GapMonitor(topo, GapSetting(Mode.BACKUP, max_ig=3))
    assert m.table1 == {"in_neighbour": 3, "out_neighbour": 3, "adjacent": 3, "any_pair": 7500}
    for w in range(1, 10_000):
        m.enter(w, 3)
    assert m.violations == 0 and (m.max_any, m.max_adjacent) == (3, 3)
    m.enter(5000, 7)  # 7 ahead of worker 0, 2500 hops away: within 3 x 2500; 4 ahead of 4999
    assert m.violations == 1
    assert m.first_violation == Violation(5000, 0, 7, 3)  # worker 0 is its out-neighbour
