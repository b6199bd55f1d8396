"""scikit-learn's bundled 8x8 digits, read straight from its CSV.

``import sklearn`` costs almost a second and every worker process loads the data, so the file
is located without importing the package (``find_spec`` only searches the path).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from hopbus.data.dataset import DataError, Dataset

SPLIT_SEED = 1797
"""Fixed, independent of the run's seed: every run tests on the same digits."""

TEST_FRACTION = 0.25


def digits_path() -> Path:
    """Where scikit-learn keeps ``digits.csv.gz``, or a DataError saying it is not installed."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the digits data set comes with scikit-learn, which is not installed")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise DataError(f"the digits data set is missing from scikit-learn: no {path}")
    return path


def load_digits() -> Dataset:
    """1797 images of 64 pixels scaled to [0, 1], 10 classes; a stratified 75/25 split."""
    table = np.loadtxt(digits_path(), delimiter=",", dtype=np.float32)
    x = table[:, :-1] / np.float32(16.0)
    y = table[:, -1].astype(np.int64)
    rng = np.random.default_rng(SPLIT_SEED)
    test_parts = []
    train_parts = []
    for label in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == label))
        n_test = round(len(rows) * TEST_FRACTION)
        test_parts.append(rows[:n_test])
        train_parts.append(rows[n_test:])
    train = rng.permutation(np.concatenate(train_parts))
    test = np.sort(np.concatenate(test_parts))
    return Dataset("digits", x[train], y[train], x[test], y[test], n_classes=10)
