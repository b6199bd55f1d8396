"""What a worker computes: its model, data shard, optimizer and emulated compute time.

Nothing here knows about the protocol or the network; the worker driver calls ``gradient``,
``reduce``, ``apply`` and ``evaluate`` when the protocol's effects ask for them. Parameters are
immutable arrays (see hopbus.models): every step returns new ones, so a snapshot handed to the
transport zero-copy is never changed under its feet.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from hopbus.config import TrainConfig
from hopbus.data import Batches, Dataset, load_dataset, shard
from hopbus.errors import ConfigError
from hopbus.heterogeneity import Heterogeneity
from hopbus.models import SGD, Model, Params, build_model
from hopbus.models.custom import (
    check_numpy_model,
    is_callable_spec,
    is_keras_model,
    keras_mode_line,
)
from hopbus.runtime.checkpoint import CheckpointError, WorkerState

EVAL_LIMIT = 2000  # test examples used by periodic evaluations (the final one uses all)


def eval_subset(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The test examples periodic evaluations use: a fixed random subset of ``EVAL_LIMIT``
    (test files may be sorted by class)."""
    pick = np.random.default_rng(0).permutation(len(x))[:EVAL_LIMIT]
    pick.sort()
    return x[pick], y[pick]


def flat(data: Dataset) -> Dataset:
    """``data`` with one flat row per sample (a user's images, for hopbus's own models)."""
    if data.x_train.ndim == 2:
        return data
    return replace(
        data,
        x_train=data.x_train.reshape(len(data.x_train), -1),
        x_test=data.x_test.reshape(len(data.x_test), -1),
    )


def paced(real: float, iter_time: float, factor: float) -> float:
    """Seconds a Compute must take, as --iter-time and --slowdown say: the emulated time (or,
    with --iter-time 0, the real one) times the worker's slowdown factor in that iteration.
    Whoever computes sleeps for what is left: every model, built in or a user's, alike."""
    return (iter_time if iter_time > 0 else real) * factor


class Trainer:
    """Worker ``worker``'s model state and its training step."""

    def __init__(
        self,
        cfg: TrainConfig,
        worker: int,
        het: Heterogeneity,
        *,
        data: Dataset | None = None,
        model: Model | None = None,
    ) -> None:
        """``data`` and ``model``: already loaded and built (a user's ``--model``); by default
        the run's ``--data`` and ``--model``."""
        assert cfg.workers is not None
        self.cfg = cfg
        self.worker = worker
        self.het = het
        if data is None:
            data = load_dataset(cfg.data, cfg.seed, keep=(worker, cfg.workers, cfg.seed))
        if model is None:
            model = build_model(
                cfg.model, data.n_features, data.n_classes, hidden=cfg.hidden, device=cfg.device
            )
            if is_keras_model(model):
                raise ConfigError(keras_mode_line(cfg.model, cfg.mode))
            if not is_callable_spec(cfg.model):
                data = flat(data)  # hopbus's own models take one flat row per sample
        if is_callable_spec(cfg.model):  # a user's numpy model, as hopbus train looked at it
            few = slice(0, cfg.batch_size)  # (a compose or multi-host run's, not there)
            check_numpy_model(model, cfg.model, cfg.seed, data.x_train[few], data.y_train[few])
        x, y = shard(data, worker, cfg.workers, cfg.seed)
        self.batches = Batches(x, y, cfg.batch_size, seed=cfg.seed * 100_003 + worker)
        self.x_test, self.y_test = data.x_test, data.y_test
        self.x_eval, self.y_eval = eval_subset(self.x_test, self.y_test)
        self.model = model
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
        target = paced(real, self.cfg.iter_time, self.het.factor(self.worker, iteration))
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

    def local_step(self, params: Params) -> tuple[Params, float]:
        """One SGD step from ``params`` on the next minibatch: (the new parameters, the
        minibatch's loss). The step a Hop worker hands its session (hopbus/runtime/builtin.py)."""
        xb, yb = self.batches.next()
        self.loss, grads = self.model.loss_and_grad(params, xb, yb)
        return self.opt.step(params, grads), self.loss

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
            except (ValueError, KeyError, TypeError, IndexError, OverflowError) as exc:
                why = str(exc) if isinstance(exc, ValueError) else "malformed"
                raise CheckpointError(f"its minibatch position is unusable ({why})") from None
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
