"""Communication graphs (data) and what they imply: W, spectral gap, paths, Table 1 bounds."""

from hopbus.topology.bounds import GapSetting, bound_matrix, table1, token_queue_capacity
from hopbus.topology.core import NotDoublyStochasticWarning, Topology
from hopbus.topology.graphs import (
    NAMES,
    build,
    complete,
    double_ring,
    from_edge_file,
    from_edge_lines,
    hierarchical,
    ring,
    ring_based,
)

__all__ = [
    "NAMES",
    "GapSetting",
    "NotDoublyStochasticWarning",
    "Topology",
    "bound_matrix",
    "build",
    "complete",
    "double_ring",
    "from_edge_file",
    "from_edge_lines",
    "hierarchical",
    "ring",
    "ring_based",
    "table1",
    "token_queue_capacity",
]
