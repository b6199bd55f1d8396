"""The TensorFlow models on the real cluster: the small CNN learns digits with 2 workers, a
CIFAR-10-format folder trains, and without TensorFlow ``--model cnn`` is refused in one line.

Each TF worker pays TensorFlow's import (~5 s on two cores), so runs are 2 workers and short.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
from cluster import env_without, train
from helpers import needs

needs_tf = needs("tensorflow", "the TensorFlow models need the tf extra: pip install -e '.[tf]'")


@needs_tf
def test_cnn_learns_digits_on_two_workers(redis_url, tmp_path):
    flags = ["--model", "cnn", "--data", "digits", "-n", "2", "-k", "200", "--lr", "0.05"]
    p, s = train(redis_url, tmp_path / "run", *flags)
    assert p.returncode == 0, p.stderr
    assert s["finished"] and s["violations"] == 0
    assert s["final_accuracy"] >= 0.90  # measured 0.98 (CPU, seed 0)
    assert [w["device"] for w in s["per_worker"]] in (["cpu", "cpu"], ["gpu:0", "gpu:0"])
    assert "tensorflow" not in p.stderr.lower() and "cuda" not in p.stderr.lower()


def _cifar_folder(root: Path, n: int = 40) -> Path:
    """A tiny folder in the standard CIFAR-10 python format, pickled as the real files are."""
    rng = np.random.default_rng(0)
    root.mkdir()
    for name in ("data_batch_1", "test_batch"):
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in rng.integers(0, 10, n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        }
        with (root / name).open("wb") as f:
            pickle.dump(batch, f, protocol=2)
    return root


@needs_tf
def test_cnn_trains_on_a_cifar10_folder(redis_url, tmp_path):
    folder = _cifar_folder(tmp_path / "cifar")
    flags = ["--model", "cnn", "--data", "cifar10", "--data-dir", str(folder), "-n", "2"]
    p, s = train(redis_url, tmp_path / "run", *flags, "-k", "5", "--batch-size", "8")
    assert p.returncode == 0, p.stderr
    assert s["finished"] and s["violations"] == 0
    assert s["iterations"]["min"] == 5


def _without_tensorflow(tmp_path: Path) -> dict[str, str]:
    return env_without("tensorflow", tmp_path / "no_tf")


def test_without_tensorflow_cnn_is_refused_in_one_line(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "hopbus", "train", "--model", "cnn", "--out", str(out)],
        capture_output=True,
        text=True,
        env=_without_tensorflow(tmp_path),
        timeout=60,
        check=False,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "--model cnn needs TensorFlow: pip install -e '.[tf]'" in lines[0]
    assert not out.exists()
