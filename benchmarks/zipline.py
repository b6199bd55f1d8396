"""What one ElasticBSP barrier decision costs: ZipLine against GridScan, time and quality.

Prints one JSON object. For n workers in (16, 100, 1000) and R predictions in (15, 150), random
instances like a heterogeneous cluster: each worker's last push uniform in [0, 1) s, its
iteration interval uniform in [0.1, 0.6) s, its next R end times from ``predict``. Per case:

* microseconds per decision (median and fastest over the instances) for ``zipline`` (exact) and
  ``gridscan`` (the paper's heuristic baseline, Algorithm 1), input as the lists of floats a
  parameter server holds, conversion included;
* how often GridScan's spread (the longest wait at the barrier) was worse than ZipLine's, and
  the mean and largest ratio gridscan.spread / zipline.spread.

    python benchmarks/zipline.py [--seed 0] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np

from hopbus.baselines.zipline import Barrier, gridscan, predict, zipline

WORKERS = (16, 100, 1000)
LOOKAHEAD = (15, 150)
LAST_S = (0.0, 1.0)
INTERVAL_S = (0.1, 0.6)
METHOD = (
    "one process, one decision per call; each instance is a fresh draw (last push uniform in "
    "[0, 1) s, interval uniform in [0.1, 0.6) s, R end times from predict()), timed once per "
    "solver with time.perf_counter_ns, solver order swapped every instance; one untimed call "
    "of each first. Fewer instances for the larger cases (3e6 / (n R), clamped to 20..200, "
    "times --scale) so the whole run stays short. Spread ratios are over the "
    "same instances; a GridScan spread is 'worse' when strictly larger than ZipLine's."
)

Solver = Callable[[Sequence[Sequence[float]]], Barrier]


def instance(rng: np.random.Generator, n: int, r: int) -> list[list[float]]:
    """n workers' next r predicted end times (seconds)."""
    last = rng.uniform(*LAST_S, n).tolist()
    interval = rng.uniform(*INTERVAL_S, n).tolist()
    return [predict(t, iv, r) for t, iv in zip(last, interval, strict=True)]


def instances_for(n: int, r: int, scale: float) -> int:
    """Instances for one case: fewer for the larger ones (20 at n=1000, R=150)."""
    return max(2, round(min(200, max(20, 3_000_000 // (n * r))) * scale))


def timed(solve: Solver, times: list[list[float]]) -> tuple[float, Barrier]:
    start = time.perf_counter_ns()
    b = solve(times)
    return (time.perf_counter_ns() - start) / 1e3, b


def case(rng: np.random.Generator, n: int, r: int, count: int) -> dict:
    solvers: dict[str, Solver] = {"zipline": zipline, "gridscan": gridscan}
    warm = instance(rng, n, r)
    for solve in solvers.values():
        solve(warm)
    us: dict[str, list[float]] = {name: [] for name in solvers}
    ratios: list[float] = []
    spreads: dict[str, list[float]] = {name: [] for name in solvers}
    worse = 0
    for k in range(count):
        times = instance(rng, n, r)
        got: dict[str, Barrier] = {}
        for name in list(solvers) if k % 2 == 0 else list(solvers)[::-1]:
            took, got[name] = timed(solvers[name], times)
            us[name].append(took)
            spreads[name].append(got[name].spread)
        z, g = got["zipline"], got["gridscan"]
        if g.spread < z.spread:
            raise SystemExit(f"n={n} R={r}: gridscan beat zipline ({g} < {z}): a bug")
        worse += g.spread > z.spread
        if z.spread > 0:
            ratios.append(g.spread / z.spread)
    out: dict = {"n": n, "R": r, "points": n * r, "instances": count}
    for name in solvers:
        out[f"{name}_us_median"] = round(statistics.median(us[name]), 1)
        out[f"{name}_us_min"] = round(min(us[name]), 1)
    out["gridscan_worse"] = worse
    out["gridscan_worse_frac"] = round(worse / count, 3)
    out["spread_ratio_mean"] = round(statistics.fmean(ratios), 4) if ratios else None
    out["spread_ratio_max"] = round(max(ratios), 4) if ratios else None
    for name in solvers:
        out[f"{name}_spread_mean_ms"] = round(1e3 * statistics.fmean(spreads[name]), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="random instances' seed")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the instance counts")
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    wall = time.perf_counter()
    cases = [case(rng, n, r, instances_for(n, r, args.scale)) for n in WORKERS for r in LOOKAHEAD]
    print(
        json.dumps(
            {
                "benchmark": "zipline",
                "unit": "microseconds per decision",
                "seed": args.seed,
                "last_push_s": list(LAST_S),
                "interval_s": list(INTERVAL_S),
                "cases": cases,
                "method": METHOD,
                "platform": platform.platform(),
                "machine": platform.machine(),
                "python": sys.version.split()[0],
                "implementation": platform.python_implementation(),
                "numpy": np.__version__,
                "cpus": os.cpu_count(),
                "wall_s": round(time.perf_counter() - wall, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
