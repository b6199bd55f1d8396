"""Graph builders, W (eq. 1), spectral gap, distances and Table 1."""

import math

import networkx as nx
import numpy as np
import pytest
from helpers import topology_of
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import graphs

from hopbus.errors import TopologyError
from hopbus.modes import Mode
from hopbus.topology import (
    GapSetting,
    NotDoublyStochasticWarning,
    Topology,
    analysis,
    build,
    from_edge_lines,
    token_queue_capacity,
)
from hopbus.topology.bounds import report_settings
from hopbus.topology.graphs import MAX_WORKERS


def peers(g: nx.DiGraph, i: int) -> set[int]:
    return {j for j in g.successors(i) if j != i}


def test_every_builder_adds_self_loops_and_eq1_weights():
    for name, n in [
        ("ring", 5),
        ("ring-based", 8),
        ("ring-based", 7),
        ("double-ring", 12),
        ("complete", 4),
        ("hierarchical:4,2,2", 8),
    ]:
        g = build(name, n)
        assert g.number_of_nodes() == n
        for j in g.nodes:
            assert g.has_edge(j, j)
            ins = list(g.predecessors(j))
            assert all(g.edges[i, j]["weight"] == pytest.approx(1 / len(ins)) for i in ins)


def test_ring_and_ring_based_neighbours():
    assert peers(build("ring", 6), 0) == {1, 5}
    assert peers(build("ring-based", 8), 0) == {1, 7, 4}  # 4 is the most distant node
    g = build("ring-based", 7)  # odd: an edge to one antipode, from the other
    assert peers(g, 0) == {1, 6, 3}
    assert {j for j in g.predecessors(0) if j != 0} == {1, 6, 4}
    assert peers(build("ring-based", 3), 0) == {1, 2}  # the antipode is already a neighbour


def test_double_ring_joins_two_ring_based_graphs_node_to_node():
    g = build("double-ring", 16)
    assert peers(g, 0) == {1, 7, 4, 8}
    assert peers(g, 8) == {9, 15, 12, 0}
    with pytest.raises(TopologyError, match="even number"):
        build("double-ring", 7)


def test_hierarchical_is_complete_inside_machines_and_a_ring_between():
    g = build("hierarchical:4,2,2", None)
    assert peers(g, 0) == {1, 2, 3, 7}  # machine {0..3}, plus the link from machine {6,7}
    assert peers(g, 3) == {0, 1, 2, 4}
    assert peers(g, 5) == {4, 6}


def test_w_of_regular_graphs_is_doubly_stochastic_and_spectral_gap_matches_theory():
    t = Topology.named("ring-based", 8)
    assert t.doubly_stochastic
    # circulant: eigenvalues (1 + 2cos(2 pi m/8) + (-1)^m) / 4; the largest besides 1 is 1/2
    assert t.spectral_gap == pytest.approx(0.5)
    ring = Topology.named("ring", 10)
    assert ring.spectral_gap == pytest.approx(1 - (1 + 2 * math.cos(2 * math.pi / 10)) / 3)


def test_not_doubly_stochastic_warns_but_builds():
    with pytest.warns(NotDoublyStochasticWarning, match="hierarchical"):
        t = Topology.named("hierarchical:4,2,2", None)
    assert not t.doubly_stochastic and t.n == 8


def test_distances_and_table1_for_a_bidirectional_ring():
    t = Topology.named("ring", 6)
    assert t.distances[0].tolist() == [0, 1, 2, 3, 2, 1]
    assert t.diameter == 3
    assert t.table1(GapSetting(Mode.STANDARD)) == {
        "in_neighbour": 1,
        "out_neighbour": 1,
        "adjacent": 1,
        "any_pair": 3,
    }
    assert t.table1(GapSetting(Mode.STALENESS, staleness=2))["any_pair"] == 9
    assert t.table1(GapSetting(Mode.BACKUP))["any_pair"] is None  # the paper's infinity
    assert t.table1(GapSetting(Mode.BACKUP, max_ig=4))["adjacent"] == 4
    assert t.table1(GapSetting(Mode.NOTIFY_ACK))["any_pair"] == 3


