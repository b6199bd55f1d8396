"""The paper's experiments (Sec. 7.3) on real processes: every paper scenario of
``hopbus experiment`` in one go, each in its own results folder. Prints one JSON object: per
scenario its seconds (start-up included), whether it exited 0, and its claims (the measured
ratio and whether it held); then the total seconds.

    python benchmarks/paper.py [--quick] [--out runs/paper]

Claims are measurements of this machine in this run, not pass/fail; see docs/results.md.
``--quick`` runs every scenario's reduced form (goal: under 5 minutes in total).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

SCENARIOS = ("random-slowdown", "deterministic-slowdown", "topology", "vs-allreduce", "vs-ps")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="every scenario's reduced form")
    ap.add_argument("--out", type=Path, default=None, help="folder for the results folders")
    a = ap.parse_args()
    out = a.out or Path("runs") / f"paper{'-quick' if a.quick else ''}-{time.strftime('%H%M%S')}"
    if out.exists() and any(out.iterdir()):
        print(f"paper.py: --out {out} is not empty", file=sys.stderr)
        return 2
    report: dict = {
        "quick": a.quick,
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count()},
        "scenarios": {},
    }
    t_all = time.monotonic()
    for name in SCENARIOS:
        folder = out / name
        cmd = ["hopbus", "experiment", name, "--out", str(folder)] + (
            ["--quick"] if a.quick else []
        )
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, check=False)
        entry: dict = {"command": " ".join(cmd), "seconds": round(time.monotonic() - t0, 1)}
        entry["exit_status"] = p.returncode
        try:
            results = json.loads((folder / "results.json").read_text())
        except (OSError, ValueError):
            entry["error"] = p.stderr.strip().splitlines()[-1:] or ["no results.json"]
        else:
            entry["claims"] = [
                {k: c[k] for k in ("claim", "value", "op", "threshold", "holds", "note")}
                for c in results["claims"]
            ]
        report["scenarios"][name] = entry
    report["total_seconds"] = round(time.monotonic() - t_all, 1)
    report["goal"] = "--quick: every scenario in under 300 s in total" if a.quick else None
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
