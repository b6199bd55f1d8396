"""``Topology``: one validated graph plus what every layer keeps asking of it, computed once."""

from __future__ import annotations

import warnings
from functools import cached_property
from typing import Any

import networkx as nx
import numpy as np

from hopbus.topology import analysis
from hopbus.topology.bounds import GapSetting, bound_matrix, table1
from hopbus.topology.graphs import WEIGHT, build

SPECTRAL_LIMIT = 2000  # dense eigenvalues of W: about 1.5 s at 2000 workers, O(n^3)


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
        if not analysis.is_doubly_stochastic(topo.weights):
            _, rows = analysis.stochastic_defects(topo.weights)
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
        return analysis.weight_matrix(self.graph)

    @cached_property
    def distances(self) -> np.ndarray:
        """``D[i, j]`` = length(Path_{i->j})."""
        return analysis.distance_matrix(self.graph)

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
        return analysis.is_doubly_stochastic(self.weights)

    @property
    def diameter(self) -> int:
        return int(self.distances.max())

    def bounds(self, setting: GapSetting) -> np.ndarray:
        """Per-pair Table 1 bounds: ``B[i, j]`` bounds Iter(i) - Iter(j) (inf: none).

        Read-only. The most recent setting's matrix is kept, because planning a run, checking
        it and summarising it all ask for the same one; only one, because it is n x n."""
        if self._bounds is None or self._bounds[0] != setting:
            b = bound_matrix(setting, self.distances)
            b.flags.writeable = False
            self._bounds = (setting, b)
        return self._bounds[1]

    def table1(self, setting: GapSetting) -> dict[str, float | None]:
        return table1(self.bounds(setting), self.distances)

    def in_degree(self, i: int) -> int:
        """Number of in-neighbours, the self-loop not counted."""
        return len(self.in_peers[i])