def test_table1_on_a_directed_ring_separates_the_two_columns():
    """Directed 0 -> 1 -> 2 -> 3 -> 0: for the edge 0 -> 1, Iter(1) - Iter(0) <= 1 (1 needs
    0's update) but Iter(0) - Iter(1) <= length(Path 1->0) = 3, or max_ig with tokens."""
    t = topology_of([(0, 1), (1, 2), (2, 3), (3, 0)])
    b = t.bounds(GapSetting(Mode.STANDARD))
    assert (b[1, 0], b[0, 1]) == (1, 3)
    b = t.bounds(GapSetting(Mode.STANDARD, max_ig=2))
    assert (b[1, 0], b[0, 1]) == (1, 2)  # min(length(Path 1->0), max_ig x length(Path 0->1))
    b = t.bounds(GapSetting(Mode.NOTIFY_ACK))
    assert b[0, 1] == 2 and b[0, 2] == 2  # min(path, 2 x reverse path)
    assert math.isinf(t.bounds(GapSetting(Mode.BACKUP))[0, 1])
    assert t.table1(GapSetting(Mode.STANDARD)) == {
        "in_neighbour": 1,
        "out_neighbour": 3,
        "adjacent": 3,
        "any_pair": 3,
    }


def test_token_queue_capacity_note_of_table1():
    assert token_queue_capacity(3, 2) == 9


def test_edge_list_parsing():
    g = from_edge_lines(["# a triangle", "0 1", "1 2", "2 0  # back"])
    assert sorted(e for e in g.edges if e[0] != e[1]) == [(0, 1), (1, 2), (2, 0)]
    w = from_edge_lines(["0 0 0.5", "1 0 0.5", "1 1 0.5", "0 1 0.5"])
    assert w.edges[1, 0]["weight"] == 0.5


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (["0 1 2 3"], "expected 'src dst"),
        (["a b"], "integers"),
        # int() refuses more than 4,300 digits with a ValueError of its own
        (["0 " + "1" * 5000, "1 0"], "integers from 0 to"),
        (["0 2", "2 0"], "without gaps"),
        (["0 1 0.5", "1 0"], "every edge or on none"),
        (["0 1 1", "1 0 1"], "self-loop"),
        (["0 0 0.9", "1 0 0.5", "1 1 1", "0 1 0"], r"must be in \(0, 1\]"),
        (["0 0 0.9", "1 0 0.5", "1 1 0.5", "0 1 0.5"], "sum to 1.4"),
        ([], "no edges"),
        # faults ``weight_twice`` (the last weight counted, silently) and ``arabic_weight``
        (["0 0 0.5", "0 1 0.3", "0 1 0.5", "1 0 0.5", "1 1 0.5"], "given a weight twice"),
        (["0 0 0.5", "0 1 \u0660.5", "1 0 0.5", "1 1 0.5"], "line 2: the weight must be a"),
    ],
)
def test_edge_list_errors_say_what_and_where(lines, match):
    with pytest.raises(TopologyError, match=match):
        from_edge_lines(lines, origin="edges.txt")


def test_edge_file_by_prefix_and_bad_path(tmp_path):
    f = tmp_path / "g.txt"
    f.write_text("0 1\n1 0\n")
    assert build(f"file:{f}", None).number_of_nodes() == 2
    assert build(str(f), 2).number_of_nodes() == 2
    with pytest.raises(TopologyError, match="cannot read"):
        build(f"file:{tmp_path / 'missing.txt'}", None)
    # fault ``bom_topology``: an editor's byte-order mark made line 1's ids not integers
    f.write_bytes(b"\xef\xbb\xbf0 1\n1 0\n")
    assert build(f"file:{f}", None).number_of_nodes() == 2


def test_not_strongly_connected_is_refused_naming_the_pair():
    with pytest.raises(
        TopologyError, match="not strongly connected: worker 0 cannot reach worker 2"
    ):
        topology_of([(0, 1), (1, 0), (2, 0)])
    with pytest.raises(
        TopologyError, match="not strongly connected: worker 2 cannot reach worker 0"
    ):
        topology_of([(0, 1), (1, 0), (0, 2)])


