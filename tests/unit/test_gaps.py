"""The gap monitor replays iteration changes and checks every pair against Table 1."""

from helpers import topology_of
from hypothesis import given
from hypothesis import strategies as st

from hopbus.gaps import GapMonitor
from hopbus.modes import HOP_MODES, Mode
from hopbus.topology import GapSetting


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
