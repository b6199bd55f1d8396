"""``--data MODULE:FUNCTION``: a user's own arrays as a Dataset.

The function takes no arguments and returns ``(x_train, y_train, x_test, y_test)``: features of
any shape (one row per sample along the first axis: flat vectors, images ...), and labels as
integers 0..C-1 (classification, what hopbus's own models and the accuracy need) or floats (a
Keras model with a loss of its own). Features become float32; anything else that cannot be
trained on is one DataError line.
"""

from __future__ import annotations

import numpy as np

from hopbus.data.dataset import FLOAT32_MAX, DataError, Dataset, check_dense_size
from hopbus.models.custom import call_user, kind_of, load_callable

MAX_CLASSES = 100_000
"""Integer labels name classes 0..C-1 up to this C: labels beyond it are most likely a
regression's targets given as integers, and an output layer that wide would not fit."""


def _array(value: object, what: str, spec: str) -> np.ndarray:
    try:
        a = np.asarray(value)
    except Exception as exc:  # e.g. ragged lists
        raise DataError(f"--data {spec!r}: {what} is not an array ({type(exc).__name__})") from None
    if a.dtype.kind not in "biuf":
        raise DataError(f"--data {spec!r}: {what} holds {a.dtype}, not numbers")
    if a.ndim == 0:  # len() of it raised TypeError
        raise DataError(f"--data {spec!r}: {what} is a single number, not one row per sample")
    return a


def load_user_data(spec: str) -> Dataset:
    """The arrays ``spec``'s function returns, checked."""
    fn = load_callable(spec, "--data")
    got = call_user(fn, spec, "--data")
    if not isinstance(got, tuple | list) or len(got) != 4:
        size = f" of {len(got)}" if isinstance(got, tuple | list) else ""
        raise DataError(
            f"--data {spec!r} returned {kind_of(got)}{size}: expected 4 arrays, "
            "(x_train, y_train, x_test, y_test)"
        )
    names = ("x_train", "y_train", "x_test", "y_test")
    x_train, y_train, x_test, y_test = (_array(v, n, spec) for v, n in zip(got, names, strict=True))
    for x, y, xn, yn in (
        (x_train, y_train, "x_train", "y_train"),
        (x_test, y_test, "x_test", "y_test"),
    ):
        if x.ndim < 2:
            raise DataError(
                f"--data {spec!r}: {xn} needs one row per sample (shape {list(x.shape)})"
            )
        if len(x) != len(y) or len(x) == 0:
            raise DataError(
                f"--data {spec!r}: {xn} has {len(x)} rows and {yn} {len(y)}: they need the "
                "same number, and more than 0"
            )
        check_dense_size(f"--data {spec!r}: {xn}", len(x), int(np.prod(x.shape[1:])))
        for a, n in ((x, xn), (y, yn)):
            if a.dtype.kind != "f":
                continue
            # hopbus computes in float32: a float64 beyond its range would turn into inf there,
            # and the run would fail later as a divergence
            flat = a.reshape(len(a), -1)
            with np.errstate(invalid="ignore"):
                bad = ~(np.abs(flat) <= FLOAT32_MAX)  # NaN and inf too
            if bad.any():
                row, col = (int(v) for v in np.argwhere(bad)[0])
                finite = np.isfinite(flat[row, col])
                what = "beyond float32's range" if finite else "that is not finite"
                raise DataError(f"--data {spec!r}: {n} row {row} holds a value {what}")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataError(
            f"--data {spec!r}: x_train rows are {list(x_train.shape[1:])}, x_test rows "
            f"{list(x_test.shape[1:])}"
        )
    ints = y_train.dtype.kind in "biu" and y_test.dtype.kind in "biu"
    if ints:
        y_train, y_test = _class_ids(y_train, "y_train", spec), _class_ids(y_test, "y_test", spec)
        low = min(int(y_train.min()), int(y_test.min()))
        if low < 0:
            raise DataError(f"--data {spec!r}: integer labels must be 0..C-1, found {low}")
        n_classes = max(int(y_train.max()), int(y_test.max())) + 1
        if n_classes > MAX_CLASSES:  # a model's output layer that size would not fit anywhere
            raise DataError(
                f"--data {spec!r}: integer labels must be 0..C-1 with C at most {MAX_CLASSES}, "
                f"found {n_classes - 1} (targets of a regression? give them as floats)"
            )
        y_train, y_test = y_train.astype(np.int64), y_test.astype(np.int64)
    else:
        n_classes = 0  # not a classification: hopbus's own models and accuracies do not apply
        y_train, y_test = y_train.astype(np.float32), y_test.astype(np.float32)
    return Dataset(
        spec, x_train.astype(np.float32), y_train, x_test.astype(np.float32), y_test, n_classes
    )


def _class_ids(y: np.ndarray, name: str, spec: str) -> np.ndarray:
    """Integer labels are class ids, one per row: a column of them (shape [N, 1]) is taken as
    one; more columns are refused (an int one-hot matrix reached a model's loss as an index
    and failed there, mid-run; one column broadcast into an accuracy of 39)."""
    if y.ndim == 2 and y.shape[1] == 1:
        return y[:, 0]
    if y.ndim != 1:
        raise DataError(
            f"--data {spec!r}: {name} has shape {list(y.shape)}: integer labels are class ids, "
            "one per row (one-hot? give y.argmax(axis=1); or floats, for a model of your own)"
        )
    return y


__all__ = ["load_user_data"]
