"""Does a long run keep every worker's memory flat? Resident memory of each worker process at
iteration 1,000 and at the end of a 20,000-iteration run (goal: within 10%).

Starts a private redis-server, runs ``hopbus train`` against it (4 workers, softmax on digits,
no emulated compute), and samples every worker's VmRSS from /proc while reading its iteration
counter from Redis. Prints one JSON object. Linux only (/proc).

    python benchmarks/memory.py [--iterations 20000] [--workers 4] [--mode standard]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

from hopbus.coord.broker import EmbeddedRedis
from hopbus.coord.keys import RunKeys

FIRST = 1000  # the iteration the end is compared with (start-up allocations are done by then)
GOAL = 1.10
SAMPLE_S = 0.2


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def workers_of(parent: int) -> dict[int, int]:
    """worker id -> pid of the ``hopbus worker --id I`` children of ``parent``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"worker" in argv and b"--id" in argv:
            found[int(argv[argv.index(b"--id") + 1])] = int(entry.name)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--mode", default="standard")
    a = ap.parse_args()
    run = f"mem{os.getpid()}"
    first: dict[int, int] = {}
    last: dict[int, tuple[int, int]] = {}  # worker -> (iteration, rss) at the latest sample
    with EmbeddedRedis(port=0) as server, tempfile.TemporaryDirectory() as tmp:
        client = redis.Redis.from_url(server.url)
        keys = RunKeys(run)
        cmd = [
            sys.executable, "-m", "hopbus", "train", "--redis", server.url, "--run", run,
            "-n", str(a.workers), "-k", str(a.iterations), "--mode", a.mode,
            "--eval-every", str(max(1, a.iterations // 4)), "--out", str(Path(tmp) / "run"),
            "--json",
        ]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        tick = threading.Event()
        pids: dict[int, int] = {}
        while proc.poll() is None:
            pids = pids if len(pids) == a.workers else workers_of(proc.pid)
            for w, pid in pids.items():
                kib = rss_kib(pid)
                it = client.get(keys.iter(w))
                if kib is None or it is None:
                    continue
                k = int(it)
                if k >= FIRST and w not in first:
                    first[w] = kib
                last[w] = (k, kib)
            tick.wait(SAMPLE_S)  # the sampling period, not a synchronization
        out, err = proc.communicate()
        wall = time.monotonic() - t0
    if proc.returncode != 0:
        print(f"memory.py: hopbus train failed: {err.strip().splitlines()[-1:]}", file=sys.stderr)
        return 1
    summary = json.loads(out)
    per_worker = {
        str(w): {
            "rss_mib_at_1000": round(first[w] / 1024, 1),
            "rss_mib_at_end": round(last[w][1] / 1024, 1),
            "last_sampled_iteration": last[w][0],
            "ratio": round(last[w][1] / first[w], 4),
        }
        for w in sorted(first)
    }
    worst = max((v["ratio"] for v in per_worker.values()), default=None)
    print(
        json.dumps(
            {
                "iterations": a.iterations,
                "workers": a.workers,
                "mode": a.mode,
                "wall_s": round(wall, 1),
                "finished": summary["finished"],
                "per_worker": per_worker,
                "worst_ratio": worst,
                "goal": f"every worker's RSS at the end <= {GOAL}x its RSS at iteration {FIRST}",
                "goal_met": worst is not None and worst <= GOAL,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
