"""The one shape every loader produces, and the error every loader raises."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hopbus.errors import UserError

MAX_DENSE_BYTES = 2 * 2**30
"""Largest dense feature matrix a loader builds: every worker process holds its own copy."""


#: The largest magnitude a feature may have: hopbus computes in float32, where a larger one is
#: inf (a data file or a ``--data`` function holding one is refused, not trained into NaN)
FLOAT32_MAX = float(np.finfo(np.float32).max)


class DataError(UserError):
    """A data set spec or data file that cannot be used."""


Keep = tuple[int, int, int] | None
"""(worker, workers, seed): load only that worker's share of the training rows (each worker
process then holds its own share, not the whole set: batches.shard_rows decides which)."""


@dataclass(frozen=True)
class Dataset:
    """float32 features, one row per sample along the first axis (2-D for hopbus's loaders; a
    user's ``--data`` may keep images' shape), and labels: int64 in 0..n_classes-1, or float32
    targets for a user's Keras model (``n_classes`` 0). Split train/test."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    shard: tuple[int, int] | None = None  # (worker, workers): x_train is that worker's share

    def __post_init__(self) -> None:
        for x, y in ((self.x_train, self.y_train), (self.x_test, self.y_test)):
            if (
                x.ndim < 2
                or x.dtype != np.float32
                or y.dtype not in (np.int64, np.float32)
                or len(x) != len(y)
            ):
                raise ValueError(f"{self.name}: malformed arrays {x.shape}/{x.dtype}, {y.shape}")
        if self.x_train.shape[1:] != self.x_test.shape[1:]:
            raise ValueError(f"{self.name}: train and test have different feature counts")

    @property
    def n_features(self) -> int:
        """Numbers per sample (the input size of a model that takes flat rows)."""
        return int(np.prod(self.x_train.shape[1:]))


def check_dense_size(what: str, rows: int, cols: int) -> None:
    """Refuse, before allocating, a float32 matrix over ``MAX_DENSE_BYTES``."""
    size = rows * cols * 4
    if size > MAX_DENSE_BYTES:
        raise DataError(
            f"{what}: {rows} x {cols} dense float32 features would take {size / 2**30:.1f} GiB, "
            f"more than the {MAX_DENSE_BYTES // 2**30} GiB limit"
        )


def split_rows(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test row indices: a permutation from ``seed``, at least one row on each side."""
    if n < 2:
        raise DataError(f"need at least 2 samples to split into train and test, got {n}")
    n_test = min(n - 1, max(1, round(n * test_fraction)))
    perm = np.random.default_rng(seed).permutation(n)
    return perm[n_test:], perm[:n_test]
