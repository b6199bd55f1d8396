"""What every model offers the worker, and the numerically stable pieces they share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

Params = dict[str, np.ndarray]
"""Named float32 arrays, insertion-ordered; never modified in place (see the package doc)."""

EVAL_CHUNK = 8192
"""Rows per forward pass in ``evaluate``, so a large test set never needs one huge activation."""


@runtime_checkable
class Model(Protocol):
    """A differentiable model: the worker needs nothing else to train and test it."""

    @property
    def name(self) -> str:
        """The registry name (one of ``MODELS``)."""
        ...

    def init_params(self, seed: int) -> Params:
        """The starting point p0; the same seed gives the same arrays on every worker."""
        ...

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, Params]:
        """Mean loss over the batch and its gradient (same names, shapes and dtypes as params)."""
        ...

    def evaluate(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean loss and accuracy in [0, 1] over ``x`` (any size: done in chunks)."""
        ...


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax, shifted by the row maximum so ``exp`` never overflows."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def sigmoid(z: np.ndarray) -> np.ndarray:
    """Logistic function without overflow for large ``|z|``."""
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(z.dtype, copy=False)


def compute_dtype(params: Params) -> np.dtype:
    """float32 for ordinary float32 params; float64 when a caller (a gradient check) asks."""
    return np.result_type(*params.values(), np.float32)


def softmax_xent(logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy and its gradient with respect to the logits."""
    n = len(y)
    logp = log_softmax(logits)
    rows = np.arange(n)
    loss = -float(logp[rows, y].mean(dtype=np.float64))
    dlogits = np.exp(logp)
    dlogits[rows, y] -= 1.0
    dlogits /= n
    return loss, dlogits


def xent_stats(logits: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """Summed cross-entropy and number of correct argmax predictions of one chunk."""
    logp = log_softmax(logits)
    loss_sum = -float(logp[np.arange(len(y)), y].sum(dtype=np.float64))
    return loss_sum, int((logp.argmax(axis=1) == y).sum())


def chunked_evaluate(
    stats_of: Callable[[np.ndarray, np.ndarray], tuple[float, int]], x: np.ndarray, y: np.ndarray
) -> tuple[float, float]:
    """Mean loss and accuracy from per-chunk (loss sum, correct count), ``EVAL_CHUNK`` rows at
    a time so memory stays bounded whatever the size of ``x``."""
    if len(y) == 0:
        return 0.0, 0.0
    total_loss = 0.0
    correct = 0
    for start in range(0, len(y), EVAL_CHUNK):
        loss_sum, n_correct = stats_of(x[start : start + EVAL_CHUNK], y[start : start + EVAL_CHUNK])
        total_loss += loss_sum
        correct += n_correct
    return total_loss / len(y), correct / len(y)
