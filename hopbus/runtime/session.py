"""The one driver of ``worker_loop`` on real processes, for any training loop.

A session owns one worker's node (Redis, inbox, outbox, heartbeat) and its ``worker_loop``
generator, and performs every effect itself except Compute: there it hands control back to
whoever trains the model (hopbus's own models, a Keras callback, a user's numpy loop). So the
protocol's rules run exactly as in the simulator, and every caller gets all of them:

* ``begin()`` runs the loop up to ``Compute(k)`` and returns x_k. In the parallel order
  (Fig. 4) Send(x_k) has then gone out while the caller computes.
* The caller takes its own step from x_k, with any optimizer, and hands ``end`` the
  parameters it arrived at. Hop's Apply adds the caller's step to the reduced parameters:
  x_{k+1} = Reduce(x_k, neighbours) + (caller's - x_k), the paper's x_{k+1/2} - lr * grad with
  "lr * grad" being whatever the caller's optimizer did. ``end`` then performs Recv, Reduce,
  Apply, Advance and any jump, and returns x_{k+1}.
* In the parallel order Recv and Reduce do not depend on Compute: for models of at least
  ``OVERLAP_MIN_BYTES`` they run in a thread while the caller computes (the paper's
  Send || Compute, taken one step further), so ``end`` is left with Apply and Advance. Only
  where that takes the very updates a Recv after Compute would (standard, notify-ack: every
  in-neighbour's update of iteration k); with backup workers or staleness, ``end`` receives.

``--slowdown`` and ``--iter-time`` stretch the caller's compute as they stretch the built-in
models' (``compute.paced``). Progress entries, TensorBoard scalars and the final report carry
what the caller reports (loss, test loss and accuracy) next to the protocol's own timings.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import redis

from hopbus.errors import ConfigError, Diverged
from hopbus.modes import Approach
from hopbus.protocol.effects import (
    Advance,
    Apply,
    Compute,
    Effect,
    Finish,
    PublishFloor,
    ReadFloors,
    ReadTokenCounts,
    Recv,
    Reduce,
    Send,
    SendAcks,
    Start,
)
from hopbus.protocol.worker import worker_loop
from hopbus.runtime.compute import paced
from hopbus.runtime.node import LOOK_S
from hopbus.runtime.reported import UsageError, figure
from hopbus.runtime.tensorboard import ScalarWriter, step_scalars
from hopbus.runtime.worker import Worker
from hopbus.transport import ALLOWED_DTYPES, Layout, Params, encode_ack, layout_of
from hopbus.transport.codec import finite

OVERLAP_MIN_BYTES = 1 << 20
"""Models at least this large reduce in a thread while the caller computes. Below it the
thread's hand-off costs more than the reduce it hides (a softmax's 2.6 kB)."""

_OVERLAPPED = (Recv, PublishFloor, Reduce, SendAcks)  # what may run beside the caller's Compute


def _may_overlap(eff: Effect | None) -> bool:
    """Whether ``eff`` may run beside the caller's Compute: a Recv only if taking its updates
    early takes the same ones as after Compute (``settled``: standard, notify-ack). With
    backup workers or staleness the paper's Recv follows Compute, and what arrives meanwhile
    (a late neighbour's update, a fresher one) joins the Reduce: there the thread stops and
    ``end`` receives."""
    if isinstance(eff, Recv):
        return eff.requirement.settled
    return isinstance(eff, _OVERLAPPED)


METRICS = ("eval_loss", "eval_accuracy", "accuracy")
"""What ``log`` takes: test loss and accuracy (the run's --target-loss and final accuracy read
them), training accuracy."""


def first_non_finite(params: Params) -> str | None:
    """``"a NaN or infinity in 'name'"`` for the first tensor holding one, else None (one
    summing pass per tensor: transport.codec.finite)."""
    for name, a in params.items():
        if not finite(a):
            return f"a NaN or infinity in {name!r}"
    return None


def frozen(params: Params) -> Params:
    """``params`` made read-only: they may be in flight, zero-copy, to a neighbour."""
    for a in params.values():
        a.flags.writeable = False
    return params


def combine(
    x: Params,
    self_weight: float,
    terms: Sequence[tuple[Params, float]],
    out: Params | None = None,
) -> Params:
    """self_weight * x + sum(weight * theirs), into ``out``'s arrays if given (they must not be
    in flight), else new ones. In place with one scratch array per tensor: no allocation per
    term, and numpy releases the GIL, so this can run beside the caller's compute."""
    result: Params = {}
    weights = {w for _, w in terms}
    for name, mine in x.items():
        kind = mine.dtype.type
        into = None if out is None else out[name]
        if len(weights) == 1 and 0 not in weights:  # eq. (1): one weight for every neighbour
            (w,) = weights  # (self_weight / w) x + sum(theirs), then times w: a pass less each
            acc = np.multiply(mine, kind(self_weight / w), out=into)
            for theirs, _ in terms:
                np.add(acc, theirs[name], out=acc)
            np.multiply(acc, kind(w), out=acc)
        else:
            acc = np.multiply(mine, kind(self_weight), out=into)
            tmp = np.empty_like(acc) if terms else None
            for theirs, weight in terms:
                np.multiply(theirs[name], kind(weight), out=tmp)
                np.add(acc, tmp, out=acc)
        result[name] = acc
    return result


