"""Each worker's own part of the training set, and an endless stream of minibatches from it."""

from __future__ import annotations

from typing import Any

import numpy as np

from hopbus.data.dataset import DataError, Dataset


def position_problem(order: np.ndarray, info: Any) -> str | None:
    """Why ``order`` and ``info`` (what :meth:`Batches.state` returns) are not a minibatch
    position, whatever rows they are for; None if they are one. The one rule, for a
    checkpoint read before the data is loaded and for :meth:`Batches.load_state`."""
    if order.ndim != 1 or order.dtype.kind not in "iu":
        return "the saved order is not a list of row numbers"
    if not np.array_equal(np.sort(order), np.arange(len(order))):
        return f"the saved order is not a permutation of the {len(order)} rows"
    if not isinstance(info, dict):
        return "the saved position is not an object"
    pos, epoch = info.get("pos"), info.get("epoch")
    if type(pos) is not int or not 0 <= pos <= len(order):
        return f"the saved position is not a row number of 0..{len(order)}"
    if type(epoch) is not int or epoch < 0 or not isinstance(info.get("rng"), dict):
        return "the saved epoch or generator state is malformed"
    return None


def shard_rows(
    n: int, worker: int, n_workers: int, seed: int, name: str = "the data"
) -> np.ndarray:
    """Worker ``worker``'s rows of ``n``: one permutation from ``seed`` cut into ``n_workers``
    near-equal, disjoint pieces that together are every row (sorted, so a sorted file stays
    sorted). The one sharding rule, for hopbus's loaders and a script's ``ctx.shard``."""
    if n_workers < 1 or not 0 <= worker < n_workers:
        raise ValueError(f"worker {worker} is not one of {n_workers} workers")
    if n_workers > n:
        raise DataError(
            f"{name} has {n} training samples, too few for {n_workers} workers (one each)"
        )
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(np.array_split(perm, n_workers)[worker])


def shard(ds: Dataset, worker: int, n_workers: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker ``worker``'s part of the training set (``shard_rows``); a data set loaded as that
    share already (``Dataset.shard``) is it."""
    if ds.shard is not None:
        if ds.shard != (worker, n_workers):
            raise ValueError(f"{ds.name} holds worker {ds.shard[0]}'s share, not worker {worker}'s")
        return ds.x_train, ds.y_train
    rows = shard_rows(len(ds.y_train), worker, n_workers, seed, ds.name)
    return ds.x_train[rows], ds.y_train[rows]


class Batches:
    """Minibatches of ``batch_size`` rows, forever: the rows in a fresh order each epoch (from
    ``seed``), and a batch that crosses an epoch's end takes the rest from the next order, so
    every row is used once per epoch and every batch is full."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, seed: int) -> None:
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"need as many labels as rows, and some rows: {len(x)}, {len(y)}")
        if batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {batch_size}")
        self.x = x
        self.y = y
        self.batch_size = min(batch_size, len(x))
        self.epoch = 0
        self._rng = np.random.default_rng(seed)
        self._order = self._rng.permutation(len(x))
        self._pos = 0

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        """The next minibatch (all of x when the batch size is at least its length)."""
        if self.batch_size == len(self.x):
            self.epoch += 1
            return self.x, self.y
        rows = self._order[self._pos : self._pos + self.batch_size]
        self._pos += len(rows)
        if len(rows) < self.batch_size:
            self._order = self._rng.permutation(len(self.x))
            self.epoch += 1
            self._pos = self.batch_size - len(rows)
            rows = np.concatenate([rows, self._order[: self._pos]])
        elif self._pos == len(self.x):
            self._order = self._rng.permutation(len(self.x))
            self.epoch += 1
            self._pos = 0
        return self.x[rows], self.y[rows]

    def state(self) -> tuple[np.ndarray, dict[str, Any]]:
        """Where the stream is: the current permutation, and its position, epoch and random
        generator's state as JSON-ready values (for checkpoints)."""
        info = {"pos": self._pos, "epoch": self.epoch, "rng": self._rng.bit_generator.state}
        return self._order.copy(), info

    def load_state(self, order: np.ndarray, info: dict[str, Any]) -> None:
        """Continue exactly where :meth:`state` was taken (same rows, same batch size)."""
        order = np.asarray(order)
        if order.shape != (len(self.x),):
            raise ValueError(f"a minibatch position for {len(order)} rows, not {len(self.x)}")
        why = position_problem(order, info)
        if why is not None:
            raise ValueError(why)
        rng = np.random.default_rng()
        rng.bit_generator.state = info["rng"]
        self._rng = rng
        self._order = order.astype(np.int64, copy=True)
        self._pos = int(info["pos"])
        self.epoch = int(info["epoch"])

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> tuple[np.ndarray, np.ndarray]:
        return self.next()
