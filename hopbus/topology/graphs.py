"""Communication graphs as data: weighted networkx DiGraphs with a self-loop on every node.

An edge ``i -> j`` means worker ``i`` sends its parameters to worker ``j`` (Sec. 3.1), so
``N_in(j)`` are the workers ``j`` averages with. Every node carries a self-loop: a worker's own
parameters always take part in its Reduce. The edge attribute ``weight`` is ``W[i, j]``, the share
of ``i``'s parameters in ``j``'s average; builders set eq. (1), ``1 / |N_in(j)|`` with the
self-loop counted.

Nothing here moves bytes. The runtime and the simulator only ever read these graphs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import networkx as nx

from hopbus.errors import TopologyError
from hopbus.userfiles import read_text

WEIGHT = "weight"
# ASCII digits only (int() would also take other scripts' digits), and few of them: int() refuses
# more than 4,300 digits with a ValueError, and no count hopbus takes needs more than nine
_INT = re.compile(r"[0-9]{1,9}")

#: The most workers a graph may have. Nothing keeps an n x n matrix for a run (Table 1 is
#: checked through the edges, hopbus/gaps.py), but its bounds need the shortest paths from every
#: worker: breadth-first searches that take time n x edges (2 s at 10,000 workers on the
#: ring-based graph, about 7 s at 20,000; twice that for graphs with one-way edges).
MAX_WORKERS = 20_000

#: The most edges a graph may have (1,000,000: a complete graph of 1,000 workers, whose report
#: takes some 12 s); every edge is a networkx edge and, in a run, a token queue. 4,000,000 let
#: a complete graph of 2,000 workers, or a file of 3,000,000 edges, run for minutes in silence.
MAX_EDGES = 1_000_000

#: The most steps the Table 1 bounds may take, workers x edges: a breadth-first search from
#: every worker (about 15 s at this many; a complete graph needs none, its paths are all 1).
MAX_PATH_WORK = 2_000_000_000

#: Names accepted by :func:`build`, with the one-line meaning shown in ``--help`` and errors.
NAMES: dict[str, str] = {
    "ring": "bidirectional ring",
    "ring-based": "ring plus an edge to the most distant node (Fig. 11)",
    "double-ring": "two ring-based graphs of n/2 workers joined node to node (Fig. 11)",
    "complete": "every worker averages with every other (all-reduce pattern)",
    "hierarchical:A,B,...": "complete inside machines of A, B, ... workers; ring between machines",
    "file:PATH": "edge list, one 'src dst [weight]' per line",
}


def _bidirectional(g: nx.DiGraph, a: int, b: int) -> None:
    g.add_edge(a, b)
    g.add_edge(b, a)


def _empty(n: int) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    return g


def with_self_loops_and_eq1(g: nx.DiGraph) -> nx.DiGraph:
    """Add a self-loop to every node and weight every edge per eq. (1): W_ij = 1/|N_in(j)|."""
    for v in g.nodes:
        g.add_edge(v, v)
    for j in g.nodes:
        preds = list(g.predecessors(j))
        for i in preds:
            g.edges[i, j][WEIGHT] = 1.0 / len(preds)
    return g


def _require(n: int, least: int, name: str, edges: int = 0) -> None:
    """``n`` workers (and ``edges`` edges, self-loops not counted) are within hopbus's limits."""
    if n < least:
        alone = (
            ": every worker averages with others, so the smallest run (to try a script in, "
            "say) has 2"
            if n == 1
            else ""
        )
        raise TopologyError(f"{name} needs at least {least} workers (got {n}){alone}")
    if n > MAX_WORKERS:
        raise TopologyError(
            f"{name} with {n} workers is more than hopbus handles ({MAX_WORKERS}): its "
            "Table 1 bounds need a breadth-first search from every worker"
        )
    if edges > MAX_EDGES:
        raise TopologyError(
            f"{name} with {n} workers has {edges} edges, more than hopbus handles "
            f"({MAX_EDGES}): every edge is a token queue"
        )
    if edges != n * (n - 1) and n * edges > MAX_PATH_WORK:
        raise TopologyError(
            f"{name} with {n} workers and {edges} edges is more than hopbus handles: its "
            f"Table 1 bounds need a breadth-first search from every worker, {n} x {edges} "
            f"steps (at most {MAX_PATH_WORK:,}: 20,000 workers with 100,000 edges)"
        )


