"""Any compiled Keras model as a Hop worker: ``model.fit(..., callbacks=[HopCallback(ctx)])``.

Hop's parallel order maps onto one batch (one Keras train step) as the session prescribes
(hopbus/runtime/session.py):

* batch begin: ``ctx.begin()``: the snapshot x_k (the model's weights now) goes out to the
  out-neighbours while Keras computes;
* Keras computes the gradient and applies its own optimizer's step (SGD, Adam, ...: its slots
  stay local, as in the paper's TensorFlow prototype);
* batch end: ``ctx.end(weights)``: receive, reduce, and set the weights to
  Reduce(x_k, neighbours) + Keras's step, then take the tokens into the next iteration.

Every floating-point weight of the model travels and is averaged, the non-trainable ones too
(BatchNorm's moving mean and variance); integer state (a Dropout layer's seed generator) stays
local. At ``on_train_begin`` every worker takes worker 0's initial weights, whatever seed the
script built its model with, and fit stops once the run's iterations are done. Keras's logs
become the run's progress: the batch ``loss`` (Keras's running mean over the epoch), training
``accuracy``, and ``val_loss``/``val_accuracy`` after each validation, which also give the
summary's final loss and accuracy. A fit that ends before the run is done (too few epochs) may
be followed by another, as in a loop that fits one epoch at a time until ``ctx.done``, with
this callback or a new one; a script that leaves without finishing the run fails then, saying so.

Modes other than Hop's (ps-*, wagma, allreduce) exchange gradients or group sums, not a model's
parameters: ``hopbus.join()`` refuses them with one line.
"""

from __future__ import annotations

import atexit
import contextlib
import sys
from typing import Any

import keras
import numpy as np

from hopbus.api import Context, join
from hopbus.errors import RunFailure
from hopbus.models.custom import NOT_BUILT, not_for_hop, unbuilt
from hopbus.runtime.session import ALIGN
from hopbus.transport import layout_of


def _accuracy_key(logs: dict[str, Any], prefix: str = "") -> str | None:
    """The accuracy among Keras's logs: ``accuracy``, else the first name with ``acc``."""
    names = [k for k in logs if k.startswith(prefix) and (prefix or not k.startswith("val_"))]
    if f"{prefix}accuracy" in names:
        return f"{prefix}accuracy"
    return next((k for k in names if "acc" in k[len(prefix) :]), None)


