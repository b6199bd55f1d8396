"""A one-hidden-layer ReLU network: the smallest non-convex model, standing in for the paper's
VGG/ResNet where a real network is too slow for tests and laptops."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hopbus.models.base import Params, chunked_evaluate, compute_dtype, softmax_xent, xent_stats


@dataclass(frozen=True)
class MLP:
    """softmax(relu(x W1 + b1) W2 + b2)."""

    n_features: int
    n_classes: int
    hidden: int = 64
    name: str = field(default="mlp", init=False)

    def init_params(self, seed: int) -> Params:
        """He-normal weights (std sqrt(2 / fan_in)) from ``seed``, zero biases."""
        rng = np.random.default_rng(seed)
        w1 = rng.standard_normal((self.n_features, self.hidden)) * np.sqrt(2.0 / self.n_features)
        w2 = rng.standard_normal((self.hidden, self.n_classes)) * np.sqrt(2.0 / self.hidden)
        return {
            "W1": w1.astype(np.float32),
            "b1": np.zeros(self.hidden, np.float32),
            "W2": w2.astype(np.float32),
            "b2": np.zeros(self.n_classes, np.float32),
        }

    def _forward(self, params: Params, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Input (in the compute dtype), hidden activations and logits."""
        dtype = compute_dtype(params)
        p = {k: v.astype(dtype, copy=False) for k, v in params.items()}
        xd = x.astype(dtype, copy=False)
        hidden = np.maximum(xd @ p["W1"] + p["b1"], 0.0)
        return xd, hidden, hidden @ p["W2"] + p["b2"]

    def loss_and_grad(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, Params]:
        """Mean cross-entropy and its gradient by backpropagation."""
        xd, hidden, logits = self._forward(params, x)
        loss, dlogits = softmax_xent(logits, y)
        w2 = params["W2"].astype(logits.dtype, copy=False)
        dhidden = (dlogits @ w2.T) * (hidden > 0)
        grads = {
            "W1": xd.T @ dhidden,
            "b1": dhidden.sum(axis=0),
            "W2": hidden.T @ dlogits,
            "b2": dlogits.sum(axis=0),
        }
        return loss, {k: g.astype(params[k].dtype, copy=False) for k, g in grads.items()}

    def evaluate(self, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """Mean cross-entropy and argmax accuracy."""
        return chunked_evaluate(lambda xs, ys: xent_stats(self._forward(params, xs)[2], ys), x, y)
