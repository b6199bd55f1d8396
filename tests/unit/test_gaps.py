"""The gap monitor replays iteration changes and checks every pair against Table 1."""

from helpers import topology_of

from hopbus.gaps import GapMonitor
from hopbus.modes import Mode
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
