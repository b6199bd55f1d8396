"""Loss curves from a run's metrics.jsonl (one entry per iteration change: ``t``, ``worker``,
``iter``, ``loss``, and ``eval_loss`` on the iterations where the worker evaluated).

Test loss over time is the mean, over the workers, of each worker's latest test loss: the
quantity ``time_to_target`` watches. It starts once every worker that evaluates has done so
once, takes a point at each evaluation, and ends at the run's final loss (every worker's model
on the whole test set) at its wall-clock end. Training loss per iteration is the mean of the
workers' minibatch losses on entering that iteration, smoothed by a trailing moving average.

Iteration time per worker and the gap timeline replay the iteration changes in file order (the
order of the run's progress stream, as the summary does), skipping any entry that does not move
its worker forward. A worker's mean iteration time is the summary's ``iter_time_s.per_worker``
rule (``hopbus.summary.RunStats``): the time of its last change / the iterations it advanced,
jumped-over ones included. The gap timeline is, after each change, the largest iteration minus
the smallest over the workers that have an entry so far.
"""

from __future__ import annotations

import heapq
import json
import math
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hopbus.errors import ConfigError
from hopbus.summary import RunStats, mean, run_seconds
from hopbus.topology.graphs import MAX_WORKERS
from hopbus.userfiles import not_regular

#: Iterations the training-loss moving average spans.
SMOOTHING = 5


@dataclass(frozen=True)
class Curve:
    x: list[float]
    y: list[float]


def read_metrics(path: Path, workers: int | None = None) -> list[dict[str, Any]]:
    """The entries of a metrics.jsonl that a run could have written: a worker id below
    ``workers`` (the run's, or the most any graph has), an iteration, and a ``t`` in
    [0, MAX_RUN_S] where there is one. Lines that do not parse (a run cut short mid-line) or
    hold anything else (an edited file: a worker 10**9 would have every per-worker table sized
    by it) are passed over; a missing file gives nothing. Only a regular file is read (not
    a directory, /dev/zero or a FIFO that would block), line by line, a line at most
    ``MAX_LINE`` characters (one without an end in sight is passed over). The lines passed
    over are counted, and said in a warning; one that cannot be opened is bad input."""
    why = not_regular(path)
    if why == "no such file":
        return []
    if why is not None:
        raise ConfigError(f"cannot read {str(path)!r}: {why}")
    try:
        fh = path.open(errors="replace")
    except OSError as exc:  # it was read as empty: a plot that said 'no data'
        raise ConfigError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    bound = workers if isinstance(workers, int) and workers > 0 else MAX_WORKERS
    with fh:
        entries, skipped = _entries(fh, bound)
    if skipped:
        warnings.warn(
            f"{path}: {skipped} line{'s' * (skipped != 1)} passed over (cut short, or not an "
            "entry a run of this size writes)",
            UserWarning,
            stacklevel=2,
        )
    return entries


PLOTTED = ("worker", "iter", "t", "loss", "eval_loss")
"""What the curves read of an entry: only these are kept (a whole entry, its timings, blocked
list and device, took some 12 bytes of memory per byte of file: 2.7 GB for a 230 MB file)."""

MAX_LINE = 1 << 20
"""Characters of a metrics.jsonl line that are read (an entry is a few hundred)."""


def _entries(fh: Any, bound: int) -> tuple[list[dict[str, Any]], int]:
    """The entries, and how many lines were passed over."""
    entries = []
    skipped = 0
    whole = True  # the line read last ended: the next read starts a line
    for line in iter(lambda: fh.readline(MAX_LINE), ""):
        starts, whole = whole, line.endswith("\n")
        if not (starts and whole):
            skipped += starts  # part of a line too long to be an entry: counted once
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            skipped += 1
            continue
        if not isinstance(rec, dict):
            skipped += 1
            continue
        w, it, t = rec.get("worker"), rec.get("iter"), rec.get("t", 0.0)
        if _index(w) and w < bound and _index(it) and run_seconds(t) is not None:
            entries.append({k: rec[k] for k in PLOTTED if k in rec})
        else:
            skipped += 1
    return entries, skipped


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def mean_test_loss_over_time(
    entries: Iterable[dict[str, Any]], end: tuple[float, float] | None = None
) -> Curve:
    """Mean of the workers' latest test losses against seconds since the run started;
    ``end`` = (wall_s, final_loss) closes the curve."""
    entries = sorted(
        (e for e in entries if _number(e.get("eval_loss")) and _number(e.get("t"))),
        key=lambda e: e["t"],
    )
    evaluating = {e["worker"] for e in entries}
    latest: dict[Any, float] = {}
    xs: list[float] = []
    ys: list[float] = []
    for e in entries:
        latest[e["worker"]] = float(e["eval_loss"])
        if len(latest) == len(evaluating):
            xs.append(float(e["t"]))
            ys.append(mean(latest.values()))
    if end is not None and _number(end[0]) and _number(end[1]) and (not xs or end[0] >= xs[-1]):
        xs.append(float(end[0]))
        ys.append(float(end[1]))
    return Curve(xs, ys)


