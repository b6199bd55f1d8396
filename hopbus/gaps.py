"""Replay iteration changes in order and measure the iteration gap against Table 1.

Feed it every ``(worker, iteration)`` change in the order they happened: the simulator does so
live, and a real run's Redis progress stream gives the same total order. After each change it
knows every Iter(i) - Iter(j) at that instant, and it records the largest gap between adjacent
workers and between any two, plus every instant at which some pair exceeded its own bound.

Only the worker that moved can have widened a gap (iterations never go back), so while no pair
is over its bound a change costs at most one vector comparison against the mover's row of
bounds. Once some pair is over, the mover's row and column are rechecked on every change, so
that ``violations`` counts every instant at which any pair is over, not only the instants at
which a pair goes over.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hopbus.topology import GapSetting, Topology

_UNBOUNDED = 2**30  # stands for the paper's infinity; exact in float32, far above any real gap


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
        self.table1 = topology.table1(setting)
        self._full_bounds = topology.bounds(setting)
        self._set_bounds(self._full_bounds)
        self._all_neighbours = [
            tuple(sorted(set(topology.in_peers[i]) | set(topology.out_peers[i]))) for i in range(n)
        ]
        self._neighbours = list(self._all_neighbours)
        self.gone: set[int] = set()  # dead workers: no longer counted (see membership)
        # After a broker restart the stream may have lost entries: positions are caught up
        # from the workers' restore entries, and nothing is judged until ``end_resync``.
        self.resyncing = False
        self._vec = np.zeros(n, dtype=np.int32)
        self._it = [0] * n
        self._count: dict[int, int] = {0: n}  # iteration -> how many workers are in it
        self._min = 0
        self.max_adjacent = 0
        self.max_any = 0
        self.violations = 0
        self.first_violation: Violation | None = None
        self._over: np.ndarray | None = None  # over[i, j]: i is beyond its bound on j (lazy)
        self._over_count = 0

    def enter(self, worker: int, iteration: int) -> None:
        """``worker`` is now in ``iteration`` (never lower than before)."""
        it = self._it
        old = it[worker]
        it[worker] = iteration
        self._vec[worker] = iteration
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
        if self.resyncing:
            return
        lead = iteration - self._min
        self.max_any = max(self.max_any, lead)
        adj = max((iteration - it[j] for j in self._neighbours[worker]), default=0)
        self.max_adjacent = max(self.max_adjacent, adj)
        if self._over_count or lead > self._row_min[worker]:
            self._recheck(worker, iteration)
        if self._over_count:
            self.violations += 1

    def _set_bounds(self, bounds: np.ndarray) -> None:
        bounds = np.where(np.isinf(bounds), np.float32(_UNBOUNDED), bounds)  # a copy
        self._bounds = bounds.astype(np.int32)
        np.fill_diagonal(bounds, _UNBOUNDED)
        self._row_min = bounds.min(axis=1)  # tightest bound on how far each worker may lead

    def remove(self, worker: int, bounds: np.ndarray) -> None:
        """``worker`` died: from now on it counts for no gap, and the live workers are held to
        ``bounds`` (``membership.bounds_without``: Table 1 in the graph without the dead)."""
        if worker in self.gone:
            return
        self.gone.add(worker)
        old = self._it[worker]
        self._count[old] -= 1
        if not self._count[old]:
            del self._count[old]
        if self._count:
            self._min = min(self._count)
        self._neighbours = [
            tuple(j for j in peers if j not in self.gone) for peers in self._all_neighbours
        ]
        self._neighbours[worker] = ()
        self._set_bounds(bounds)
        self._recount()

    def rejoin(self, worker: int, iteration: int, bounds: np.ndarray) -> None:
        """A replacement for dead ``worker`` joined in ``iteration``; ``bounds`` as for remove."""
        if worker not in self.gone:
            return
        self.gone.discard(worker)
        self._it[worker] = iteration
        self._vec[worker] = iteration
        self._count[iteration] = self._count.get(iteration, 0) + 1
        self._min = min(self._count)
        self._neighbours = [
            tuple(j for j in peers if j not in self.gone) for peers in self._all_neighbours
        ]
        self._set_bounds(bounds)
        self._recount()

    def end_resync(self) -> None:
        """Every live worker's position is known again: judge gaps from here on."""
        self.resyncing = False
        self._recount()

    def _recount(self) -> None:
        """Every pair's over-the-bound flag, afresh (after the bounds changed)."""
        vec = self._vec
        over = (vec[:, None] - vec[None, :]) > self._bounds
        for w in self.gone:
            over[w, :] = False
            over[:, w] = False
        self._over = over if over.any() else None
        self._over_count = int(over.sum())

    def _recheck(self, worker: int, iteration: int) -> None:
        """Which pairs with ``worker`` are over their bound now, in either direction."""
        row = (iteration - self._vec) > self._bounds[worker]  # worker too far ahead of j
        if self._over is None:
            if not row.any():
                return
            self._over = np.zeros(self._bounds.shape, dtype=bool)
        col = (self._vec - iteration) > self._bounds[:, worker]  # j too far ahead of worker
        over = self._over
        self._over_count += (
            int(row.sum()) - int(over[worker].sum()) + int(col.sum()) - int(over[:, worker].sum())
        )
        over[worker] = row
        over[:, worker] = col
        if self.first_violation is None and row.any():
            j = int(np.argmax(row))
            self.first_violation = Violation(
                worker, j, int(iteration - self._it[j]), int(self._bounds[worker, j])
            )

    def start_at(self, iteration: int) -> None:
        """Every worker is in ``iteration``, before any change is fed: a run resumed from a
        checkpoint set starts all its workers there, so no gap is seen."""
        n = len(self._it)
        self._it = [iteration] * n
        self._vec[:] = iteration
        self._count = {iteration: n}
        self._min = iteration

    def iteration_of(self, worker: int) -> int:
        return self._it[worker]
