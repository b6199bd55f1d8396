"""How long `hopbus sim --workers N --iterations K` takes, end to end, as a user runs it.

Prints one JSON object. The issue's goal is N = K = 1000 in under 60 s on a 2-core machine;
``target_ratio`` is wall time / 60 s (below 1 meets it). A 100 x 100 run is timed in the same
invocation: ``scaling`` is the simulator's time per worker-iteration at N x K over that at
100 x 100 (near 1 means it scales linearly), a ratio that survives noisy, shared machines.

    python benchmarks/sim_scale.py [--workers 1000] [--iterations 1000] [-- extra sim flags]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

TARGET_S = 60.0


def run(workers: int, iterations: int, extra: list[str]) -> tuple[float, dict]:
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
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, json.loads(p.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("extra", nargs="*", help="more `hopbus sim` flags, after --")
    a = ap.parse_args()
    _, small = run(100, 100, a.extra)
    wall_s, summary = run(a.workers, a.iterations, a.extra)
    per_small = small["runtime_s"] / (100 * 100)
    per_big = summary["runtime_s"] / (a.workers * a.iterations)
    print(
        json.dumps(
            {
                "command": f"hopbus sim --workers {a.workers} --iterations {a.iterations} "
                + " ".join(a.extra),
                "cpus": os.cpu_count(),
                "wall_s": round(wall_s, 2),
                "simulate_s": round(summary["runtime_s"], 2),
                "target_s": TARGET_S,
                "target_ratio": round(wall_s / TARGET_S, 3),
                "us_per_worker_iteration": round(per_big * 1e6, 2),
                "scaling": round(per_big / per_small, 2),
                "finished": summary["finished"],
                "violations": summary["violations"],
            }
        )
    )


if __name__ == "__main__":
    main()
