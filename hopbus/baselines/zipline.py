"""ElasticBSP's barrier choice: when the parameter server imposes the next synchronization barrier.

ElasticBSP (Zhao et al., "ElasticBSP/ZipLine", elasticbsp-zipline.txt) replaces BSP's barrier
after every iteration with one decision per superstep: the server predicts each worker's next R
iteration end times from the interval between its last two pushes (Sec. 4, :func:`predict`) and
picks one predicted time per worker so that the spread ``d_Z = max(Z) - min(Z)``, the longest
wait at the barrier, is smallest (Problem 1, Sec. 4.1). Among equal spreads the earliest barrier
``t_sync = max(Z)`` wins, since a shorter superstep leaves less stale gradients (Sec. 4.2,
Theorem 1, Corollary 1).

Three solvers share that definition of the optimum:

* :func:`zipline`: ZipLine (Sec. 5.2, Algorithm 2, with the ZipLineOpt pruning of Sec. 5.3.1),
  exact, a merge of the n sorted rows plus one sliding-window pass, O(Rn log n);
* :func:`gridscan`: GridScan (Sec. 5.1, Algorithm 1), the paper's heuristic baseline, which can
  miss the optimum;
* :func:`brute_force`: naive search over all R^n choices (Sec. 5.1), the oracle for tiny inputs.

All three report the same kind of answer: for the chosen window ``[t_sync - spread, t_sync]``
each worker takes its *latest* predicted time inside it (same spread and barrier, less waiting),
so equal optima give equal :class:`Barrier` values. Pure code: no I/O, no clocks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BRUTE_FORCE_LIMIT = 10**7
"""The most candidate sets :func:`brute_force` agrees to enumerate (it is an oracle for tests)."""


@dataclass(frozen=True)
class Barrier:
    """One barrier decision: a predicted end time per worker and what it costs."""

    choice: tuple[int, ...]
    """Per worker p, the 0-based index i of its chosen predicted end time ``times[p][i]``."""
    spread: float
    """``d_Z``: max - min of the chosen times, the longest wait at the barrier."""
    t_sync: float
    """Max of the chosen times: when the barrier releases."""


def predict(last: float, interval: float, r: int) -> list[float]:
    """ElasticBSP's lookahead (Sec. 4): ``[last + k * interval for k in 1..r]``.

    ``last`` is the worker's latest push time and ``interval`` the gap between its last two
    pushes; ``r >= 1`` and ``interval >= 0``.
    """
    if r < 1:
        raise ValueError(f"r must be at least 1, got {r}")
    if not interval >= 0 or not math.isfinite(interval) or not math.isfinite(last):
        raise ValueError(f"need a finite last and interval >= 0, got {last=}, {interval=}")
    return [last + k * interval for k in range(1, r + 1)]


@dataclass(frozen=True)
class _Rows:
    """The validated input, flattened: worker p's times are ``flat[starts[p]:starts[p + 1]]``."""

    flat: np.ndarray  # float64, every row's times one after another
    starts: np.ndarray  # int64, n + 1 offsets into flat

    @property
    def n(self) -> int:
        return len(self.starts) - 1

    def row(self, p: int) -> np.ndarray:
        return self.flat[self.starts[p] : self.starts[p + 1]]


def _rows(times: Sequence[Sequence[float]]) -> _Rows:
    """Flatten and check: at least one worker, no empty row, finite values, rows ascending."""
    if isinstance(times, np.ndarray) and times.ndim == 2:
        if times.shape[0] == 0:
            raise ValueError("times is empty: need the predicted end times of at least one worker")
        if times.shape[1] == 0:
            raise ValueError("worker 0 has no predicted end times")
        flat = np.ascontiguousarray(times, dtype=np.float64).reshape(-1)
        lengths = np.full(times.shape[0], times.shape[1], dtype=np.int64)
    else:
        if len(times) == 0:
            raise ValueError("times is empty: need the predicted end times of at least one worker")
        lengths = np.fromiter((len(row) for row in times), dtype=np.int64, count=len(times))
        if not lengths.all():
            p = int(np.argmin(lengths))
            raise ValueError(f"worker {p} has no predicted end times")
        flat = np.fromiter(
            itertools.chain.from_iterable(times), dtype=np.float64, count=int(lengths.sum())
        )
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    if not np.isfinite(flat).all():
        k = int(np.argmin(np.isfinite(flat)))
        p = int(np.searchsorted(starts, k, side="right")) - 1
        raise ValueError(f"worker {p} has a non-finite predicted end time {flat[k]}")
    falls = np.flatnonzero(flat[1:] < flat[:-1]) + 1  # k: flat[k] < flat[k - 1]
    if len(falls):
        falls = falls[~np.isin(falls, starts)]  # a new row may start lower
        if len(falls):
            k = int(falls[0])
            p = int(np.searchsorted(starts, k, side="right")) - 1
            i = k - int(starts[p])
            raise ValueError(
                f"worker {p}'s predicted end times must be ascending: "
                f"times[{p}][{i - 1}] = {flat[k - 1]} > times[{p}][{i}] = {flat[k]}"
            )
    return _Rows(flat, starts)


