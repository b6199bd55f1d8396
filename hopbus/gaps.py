"""Replay iteration changes in order and measure the iteration gap against Table 1.

Feed it every ``(worker, iteration)`` change in the order they happened: the simulator does so
live, and a real run's Redis progress stream gives the same total order. After each change it
knows every Iter(i) - Iter(j) at that instant, and it records the largest gap between adjacent
workers and between any two, plus every instant at which some pair exceeded its own bound.

Every pair is checked, exactly, without an n x n matrix. Table 1's bound on Iter(i) - Iter(j) is
min(b0 x length(Path j->i), back x length(Path i->j)) (``topology.bounds``): per-hop limits
composed along shortest paths. So some pair is over its bound exactly when some *edge* is over
its own limit: Iter(i) - Iter(j) <= b0 for each edge j -> i and <= back for each edge i -> j.
(If every edge holds, summing them along Path j->i gives Iter(i) - Iter(j) <= b0 x its length,
and along Path i->j <= back x its length; and an edge's limit is never below its pair's bound,
whose paths are of length 1.) The largest gap between any two workers is the largest
iteration minus the smallest. So a change costs the mover's neighbours only: its edges' limits
and the running minimum. The same holds between the live workers of a run that lost some,
edges to the dead left out (``protocol.membership.bounds_without``).

While no edge is over its limit a change is checked against the mover's tightest limit only;
once some is over, the mover's edges are rechecked on every change, so that ``violations``
counts every instant at which any pair is over, not only the instants at which a pair goes
over. The first violation names the pair the n x n check would (the lowest-numbered worker the
mover is too far ahead of), found from two breadth-first searches when it happens (the first
time some pair is over, the mover is one of it: before its move no edge was over).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from hopbus.topology import GapSetting, Topology
from hopbus.topology.bounds import neighbour_bound

PAIRS_CHECKED = "all"
"""What the summary's ``pairs_checked`` says: every pair, exactly (through the edges, above)."""


@dataclass(frozen=True)
class Violation:
    """The first pair seen over its bound: ``ahead`` was ``gap`` iterations ahead of ``behind``."""

    ahead: int
    behind: int
    gap: int
    bound: int