def mean_train_loss_by_iteration(
    entries: Iterable[dict[str, Any]], smoothing: int = SMOOTHING
) -> Curve:
    """Mean minibatch loss of the workers entering each iteration, trailing average over
    ``smoothing`` iterations (iterations nobody entered, e.g. jumped over, have no point)."""
    by_iter: dict[int, list[float]] = {}
    for e in entries:
        if _number(e.get("loss")) and isinstance(e.get("iter"), int):
            by_iter.setdefault(e["iter"], []).append(float(e["loss"]))
    iters = sorted(by_iter)
    means = [mean(by_iter[i]) for i in iters]
    window = max(1, smoothing)
    smoothed = [mean(means[max(0, k - window + 1) : k + 1]) for k in range(len(means))]
    return Curve([float(i) for i in iters], smoothed)


def _advances(entries: Iterable[dict[str, Any]]) -> Iterator[tuple[int, int, float]]:
    """``(worker, iteration, t)`` of each entry that moves its worker forward, in the given
    order: entries that do not (a repeated or out-of-order line) are skipped, as the summary's
    replay skips them, so a worker's iteration only grows."""
    current: dict[int, int] = {}
    for e in entries:
        w, it, t = e.get("worker"), e.get("iter"), e.get("t")
        if not (_index(w) and _index(it) and _number(t)) or it <= current.get(w, 0):
            continue
        current[w] = it
        yield w, it, float(t)


def _index(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def iteration_time_per_worker(entries: Iterable[dict[str, Any]]) -> dict[int, float]:
    """Each worker's mean seconds per iteration, by the summary's own rule (``RunStats``, so
    the two cannot drift apart): the ``t`` of its last change / the iterations it advanced,
    jumped-over iterations counted as done. Workers without an entry are left out."""
    moves = list(_advances(entries))
    if not moves:
        return {}
    stats = RunStats(max(w for w, _, _ in moves) + 1)  # start 0: t counts from the run's start
    for w, it, t in moves:
        stats.enter(w, it, t)
    per = stats.iter_time()["per_worker"]
    return {w: float(x) for w, x in enumerate(per) if x is not None}


def gap_timeline(entries: Iterable[dict[str, Any]]) -> Curve:
    """After each iteration change, the largest iteration gap between any two workers that
    have started (max - min of their iterations), against ``t``: a step function. A worker
    with no entry yet does not count. ``t`` is made non-decreasing (workers' clocks can put a
    change a fraction of a millisecond before the one the stream has before it)."""
    current: dict[int, int] = {}
    count: dict[int, int] = {}  # iteration -> workers in it
    occupied: list[int] = []  # a heap of iterations that had workers (some emptied since)
    low = high = 0
    xs: list[float] = []
    ys: list[float] = []
    for w, it, t in _advances(entries):
        old = current.get(w)
        current[w] = it
        count[it] = count.get(it, 0) + 1
        if count[it] == 1:
            heapq.heappush(occupied, it)
        if old is None:
            low = it if len(current) == 1 else min(low, it)
        else:
            count[old] -= 1
            if not count[old]:
                del count[old]
                # the slowest iteration emptied: the lowest one still held (not low + 1, ... in
                # turn: one forged entry can jump a worker by 10**15)
                while occupied[0] not in count:
                    heapq.heappop(occupied)
                low = occupied[0]
        high = max(high, it)
        xs.append(max(t, xs[-1]) if xs else t)
        ys.append(float(high - low))
    return Curve(xs, ys)


__all__ = [
    "SMOOTHING",
    "Curve",
    "gap_timeline",
    "iteration_time_per_worker",
    "mean_test_loss_over_time",
    "mean_train_loss_by_iteration",
    "read_metrics",
]
