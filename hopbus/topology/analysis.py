"""What a communication graph implies: W (eq. 1), doubly stochasticity, spectral gap, distances."""

from __future__ import annotations

from collections import deque

import networkx as nx
import numpy as np

from hopbus.errors import TopologyError
from hopbus.topology.graphs import WEIGHT

#: Rows of W may be off by this much and still count as summing to one.
STOCHASTIC_TOLERANCE = 1e-9


def weight_matrix(g: nx.DiGraph) -> np.ndarray:
    """W with ``W[i, j]`` = weight of edge i -> j: the share of i's parameters in j's average."""
    n = g.number_of_nodes()
    w = np.zeros((n, n))
    for i, j, data in g.edges(data=True):
        w[i, j] = data.get(WEIGHT, 0.0)
    return w


def stochastic_defects(w: np.ndarray) -> tuple[float, float]:
    """Largest deviation from 1 of a column sum and of a row sum of W.

    Columns are each worker's averaging coefficients and always sum to 1 by construction; rows
    summing to 1 as well (doubly stochastic) is what the convergence results of Sec. 3.1 need.
    """
    cols = float(np.max(np.abs(w.sum(axis=0) - 1.0)))
    rows = float(np.max(np.abs(w.sum(axis=1) - 1.0)))
    return cols, rows


def is_doubly_stochastic(w: np.ndarray) -> bool:
    cols, rows = stochastic_defects(w)
    return cols <= STOCHASTIC_TOLERANCE and rows <= STOCHASTIC_TOLERANCE


def spectral_gap(w: np.ndarray) -> float:
    """|lambda_1(W)| - |lambda_2(W)|, eigenvalues ordered by modulus (footnote 2 of Sec. 7.3.6).

    The bigger the gap, the faster information spreads. Computed densely: fine for the
    hundreds-of-workers graphs this is meant for.
    """
    mods = np.sort(np.abs(np.linalg.eigvals(w)))[::-1]
    if len(mods) < 2:
        return float(mods[0]) if len(mods) else 0.0
    return float(mods[0] - mods[1])


def require_strongly_connected(g: nx.DiGraph, name: str) -> None:
    """Refuse a graph in which some worker's updates can never reach some other worker."""
    if g.number_of_nodes() < 2:
        raise TopologyError(f"topology {name!r} needs at least 2 workers")
    if nx.is_strongly_connected(g):
        return
    dist = distances_from(g, 0)
    unreached = [v for v in range(g.number_of_nodes()) if dist[v] < 0]
    if unreached:
        raise TopologyError(
            f"topology {name!r} is not strongly connected: "
            f"worker 0 cannot reach worker {unreached[0]}"
        )
    for v in range(1, g.number_of_nodes()):
        if distances_from(g, v)[0] < 0:
            raise TopologyError(
                f"topology {name!r} is not strongly connected: worker {v} cannot reach worker 0"
            )
    raise TopologyError(f"topology {name!r} is not strongly connected")  # pragma: no cover


def distances_from(g: nx.DiGraph, source: int) -> list[int]:
    """Hop counts of the shortest directed paths from ``source`` (-1 where unreachable)."""
    n = g.number_of_nodes()
    dist = [-1] * n
    dist[source] = 0
    frontier = deque([source])
    succ = g._succ  # adjacency dict; avoids a view object per node on big graphs
    while frontier:
        u = frontier.popleft()
        du = dist[u] + 1
        for v in succ[u]:
            if dist[v] < 0:
                dist[v] = du
                frontier.append(v)
    return dist


def distance_matrix(g: nx.DiGraph) -> np.ndarray:
    """``D[i, j]`` = length(Path_{i->j}), the shortest directed path from i to j (-1: none)."""
    n = g.number_of_nodes()
    d = np.empty((n, n), dtype=np.int32)  # n^2 entries: keep them small for big graphs
    for i in range(n):
        d[i] = distances_from(g, i)
    return d
