"""The summary object every run reports, simulated or real, and the timings it is made from.

Iteration time is measured per *step*: each time a worker's iteration counter moves, the time
since its previous move divided by how many iterations it moved (a jump of J counts J).

* ``iter_time_s.per_worker[i]``: worker i's elapsed time / iterations it advanced;
* ``iter_time_s.mean``: the mean of ``per_worker``;
* ``iter_time_s.p50``: the median step time over every step of every worker (over a uniform
  sample of ``P50_SAMPLE`` steps when there are more, so memory does not grow with the run).
"""

from __future__ import annotations

import math
import random
import statistics
from array import array
from collections.abc import Iterable
from typing import Any

from hopbus.gaps import PAIRS_CHECKED, GapMonitor

P50_SAMPLE = 1_000_000

MAX_RUN_S = 1e9
"""No run's ``t`` (seconds since it began) is larger: about 30 years. A larger one in a
results file is junk, passed over by whatever reads it."""


def mean(values: Iterable[float]) -> float:
    """``statistics.fmean`` that a sum beyond the largest float cannot break: a loss of 1e308
    on two workers (a model diverging through the finite range, or a number a script or
    Redis handed over) has a mean, as any numbers have; inf and -inf together have none
    (nan). The same value as fmean wherever fmean has one."""
    values = list(values)
    try:
        return statistics.fmean(values)
    except OverflowError:  # its sum overflowed: the terms divided first cannot
        return math.fsum(v / len(values) for v in values)
    except ValueError:  # fsum of inf and -inf
        return math.nan


def run_seconds(t: Any) -> float | None:
    """``t`` as seconds since a run began, where a run could have written it (a number in
    [0, MAX_RUN_S]), else None: the one check every reader of metrics.jsonl's ``t`` makes."""
    if isinstance(t, int | float) and not isinstance(t, bool) and 0 <= t <= MAX_RUN_S:
        return float(t)
    return None


class RunStats:
    """Per-worker timing of iteration changes, fed in the order they happen."""

    def __init__(self, n: int, start: float = 0.0) -> None:
        self.n = n
        self.start = start
        self.iterations = [0] * n
        self.last_change = [start] * n
        self.steps = array("d")  # step times, or a uniform sample of them (reservoir)
        self._steps_seen = 0
        self._sampler = random.Random(0)
        self.jumps = 0
        self.skipped = 0  # iterations passed over by jumps
        self.first = 0  # the iteration every worker started in (a resumed run's; else 0)

    def enter(self, worker: int, iteration: int, t: float) -> None:
        moved = iteration - self.iterations[worker]
        step = (t - self.last_change[worker]) / moved
        self._steps_seen += 1
        if len(self.steps) < P50_SAMPLE:
            self.steps.append(step)
        else:
            slot = self._sampler.randrange(self._steps_seen)
            if slot < P50_SAMPLE:
                self.steps[slot] = step
        if moved > 1:
            self.jumps += 1
            self.skipped += moved - 1
        self.iterations[worker] = iteration
        self.last_change[worker] = t

    def restart(self, worker: int, iteration: int, t: float) -> None:
        """``worker`` was replaced and goes on from ``iteration`` at ``t`` (no step counted)."""
        self.iterations[worker] = iteration
        self.last_change[worker] = t

    def start_at(self, iteration: int) -> None:
        """Every worker starts in ``iteration`` (a resumed run): times count from there."""
        self.first = iteration
        self.iterations = [iteration] * self.n

    def iter_time(self) -> dict[str, Any]:
        per = [
            (self.last_change[i] - self.start) / (k - self.first) if k > self.first else None
            for i, k in enumerate(self.iterations)
        ]
        known = [p for p in per if p is not None]
        return {
            "mean": mean(known) if known else None,
            "p50": statistics.median(self.steps) if self.steps else None,
            "per_worker": per,
        }

    def iterations_summary(self) -> dict[str, Any]:
        return {
            "min": min(self.iterations),
            "max": max(self.iterations),
            "per_worker": list(self.iterations),
        }


def progress_summary(stats: RunStats, monitor: GapMonitor) -> dict[str, Any]:
    """The summary fields every run derives from its iteration changes, simulated or real:
    ``iterations``, ``iter_time_s``, the gap fields, ``jumps``, ``skipped_iterations``."""
    return {
        "iterations": stats.iterations_summary(),
        "iter_time_s": stats.iter_time(),
        **gap_summary(monitor),
        "jumps": stats.jumps,
        "skipped_iterations": stats.skipped,
    }


def gap_summary(monitor: GapMonitor) -> dict[str, Any]:
    """``max_gap``, ``gap_bound``, ``violations`` and ``pairs_checked`` of the summary object
    (every pair of live workers, exactly, whatever the number of workers: hopbus/gaps.py)."""
    v = monitor.first_violation
    return {
        "max_gap": {"adjacent": monitor.max_adjacent, "any_pair": monitor.max_any},
        "gap_bound": {
            "adjacent": monitor.table1["adjacent"],
            "any_pair": monitor.table1["any_pair"],
        },
        "violations": monitor.violations,
        "pairs_checked": PAIRS_CHECKED,
        "first_violation": None
        if v is None
        else {
            "ahead": v.ahead,
            "behind": v.behind,
            "gap": v.gap,
            "bound": v.bound,
        },
    }