def ring(n: int) -> nx.DiGraph:
    """Workers in a circle, each exchanging with both ring neighbours (Fig. 11, graph 1)."""
    _require(n, 2, "ring")
    g = _empty(n)
    for i in range(n):
        _bidirectional(g, i, (i + 1) % n)
    return with_self_loops_and_eq1(g)


def _add_ring_based(g: nx.DiGraph, nodes: Sequence[int]) -> None:
    m = len(nodes)
    for x in range(m):
        _bidirectional(g, nodes[x], nodes[(x + 1) % m])
    # The most distant node is m/2 hops away. With an odd m a node has two antipodes; an edge
    # x -> x + (m-1)/2 links every node to both of them (one out, one in) and keeps every in- and
    # out-degree equal, so W stays doubly stochastic.
    half = m // 2
    for x in range(m):
        far = nodes[(x + half) % m]
        if m % 2 == 0:
            _bidirectional(g, nodes[x], far)
        else:
            g.add_edge(nodes[x], far)


def ring_based(n: int) -> nx.DiGraph:
    """Ring plus an edge from every worker to the most distant one (Fig. 11, graph 2)."""
    _require(n, 2, "ring-based")
    g = _empty(n)
    _add_ring_based(g, list(range(n)))
    return with_self_loops_and_eq1(g)


def double_ring(n: int) -> nx.DiGraph:
    """Two ring-based graphs of n/2 workers, worker x of one joined to worker x of the other."""
    if n < 4 or n % 2:
        raise TopologyError(f"double-ring needs an even number of workers, at least 4 (got {n})")
    half = n // 2
    g = _empty(n)
    _add_ring_based(g, list(range(half)))
    _add_ring_based(g, list(range(half, n)))
    for x in range(half):
        _bidirectional(g, x, x + half)
    return with_self_loops_and_eq1(g)


def complete(n: int) -> nx.DiGraph:
    """Every worker sends to every other one."""
    _require(n, 2, "complete", n * (n - 1))
    g = _empty(n)
    for i in range(n):
        for j in range(n):
            if i != j:
                g.add_edge(i, j)
    return with_self_loops_and_eq1(g)


def hierarchical(sizes: Sequence[int]) -> nx.DiGraph:
    """Complete inside each machine, a ring between machines (Sec. 7.3.6, Fig. 21 (b)/(c)).

    Machines hold consecutive worker ids (sizes 4,2,2 give machines {0..3}, {4,5}, {6,7}). The
    ring between machines joins the last worker of machine m to the first worker of machine m+1
    in both directions, so inter-machine traffic is spread over different workers rather than
    funnelled through one gateway.
    """
    if not sizes or any(s < 1 for s in sizes):
        raise TopologyError(
            "hierarchical needs machine sizes of at least 1, e.g. hierarchical:4,2,2"
        )
    n = sum(sizes)
    _require(n, 2, "hierarchical", sum(s * (s - 1) for s in sizes))
    g = _empty(n)
    machines: list[list[int]] = []
    start = 0
    for s in sizes:
        machines.append(list(range(start, start + s)))
        start += s
    for nodes in machines:
        for a in nodes:
            for b in nodes:
                if a != b:
                    g.add_edge(a, b)
    if len(machines) > 1:
        for m, nodes in enumerate(machines):
            nxt = machines[(m + 1) % len(machines)]
            if nodes[-1] != nxt[0]:
                _bidirectional(g, nodes[-1], nxt[0])
    return with_self_loops_and_eq1(g)


