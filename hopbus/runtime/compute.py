"""What a worker computes: its model, data shard, optimizer and emulated compute time.

Nothing here knows about the protocol or the network; the worker driver calls ``gradient``,
``reduce``, ``apply`` and ``evaluate`` when the protocol's effects ask for them. Parameters are
immutable arrays (see hopbus.models): every step returns new ones, so a snapshot handed to the
transport zero-copy is never changed under its feet.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from hopbus.config import TrainConfig
from hopbus.data import Batches, load_dataset, shard
from hopbus.heterogeneity import Heterogeneity
from hopbus.models import SGD, Params, build_model
from hopbus.runtime.checkpoint import CheckpointError, WorkerState

EVAL_LIMIT = 2000  # test examples used by periodic evaluations (the final one uses all)


class Trainer:
    """Worker ``worker``'s model state and its training step."""

    def __init__(self, cfg: TrainConfig, worker: int, het: Heterogeneity) -> None:
        assert cfg.workers is not None
        self.cfg = cfg
        self.worker = worker
        self.het = het
        data = load_dataset(cfg.data, cfg.seed)
        x, y = shard(data, worker, cfg.workers, cfg.seed)
        self.batches = Batches(x, y, cfg.batch_size, seed=cfg.seed * 100_003 + worker)
        self.x_test, self.y_test = data.x_test, data.y_test
        pick = np.random.default_rng(0).permutation(len(self.x_test))[:EVAL_LIMIT]
        pick.sort()  # a fixed random subset: test files may be sorted by class
        self.x_eval, self.y_eval = self.x_test[pick], self.y_test[pick]
        self.model = build_model(
            cfg.model, data.n_features, data.n_classes, hidden=cfg.hidden, device=cfg.device
        )
        self.params: Params = self.model.init_params(cfg.seed)  # same p0 on every worker
        # where the gradients are computed ("cpu", "gpu:0"), known once the model is built
        self.device: str = getattr(self.model, "device", None) or "cpu"
        self.opt = SGD(cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        self._grads: Params | None = None
        self.loss = float("nan")

    def gradient(self, iteration: int) -> tuple[float, float]:
        """Gradients on the next minibatch, then sleep to the emulated compute time times this
        worker's slowdown factor. Returns (seconds computing, of which emulated)."""
        t0 = time.perf_counter()
        xb, yb = self.batches.next()
        self.loss, self._grads = self.model.loss_and_grad(self.params, xb, yb)
        real = time.perf_counter() - t0
        base = self.cfg.iter_time if self.cfg.iter_time > 0 else real
        target = base * self.het.factor(self.worker, iteration)
        if target > real:
            time.sleep(target - real)  # emulated compute: the slowdown of --slowdown/--iter-time
        return time.perf_counter() - t0, max(0.0, target - real)

    def reduce(self, self_weight: float, terms: Sequence[tuple[Params, float]]) -> None:
        """params := self_weight * params + sum(weight * theirs)."""
        out: Params = {}
        for name, mine in self.params.items():
            acc = mine * np.float32(self_weight)
            for theirs, weight in terms:
                acc += theirs[name] * np.float32(weight)
            out[name] = acc
        self.params = out

    def apply(self) -> None:
        assert self._grads is not None, "Apply before Compute"
        self.params = self.opt.step(self.params, self._grads)
        self._grads = None

    @property
    def grads(self) -> Params:
        """The last Compute's gradients (to push to a parameter server)."""
        assert self._grads is not None, "no gradients before Compute"
        return self._grads

    def step(self, grads: Params) -> None:
        """params := the optimizer's step along ``grads`` (a parameter server's update)."""
        self.params = self.opt.step(self.params, grads)

    def scale(self, total: Params, divisor: float) -> None:
        """params := total / divisor (a group's or the global model average)."""
        inv = np.float32(1.0 / divisor)
        self.params = {name: a * inv for name, a in total.items()}

    def state(self) -> WorkerState:
        """What a checkpoint keeps: parameters, momentum and the minibatch stream's place."""
        order, stream = self.batches.state()
        return WorkerState(dict(self.params), self.opt.state(), order, stream)

    def load_state(self, state: WorkerState) -> None:
        """Continue from a checkpoint's state (its layout was checked by checkpoint.load).
        Without a saved stream position, the minibatches restart from the worker's seed."""
        self.params = {name: np.array(a, copy=True) for name, a in state.params.items()}
        self.opt.load_state(state.optimizer)
        if state.order is not None and state.stream:
            try:
                self.batches.load_state(state.order, state.stream)
            except (ValueError, KeyError, TypeError) as exc:
                raise CheckpointError(f"checkpoint's minibatch position: {exc}") from None
        self._grads = None

    def adopt(self, params: Params) -> None:
        """Start from a neighbour's parameters (a replacement rejoining a run): copies, and no
        momentum yet."""
        self.params = {name: np.array(a, copy=True) for name, a in params.items()}
        self.opt.load_state({})
        self._grads = None

    def evaluate(self, *, full: bool = False) -> tuple[float, float]:
        """Test loss and accuracy: on the whole test set, or on the periodic subset."""
        if full:
            return self.model.evaluate(self.params, self.x_test, self.y_test)
        return self.model.evaluate(self.params, self.x_eval, self.y_eval)
