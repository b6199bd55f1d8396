"""SGD with momentum and weight decay, as the paper trains (momentum 0.9; weight decay 1e-4 for
VGG, 1e-7 for the SVM).

``step`` never touches the arrays it is given and returns new ones: parameters may be in flight
in zero-copy messages. The momentum buffers are the optimizer's own, so they are updated in
place.
"""

from __future__ import annotations

import numpy as np

from hopbus.errors import ConfigError
from hopbus.models.base import Params


class SGD:
    """g = grad + weight_decay * p;  v = momentum * v + g;  p_new = p - lr * v."""

    def __init__(self, lr: float, momentum: float = 0.9, weight_decay: float = 0.0) -> None:
        if not lr > 0:
            raise ConfigError(f"learning rate must be positive, got {lr}")
        if not 0 <= momentum < 1:
            raise ConfigError(f"momentum must be in [0, 1), got {momentum}")
        if not weight_decay >= 0:
            raise ConfigError(f"weight decay must be non-negative, got {weight_decay}")
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self._velocity: dict[str, np.ndarray] = {}

    def step(self, params: Params, grads: Params) -> Params:
        """New parameters after one step; ``params`` and ``grads`` are left as they were."""
        if params.keys() != grads.keys():
            raise ValueError(f"gradient names {list(grads)} do not match params {list(params)}")
        new: Params = {}
        for name, p in params.items():
            g = grads[name] + self.weight_decay * p if self.weight_decay else grads[name]
            v = self._velocity.get(name)
            if v is None or v.shape != p.shape:
                v = self._velocity[name] = np.zeros_like(p)
            v *= self.momentum
            v += g
            new[name] = (p - self.lr * v).astype(p.dtype, copy=False)
        return new

    def state(self) -> dict[str, np.ndarray]:
        """Copies of the momentum buffers, by parameter name (for checkpoints)."""
        return {name: v.copy() for name, v in self._velocity.items()}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore momentum buffers saved by :meth:`state` (copied, so the caller keeps its own)."""
        self._velocity = {name: np.array(v, copy=True) for name, v in state.items()}
