"""libsvm / svmlight text files (the paper's webspam), through scikit-learn's parser.

Files are read with raw (zero-based) indices and the one-based shift is decided for train and
test together, as scikit-learn's own ``load_svmlight_files`` does: deciding per file could shift
the test's columns by one against the train's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hopbus.data.dataset import DataError, Dataset, check_dense_size, split_rows

SPLIT_SEED = 0
"""Fixed, independent of the run's seed: every run tests on the same rows."""

TEST_FRACTION = 0.2
MAX_CLASSES = 1000


def _read(path: str) -> tuple[Any, np.ndarray]:
    """Sparse features (raw indices) and labels of one file, or a DataError naming it."""
    p = Path(path)
    if not p.is_file():
        why = "is a directory" if p.is_dir() else "no such file"
        raise DataError(f"cannot read svmlight file {path!r}: {why}")
    from sklearn.datasets import load_svmlight_file

    try:
        x, y = load_svmlight_file(str(p), dtype=np.float32, zero_based=True)
    except (ValueError, OSError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"cannot read svmlight file {path!r}: {first}") from None
    if x.shape[0] == 0:
        raise DataError(f"svmlight file {path!r} has no samples")
    return x.tocsr(), y


def _fit_columns(x: Any, n_features: int) -> Any:
    """Pad with empty columns or drop extra ones, so a test file matches the train's width."""
    if x.shape[1] == n_features:
        return x
    if x.shape[1] > n_features:
        return x[:, :n_features]
    x = x.copy()
    x.resize((x.shape[0], n_features))
    return x


def _labels(path: str, *ys: np.ndarray) -> tuple[list[np.ndarray], int]:
    """Labels mapped to 0..C-1 in sorted order of the distinct values (-1/+1 become 0/1)."""
    values = np.unique(np.concatenate(ys))
    if len(values) < 2:
        raise DataError(f"svmlight file {path!r}: all samples have the same label {values[0]:g}")
    if len(values) > MAX_CLASSES:
        raise DataError(
            f"svmlight file {path!r}: {len(values)} distinct labels (more than {MAX_CLASSES}); "
            "is it a regression data set?"
        )
    return [np.searchsorted(values, y).astype(np.int64) for y in ys], len(values)


def load_svmlight(path: str, test_path: str | None) -> Dataset:
    """Train (and test) file(s) as a dense Dataset; without a test file, a fixed 80/20 split."""
    mats, ys = zip(*[_read(p) for p in (path, test_path) if p is not None], strict=True)
    if all(m.nnz and m.indices.min() > 0 for m in mats):  # no index 0 anywhere: one-based
        mats = tuple(m[:, 1:] for m in mats)
    n_features = max(1, mats[0].shape[1])
    mats = tuple(_fit_columns(m, n_features) for m in mats)
    check_dense_size(f"svmlight {path!r}", sum(m.shape[0] for m in mats), n_features)
    labels, n_classes = _labels(path, *ys)
    name = f"svmlight:{Path(path).name}"
    if len(mats) == 2:
        return Dataset(name, mats[0].toarray(), labels[0], mats[1].toarray(), labels[1], n_classes)
    train, test = split_rows(mats[0].shape[0], TEST_FRACTION, SPLIT_SEED)
    x = mats[0]
    return Dataset(
        name, x[train].toarray(), labels[0][train], x[test].toarray(), labels[0][test], n_classes
    )
