"""How long `hopbus sim --workers N --iterations K` takes, and how much memory, as a user runs it.

Prints one JSON object with each goal beside its figure. The issue's goals: N = 10,000 workers x
K = 100 iterations in under 60 s and 4 GB on a 2-core machine (``wall_s`` against
``wall_goal_s``, ``peak_memory_gb`` against ``memory_goal_gb``: the command's whole process, the
interpreter's start-up and the graph included; the memory is the peak resident set size the
kernel reports for it). A 100 x 100 run is timed in the same invocation: ``scaling`` is the
simulator's time per worker-iteration at N x K over that at 100 x 100 (near 1 means it scales
linearly), a ratio that survives noisy, shared machines; ``load_average`` says how shared the
machine was.

    python benchmarks/sim_scale.py [--workers 10000] [--iterations 100] [-- extra sim flags]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

WALL_GOAL_S = 60.0
MEMORY_GOAL_GB = 4.0


def run(workers: int, iterations: int, extra: list[str]) -> tuple[float, float, dict]:
    """Wall seconds, peak resident GB and the summary of one ``hopbus sim`` process."""
    cmd = [
        sys.executable,
        "-m",
        "hopbus",
        "sim",
        "--workers",
        str(workers),
        "--iterations",
        str(iterations),
        "--json",
        *extra,
    ]
    start = time.perf_counter()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as p:
        out = p.stdout.read() if p.stdout is not None else ""
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if p.returncode != 0:
        raise SystemExit(f"hopbus sim exited with {p.returncode}")
    return wall, usage.ru_maxrss * 1024 / 1e9, json.loads(out)  # ru_maxrss: KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=10_000)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("extra", nargs="*", help="more `hopbus sim` flags, after --")
    a = ap.parse_args()
    _, _, small = run(100, 100, a.extra)
    wall_s, peak_gb, summary = run(a.workers, a.iterations, a.extra)
    per_small = small["runtime_s"] / (100 * 100)
    per_big = summary["runtime_s"] / (a.workers * a.iterations)
    print(
        json.dumps(
            {
                "command": f"hopbus sim --workers {a.workers} --iterations {a.iterations} "
                + " ".join(a.extra),
                "cpus": os.cpu_count(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "wall_s": round(wall_s, 2),
                "wall_goal_s": WALL_GOAL_S,
                "peak_memory_gb": round(peak_gb, 3),
                "memory_goal_gb": MEMORY_GOAL_GB,
                "meets_goals": wall_s < WALL_GOAL_S and peak_gb < MEMORY_GOAL_GB,
                "simulate_s": round(summary["runtime_s"], 2),
                "us_per_worker_iteration": round(per_big * 1e6, 2),
                "scaling": round(per_big / per_small, 2),
                "finished": summary["finished"],
                "violations": summary["violations"],
                "pairs_checked": summary.get("pairs_checked"),
                "gap_bound": summary["gap_bound"],
            }
        )
    )


if __name__ == "__main__":
    main()
