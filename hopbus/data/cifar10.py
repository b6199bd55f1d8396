"""CIFAR-10's "python version" folder, unpickled with an allow-list.

The batches are pickles, and a pickle can run any code it names. Only the handful of globals
that numpy arrays in such files need are allowed; a file asking for anything else is refused
before it runs.
"""

from __future__ import annotations

import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from hopbus.data.batches import shard_rows
from hopbus.data.dataset import DataError, Dataset, Keep

N_CLASSES = 10
N_PIXELS = 3072  # 32 x 32 x 3, channel-major as stored
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,63}")  # a module.name fit to be quoted


def _allowed() -> dict[tuple[str, str], Any]:
    """The globals a CIFAR-10 batch may name, under both numpy 1 and numpy 2 module paths."""
    import codecs
    import copyreg

    try:
        from numpy._core.multiarray import _reconstruct
        from numpy._core.numeric import _frombuffer
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
        from numpy.core.numeric import _frombuffer  # type: ignore[no-redef]
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("copyreg", "_reconstructor"): copyreg._reconstructor,  # type: ignore[attr-defined]
        ("_codecs", "encode"): codecs.encode,  # how protocol 2 spells bytes
    }
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = _reconstruct
        allowed[(f"{core}.numeric", "_frombuffer")] = _frombuffer
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only allow-listed globals."""

    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file, encoding="bytes")
        self._path = path
        self._allowed = _allowed()

    def find_class(self, module: str, name: str) -> Any:
        found = self._allowed.get((module, name))
        if found is None:  # the names come from the file: quoted only if they are names
            asked = f"{module}.{name}"
            what = asked if _NAME.fullmatch(asked) else "something else"
            raise DataError(
                f"refusing to load {str(self._path)!r}: it asks for {what}, which a CIFAR-10 "
                "batch never does"
            )
        return found


def _load_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Pixels (N x 3072 uint8) and int64 labels of one batch file, checked."""
    try:
        with path.open("rb") as f:
            batch = _RestrictedUnpickler(f, path).load()
    except DataError:
        raise
    except OSError as exc:
        raise DataError(f"cannot read CIFAR-10 file {str(path)!r}: {exc.strerror or exc}") from None
    except Exception as exc:  # any unpickling failure of a damaged or foreign file
        raise DataError(
            f"cannot read CIFAR-10 file {str(path)!r}: not a CIFAR-10 batch ({type(exc).__name__})"
        ) from None
    data = batch.get(b"data") if isinstance(batch, dict) else None
    labels = batch.get(b"labels") if isinstance(batch, dict) else None
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise DataError(f"CIFAR-10 file {str(path)!r}: no uint8 'data' matrix")
    try:  # a list of lists of unequal lengths: np.ndim raises
        flat = isinstance(labels, list | np.ndarray) and np.ndim(labels) == 1
    except ValueError:
        flat = False
    count = len(labels) if flat else None
    if data.shape[1] != N_PIXELS or count != len(data) or not count:
        raise DataError(
            f"CIFAR-10 file {str(path)!r}: expected N x {N_PIXELS} data and N labels, N above "
            f"0, got {data.shape} and {'no list of' if count is None else count} labels"
        )
    try:  # integers only: 3.7 or "3" was cast, and trained on as another class
        y = np.asarray(labels)
        y = (
            y.astype(np.int64)
            if y.dtype.kind in "iu" or (y.dtype == object and all(type(v) is int for v in labels))
            else None
        )
    except (OverflowError, ValueError, TypeError):
        y = None
    if y is None or y.ndim != 1 or (len(y) and (y.min() < 0 or y.max() >= N_CLASSES)):
        raise DataError(f"CIFAR-10 file {str(path)!r}: labels are not all in 0..{N_CLASSES - 1}")
    return data, y


def _scaled(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels as float32 in [0, 1]."""
    x = pixels.astype(np.float32)
    x *= np.float32(1 / 255)
    return x


def load_cifar10(folder: str, keep: Keep = None) -> Dataset:
    """Whichever of data_batch_1..5 exist (at least one) for training, test_batch for testing;
    with ``keep``, only that worker's share of the training images becomes float32."""
    root = Path(folder)
    if not root.is_dir():
        why = "not a directory" if root.exists() else "no such directory"
        raise DataError(f"cannot read CIFAR-10 folder {folder!r}: {why}")
    train_paths = [root / name for name in TRAIN_FILES if (root / name).is_file()]
    if not train_paths:
        raise DataError(f"CIFAR-10 folder {folder!r} has none of data_batch_1..data_batch_5")
    if len(train_paths) < len(TRAIN_FILES):  # a subset is fine (a quick run), but said
        left = [n for n in TRAIN_FILES if root / n not in train_paths]
        warnings.warn(
            f"CIFAR-10 folder {folder!r}: training on {len(train_paths)} of the 5 batches "
            f"({', '.join(left)}: missing, or not a regular file)",
            UserWarning,
            stacklevel=2,
        )
    if not (root / TEST_FILE).is_file():
        raise DataError(f"CIFAR-10 folder {folder!r} has no {TEST_FILE}")
    parts = [_load_batch(p) for p in train_paths]
    pixels_test, y_test = _load_batch(root / TEST_FILE)
    pixels = np.concatenate([x for x, _ in parts])
    y_train = np.concatenate([y for _, y in parts])
    shard = None
    if keep is not None:
        worker, workers, seed = keep
        rows = shard_rows(len(y_train), worker, workers, seed, "cifar10")
        pixels, y_train, shard = pixels[rows], y_train[rows], (worker, workers)
    return Dataset(
        "cifar10", _scaled(pixels), y_train, _scaled(pixels_test), y_test, N_CLASSES, shard=shard
    )
