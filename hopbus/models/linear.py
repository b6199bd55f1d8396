"""The paper's convex models: binary logistic regression ("SVM with log loss") and its
multinomial form.

Both start from zeros: the loss is convex, so nothing is gained from a random start, and the
seed can never make workers disagree on p0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hopbus.models.base import (
    Params,
    chunked_evaluate,
    compute_dtype,
    sigmoid,
    softmax_xent,
    xent_stats,
)


@dataclass(frozen=True)
class LogReg:
    """Binary logistic regression: p(y=1 | x) = sigmoid(x . w + b), labels in {0, 1}."""

    n_features: int
    name: str = field(default="logreg", init=False)

    def init_params(self, seed: int) -> Params:
        """Zeros (the seed is accepted for the common interface)."""
        del seed
        return {"w": np.zeros(self.n_features, np.float32), "b": np.zeros(1, np.float32)}

    def _margin(self, params: Params, x: np.ndarray) -> np.ndarray:
        dtype = compute_dtype(params)
        return x.astype(dtype, copy=False) @ params["w"].astype(dtype, copy=False) + params[
            "b"
        ].astype(dtype, copy=False)

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, Params]:
        """Mean log loss log(1 + exp(-s z)) with s = 2y - 1, and its gradient."""
        z = self._margin(params, x)
        sign = 2.0 * y.astype(z.dtype) - 1.0
        loss = float(np.logaddexp(0.0, -sign * z).mean(dtype=np.float64))
        dz = (sigmoid(z) - y.astype(z.dtype)) / len(y)
        xd = x.astype(z.dtype, copy=False)
        grads = {
            "w": (dz @ xd).astype(params["w"].dtype, copy=False),
            "b": np.array([dz.sum()], dtype=params["b"].dtype),
        }
        return loss, grads

    def evaluate(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean log loss and accuracy (predict 1 where the margin is positive)."""

        def stats(xs: np.ndarray, ys: np.ndarray) -> tuple[float, int]:
            z = self._margin(params, xs)
            sign = 2.0 * ys.astype(z.dtype) - 1.0
            loss_sum = float(np.logaddexp(0.0, -sign * z).sum(dtype=np.float64))
            return loss_sum, int(((z > 0) == (ys == 1)).sum())

        return chunked_evaluate(stats, x, y)


@dataclass(frozen=True)
class Softmax:
    """Multinomial logistic regression: softmax(x W + b)."""

    n_features: int
    n_classes: int
    name: str = field(default="softmax", init=False)

    def init_params(self, seed: int) -> Params:
        """Zeros (the seed is accepted for the common interface)."""
        del seed
        return {
            "W": np.zeros((self.n_features, self.n_classes), np.float32),
            "b": np.zeros(self.n_classes, np.float32),
        }

    def _logits(self, params: Params, x: np.ndarray) -> np.ndarray:
        dtype = compute_dtype(params)
        return x.astype(dtype, copy=False) @ params["W"].astype(dtype, copy=False) + params[
            "b"
        ].astype(dtype, copy=False)

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, Params]:
        """Mean cross-entropy and its gradient."""
        logits = self._logits(params, x)
        loss, dlogits = softmax_xent(logits, y)
        xd = x.astype(logits.dtype, copy=False)
        grads = {
            "W": (xd.T @ dlogits).astype(params["W"].dtype, copy=False),
            "b": dlogits.sum(axis=0).astype(params["b"].dtype, copy=False),
        }
        return loss, grads

    def evaluate(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean cross-entropy and argmax accuracy."""
        return chunked_evaluate(lambda xs, ys: xent_stats(self._logits(params, xs), ys), x, y)
