"""libsvm / svmlight text files (the paper's webspam), through scikit-learn's parser.

Files are read with raw (zero-based) indices and the one-based shift is decided for train and
test together, as scikit-learn's own ``load_svmlight_files`` does: deciding per file could shift
the test's columns by one against the train's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hopbus.data.batches import shard_rows
from hopbus.data.dataset import (
    FLOAT32_MAX,
    DataError,
    Dataset,
    Keep,
    check_dense_size,
    split_rows,
)

SPLIT_SEED = 0
"""Fixed, independent of the run's seed: every run tests on the same rows."""

TEST_FRACTION = 0.2
MAX_CLASSES = 1000
MAX_INDEX = 2**31 - 1  # what the sparse parser's column indices hold


def _number(token: bytes) -> float | None:
    if b"_" in token:  # Python's float reads 1_0 as 10; svmlight's C readers stop at the _
        return None
    try:
        return float(token)
    except ValueError:
        return None


def _problem(line: bytes) -> str | None:
    """What is wrong with one line of an svmlight file, in words that quote none of it
    (None: a good sample, an empty line or a comment)."""
    fields = line.split(b"#", 1)[0].split()
    if not fields:
        return None
    label = _number(fields[0])
    if label is None:
        return "its label is not a number"
    if not np.isfinite(label):
        return "its label is not finite"
    last = -1
    for i, token in enumerate(fields[1:], start=2):
        key, sep, value = token.partition(b":")
        digits = key[1:] if key[:1] in (b"+", b"-") else key  # the parser takes a sign
        if not sep or (not digits.isdigit() and not (i == 2 and key == b"qid")):
            return f"field {i} is not index:value"
        number = _number(value)
        if number is None:
            return f"field {i} has a value that is not a number"
        if not np.isfinite(number):
            return f"field {i} has a value that is not finite"
        if abs(number) > FLOAT32_MAX:
            return f"field {i} has a value beyond float32's range (features are float32)"
        if digits.isdigit():
            significant = digits.lstrip(b"0") or b"0"  # int() of 5000 digits would raise
            if len(significant) > len(str(MAX_INDEX)) or int(significant) > MAX_INDEX:
                return f"field {i} has an index above {MAX_INDEX}"
            index = -int(significant) if key[:1] == b"-" else int(significant)
            if index < 0:
                return f"field {i} has a negative index"
            if index <= last:
                return f"field {i}'s index is not above the one before (indices go up, once each)"
            last = index
    return None


def _first_bad(path: Path, only: bytes = b"") -> str | None:
    """Where and what the first bad line of an svmlight file is (``line 3: ...``), read line by
    line; None if every line is good. ``only``: look only at lines that hold these bytes. The
    file's content is never quoted (it may be anything: a secret, a binary)."""
    try:
        with path.open("rb") as fh:
            for number, line in enumerate(fh, start=1):
                if only in line and (why := _problem(line)) is not None:
                    return f"line {number}: {why}"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def first_problem(path: Path) -> str:
    """``_first_bad``, for a file the parser refused: the error path only, so a large file is
    scanned only when it is refused."""
    return _first_bad(path) or "its format is not svmlight's (label index:value ...)"


def _underscored(path: Path) -> str | None:
    """The first line whose numbers hold an underscore, which scikit-learn's parser reads as
    Python does (``1_0`` as 10) and svmlight's own readers refuse: one pass of memchr over
    the file, and a line by line look only where one is found (a comment may hold one)."""
    import mmap

    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m.find(b"_") < 0:
                return None
    except (OSError, ValueError):  # an empty file cannot be mapped: nothing to find
        return None
    return _first_bad(path, only=b"_")


def _read(path: str) -> tuple[Any, np.ndarray]:
    """Sparse features (raw indices) and labels of one file, or a DataError naming it and the
    line at fault."""
    p = Path(path)
    if not p.is_file():
        why = (
            "is a directory"
            if p.is_dir()
            else ("is not a regular file" if p.exists() else "no such file")
        )
        raise DataError(f"cannot read svmlight file {path!r}: {why}")
    from sklearn.datasets import load_svmlight_file

    try:
        x, y = load_svmlight_file(str(p), dtype=np.float32, zero_based=True)
    except OSError as exc:
        raise DataError(f"cannot read svmlight file {path!r}: {exc.strerror or exc}") from None
    except (ValueError, RuntimeError, UnicodeError, OverflowError):
        raise DataError(f"svmlight file {path!r}, {first_problem(p)}") from None
    if x.shape[0] == 0:
        raise DataError(f"svmlight file {path!r} has no samples")
    if not (np.isfinite(x.data).all() and np.isfinite(y).all()):
        raise DataError(f"svmlight file {path!r}, {first_problem(p)}")
    if (why := _underscored(p)) is not None:
        raise DataError(f"svmlight file {path!r}, {why}")
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


def load_svmlight(path: str, test_path: str | None, keep: Keep = None) -> Dataset:
    """Train (and test) file(s) as a dense Dataset; without a test file, a fixed 80/20 split.
    The rows stay sparse until the split and ``keep``'s share are chosen: only those become
    dense (a worker holds its own share, not the whole file)."""
    mats, ys = zip(*[_read(p) for p in (path, test_path) if p is not None], strict=True)
    if all(m.nnz and m.indices.min() > 0 for m in mats):  # no index 0 anywhere: one-based
        mats = tuple(m[:, 1:] for m in mats)
    n_features = max(1, mats[0].shape[1])
    mats = tuple(_fit_columns(m, n_features) for m in mats)
    labels, n_classes = _labels(path, *ys)
    name = f"svmlight:{Path(path).name}"
    if len(mats) == 2:
        x_train, y_train, x_test, y_test = mats[0], labels[0], mats[1], labels[1]
    else:
        train, test = split_rows(mats[0].shape[0], TEST_FRACTION, SPLIT_SEED)
        x_train, y_train = mats[0][train], labels[0][train]
        x_test, y_test = mats[0][test], labels[0][test]
    shard = None
    if keep is not None:
        worker, workers, seed = keep
        rows = shard_rows(x_train.shape[0], worker, workers, seed, name)
        x_train, y_train, shard = x_train[rows], y_train[rows], (worker, workers)
    check_dense_size(f"svmlight {path!r}", x_train.shape[0] + x_test.shape[0], n_features)
    return Dataset(
        name, x_train.toarray(), y_train, x_test.toarray(), y_test, n_classes, shard=shard
    )
