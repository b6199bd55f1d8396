"""A PyTorch training loop as Hop workers: examples/torch_loop.py (an MLP with BatchNorm, Adam,
no seed) through ``hopbus launch``, with real processes and a real redis-server; skipped,
saying why, without PyTorch (the bench extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cluster import clean_env, hopbus_args, processes_mentioning
from helpers import needs

pytestmark = needs("torch", "the PyTorch example needs torch: pip install -e '.[bench]'")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "torch_loop.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(args), capture_output=True, text=True, env=clean_env(), timeout=300, check=False
    )


def test_a_pytorch_loop_learns_as_hop_workers(redis_url, tmp_path):
    out = tmp_path / "run"
    launch = hopbus_args("launch", "--redis", redis_url, "--run", f"torch{os.getpid()}")
    flags = ["--out", str(out), "--json", "-n", "4", "--mode", "backup", "--iterations", "300"]
    p = _run(*launch, *flags, "--", sys.executable, str(EXAMPLE))
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["finished"] and s["violations"] == 0
    assert all(v == 0 for v in s["checks"].values()), s["checks"]
    assert s["iterations"]["min"] == 300
    # each worker on a quarter of the data reaches about what the script reaches alone
    alone = _run(sys.executable, str(EXAMPLE), "--steps", "300")
    assert alone.returncode == 0, alone.stderr
    by_itself = float(alone.stdout.split("accuracy")[-1])
    assert s["final_accuracy"] >= min(0.9, by_itself - 0.03), (s["final_accuracy"], by_itself)
    # and the models agree (parameters and BatchNorm's statistics alike): two copies trained
    # alone from their own random starts stand 0.6 apart, averaged workers about 0.005
    assert s["consensus_distance"] is not None and s["consensus_distance"] < 0.1
    entries = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(entries) == 4 * 300 - s["skipped_iterations"]
    assert any("eval_accuracy" in e for e in entries)
    assert not processes_mentioning(str(EXAMPLE))
