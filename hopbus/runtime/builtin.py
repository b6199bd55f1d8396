"""``hopbus worker`` without a command: the run's ``--model`` on its ``--data``, through the same
``Context`` and ``Session`` every user's training loop goes through.

* hopbus's own models and a user's numpy model (``--model MODULE:FUNCTION``): a plain loop,
  one SGD step (``Trainer.local_step``) between ``begin`` and ``end``, evaluated on the test
  subset every --eval-every iterations and on the whole test set at the end; checkpoints
  every --checkpoint-every iterations, and ``--resume-from`` starts from one.
* a user's compiled Keras model: ``model.fit`` with ``HopCallback`` on this worker's shard,
  one epoch per --eval-every iterations so that Keras validates on the test subset exactly
  there, and the final report from the whole test set.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from hopbus.api import Context
from hopbus.coord import read
from hopbus.coord.keys import RESUMED_FROM
from hopbus.data import Batches, Dataset, load_dataset, shard
from hopbus.errors import ConfigError, RunFailure
from hopbus.models import build_model
from hopbus.models.custom import is_callable_spec, is_keras_model
from hopbus.runtime import checkpoint
from hopbus.runtime.checkpoint import CheckpointError
from hopbus.runtime.compute import Trainer, eval_subset
from hopbus.runtime.node import redis_failures
from hopbus.runtime.reported import scored
from hopbus.runtime.worker import Worker
from hopbus.transport import layout_of


def train_builtin(node: Worker) -> dict[str, Any]:
    """Join, train the run's model to the end, report; returns this worker's result."""
    ctx = Context(node, tensorboard=node.tensorboard_dir, report=False)  # the CLI reports
    try:
        with redis_failures(node.who, node.keys.run, node.redis_url):
            node._connect()
            cfg = node.cfg
            data = load_dataset(cfg.data, cfg.seed, keep=(node.worker, cfg.workers, cfg.seed))
            model = None
            if is_callable_spec(cfg.model):
                model = build_model(
                    cfg.model, data.n_features, data.n_classes, device=cfg.device,
                    input_shape=tuple(data.x_train.shape[1:]),
                )  # fmt: skip
                if is_keras_model(model):
                    return fit_keras(ctx, model, data)
            trainer = Trainer(cfg, node.worker, node.het, data=data, model=model)
            return train_loop(ctx, trainer)
    finally:
        ctx.close()


def train_loop(ctx: Context, trainer: Trainer) -> dict[str, Any]:
    """A numpy model's run: one local step of SGD per iteration."""
    node = ctx.node
    saver = Checkpoints(node, trainer)
    x = ctx.start(
        trainer.params,
        device=trainer.device,
        evaluate=lambda p: trainer.model.evaluate(p, trainer.x_eval, trainer.y_eval),
    )
    if node.rejoin:
        trainer.adopt(x)  # a neighbour's parameters, and no momentum yet
    else:
        trainer.params = x
    ctx.session.on_enter = saver.save
    ctx.session.hint = f"lower --lr, now {ctx.config.lr:g}"
    while (x := ctx.begin()) is not None:
        new, loss = trainer.local_step(x)
        trainer.params = ctx.end(new, loss=loss)
    loss, accuracy = scored(trainer.evaluate(full=True))
    return ctx.finish(loss=loss, accuracy=accuracy)


