"""What a communication graph implies: W (eq. 1), doubly stochasticity, spectral gap, distances."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

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


def graph_defects(g: nx.DiGraph) -> tuple[float, float]:
    """``stochastic_defects`` of the graph's W, from its edges alone (no n x n matrix)."""
    n = g.number_of_nodes()
    cols = np.zeros(n)
    rows = np.zeros(n)
    for i, j, data in g.edges(data=True):
        w = data.get(WEIGHT, 0.0)
        rows[i] += w
        cols[j] += w
    return float(np.max(np.abs(cols - 1.0))), float(np.max(np.abs(rows - 1.0)))


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


PATH_CHUNK_ENTRIES = 4_000_000
"""Distances computed at a time (rows of sources x n): about 32 MB of float64 per pass."""


@dataclass(frozen=True)
class PathFacts:
    """What Table 1 needs of a graph's shortest paths, kept without an n x n matrix.

    ``diameter``: the longest shortest path. ``return_of[(u, v)]`` for each edge u -> v:
    length(Path v->u), the way back (empty for a two-way graph, where it is always 1);
    ``max_return`` the longest of them. ``pairs``: the pairs (length(Path i->j),
    length(Path j->i)) over i != j that no other pair exceeds in both (a Pareto front: the
    largest pairwise bound of any setting is reached on one of them)."""

    diameter: int
    max_return: int
    return_of: dict[tuple[int, int], int]
    pairs: tuple[tuple[int, int], ...]


def is_two_way(g: nx.DiGraph) -> bool:
    """Whether every edge has its reverse (then length(Path i->j) == length(Path j->i))."""
    succ = g._succ
    return all(u in succ[v] for u, vs in succ.items() for v in vs)


def _adjacency(g: nx.DiGraph, n: int, reverse: bool = False):
    from scipy.sparse import csr_array

    src, dst = [], []
    for u, v in g.edges:
        if u != v:
            src.append(u)
            dst.append(v)
    rows, cols = (dst, src) if reverse else (src, dst)
    data = np.ones(len(rows), dtype=np.int8)
    return csr_array((data, (np.array(rows), np.array(cols))), shape=(n, n))


def path_facts(g: nx.DiGraph) -> PathFacts:
    """``PathFacts`` of a strongly connected graph: one breadth-first search from every worker
    (two, forwards and backwards, on a graph with one-way edges), done by scipy in chunks of
    sources, so time grows as n x edges and memory as n (seconds at 10,000 workers)."""
    from scipy.sparse.csgraph import shortest_path

    n = g.number_of_nodes()
    succ = g._succ
    if all(len(succ[v]) - (v in succ[v]) == n - 1 for v in succ):  # complete: every path is 1
        return PathFacts(1, 1, {}, ((1, 1),))
    two_way = is_two_way(g)
    fwd = _adjacency(g, n)
    back = None if two_way else _adjacency(g, n, reverse=True)
    chunk = max(1, PATH_CHUNK_ENTRIES // n)
    diameter = 0
    return_of: dict[tuple[int, int], int] = {}
    found: set[int] = set()  # pairs (a, c) as a * (n + 1) + c
    for start in range(0, n, chunk):
        sources = np.arange(start, min(n, start + chunk))
        d = shortest_path(fwd, unweighted=True, indices=sources)  # d[r, j] = Path i->j
        if not np.isfinite(d).all():
            raise AssertionError("path_facts needs a strongly connected graph")
        diameter = max(diameter, int(d.max()))
        if back is None:
            continue
        dt = shortest_path(back, unweighted=True, indices=sources)  # dt[r, j] = Path j->i
        for r, i in enumerate(sources.tolist()):
            for v in succ[i]:  # edge i -> v: the way back is Path v->i
                if v != i:
                    return_of[(i, v)] = int(dt[r, v])
        codes = d.astype(np.int64) * (n + 1) + dt.astype(np.int64)
        codes[np.arange(len(sources)), sources] = -1  # i == j is no pair
        found.update(np.unique(codes).tolist())
    if back is None:
        return PathFacts(diameter, 1, {}, ((diameter, diameter),))
    found.discard(-1)
    pairs = sorted(((c // (n + 1), c % (n + 1)) for c in found), reverse=True)
    front: list[tuple[int, int]] = []
    best_c = -1
    for a, c in pairs:  # by decreasing a: keep those with a larger c than every earlier one
        if c > best_c:
            front.append((a, c))
            best_c = c
    return PathFacts(diameter, max(return_of.values()), return_of, tuple(front))


def largest_bound(forward: float, backward: float, pairs: tuple[tuple[int, int], ...]) -> float:
    """max over pairs (a, c) = (Path i->j, Path j->i) of min(forward x c, backward x a): the
    largest bound on Iter(i) - Iter(j) over every pair (``topology.bounds``)."""
    best = 0.0
    for a, c in pairs:
        best = max(best, min(forward * c, backward * a))
        if math.isinf(best):
            break
    return best
