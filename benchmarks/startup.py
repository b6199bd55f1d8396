"""What starting a run's workers costs: forked from hopbus's fork server, or each a fresh
interpreter (``HOPBUS_FORKSERVER=0``).

Runs ``hopbus train -n N --iterations K`` (softmax on digits, embedded Redis) with the fork
server and without, alternately, ``--repeat`` times each, and measures the CPU time of the
whole process tree (the launcher, Redis, the server, every worker: user + system seconds, from
``getrusage(RUSAGE_CHILDREN)`` of this process around each run) and its wall-clock time. CPU
is the figure that counts on a shared machine (wall time also counts waiting for the cores).
Goal: the fork server saves at least half a second of CPU per worker (each fresh interpreter
spends about a second importing numpy, redis-py, pyzmq, networkx, pydantic and hopbus). Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_SAVED_S = 0.5  # CPU seconds saved per worker


def run_once(workers: int, iterations: int, fork: bool) -> tuple[float, float]:
    """(CPU seconds of the whole tree, wall seconds) of one ``hopbus train``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOPBUS_")}
    env["HOPBUS_FORKSERVER"] = "1" if fork else "0"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "hopbus", "train", "-n", str(workers),
               "--iterations", str(iterations), "--eval-every", "0", "--json",
               "--out", str(Path(tmp) / "run")]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        sys.exit(f"startup: hopbus train failed ({p.returncode}): {p.stderr.strip()[-300:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    runs: dict[str, list[tuple[float, float]]] = {"forked": [], "fresh": []}
    for _ in range(a.repeat):  # alternately, so that a busy spell hits both
        runs["forked"].append(run_once(a.workers, a.iterations, fork=True))
        runs["fresh"].append(run_once(a.workers, a.iterations, fork=False))
    cpu = {k: statistics.median(c for c, _ in v) for k, v in runs.items()}
    wall = {k: statistics.median(w for _, w in v) for k, v in runs.items()}
    saved = (cpu["fresh"] - cpu["forked"]) / a.workers
    print(json.dumps({
        "workers": a.workers, "iterations": a.iterations, "repeat": a.repeat,
        "cpu_s_median": {k: round(v, 2) for k, v in cpu.items()},
        "wall_s_median": {k: round(v, 2) for k, v in wall.items()},
        "cpu_ratio_fresh_over_forked": round(cpu["fresh"] / cpu["forked"], 2),
        "cpu_saved_per_worker_s": round(saved, 3),
        "goal_saved_per_worker_s": GOAL_SAVED_S,
        "goal_met": saved >= GOAL_SAVED_S,
        "runs": {k: [[round(c, 2), round(w, 2)] for c, w in v] for k, v in runs.items()},
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
