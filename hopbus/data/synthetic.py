"""A generated classification problem: known to be learnable, any size, no files.

Gaussian inputs labelled by a random linear teacher (argmax of x W), with a small fraction of
labels flipped so that the problem is not perfectly separable. Linear models can reach about
``1 - LABEL_NOISE`` test accuracy.
"""

from __future__ import annotations

import numpy as np

from hopbus.data.dataset import DataError, Dataset, check_dense_size

DEFAULTS = (4000, 32, 2)
LIMITS = {"SAMPLES": (10, 10_000_000), "FEATURES": (1, 100_000), "CLASSES": (2, 1000)}
LABEL_NOISE = 0.02
TEST_FRACTION = 0.2
CHUNK = 65536
"""Rows labelled at a time, so the logits of a large problem never exist all at once."""


def parse_synthetic(args: str) -> tuple[int, int, int]:
    """SAMPLES[,FEATURES[,CLASSES]] -> (samples, features, classes), defaults filling the rest."""
    parts = [p.strip() for p in args.split(",")] if args.strip() else []
    if len(parts) > 3:
        raise DataError(f"synthetic takes at most SAMPLES,FEATURES,CLASSES; got {args!r}")
    values = list(DEFAULTS)
    for i, (text, (label, (low, high))) in enumerate(zip(parts, LIMITS.items(), strict=False)):
        try:
            value = int(text)
        except ValueError:
            raise DataError(f"synthetic {label} must be an integer, got {text!r}") from None
        if not low <= value <= high:
            raise DataError(f"synthetic {label} must be in {low}..{high:_}, got {value}")
        values[i] = value
    return values[0], values[1], values[2]


def make_synthetic(samples: int, features: int, classes: int, seed: int) -> Dataset:
    """The problem of this size for ``seed`` (same seed, same arrays); an 80/20 split."""
    check_dense_size("synthetic", samples, features)
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((features, classes), dtype=np.float32)
    x = rng.standard_normal((samples, features), dtype=np.float32)
    y = np.empty(samples, np.int64)
    for start in range(0, samples, CHUNK):
        y[start : start + CHUNK] = (x[start : start + CHUNK] @ teacher).argmax(axis=1)
    flipped = np.flatnonzero(rng.random(samples) < LABEL_NOISE)
    y[flipped] = (y[flipped] + rng.integers(1, classes, len(flipped))) % classes
    n_test = max(1, round(samples * TEST_FRACTION))
    n_train = samples - n_test
    return Dataset(
        f"synthetic:{samples},{features},{classes}",
        x[:n_train],
        y[:n_train],
        x[n_train:],
        y[n_train:],
        n_classes=classes,
    )