def _number(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _path(variable: Any) -> str:
    """A weight's name as Keras gives it: its path (``dense/kernel``), else its name."""
    return str(getattr(variable, "path", None) or variable.name)


def shared_weights(model: Any) -> tuple[list[Any], list[str]]:
    """The model's floating-point weights (trainable or not) and a unique name for each; one
    line for a float hopbus does not carry (bfloat16, float8: numpy knows no float of them)."""
    variables = []
    for v in model.weights:
        dtype = str(v.dtype)
        try:
            kind = np.dtype(dtype).kind
        except TypeError:
            kind = None
        if kind == "f":
            variables.append(v)
        elif "float" in dtype:
            raise RunFailure(
                f"HopCallback: weight {_path(v)!r} is {dtype}, "
                "which hopbus does not exchange (float16, float32, float64): keep the "
                "variables float32 (a mixed_bfloat16 policy does, and computes in bfloat16)"
            )
    names: list[str] = []
    seen: dict[str, int] = {}
    for v in variables:
        name = _path(v)
        if name in seen:
            seen[name] += 1
            name = f"{name}#{seen[name]}"
        else:
            seen[name] = 0
        names.append(name)
    return variables, names


def keras_device() -> str:
    """Where Keras computes: the device hopbus chose (``--device``), else the first GPU
    TensorFlow sees, else the CPU."""
    from hopbus.models.tf.runtime import _chosen

    if _chosen:
        return next(iter(_chosen.values()))
    tf = sys.modules.get("tensorflow")
    if tf is not None and tf.config.list_logical_devices("GPU"):
        return "gpu:0"
    return "cpu"


def _tensor(a: np.ndarray) -> Any:
    """``a`` for TensorFlow without a copy where it can be (a contiguous array on an ``ALIGN``
    boundary, the session's own scratch arrays, shared through DLPack); else ``a`` itself,
    which TensorFlow copies."""
    tf = sys.modules.get("tensorflow")
    if tf is not None and a.size and a.flags.c_contiguous and a.ctypes.data % ALIGN == 0:
        with contextlib.suppress(Exception):  # an old TensorFlow without DLPack: copy
            return tf.experimental.dlpack.from_dlpack(a.__dlpack__())
    return a


def _snapshot(variable: Any) -> np.ndarray:
    """A read-only view of ``variable``'s current value: without a copy for TensorFlow's
    variables (their ``read_value``), a copy for any other backend's."""
    raw = getattr(variable, "value", variable)
    read = getattr(raw, "read_value", None)
    a = np.asarray(read()) if read is not None else np.array(keras.ops.convert_to_numpy(variable))
    a.flags.writeable = False
    return a


_WATCHED: dict[int, HopCallback] = {}
"""Per context (``id``), the callback of its last fit once the run was done: its model is
compared with the run's final weights when the script ends (HopCallback._watch)."""
_TOLD: set[int] = set()
"""Contexts whose worker was told to report its own final figures (once)."""


class HopCallback(keras.callbacks.Callback):
    """Makes ``model.fit`` a worker of the run ``ctx`` joined (default: ``hopbus.join()`` at
    the start of fit). ``finish``: report the final test loss and accuracy when fit ends (the
    last validation's); False leaves ``ctx.finish`` to the caller. ``overlap``: see
    ``Context.start``."""

    def __init__(
        self, ctx: Context | None = None, *, finish: bool = True, overlap: bool | None = None
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.finish = finish
        self.overlap = overlap  # Context.start's: reduce beside Keras's step (default: 1 MiB+)
        self._variables: list[Any] = []
        self._names: list[str] = []
        self._stepping = False
        self._applied: dict[str, np.ndarray] | None = None
        self._in_epoch = 0  # batches of the epoch going on, or of the last one
        self._first_epoch: int | None = None  # this fit's first (initial_epoch, if resumed)
        self._validated = False  # the last epoch ended with a validation
        self._stopping = False  # this callback ended fit (not EarlyStopping or another)
        self._began_run = False  # this fit entered the run (the process's first fit)

    # -- fit's start and end --------------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        why = not_for_hop(self.model)
        if why is not None:
            raise RunFailure(f"HopCallback: {why}")
        if self.ctx is None:
            self.ctx = join()
        self._variables, self._names = shared_weights(self.model)
        self._stopping = False
        self._first_epoch = None
        self._began_run = self.ctx.session is None
        if self.ctx.session is not None:  # a second fit: go on from where the run is
            with self.ctx._guard():
                self._go_on()
            if self.ctx.done:
                print(
                    f"hopbus: worker {self.ctx.worker}: the run's {self.ctx.iterations} "
                    "iterations are done: this fit trains nothing (the model keeps the run's "
                    "final weights)",
                    file=sys.stderr,
                    flush=True,
                )
            return
        if not self._variables:
            if unbuilt(self.model):
                raise RunFailure(f"HopCallback: {NOT_BUILT}")
            raise RunFailure("HopCallback: the model has no floating-point weights to train")
        self._set(self.ctx.start(self._get(), device=keras_device(), overlap=self.overlap))

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        ctx = self.ctx
        assert ctx is not None
        if not ctx.done and self.model.stop_training and not self._stopping:
            with ctx._guard():  # told to the run, as any failure of this worker
                raise RunFailure(
                    f"worker {ctx.worker}: model.fit was stopped after {ctx.node.iteration} of "
                    f"{ctx.iterations} iterations by a callback (model.stop_training, as "
                    "EarlyStopping sets it): one worker cannot leave before the run is done, its "
                    "neighbours wait for its updates; leave such callbacks out of fit and end the "
                    "run with --iterations"
                )
        if not ctx.done:  # the script may call fit again (one epoch per fit); if it does not:
            steps = (self.params or {}).get("steps")
            per_epoch = f" ({steps} batches an epoch)" if isinstance(steps, int) else ""
            if isinstance(steps, int) and 0 < self._in_epoch < steps:  # the data ran out
                ctx._ended_short(
                    f"worker {ctx.worker}: model.fit ended after {ctx.node.iteration} of "
                    f"{ctx.iterations} iterations: its data ran out after {self._in_epoch} "
                    f"batches of an epoch of {steps} (steps_per_epoch): repeat the dataset "
                    "(dataset.repeat()), or give fit no more steps_per_epoch than it holds, "
                    "and more epochs"
                )
                return
            epochs = (self.params or {}).get("epochs")
            first = self._first_epoch or 0
            if self._began_run and first > 0 and isinstance(epochs, int):
                # the process's first fit began at a later epoch: BackupAndRestore resumed it
                ctx._ended_short(
                    f"worker {ctx.worker}: model.fit ended after {ctx.node.iteration} of "
                    f"{ctx.iterations} iterations{per_epoch}: it began at epoch {first} "
                    "(initial_epoch, as BackupAndRestore sets it when it resumes) and so ran "
                    f"{epochs - first} of its {epochs} epochs, while a run launched again "
                    f"starts at iteration 0: give fit epochs={first} + "
                    "ctx.epochs(len(x_train), batch_size)"
                )
                return
            ctx._ended_short(
                f"worker {ctx.worker}: model.fit ended after {ctx.node.iteration} of "
                f"{ctx.iterations} iterations{per_epoch}, before the run was done: give fit "
                "more epochs (epochs=ctx.epochs(len(x_train), batch_size), with "
                "validation_split=... if fit has one; a batched dataset: "
                "ctx.epochs(batches, 1); more is fine, fit stops when the run is done), or "
                "call fit again until ctx.done"
            )
            return
        self._watch()
        if self.finish and not ctx.session.finished:
            why = None
            unknown = ctx.session.last_eval == (None, None)
            if unknown:
                why = (
                    "fit ran no validation (no validation data, or a validation_freq beyond "
                    "its epochs)"
                )
            elif not self._validated:
                why = "fit's last validation came before the run's last iteration (validation_freq)"
            if why is None:
                ctx.finish()
                return
            if id(ctx) in _TOLD:  # a later fit after the run: said once
                return
            _TOLD.add(id(ctx))
            # the script may report its own figures; at its end, hopbus reports the last
            # validation's (or none)
            print(
                f"hopbus: worker {ctx.worker}: {why}: report the final test loss and "
                "accuracy with ctx.finish(loss=..., accuracy=...) after model.evaluate(...), "
                "or the run's are " + ("unknown" if unknown else "that validation's"),
                file=sys.stderr,
                flush=True,
            )

    def _watch(self) -> None:
        """Once the run is done: at the script's end, say so if the model no longer holds the
        run's final weights (a callback after this one set others, as
        EarlyStopping(restore_best_weights=True) does even when it never stopped fit): the
        summary, the consensus and the accuracy reported are the run's model's."""
        ctx = self.ctx
        assert ctx is not None and ctx.session is not None
        session = ctx.session
        known = id(ctx) in _WATCHED
        _WATCHED[id(ctx)] = self  # the model of the context's last fit is compared
        if known:
            return

        def compare() -> None:
            last = _WATCHED[id(ctx)]
            with contextlib.suppress(Exception):  # TensorFlow going away: nothing to say
                mine = last._get()
                if any(not np.array_equal(mine[n], session.x[n]) for n in last._names):
                    print(
                        f"hopbus: worker {ctx.worker}: the model no longer holds the run's "
                        "final weights (a callback set others after the run ended: "
                        "EarlyStopping(restore_best_weights=True) does, even when it did not "
                        "stop fit); what the run reported is the run's model",
                        file=sys.stderr,
                        flush=True,
                    )

        atexit.register(compare)  # runs before the Context's close (registered at join)

    # -- each batch: one Hop iteration ----------------------------------------------------------
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._in_epoch = 0
        if self._first_epoch is None:
            self._first_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        assert self.ctx is not None
        session = self.ctx.session
        if session is not None and session.awaiting_end:
            # a batch begun on data that ran out (a dataset of unknown length, at an epoch's
            # end) never ended: Keras took no step from its x_k, so this batch is that step
            self._stepping = True
            return
        self._stepping = self.ctx.begin() is not None
        if not self._stepping:  # the run is done: no more steps
            self._stop()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._in_epoch += 1  # a batch begun on data that ran out does not end
        if not self._stepping:
            # a fit begun after the run was done: Keras cannot be kept from one batch (it
            # reads stop_training after it), so its step is undone, and the model stays the
            # one the summary reports
            assert self.ctx is not None and self.ctx.session is not None
            self._set(self.ctx.session.x)
            return
        ctx = self.ctx
        assert ctx is not None
        logs = logs or {}
        key = _accuracy_key(logs)
        if key is not None:
            ctx.log(accuracy=_number(logs[key]))
        self._applied = None
        x = ctx.end(apply=self._apply, loss=_number(logs.get("loss")))
        applied = self._applied
        if applied is None or any(x[n] is not applied[n] for n in self._names):
            self._set(x)  # the serial order, or a jump: Reduce came after Apply
        self._stepping = False
        if ctx.done:
            self._stop()

    def _stop(self) -> None:
        """End fit: the run is done (a callback that ends it sooner fails the worker)."""
        self._stopping = True
        self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs or {}
        key = _accuracy_key(logs, "val_")
        self._validated = "val_loss" in logs or key is not None
        if self._validated:
            assert self.ctx is not None
            self.ctx.log(
                eval_loss=_number(logs.get("val_loss")),
                eval_accuracy=None if key is None else _number(logs[key]),
            )

    # -- the weights ----------------------------------------------------------------------------
    def _go_on(self) -> None:
        """A later fit (this callback's, or a new one's) takes the run's parameters as they
        are: the model must be the one the run started with."""
        assert self.ctx is not None and self.ctx.session is not None
        session = self.ctx.session
        if layout_of(self._get()) != session.layout:  # names, dtypes, shapes as start() took
            raise RunFailure(
                "HopCallback: this fit's model has other weights than the model the run "
                "started with: a later fit goes on with the same model"
            )
        self._set(session.x)

    def _apply(self, part: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """Hop's Apply, inside TensorFlow: the variables (x_k plus Keras's step) += Reduce's
        part; returns them as they now are (the serial order: as they are)."""
        if part is not None:
            for n, v in zip(self._names, self._variables, strict=True):
                v.assign_add(_tensor(part[n]))
        self._applied = self._get()
        return self._applied

    def _get(self) -> dict[str, np.ndarray]:
        """The weights as read-only snapshots without a copy: TensorFlow copies a variable
        before it writes in place into a buffer a snapshot still holds (copy-on-write), so a
        snapshot in flight to a neighbour never changes."""
        return {n: _snapshot(v) for n, v in zip(self._names, self._variables, strict=True)}

    def _set(self, params: dict[str, np.ndarray]) -> None:
        for n, v in zip(self._names, self._variables, strict=True):
            v.assign(params[n])


__all__ = ["HopCallback", "keras_device", "shared_weights"]
