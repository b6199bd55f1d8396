"""Loss curves from a run's metrics.jsonl (one entry per iteration change: ``t``, ``worker``,
``iter``, ``loss``, and ``eval_loss`` on the iterations where the worker evaluated).

Test loss over time is the mean, over the workers, of each worker's latest test loss: the
quantity ``time_to_target`` watches. It starts once every worker that evaluates has done so
once, takes a point at each evaluation, and ends at the run's final loss (every worker's model
on the whole test set) at its wall-clock end. Training loss per iteration is the mean of the
workers' minibatch losses on entering that iteration, smoothed by a trailing moving average.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Iterations the training-loss moving average spans.
SMOOTHING = 5


@dataclass(frozen=True)
class Curve:
    x: list[float]
    y: list[float]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The entries of a metrics.jsonl; lines that do not parse (a run cut short mid-line) and
    a missing file give nothing."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    entries = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "worker" in rec and "iter" in rec:
            entries.append(rec)
    return entries


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
            ys.append(statistics.fmean(latest.values()))
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
    means = [statistics.fmean(by_iter[i]) for i in iters]
    window = max(1, smoothing)
    smoothed = [statistics.fmean(means[max(0, k - window + 1) : k + 1]) for k in range(len(means))]
    return Curve([float(i) for i in iters], smoothed)


__all__ = [
    "SMOOTHING",
    "Curve",
    "mean_test_loss_over_time",
    "mean_train_loss_by_iteration",
    "read_metrics",
]
