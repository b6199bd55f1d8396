"""``Topology``: one validated graph plus what every layer keeps asking of it, computed once."""

from __future__ import annotations

import warnings
from functools import cached_property
from typing import Any

import networkx as nx
import numpy as np

from hopbus.topology import analysis
from hopbus.topology.bounds import GapSetting, bound_matrix, neighbour_bound, table1
from hopbus.topology.graphs import WEIGHT, build

SPECTRAL_LIMIT = 2000  # dense eigenvalues of W: O(n^3), about 4 s at 1000 workers here


class NotDoublyStochasticWarning(UserWarning):
    """W's rows do not sum to 1: training still runs, but the convergence results do not apply."""


class Topology:
    """A strongly connected communication graph with self-loops and eq. (1) (or file) weights.

    ``in_peers[i]`` and ``out_peers[i]`` leave out the self-loop: they are the workers ``i``
    receives from and sends to over the network. Its own parameters always join its Reduce.
    """

    def __init__(self, graph: nx.DiGraph, name: str = "custom") -> None:
        analysis.require_strongly_connected(graph, name)
        self.graph = graph
        self.name = name
        self._bounds: tuple[GapSetting, np.ndarray] | None = None
        self.n = graph.number_of_nodes()
        self.in_peers: tuple[tuple[int, ...], ...] = tuple(
            tuple(sorted(j for j in graph.predecessors(i) if j != i)) for i in range(self.n)
        )
        self.out_peers: tuple[tuple[int, ...], ...] = tuple(
            tuple(sorted(j for j in graph.successors(i) if j != i)) for i in range(self.n)
        )

    @classmethod
    def named(cls, name: str, n: int | None) -> Topology:
        """Build and validate the graph a ``--topology`` string names; warn if W is not doubly
        stochastic (the paper's convergence needs it, but a user may know better)."""
        topo = cls(build(name, n), name=name)
        if not topo.doubly_stochastic:
            _, rows = analysis.graph_defects(topo.graph)
            warnings.warn(
                f"topology {name!r}: W is not doubly stochastic (a row sums {rows:.3g} away "
                "from 1); decentralized SGD may converge to a biased average",
                NotDoublyStochasticWarning,
                stacklevel=2,
            )
        return topo

    def weight(self, src: int, dst: int) -> float:
        """W[src, dst]: the share of ``src``'s parameters in ``dst``'s average."""
        return float(self.graph.edges[src, dst][WEIGHT])

    @cached_property
    def weights(self) -> np.ndarray:
        """W as a dense n x n matrix (the spectral gap's); ``weight`` reads one entry."""
        return analysis.weight_matrix(self.graph)

    @cached_property
    def distances(self) -> np.ndarray:
        """``D[i, j]`` = length(Path_{i->j}), as an n x n matrix: for small graphs only (a
        run's own checks use ``paths``)."""
        return analysis.distance_matrix(self.graph)

    @cached_property
    def paths(self) -> analysis.PathFacts:
        """What Table 1 needs of the shortest paths, without an n x n matrix."""
        return analysis.path_facts(self.graph)

    def return_distance(self, src: int, dst: int) -> int:
        """length(Path_{dst->src}) for an edge src -> dst: how far its way back is."""
        if not self.paths.return_of:
            return 1  # every edge goes both ways
        return self.paths.return_of[(src, dst)]

    def neighbour_bound(self, i: int, j: int, setting: GapSetting) -> float:
        """Table 1's bound on Iter(i) - Iter(j) for neighbours i and j (an edge either way;
        ``inf``: none): ``bounds(setting)[i, j]`` without the matrix."""
        to_j = 1 if j in self.out_peers[i] else self.return_distance(j, i)  # Path i->j
        to_i = 1 if j in self.in_peers[i] else self.return_distance(i, j)  # Path j->i
        return neighbour_bound(setting, to_j, to_i)

    @cached_property
    def spectral_gap(self) -> float | None:
        """|lambda_1(W)| - |lambda_2(W)|; None above ``SPECTRAL_LIMIT`` workers, where dense
        eigenvalues would take minutes."""
        if self.n > SPECTRAL_LIMIT:
            return None
        return analysis.spectral_gap(self.weights)

    @property
    def brief(self) -> dict[str, Any]:
        """What a run's summary says about its graph."""
        return {"name": self.name, "diameter": self.diameter, "spectral_gap": self.spectral_gap}

    @property
    def doubly_stochastic(self) -> bool:
        cols, rows = analysis.graph_defects(self.graph)
        return max(cols, rows) <= analysis.STOCHASTIC_TOLERANCE

    @property
    def diameter(self) -> int:
        return self.paths.diameter

    def bounds(self, setting: GapSetting) -> np.ndarray:
        """Per-pair Table 1 bounds: ``B[i, j]`` bounds Iter(i) - Iter(j) (inf: none).

        Read-only, n x n: for small graphs (``hopbus top``, a run that lost a worker); planning
        a run, checking it and summarising it use ``neighbour_bound``, ``table1`` and the
        gap monitor's per-edge limits instead. The most recent setting's matrix is kept."""
        if self._bounds is None or self._bounds[0] != setting:
            b = bound_matrix(setting, self.distances)
            b.flags.writeable = False
            self._bounds = (setting, b)
        return self._bounds[1]

    def table1(self, setting: GapSetting) -> dict[str, float | None]:
        """Table 1's columns maximised over this graph (``bounds.table1``)."""
        return table1(setting, self.paths)

    def in_degree(self, i: int) -> int:
        """Number of in-neighbours, the self-loop not counted."""
        return len(self.in_peers[i])