@pytest.mark.parametrize(
    ("name", "n", "match"),
    [
        ("nope", 4, "unknown topology"),
        ("ring", 1, "at least 2"),
        ("hierarchical", None, "machine sizes"),
        ("hierarchical:4,x", None, "integers"),
        ("hierarchical:4," + "1" * 5000, None, "integers"),
        ("hierarchical:4,2,2", 9, "has 8 workers but 9"),
    ],
)
def test_build_errors(name, n, match):
    with pytest.raises(TopologyError, match=match):
        build(name, n)


def test_large_graph_distances_are_correct():
    t = Topology.named("ring-based", 200)
    d = t.distances
    ref = dict(nx.all_pairs_shortest_path_length(t.graph))
    sample = np.random.default_rng(0).integers(0, 200, size=(50, 2))
    for i, j in sample:
        assert d[i, j] == ref[i][j]


# -- Table 1 without n x n matrices (issue 18) -----------------------------------------------------


def table1_of_matrix(t: Topology, s: GapSetting) -> dict:
    """Table 1's columns as the largest entries of the n x n bound matrix (the definition)."""
    b, d = t.bounds(s), t.distances
    off = ~np.eye(t.n, dtype=bool)
    edge = (d == 1) & off

    def top(values: np.ndarray):
        x = float(values.max())
        return None if math.isinf(x) else int(x)

    return {
        "in_neighbour": top(b[edge.T]),
        "out_neighbour": top(b[edge]),
        "adjacent": top(b[edge | edge.T]),
        "any_pair": top(b[off]),
    }


@settings(max_examples=200, deadline=None)
@given(graphs(), st.sampled_from(report_settings(2, 3) + report_settings(0, 1)))
def test_table1_from_path_facts_equals_the_bound_matrix(topo, setting):
    assert topo.table1(setting) == table1_of_matrix(topo, setting)
    b = topo.bounds(setting)
    for i, j in topo.graph.edges:
        if i != j:
            assert topo.neighbour_bound(i, j, setting) == b[i, j]
            assert topo.neighbour_bound(j, i, setting) == b[j, i]
    assert topo.diameter == int(topo.distances.max())
    assert topo.doubly_stochastic == analysis.is_doubly_stochastic(topo.weights)


@pytest.mark.parametrize(("name", "n"), [("ring-based", 9), ("double-ring", 14), ("complete", 5)])
def test_path_facts_of_the_named_graphs(name, n):
    t = Topology.named(name, n)
    for s in report_settings(5, 4):
        assert t.table1(s) == table1_of_matrix(t, s)


def test_ten_thousand_workers_without_a_matrix():
    t = Topology.named("ring-based", 10_001)  # odd: one-way edges to the antipodes
    assert t.diameter == 2501 and t.paths.max_return == 2
    assert t.table1(GapSetting(Mode.STANDARD)) == {
        "in_neighbour": 1,
        "out_neighbour": 2,
        "adjacent": 2,
        "any_pair": 2501,
    }
    assert "distances" not in t.__dict__ and "weights" not in t.__dict__  # never built


def test_limits_on_workers_and_edges():
    with pytest.raises(TopologyError, match=f"more than hopbus handles \\({MAX_WORKERS}\\)"):
        build("ring", MAX_WORKERS + 1)
    with pytest.raises(TopologyError, match="edges, more than hopbus handles"):
        build("complete", 1001)  # fault ``silent_big_graph``: 2,000 ran for minutes, silent
    assert build("complete", 1000).number_of_nodes() == 1000
    with pytest.raises(TopologyError, match="edges, more than hopbus handles"):
        build("hierarchical:1500,1500", None)
    # a file of 20,000 workers and 150 edges each: 3,000,000 x 20,000 breadth-first steps
    from hopbus.topology.graphs import MAX_PATH_WORK, _require

    # a file of millions of edges is refused as soon as it passed the limit, not once parsed
    lines = (f"{i % 20_000} {(i + 1) % 20_000}" for i in range(2_000_000))
    with pytest.raises(TopologyError, match="more than 1000000 edges"):
        from_edge_lines(lines, origin="big.txt")
    with pytest.raises(TopologyError, match="x 150000 steps"):
        _require(20_000, 2, "file:big", 150_000)
    _require(20_000, 2, "file:big", MAX_PATH_WORK // 20_000)
