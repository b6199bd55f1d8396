"""The rules for going on without dead workers (protocol/membership.py) and the gap monitor's
view of them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopbus.gaps import GapMonitor
from hopbus.modes import Mode
from hopbus.protocol.membership import bounds_without, live, rejoin_iteration, survivable
from hopbus.protocol.spec import ProtocolSettings
from hopbus.topology import Topology


def _topo(name: str = "ring-based", n: int = 8) -> Topology:
    return Topology.named(name, n)


def test_standard_and_staleness_cannot_lose_anyone():
    topo = _topo()
    for mode in (Mode.STANDARD, Mode.NOTIFY_ACK, Mode.STALENESS):
        reason = survivable(ProtocolSettings(mode=mode), topo, {3})
        assert reason is not None and f"--mode {mode} cannot go on" in reason
    assert survivable(ProtocolSettings(mode=Mode.STANDARD), topo, set()) is None


@given(st.sets(st.integers(0, 7), max_size=7), st.integers(0, 2))
def test_backup_tolerates_up_to_backup_dead_in_neighbours(dead, backup):
    topo = _topo()
    backup = min(backup, min(topo.in_degree(i) for i in range(topo.n)) - 1)
    for mode in (Mode.BACKUP, Mode.HYBRID):
        s = ProtocolSettings(mode=mode, backup=backup)
        worst = max(
            (len(dead & set(topo.in_peers[i])) for i in range(topo.n) if i not in dead),
            default=0,
        )
        assert (survivable(s, topo, dead) is None) == (worst <= backup)


def test_the_reason_names_the_worker_that_lost_too_many():
    topo = _topo()
    s = ProtocolSettings(mode=Mode.BACKUP, backup=1)
    i = 0
    two = set(topo.in_peers[i][:2])
    reason = survivable(s, topo, two)
    assert reason is not None and "lost 2 in-neighbours" in reason and "--backup 1" in reason


def test_live_keeps_order():
    assert live((5, 1, 3, 2), {1, 2}) == (5, 3)


def test_bounds_without_measures_paths_in_the_graph_that_is_left():
    topo = _topo("ring", 6)  # 0 -> 1 -> ... -> 5 -> 0 and back
    setting = ProtocolSettings(mode=Mode.BACKUP, max_ig=2).gap_setting
    full = topo.bounds(setting)
    b = bounds_without(topo, setting, {3})
    assert np.isinf(b[3]).sum() == 5 and np.isinf(b[:, 3]).sum() == 5
    # 2 -> 4 went through 3 (two hops); now it goes the other way round (four hops)
    assert full[2, 4] == 2 * 2 and b[2, 4] == 2 * 4
    assert (b[np.ix_([0, 1], [0, 1])] == full[np.ix_([0, 1], [0, 1])]).all()


@pytest.mark.parametrize("name", ["ring", "ring-based", "hierarchical:4,4,2", "complete"])
def test_bounds_without_is_the_pairwise_bound_of_the_graph_left(name):
    """Against networkx's breadth-first searches in the graph without the dead, pair by pair
    (the matrix is scipy's, in C: 8x faster at 2,000 workers)."""
    import networkx as nx

    from hopbus.topology.bounds import neighbour_bound

    topo = _topo(name, 10)
    setting = ProtocolSettings(mode=Mode.BACKUP, max_ig=3).gap_setting
    for dead in ({3}, {0, 4}, {1, 2, 5}):
        b = bounds_without(topo, setting, dead)
        g = topo.graph.copy()
        g.remove_nodes_from(dead)
        d = dict(nx.all_pairs_shortest_path_length(g))
        inf = float("inf")
        for i in range(topo.n):
            for j in range(topo.n):
                if i == j:
                    want = 0.0
                elif i in dead or j in dead:
                    want = inf
                else:
                    want = neighbour_bound(setting, d[i].get(j, inf), d[j].get(i, inf))
                assert b[i, j] == want, (name, dead, i, j)


def test_a_dead_worker_counts_for_no_gap():
    topo = _topo("ring", 4)
    setting = ProtocolSettings(mode=Mode.BACKUP, max_ig=1).gap_setting
    m = GapMonitor(topo, setting)
    m.remove(2)
    for k in range(1, 6):  # the others run on; worker 2 stays at 0
        for w in (0, 1, 3):
            m.enter(w, k)
    assert m.violations == 0 and m.max_any == 1 and m.gone == {2}  # not 5: 2 left out
    m.rejoin(2, 5)
    m.enter(2, 6)
    assert m.violations == 0 and m.max_any == 1


def test_removing_a_worker_that_is_behind_clears_its_violation():
    topo = _topo("ring", 4)
    setting = ProtocolSettings(mode=Mode.STANDARD, max_ig=1).gap_setting
    m = GapMonitor(topo, setting)
    m.enter(0, 1)
    m.enter(0, 2)  # 2 ahead of its neighbours: over the bound
    before = m.violations
    assert before > 0
    for w in (1, 2, 3):
        m.remove(w)
    m.enter(0, 3)
    assert m.violations == before  # nothing left to be over against


# -- a replacement's iteration (rejoin_iteration) -------------------------------------------


def test_rejoins_in_the_newest_iteration_enough_neighbours_send():
    held = {1: (40, 41, 42), 2: (41,)}
    # 2 is at 43 and never sent 42: with need 2, 42 has only worker 1; 41 has both
    k, why = rejoin_iteration(held, {1: 42, 2: 43}, {4: 41}, need=2, max_ig=5)
    assert (k, why) == (41, "")
    # a neighbour still below k sends k when it gets there
    k, _ = rejoin_iteration(held, {1: 42, 2: 40}, {4: 41}, need=2, max_ig=5)
    assert k == 42


def test_no_update_yet():
    assert rejoin_iteration({}, {1: 3}, {}, need=1, max_ig=2) == (
        None,
        "no update from its in-neighbours yet",
    )


def test_an_out_neighbour_far_behind_caps_the_iteration():
    held = {1: (30, 31, 32)}
    k, _ = rejoin_iteration(held, {1: 32}, {5: 26}, need=1, max_ig=5)
    assert k == 31  # 32 would leave TokenQ(5->self) at 5 + 26 - 32 = -1
    k, why = rejoin_iteration({1: (32,)}, {1: 32}, {5: 20}, need=1, max_ig=5)
    assert k is None and "out-neighbour 5 is in iteration 20" in why


def test_an_in_neighbour_far_ahead_rules_out_old_updates():
    k, why = rejoin_iteration({1: (10,)}, {1: 10, 2: 17}, {}, need=1, max_ig=5)
    assert k is None and "in-neighbour 2 is in iteration 17" in why


@given(
    st.dictionaries(st.integers(0, 3), st.sets(st.integers(0, 30), max_size=5), max_size=4),
    st.dictionaries(st.integers(0, 3), st.integers(0, 30), min_size=1, max_size=4),
    st.dictionaries(st.integers(4, 7), st.integers(0, 30), max_size=4),
    st.integers(1, 3),
    st.integers(1, 6),
)
def test_a_chosen_iteration_keeps_every_queue_non_negative_and_is_coming(
    held, ins, outs, need, max_ig
):
    held = {j: its for j, its in held.items() if j in ins}
    k, why = rejoin_iteration(held, ins, outs, need=need, max_ig=max_ig)
    if k is None:
        assert why
        return
    assert any(k in its for its in held.values())
    assert all(max_ig + k - it >= 0 for it in ins.values())  # TokenQ(self->j)
    assert all(max_ig + it - k >= 0 for it in outs.values())  # TokenQ(m->self)
    assert sum(1 for j, it in ins.items() if k in held.get(j, ()) or it < k) >= need
    newer = [x for its in held.values() for x in its if x > k]
    for x in newer:  # nothing newer would have done
        coming = sum(1 for j, it in ins.items() if x in held.get(j, ()) or it < x)
        fits = all(max_ig + x - it >= 0 for it in ins.values()) and all(
            max_ig + it - x >= 0 for it in outs.values()
        )
        assert not (fits and coming >= need)


def test_a_reader_of_a_graph_too_large_for_the_matrix_holds_to_the_whole_graphs_bounds(
    monkeypatch,
):
    """Fault ``dead_in_a_large_graph``: inspect of a 20,000-worker run with one worker in its
    dead set ran for minutes (an n x n matrix filled from Python). Above the limit the live
    workers are held to the whole graph's bounds (never looser), and the reader says so."""
    from hopbus.coord.snapshot import live_gaps
    from hopbus.protocol import membership

    topo = _topo("ring", 6)
    setting = ProtocolSettings(mode=Mode.BACKUP, max_ig=2).gap_setting
    iters = [5, 4, 4, 0, 3, 5]
    exact = live_gaps(iters, topo, setting, {3})
    assert not exact["bound_of_whole_graph"] and exact["bound"]["any_pair"] == 2 * 4
    monkeypatch.setattr(membership, "BOUNDS_WITHOUT_LIMIT", 5)
    whole = live_gaps(iters, topo, setting, {3})
    assert whole["bound_of_whole_graph"] and whole["bound"] == topo.table1(setting)
    assert whole["max_adjacent"] == exact["max_adjacent"] and whole["dead"] == [3]