ALIGN = 128
"""Byte alignment of the session's own scratch arrays: TensorFlow can use an array aligned for
its widest vectors (64 bytes) in place, through DLPack, so a Keras model adds Reduce's part
to its variables straight from it (hopbus/keras.py)."""


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array whose data starts on an ``ALIGN``-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def check_layout(layout: Layout) -> None:
    """Every tensor of a model must be something the wire carries."""
    for name, dtype, _ in layout:
        if dtype not in ALLOWED_DTYPES:
            raise ConfigError(
                f"tensor {name!r} is {dtype}: hopbus exchanges {', '.join(sorted(ALLOWED_DTYPES))} "
                "parameters only"
            )


class Session:
    """Worker ``node``'s run, driven step by step by its caller (see the module docstring).

    ``evaluate(params)`` -> (test loss, accuracy), if given, is called at every --eval-every
    boundary for the progress entry; ``on_enter(k, params)`` after entering each iteration
    (the built-in models' checkpoints); ``board``: where TensorBoard scalars go."""

    def __init__(
        self,
        node: Worker,
        *,
        device: str = "cpu",
        evaluate: Callable[[Params], tuple[float, float]] | None = None,
        on_enter: Callable[[int, Params], None] | None = None,
        board: Path | None = None,
        overlap: bool | None = None,
    ) -> None:
        self.node = node
        self.device = device
        self.hint = "lower the learning rate"  # what to try when the model diverges
        self.evaluate = evaluate
        self.on_enter = on_enter
        self._board_dir = board
        self.board: ScalarWriter | None = None
        self._overlap_flag = overlap
        self.x: Params = {}
        self.layout: Layout = ()
        self.iteration = 0  # the step begun last (or the iteration started in)
        self.done = False  # every iteration done: only finish() is left
        self.report: dict[str, Any] | None = None  # the final report published
        self.loss: float | None = None
        self.pending: dict[str, float] = {}  # fields for the next progress entry
        self.last_eval: tuple[float | None, float | None] = (None, None)
        self.compute_total = 0.0
        self.last_wait_s = 0.0  # the step ended last: seconds blocked (updates, then tokens)
        self.overlap_cpu_s = 0.0  # CPU time of the Recv and Reduce done beside Compute
        self._gen: Any = None
        self._next: Effect | None = None
        self._in_step = False
        self._ending = False  # end() entered for the step begun (it may have been interrupted)
        self._awaiting_apply = False  # parallel order, between Compute and Apply
        self._corr: Params | None = None  # Reduce's part of x_{k+1}, waiting for Apply
        self._corr_buf: Params | None = None  # its arrays, reused step after step
        self._owned = False  # the caller's parameters of this step are the session's to write
        self._apply_fn: Callable[[Params | None], Mapping[str, np.ndarray]] | None = None
        self._new: Params | None = None
        self._t0 = 0.0
        self._compute_s = self._wait_s = 0.0
        self._blocked: tuple[int, ...] = ()
        self._bg: threading.Thread | None = None
        self._bg_req: Any = None
        self._bg_error: BaseException | None = None
        self._last_t = 0.0
        self.cpu0 = time.process_time()

    # -- the caller's calls -------------------------------------------------------------------
    def start(self, params: Params) -> Params:
        """Set up the node for a model of these parameters and enter the run; returns the
        parameters to start from: worker 0's (every worker starts alike), a checkpoint's (a
        resumed run: ``params`` as given) or a neighbour's (a replacement, --rejoin)."""
        if self._gen is not None:
            raise UsageError("start() was already called: a session trains one model")
        n = self.node
        layout = layout_of(params)
        check_layout(layout)
        bad = first_non_finite({k: np.asarray(v) for k, v in params.items()})
        if bad is not None:  # worker 0's would be every worker's start; anyone's is a bug
            raise UsageError(f"start(): the parameters hold {bad}; a model must start finite")
        self.layout = layout
        n.setup(layout)
        if n.rejoin:
            x = n.join_as_replacement()
        elif n.start_at > 0:
            x = params
        else:
            x = n.share_start(params)
        self.x = frozen({k: np.array(v, copy=True) for k, v in x.items()})
        self._overlap = (
            self._overlap_flag
            if self._overlap_flag is not None
            else sum(a.nbytes for a in self.x.values()) >= OVERLAP_MIN_BYTES
        )
        if self._board_dir is not None:
            self.board = ScalarWriter(self._board_dir, start=n.start_at + 1)  # its first step
        self._gen = worker_loop(n.spec, start=n.start_at)
        self._perform(next(self._gen))  # Start
        self._next = self._gen.send(None)
        self.iteration = n.start_at
        self._last_t = time.perf_counter()
        self.cpu0 = time.process_time()
        self.done = isinstance(self._next, Finish)
        return self.x

    @property
    def finished(self) -> bool:
        """This worker's final report is published (finish())."""
        return self.report is not None

    @property
    def awaiting_end(self) -> bool:
        """A step begun whose end() has not been entered: the caller may still take its step
        from x_k (hopbus.keras: a batch begun on data that ran out)."""
        return self._in_step and not self._ending

    def _interrupted(self) -> UsageError:
        return UsageError(
            f"the step of iteration {self.iteration} did not end: its end() was interrupted "
            "(Ctrl-C, or an error the script caught), so the protocol is in the middle of it "
            "and this worker cannot go on"
        )

    def begin(self) -> Params | None:
        """Begin the next step: returns x_k (read-only: compute new arrays from it), or None
        once the run's iterations are done."""
        if self._gen is None:
            raise UsageError("begin() before start()")
        if self._in_step:
            if self._ending:
                raise self._interrupted()
            raise UsageError("begin() twice: end() the step begun first")
        if self.done:
            return None
        eff = self._run_until(Compute)
        if isinstance(eff, Finish):
            self.done = True
            return None
        assert isinstance(eff, Compute)
        self.iteration = eff.iteration
        self._in_step = True
        parallel = self.node.spec.settings.approach is Approach.PARALLEL
        self._awaiting_apply = parallel
        if parallel and self._overlap:
            self._bg_error = None
            self._bg = threading.Thread(target=self._overlapped, name="hop-reduce", daemon=True)
            self._bg.start()
        self._t0 = time.perf_counter()
        return self.x

    def end(
        self,
        params: Mapping[str, np.ndarray] | None = None,
        loss: float | None = None,
        *,
        owned: bool = False,
        apply: Callable[[Params | None], Mapping[str, np.ndarray]] | None = None,
    ) -> Params:
        """End the step begun last with the caller's parameters after its own step from x_k;
        returns x_{k+1} (read-only), the parameters to continue from. ``owned``: the caller
        hands its arrays over (fresh copies it will not touch again), so x_{k+1} is built in
        them instead of in new ones.

        Or, instead of ``params``, ``apply(part)``: a caller whose parameters live elsewhere
        (a Keras model's variables) adds Reduce's ``part`` of x_{k+1} to them itself, in place,
        and returns them (read-only snapshots do); ``part`` is None in the serial order, where
        the parameters are taken as they are and Reduce follows. If the returned x_{k+1} is
        not what ``apply`` returned (the serial order, or a jump), the caller sets it."""
        if not self._in_step:
            raise UsageError("end() without begin()")
        if self._ending:
            raise self._interrupted()
        if params is None and apply is None:
            raise UsageError("end() needs your step's parameters (or apply=)")
        if params is not None and apply is not None:
            raise UsageError("end() takes the parameters, or apply, not both")
        n = self.node
        real = time.perf_counter() - self._t0
        target = paced(real, n.cfg.iter_time, n.het.factor(n.worker, self.iteration))
        if target > real:
            time.sleep(target - real)  # emulated compute: --slowdown / --iter-time
        self._compute_s = time.perf_counter() - self._t0
        self.compute_total += self._compute_s
        self._apply_fn = apply
        if params is not None:
            self._new = self._conform(params)
            self._owned = owned and all(
                a.flags.writeable and a.flags.c_contiguous and a is params[k]
                for k, a in self._new.items()
            )
        self.loss = figure("end()", "loss", loss)
        if self.loss is not None and not math.isfinite(self.loss):
            self._diverge(f"its training loss is {self.loss}")
        self._ending = True  # from here on the protocol moves: an interrupted end() is final
        if self._bg is not None:
            self._join_overlap()
        else:
            self._next = self._gen.send(None)  # Compute's result
        while True:  # Recv, Reduce, Apply, ..., Advance
            eff = self._next
            value = self._perform(eff)
            self._next = self._gen.send(value)
            if isinstance(eff, Advance):
                break
        self._in_step = self._ending = False
        self._new = self._apply_fn = None
        self.done = isinstance(self._next, Finish)
        return self.x

    def log(self, **metrics: float | None) -> None:
        """Metrics for the next progress entry (``eval_loss``, ``eval_accuracy``, ...); the
        last test loss and accuracy logged are the final report's unless finish() is given
        its own."""
        for k, v in metrics.items():
            if k not in METRICS:
                raise UsageError(f"log(): unknown metric {k!r}; it takes {', '.join(METRICS)}")
            x = figure("log()", k, v)
            if x is not None:
                self.pending[k] = x
        if "eval_loss" in self.pending or "eval_accuracy" in self.pending:
            self.last_eval = (self.pending.get("eval_loss"), self.pending.get("eval_accuracy"))

    def finish(self, loss: float | None = None, accuracy: float | None = None) -> dict[str, Any]:
        """Publish this worker's final report (its final test loss and accuracy: as given, or
        the last logged) once the run's iterations are done."""
        if not self.done:
            raise UsageError(
                f"finish() in iteration {self.iteration} of {self.node.cfg.iterations}: the run "
                "is not done yet"
            )
        if self.report is not None:  # reported: a second report changes nothing (the run's
            print(  # part of this worker is done; failing it now would fail a finished run)
                f"hopbus: worker {self.node.worker}: finish() was already called: the run has "
                "this worker's report; this call's figures are not reported",
                file=sys.stderr,
                flush=True,
            )
            return self.report
        n = self.node
        if loss is None and accuracy is None:
            loss, accuracy = self.last_eval
        loss, accuracy = (
            figure("finish()", "loss", loss),
            figure("finish()", "accuracy", accuracy),
        )
        if accuracy is not None and math.isnan(accuracy):  # not measured (an evaluation on
            accuracy = None  # nothing): the report's null, as a logged NaN is the entry's
        eff = self._next
        assert isinstance(eff, Finish)

        def publish() -> dict[str, Any]:
            if n._floor is not None:
                n.publish_floor(n._floor)
            return n.publish_worker_result(
                eff.iterations, self.cpu0, self.compute_total, loss=loss, accuracy=accuracy,
                device=self.device, params=self.x,
            )  # fmt: skip

        result = n.with_redis(publish)
        self.report = result
        if self.board is not None:
            self.board.add(
                eff.iterations, {"test/loss": loss, "test/accuracy": accuracy}, keep=True
            )
            self.board.flush()
        assert result is not None
        return result

    def close(self) -> None:
        """Before the node closes its sockets: a Recv or Reduce still running beside the
        caller's step (the step failed, or the process is stopping) is told to leave, and
        waited for up to three looks (it stops at its next look, or before its next effect),
        so no thread is in a socket as it closes."""
        bg = self._bg
        if bg is not None and bg.is_alive():
            self.node.leaving = True  # its next look raises Leaving
            bg.join(LOOK_S * 3)
        self._bg = None
        if self.board is not None:
            self.board.flush()

    # -- performing effects ---------------------------------------------------------------------
    def _run_until(self, stop: type) -> Effect:
        """Perform effects until one of type ``stop`` (or Finish) comes up; it is left
        pending."""
        while True:
            eff = self._next
            assert eff is not None
            if isinstance(eff, stop | Finish):
                return eff
            value = self._perform(eff)
            self._next = self._gen.send(value)

    def _perform(self, eff: Effect) -> Any:
        n = self.node
        kind = type(eff)
        if kind is Send:
            n.send_update(eff, self.x)
        elif kind is Recv:
            req = eff.requirement
            got, waited, on = n.with_redis(lambda: n.recv(req))
            if threading.current_thread() is not self._bg:  # beside Compute it is not waiting
                self._wait_s += waited
                if on:
                    self._blocked = on
            return got
        elif kind is Reduce:
            terms = [(u.payload, w) for u, w in eff.terms]
            if self._awaiting_apply:  # parallel: Reduce's part of x_{k+1} (Apply adds the step)
                if self._corr_buf is None:  # never sent: every step's Reduce reuses it
                    self._corr_buf = {k: aligned_empty(a.shape, a.dtype) for k, a in self.x.items()}
                self._corr = combine(self.x, eff.self_weight - 1.0, terms, out=self._corr_buf)
            else:
                self.x = frozen(combine(self.x, eff.self_weight, terms))
        elif kind is Apply:
            self._apply()
        elif kind is Advance:
            self._advance(eff)
        elif kind is PublishFloor:
            n._floor = eff.floor  # rides on the next Advance: late only costs a drop
        elif kind is ReadFloors:
            return n.with_redis(lambda: n.read_floors(eff.of))
        elif kind is ReadTokenCounts:
            return n.with_redis(lambda: n.token_counts(eff.of))
        elif kind is SendAcks:
            if eff.to:
                n.send(eff.to, encode_ack(n.keys.run, n.worker, eff.iteration))
            n.counters["acks"] += len(eff.to)
        elif kind is Start:
            n.start(eff.put_to, eff.count, eff.at)
        else:  # pragma: no cover - a new effect without a driver is a bug
            raise AssertionError(f"no driver for {eff!r}")
        return None

    def _overlapped(self) -> None:
        """In a thread, while the caller computes: Recv and Reduce (parallel order), up to
        Apply, which needs the caller's step."""
        cpu0 = time.thread_time()
        try:
            self._next = self._gen.send(None)  # Compute's result
            while _may_overlap(self._next) and not self.node.leaving:
                eff = self._next
                self._bg_req = eff.requirement if isinstance(eff, Recv) else None
                value = self._perform(eff)
                self._bg_req = None
                self._next = self._gen.send(value)
        except BaseException as exc:  # handed to the caller's thread by _join_overlap
            self._bg_error = exc
        self.overlap_cpu_s += time.thread_time() - cpu0

    def _join_overlap(self) -> None:
        """Wait for the overlapped Recv and Reduce; the time waited is this step's wait."""
        bg = self._bg
        assert bg is not None
        if bg.is_alive():
            t0 = time.monotonic()
            req = self._bg_req
            if req is not None:
                self._blocked = self.node.missing(req)
            bg.join()
            self._wait_s += time.monotonic() - t0
        self._bg = None
        if self._bg_error is not None:
            error, self._bg_error = self._bg_error, None
            raise error

    def _apply(self) -> None:
        """x_{k+1} = Reduce(x_k, neighbours) + the caller's step (parallel order), or the
        caller's parameters themselves (serial order: Reduce follows)."""
        if self._apply_fn is not None:  # the caller adds Reduce's part where its model lives
            self.x = frozen(self._conform(self._apply_fn(self._corr)))
        else:
            new = self._new
            assert new is not None, "Apply before the caller's step"
            if not self._owned:  # the caller may use its arrays again: ours are copies
                new = {k: np.array(a, copy=True) for k, a in new.items()}
            if self._corr is not None:
                for k, c in self._corr.items():
                    np.add(new[k], c, out=new[k])
            self.x = frozen(new)
        self._corr = None
        self._awaiting_apply = False
        bad = first_non_finite(self.x)
        if bad is not None:
            self._diverge(f"its parameters hold {bad}")

    def _diverge(self, what: str) -> None:
        """Stop the run: this worker's model is no longer finite, and its neighbours would
        average that in. One line naming the worker, the iteration and what to try."""
        n = self.node
        line = f"worker {n.worker} diverged in iteration {self.iteration}: {what} ({self.hint})"
        with contextlib.suppress(redis.RedisError):
            if n.control.stop_run(line) == line:  # the run's failure names this worker: so
                n.control.event("diverged", iteration=self.iteration, what=what)  # does its record
        raise Diverged(line)

    def _advance(self, eff: Advance) -> None:
        n = self.node
        n.faults.before_iteration(eff.to)
        evaluate = self.evaluate
        fields = n.entry_fields(
            eff.start, eff.to, self._compute_s, self._wait_s, self._blocked, loss=self.loss,
            device=self.device,
            evaluate=None if evaluate is None else lambda: evaluate(self.x),
        )  # fmt: skip
        fields.update(self.pending)
        self.pending = {}
        if "eval_loss" in fields:
            self.last_eval = (fields["eval_loss"], fields.get("eval_accuracy"))
        n.with_redis(lambda: n.advance(eff, fields), advancing=eff)
        self.last_wait_s = fields["wait_s"]
        now = time.perf_counter()
        step_s, self._last_t = (now - self._last_t) / eff.count, now
        if self.board is not None and ("eval_loss" in fields or self.board.due()):
            self.board.add(
                eff.to,
                step_scalars(self.loss, fields, step_s, n.behind(eff.to)),
                keep="eval_loss" in fields,
            )
        if self.on_enter is not None:
            self.on_enter(eff.to, self.x)
        self._compute_s = self._wait_s = 0.0
        self._blocked = ()

    def _conform(self, params: Mapping[str, np.ndarray]) -> Params:
        """The caller's parameters, checked against the layout it started with (a float of
        another width is converted); one line for anything else."""
        if not isinstance(params, Mapping) or params.keys() != self.x.keys():
            got = list(params) if isinstance(params, Mapping) else type(params).__name__
            raise ConfigError(
                f"end(): expected parameters named {list(self.x)} as given to start(), got {got}"
            )
        out: Params = {}
        for name, mine in self.x.items():
            a = np.asarray(params[name])
            if a.shape != mine.shape:
                raise ConfigError(
                    f"end(): tensor {name!r} has shape {list(a.shape)}, not {list(mine.shape)} "
                    "as given to start()"
                )
            if a.dtype != mine.dtype:
                if a.dtype.kind not in "fiu":
                    raise ConfigError(f"end(): tensor {name!r} is {a.dtype}, not {mine.dtype}")
                a = a.astype(mine.dtype)
            out[name] = a
        return out


__all__ = ["OVERLAP_MIN_BYTES", "Session", "UsageError", "combine", "frozen"]