def from_edge_lines(lines: Iterable[str], origin: str = "edge list") -> nx.DiGraph:
    """Parse ``src dst [weight]`` lines (``#`` starts a comment) into a graph.

    Workers must be numbered 0..n-1 without holes. Either no line carries a weight (eq. (1) is
    used) or every edge, self-loops included, does; then each worker's incoming weights must sum
    to 1 because they are the coefficients of its average.
    """
    g = nx.DiGraph()
    weighted: list[bool] = []
    for lineno, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        where = f"{origin}, line {lineno}"
        if len(parts) not in (2, 3):
            # what the line holds is not quoted: the file may be anything (docs/security.md)
            raise TopologyError(f"{where}: expected 'src dst [weight]', got {len(parts)} fields")
        if not (_INT.fullmatch(parts[0]) and _INT.fullmatch(parts[1])):
            raise TopologyError(f"{where}: worker ids must be integers from 0 to {MAX_WORKERS - 1}")
        a, b = int(parts[0]), int(parts[1])
        if len(parts) == 3:
            try:
                w = float(parts[2]) if parts[2].isascii() else math.nan  # not '٠.5'
            except ValueError:
                w = math.nan
            if math.isnan(w):
                raise TopologyError(f"{where}: the weight must be a number")
            if not 0 < w <= 1:
                raise TopologyError(f"{where}: weight must be in (0, 1], got {parts[2]!r}")
            if g.has_edge(a, b):  # which weight would count? (the last did, silently)
                raise TopologyError(f"{where}: edge {a} -> {b} is given a weight twice")
            g.add_edge(a, b, **{WEIGHT: w})
        else:
            g.add_edge(a, b)
        weighted.append(len(parts) == 3)
        if len(weighted) > MAX_EDGES + MAX_WORKERS:  # edges and self-loops: refused before
            raise TopologyError(  # the rest of a file of millions is read (_require's limit)
                f"{origin}: more than {MAX_EDGES} edges, more than hopbus handles: every edge "
                "is a token queue"
            )
    if g.number_of_nodes() == 0:
        raise TopologyError(f"{origin}: no edges")
    n = max(g.nodes) + 1
    _require(n, 2, origin, sum(a != b for a, b in g.edges))
    missing = sorted(set(range(n)) - set(g.nodes))
    if missing:
        raise TopologyError(
            f"{origin}: workers must be numbered 0..{n - 1} without gaps (missing {missing[:5]})"
        )
    ordered = _empty(n)  # node order = worker id, whatever order the lines came in
    ordered.add_edges_from(g.edges(data=True))
    g = ordered
    if not any(weighted):
        return with_self_loops_and_eq1(g)
    if not all(weighted):
        raise TopologyError(f"{origin}: give a weight on every edge or on none")
    for v in range(n):
        if not g.has_edge(v, v):
            raise TopologyError(
                f"{origin}: weighted graphs need a self-loop weight 'v v w' for {v}"
            )
        total = sum(g.edges[u, v][WEIGHT] for u in g.predecessors(v))
        if abs(total - 1.0) > 1e-6:
            raise TopologyError(
                f"{origin}: weights into worker {v} sum to {total:g}; they must sum to 1 "
                "(they are the coefficients of its average)"
            )
    return g


def from_edge_file(path: str | Path) -> nx.DiGraph:
    text = read_text(path, "topology file", TopologyError)
    return from_edge_lines(text.splitlines(), origin=str(path))


#: The graphs built for any number of workers; every other name fixes the number itself.
SIZED = {"ring": ring, "ring-based": ring_based, "double-ring": double_ring, "complete": complete}


def _parse_sizes(spec: str) -> list[int]:
    items = [s.strip() for s in spec.split(",")]
    if not all(_INT.fullmatch(s) for s in items):
        raise TopologyError(
            f"hierarchical sizes must be integers like hierarchical:4,2,2 (got {spec!r})"
        )
    return [int(s) for s in items]


def edge_file(name: str) -> str | None:
    """The edge file a ``--topology`` string names (``file:PATH``, or the path of a file that
    is no built-in graph's name), or None: what ``build`` reads, and what a command that
    writes a file, or a stack whose containers cannot read this host's, looks at."""
    key = name.strip()
    if key.startswith("file:"):
        return key.split(":", 1)[1]
    if key.startswith("hierarchical:") or key in ("hierarchical", *SIZED):
        return None
    return key if Path(key).is_file() else None


def build(name: str, n: int | None) -> nx.DiGraph:
    """Build the graph a ``--topology`` string names, for ``n`` workers.

    ``n`` may be None only where the name fixes it (``hierarchical:...``, ``file:...``). Where both
    fix it they must agree.
    """
    key = name.strip()
    path = edge_file(key)
    if key.startswith("hierarchical:"):
        g = hierarchical(_parse_sizes(key.split(":", 1)[1]))
    elif key == "hierarchical":
        raise TopologyError("hierarchical needs machine sizes, e.g. --topology hierarchical:4,2,2")
    elif path is not None:
        g = from_edge_file(path)
    elif key in SIZED:
        if n is None:
            raise TopologyError(f"{key} needs a number of workers")
        return SIZED[key](n)
    else:
        choices = ", ".join(NAMES)
        raise TopologyError(f"unknown topology {name!r} (choose from: {choices})")
    if n is not None and g.number_of_nodes() != n:
        raise TopologyError(
            f"topology {name!r} has {g.number_of_nodes()} workers but {n} were asked for"
        )
    return g