class Checkpoints:
    """The built-in loop's checkpoints (hopbus/runtime/checkpoint.py): where they go (the
    worker's --checkpoint-dir, else runs/RUN/checkpoints), how many are kept, and, with
    --resume-from C, loading checkpoint C so that the run starts there."""

    def __init__(self, node: Worker, trainer: Trainer) -> None:
        cfg = node.cfg
        self.node, self.trainer = node, trainer
        self.folder = node.checkpoint_dir or checkpoint.default_folder(node.keys.run)
        self.keep: int | None = None
        if cfg.checkpoint_every:
            bound = node.topo.table1(cfg.gap_setting())["any_pair"]
            self.keep = checkpoint.keep_for(bound, cfg.checkpoint_every)
        c = node.resume_from
        if c is None:
            return
        if not 0 <= c <= cfg.iterations:
            raise ConfigError(
                f"--resume-from {c}: run {node.keys.run} has iterations 0..{cfg.iterations}"
            )
        self._record_resume(c)
        got = checkpoint.load(self.folder, node.worker, c, layout_of(trainer.params))
        try:
            trainer.load_state(got.state)
        except CheckpointError as exc:  # e.g. a position for another number of rows
            path = checkpoint.path_of(self.folder, node.worker, c)
            raise CheckpointError(
                f"checkpoint {path}: {exc}; remove the set of iteration {c} to resume from an "
                "older one"
            ) from None
        node.start_at = c

    def _record_resume(self, c: int) -> None:
        """The run's resume point in its meta hash (keys.RESUMED_FROM), which a hopbus watch
        places the workers at: set by the first worker of the run to resume (or by the
        launcher's --resume), and this worker refused, before it takes its place, if it
        resumes from another (the run would wait for updates of iterations nobody sends)."""
        node = self.node
        r, meta = node.r, node.keys.meta
        if r.hsetnx(meta, RESUMED_FROM, c):
            return
        recorded = read.integer(r.hget(meta, RESUMED_FROM), 0, node.cfg.iterations)
        if recorded is not None and recorded != c:
            raise ConfigError(
                f"--resume-from {c}: run {node.keys.run}'s workers resume from iteration "
                f"{recorded} (its first to resume recorded it in {meta}): every worker resumes "
                "from the same checkpoint set"
            )

    def save(self, k: int, params: Any) -> None:
        """On entering iteration ``k``, write this worker's checkpoint if ``k`` is a multiple
        of --checkpoint-every (not the last iteration: nothing would be left to resume). A jump
        over a multiple writes nothing, so that every set holds one iteration for all."""
        cfg, node = self.node.cfg, self.node
        every = cfg.checkpoint_every
        if not every or k % every or k >= cfg.iterations:
            return
        self.trainer.params = params
        try:
            checkpoint.save(
                self.folder, node.worker, k, self.trainer.state(), run=node.keys.run,
                model=cfg.model,
            )  # fmt: skip
            checkpoint.prune(self.folder, node.worker, self.keep)
        except OSError as exc:
            raise RunFailure(
                f"worker {node.worker} could not write its checkpoint of iteration {k} in "
                f"{self.folder}: {exc.strerror or exc}"
            ) from None


def fit_keras(ctx: Context, model: Any, data: Dataset) -> dict[str, Any]:
    """A user's compiled Keras model (``--model MODULE:FUNCTION``): ``model.fit`` with the
    callback on this worker's shard, validated every --eval-every iterations."""
    from hopbus.keras import HopCallback

    cfg, node = ctx.config, ctx.node
    if cfg.checkpoint_every or node.resume_from is not None:
        raise ConfigError(
            f"--model {cfg.model} is a Keras model: --checkpoint-every and --resume are for "
            "hopbus's numpy models and the built-in cnn and vgg11"
        )
    x, y = shard(data, ctx.worker, ctx.workers, cfg.seed)  # the rule ctx.shard follows
    batches = Batches(x, y, cfg.batch_size, seed=cfg.seed * 100_003 + ctx.worker)

    def stream() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        while True:
            yield batches.next()

    every = cfg.eval_every or cfg.iterations
    x_eval, y_eval = eval_subset(data.x_test, data.y_test)
    callback = HopCallback(ctx, finish=False)
    model.fit(
        stream(),
        steps_per_epoch=every,
        epochs=math.ceil(cfg.iterations / every),
        validation_data=(x_eval, y_eval) if cfg.eval_every else None,
        callbacks=[callback],
        shuffle=False,  # the stream draws its own batches; Keras's default warns it ignores it
        verbose=0,
    )
    got = model.evaluate(data.x_test, data.y_test, batch_size=256, verbose=0, return_dict=True)
    key = next((k for k in got if "acc" in k), None)
    return ctx.finish(
        loss=float(got["loss"]) if "loss" in got else None,
        accuracy=None if key is None else float(got[key]),
    )


__all__ = ["Checkpoints", "fit_keras", "train_builtin", "train_loop"]