class GapMonitor:
    def __init__(self, topology: Topology, setting: GapSetting) -> None:
        n = topology.n
        self.topology = topology
        self.setting = setting
        self.table1 = topology.table1(setting)
        f, b = setting.forward, setting.backward
        # per worker i: (j, limit on Iter(i) - Iter(j), limit on Iter(j) - Iter(i)) per neighbour
        self._all_edges: list[tuple[tuple[int, float, float], ...]] = []
        for i in range(n):
            ins, outs = set(topology.in_peers[i]), set(topology.out_peers[i])
            self._all_edges.append(
                tuple(
                    (j, min(f if j in ins else math.inf, b if j in outs else math.inf),
                     min(f if j in outs else math.inf, b if j in ins else math.inf))
                    for j in sorted(ins | outs)
                )
            )  # fmt: skip
        self.gone: set[int] = set()  # dead workers: no longer counted (see membership)
        self._set_edges()
        # After a broker restart the stream may have lost entries: positions are caught up
        # from the workers' restore entries, and nothing is judged until ``end_resync``.
        self.resyncing = False
        self._it = [0] * n
        self._count: dict[int, int] = {0: n}  # iteration -> how many workers are in it
        self._min = 0
        self.max_adjacent = 0
        self.max_any = 0
        self.violations = 0
        self.first_violation: Violation | None = None
        self._over: set[tuple[int, int]] = set()  # (i, j): Iter(i) - Iter(j) over the edge's limit
        self._unsure: set[int] = set()  # placed after lost entries: no gap judged with them

    def _set_edges(self) -> None:
        """Each worker's edges between live workers, and its tightest limit on leading one."""
        gone = self.gone
        self._edges = [
            () if i in gone else tuple(e for e in edges if e[0] not in gone)
            for i, edges in enumerate(self._all_edges)
        ]
        self._neighbours = [tuple(e[0] for e in edges) for edges in self._edges]
        self._lead_limit = [min((e[1] for e in edges), default=math.inf) for edges in self._edges]

    def place(self, worker: int, iteration: int) -> None:
        """``worker`` is in ``iteration``, as an entry that follows entries of it that were
        lost says (deleted from the stream before it was read): no gap with it is judged until
        its next step confirms where it is (an entry written out of turn must not fake a
        broken bound)."""
        self._move(worker, iteration)
        self.doubt(worker)

    def doubt(self, worker: int) -> None:
        """Entries of ``worker`` may have been lost: no gap with it is judged until its next
        step says where it is (its last known iteration may be behind where it is)."""
        self._unsure.add(worker)
        self._over = {(i, j) for i, j in self._over if worker not in (i, j)}

    def _move(self, worker: int, iteration: int) -> None:
        it = self._it
        old = it[worker]
        it[worker] = iteration
        count = self._count  # only iterations someone is in
        count[old] -= 1
        if not count[old]:
            del count[old]
        count[iteration] = count.get(iteration, 0) + 1
        if old == self._min and old not in count:  # the last one left the slowest iteration
            m = old + 1
            while m not in count:
                m += 1
            self._min = m

    def enter(self, worker: int, iteration: int) -> None:
        """``worker`` is now in ``iteration`` (never lower than before)."""
        unsure = self._unsure
        if unsure:
            unsure.discard(worker)  # its step confirms where it is
        self._move(worker, iteration)
        if self.resyncing:
            return
        lead = iteration - self._min
        self.max_any = max(self.max_any, lead)
        it, peers = self._it, self._neighbours[worker]
        adj = max((iteration - it[j] for j in peers if j not in unsure), default=0)
        self.max_adjacent = max(self.max_adjacent, adj)
        if self._over or adj > self._lead_limit[worker]:
            self._recheck(worker, iteration)
        if self._over:
            self.violations += 1
            if self.first_violation is None:
                self.first_violation = self._first_pair(worker, iteration)

    def remove(self, worker: int) -> None:
        """``worker`` died: from now on it counts for no gap, and the live workers are held to
        Table 1 in the graph without it (that graph's ``bounds_without`` matrix is not needed:
        its bounds are the live edges' limits composed, as above)."""
        if worker in self.gone:
            return
        self.gone.add(worker)
        old = self._it[worker]
        self._count[old] -= 1
        if not self._count[old]:
            del self._count[old]
        if self._count:
            self._min = min(self._count)
        self._set_edges()
        self._recount()

    def rejoin(self, worker: int, iteration: int) -> None:
        """A replacement for dead ``worker`` joined in ``iteration``."""
        if worker not in self.gone:
            return
        self.gone.discard(worker)
        self._it[worker] = iteration
        self._count[iteration] = self._count.get(iteration, 0) + 1
        self._min = min(self._count)
        self._set_edges()
        self._recount()

    def end_resync(self) -> None:
        """Every live worker's position is known again: judge gaps from here on."""
        self.resyncing = False
        self._recount()

    def _recount(self) -> None:
        """Every edge's over-the-limit flags, afresh (after the live workers changed)."""
        it, unsure = self._it, self._unsure
        self._over = {
            (i, j) for i, edges in enumerate(self._edges) for j, lead, _ in edges
            if it[i] - it[j] > lead and i not in unsure and j not in unsure
        }  # fmt: skip

    def _recheck(self, worker: int, iteration: int) -> None:
        """Which of ``worker``'s edges are over their limit now, in either direction."""
        it, over, unsure = self._it, self._over, self._unsure
        for j, lead, trail in self._edges[worker]:
            if j in unsure:
                continue
            gap = iteration - it[j]
            if gap > lead:
                over.add((worker, j))
            else:
                over.discard((worker, j))
            if -gap > trail:
                over.add((j, worker))
            else:
                over.discard((j, worker))

    def _first_pair(self, worker: int, iteration: int) -> Violation | None:
        """The pair the n x n check names: the lowest-numbered live worker j that ``worker`` is
        further ahead of than Table 1 allows, with lengths of paths between live workers (None
        if there is none: the pairs over their bounds do not involve the mover)."""
        g = self.topology.graph
        if self.gone:
            g = nx.restricted_view(g, list(self.gone), [])
        to_j = nx.single_source_shortest_path_length(g, worker)  # Path worker->j
        to_i = nx.single_source_shortest_path_length(nx.reverse_view(g), worker)  # j->worker
        inf = math.inf
        for j in sorted(to_j.keys() | to_i.keys()):  # a path one way may be all that binds
            bound = neighbour_bound(self.setting, to_j.get(j, inf), to_i.get(j, inf))
            gap = iteration - self._it[j]
            if j != worker and gap > bound:
                return Violation(worker, j, gap, int(bound))
        return None

    def start_at(self, iteration: int) -> None:
        """Every worker is in ``iteration``, before any change is fed: a run resumed from a
        checkpoint set starts all its workers there, so no gap is seen."""
        n = len(self._it)
        self._it = [iteration] * n
        self._count = {iteration: n}
        self._min = iteration

    def iteration_of(self, worker: int) -> int:
        return self._it[worker]