def _barrier(rows: _Rows, t_sync: float) -> Barrier:
    """The barrier at ``t_sync``: each worker's latest predicted time at or before it.

    Every worker must have a time at or before ``t_sync``. When ``t_sync`` is the barrier of
    an optimal window this picks the latest time of every worker inside that window, and the
    spread comes out as the window's width.
    """
    at_or_before = np.add.reduceat((rows.flat <= t_sync).astype(np.int64), rows.starts[:-1])
    choice = at_or_before - 1
    chosen = rows.flat[rows.starts[:-1] + choice]
    return Barrier(tuple(choice.tolist()), float(t_sync - float(chosen.min())), float(t_sync))


def zipline(times: Sequence[Sequence[float]]) -> Barrier:
    """ZipLine (Sec. 5.2, Algorithm 2): the optimal barrier in one pass over the sorted times.

    Every predicted time becomes a triple (t, worker, i), sorted by (t, worker, i) (Step 1). A
    window over that order grows to the right one element at a time and drops elements on the
    left while the leftmost worker appears more than once, so it ends as the narrowest window
    ending at the newest element that holds every worker (Step 2). Its width ``t_right - t_left``
    is a candidate ``d_Z``; only strict improvements are kept, so on ties the earliest barrier
    wins (Fig. 9). If the new element's worker is not the leftmost one, the window cannot
    narrow and the width cannot improve (Theorem 3, ZipLineOpt), so that case costs O(1).
    The sort is numpy's stable sort (timsort), which merges the n already ascending rows, in
    the place of the paper's heap merge: O(Rn log n); the scan is O(Rn).
    """
    rows = _rows(times)
    n = rows.n
    workers = np.repeat(np.arange(n, dtype=np.int64), np.diff(rows.starts))
    # flat is in (worker, i) order already, so a stable sort on t alone orders by (t, worker, i)
    order = np.argsort(rows.flat, kind="stable")
    ts: list[float] = rows.flat[order].tolist()
    ws: list[int] = workers[order].tolist()

    count = [0] * n
    covered = 0
    left = 0
    best_d = math.inf
    best_t = ts[0]
    for right, w in enumerate(ws):
        c = count[w] + 1
        count[w] = c
        if c == 1:  # a worker new to the window
            covered += 1
        elif w == ws[left]:  # the leftmost worker came again: narrow from the left
            count[w] = c - 1
            left += 1
            lw = ws[left]
            while count[lw] > 1:
                count[lw] -= 1
                left += 1
                lw = ws[left]
        else:
            continue  # Theorem 3: the left end stays, so the width cannot shrink
        if covered < n:
            continue
        d = ts[right] - ts[left]
        if d < best_d:
            best_d = d
            best_t = ts[right]
            if d == 0:
                break  # nothing beats zero, and later barriers lose the tie
    return _barrier(rows, best_t)


def gridscan(times: Sequence[Sequence[float]]) -> Barrier:
    """GridScan (Sec. 5.1, Algorithm 1): the paper's heuristic baseline, not always optimal.

    The designated row is the worker with the earliest first predicted time (line 4; the lowest
    worker id on ties). Each of its R times makes one candidate set with the closest time of
    every other worker (line 10; the earlier of two equally close times, as a scan keeping
    strict improvements finds it). The candidate with the smallest ``d_Z`` wins, the earliest
    barrier on ties. Finding the closest time by binary search instead of a scan gives the
    same candidates in O(Rn log R) rather than O(R^2 n). The winner's barrier is then reported
    as every worker's latest time at or before it, like the other solvers, which can only
    narrow the winner's spread.
    """
    rows = _rows(times)
    firsts = rows.flat[rows.starts[:-1]]
    designated = int(np.argmin(firsts))
    anchors = rows.row(designated)
    hi_z = anchors.copy()
    lo_z = anchors.copy()
    for q in range(rows.n):
        if q == designated:
            continue
        row = rows.row(q)
        j = np.searchsorted(row, anchors, side="left")  # first index with row[j] >= anchor
        after = row[np.minimum(j, len(row) - 1)]
        before = row[np.maximum(j - 1, 0)]
        take_before = (j > 0) & ((j == len(row)) | (anchors - before <= after - anchors))
        closest = np.where(take_before, before, after)
        np.maximum(hi_z, closest, out=hi_z)
        np.minimum(lo_z, closest, out=lo_z)
    spreads = hi_z - lo_z
    best = int(np.lexsort((hi_z, spreads))[0])
    return _barrier(rows, float(hi_z[best]))


def brute_force(times: Sequence[Sequence[float]]) -> Barrier:
    """Naive search (Sec. 5.1): every one of the prod(R_p) ~ R^n choices; exact.

    Exponential in the number of workers: only for tiny instances (the oracle of the tests).
    Refuses more than ``BRUTE_FORCE_LIMIT`` candidate sets.
    """
    rows = _rows(times)
    lists = [rows.row(p).tolist() for p in range(rows.n)]
    total = math.prod(len(row) for row in lists)
    if total > BRUTE_FORCE_LIMIT:
        raise ValueError(
            f"brute_force would try {total} choices (limit {BRUTE_FORCE_LIMIT}); use zipline"
        )
    _, t_sync = min((max(z) - min(z), max(z)) for z in itertools.product(*lists))
    return _barrier(rows, t_sync)
