"""Protocol overhead per iteration: everything but compute and payload bytes.

Runs a real local cluster (``hopbus train``, embedded Redis, one process per worker) on the
complete graph of 4 workers, so every worker has degree 3, with a model of a few dozen bytes
so that payload costs nothing. From every progress entry:

    overhead = step time - compute_s - wait_s

i.e. the driver's own work in an iteration: encoding and sending snapshots, the Redis round
trips (floors, token takes, the Advance script), Reduce and Apply on a tiny model. Waiting for
neighbours is the protocol doing its job and is reported separately.

That wall-clock figure also counts time a worker was ready but not scheduled, which dominates
when 4 workers and Redis share fewer cores. So the goal (at most 0.5 ms) is judged on CPU time:
each worker's process CPU time (all its threads: driver, receiver, heartbeat) minus its compute
time, per iteration. Prints one JSON object with both; with ``--repeat N``, the first run's
details and every run's CPU figure, the goal judged on their median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

GOAL_MS = 0.5  # CPU per worker-iteration at degree 3 (issue 18)


def measure(iterations: int, workers: int) -> dict:
    """One run's figures (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [
            sys.executable, "-m", "hopbus", "train", "-n", str(workers),
            "--topology", "complete", "--model", "logreg", "--data", "synthetic:2000,4,2",
            "--iterations", str(iterations), "--eval-every", "0", "--out", str(out),
            "--json",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOPBUS_")}
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if p.returncode:
            sys.exit(f"hopbus train failed: {p.stderr.strip()}")
        summary = json.loads(p.stdout)
        cpu_overhead = [
            (r["cpu_s"] - r["compute_s"]) / r["iterations"] for r in summary["per_worker"]
        ]
        last_t: dict[int, float] = {}
        overhead, steps, waits = [], [], []
        for line in (out / "metrics.jsonl").read_text().splitlines():
            r = json.loads(line)
            w = r["worker"]
            if w in last_t:  # the first step includes start-up
                step = (r["t"] - last_t[w]) / (r["jump"] or 1)
                steps.append(step)
                waits.append(r["wait_s"])
                overhead.append(step - r["compute_s"] - r["wait_s"])
            last_t[w] = r["t"]
    ms = 1000.0
    return {
        "command": " ".join(cmd[1:]),
        "step_ms": {"median": statistics.median(steps) * ms, "mean": statistics.fmean(steps) * ms},
        "wait_ms": {"median": statistics.median(waits) * ms, "mean": statistics.fmean(waits) * ms},
        "overhead_ms": {
            "median": statistics.median(overhead) * ms,
            "mean": statistics.fmean(overhead) * ms,
            "p90": statistics.quantiles(overhead, n=10)[-1] * ms,
        },
        "cpu_overhead_ms_per_worker": [round(x * ms, 4) for x in cpu_overhead],
        "cpu_overhead_ms_mean": round(statistics.fmean(cpu_overhead) * ms, 4),
        "violations": summary["violations"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument(
        "--repeat", type=int, default=1,
        help="runs, one after another; the goal is judged on their median (a shared machine's "
        "load moves one run's figure by 10%% or more)",
    )  # fmt: skip
    args = ap.parse_args()
    runs = [measure(args.iterations, args.workers) for _ in range(max(1, args.repeat))]
    median = statistics.median(r["cpu_overhead_ms_mean"] for r in runs)
    result = {
        "benchmark": "protocol_overhead",
        "workers": args.workers,
        "degree": args.workers - 1,
        "iterations": args.iterations,
        "cpu_cores": os.cpu_count(),
        **runs[0],
        "runs": len(runs),
        "cpu_overhead_ms_of_runs": [r["cpu_overhead_ms_mean"] for r in runs],
        "step_ms_median_of_runs": [round(r["step_ms"]["median"], 4) for r in runs],
        "cpu_overhead_ms_median": median,
        "goal_ms": GOAL_MS,
        "meets_goal": median <= GOAL_MS,
        "violations": sum(r["violations"] for r in runs),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
