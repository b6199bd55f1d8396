"""hopbus as a library: any training loop joins a Hop run (numpy arrays in, numpy arrays out).

::

    import hopbus

    with hopbus.join() as ctx:            # the run hopbus launch / hopbus worker started
        x, y = ctx.shard(x_all, y_all)     # this worker's share of the data
        params = ctx.start(params)         # everyone starts from worker 0's parameters
        while (params := ctx.begin()) is not None:
            new, loss = my_step(params, x, y)  # any optimizer, any framework: new arrays
            ctx.end(new, loss=loss)        # Recv, Reduce, Apply, tokens, jumps: Hop's rules
        ctx.finish(loss=test_loss, accuracy=test_accuracy)

``begin`` returns x_k after Send(x_k) has gone out (Hop's parallel order: neighbours receive it
while you compute); ``end`` takes the parameters your step arrived at and returns x_{k+1} =
Reduce(x_k, neighbours) + your step. Every mode's rules (token queues, backup workers,
staleness, skipping, notify-ack) happen inside, by the same code as hopbus's own workers
(hopbus/runtime/session.py). Keras users need none of this: ``hopbus.keras.HopCallback``.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import math
import numbers
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import numpy as np

from hopbus.errors import DeclaredDead, RejoinFailed, RunFailure, RunStopped, UserError
from hopbus.runtime import env

LAUNCH_HINT = (
    "start it with `hopbus launch -n 4 -- python SCRIPT` (a local run), or one copy with "
    "`hopbus worker --run RUN --redis URL -- python SCRIPT`"
)


class NotLaunchedError(UserError):
    """``hopbus.join()`` in a process that no hopbus run started."""


def launched() -> bool:
    """Whether this process was started as a worker of a run (``hopbus launch`` or
    ``hopbus worker -- COMMAND``): a script can then train alone when it was not. A
    ``HOPBUS_RUN`` exported in the shell (for hopbus top or inspect) does not make it one."""
    return env.flag(os.environ.get(env.SCRIPT))


_HOOKED: list[bool] = []  # once the hook is installed
_ESCAPED: list[bool] = []  # an exception reached the hook: the script is failing already


def _show_user_errors() -> None:
    """A hopbus error that escapes the script is one line, ``hopbus: error: ...``, as on the
    command line, not a traceback (the exit status is Python's, 1). Other exceptions are left
    to the hook that was there."""
    if _HOOKED:
        return
    _HOOKED.append(True)
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        _ESCAPED.append(True)
        if isinstance(exc, UserError):
            from hopbus.coord.client import scrub

            with contextlib.suppress(OSError):
                print(f"hopbus: error: {scrub(str(exc))}", file=sys.stderr, flush=True)
            return
        previous(kind, exc, tb)

    sys.excepthook = hook


def _env_number(name: str, kind: type, value: Any) -> Any:
    """``value`` if given, else the environment's ``name`` as a ``kind``: ASCII digits (and a
    sign, a point, an exponent), not what else Python's int() and float() take (``1_0``,
    other scripts' digits)."""
    if value is not None:
        return value
    text = os.environ.get(name)
    if text is None or text == "":
        return None
    try:
        if not text.isascii() or "_" in text:
            raise ValueError(text)
        return kind(text)
    except ValueError:
        whole = " whole" if kind is int else ""
        raise UserError(f"{name}={text!r:.80} is not a{whole} number") from None


def _check_join_args(**given: Any) -> None:
    """join()'s arguments of the wrong kind, as one line each (they met a traceback deep in
    the run's code, or a message blaming Redis); ``timeout`` follows the run's own rule
    (check_setting). An empty one means its default (a run of "" is no run:
    NotLaunchedError), but for ``redis``: the default broker is nobody's run."""
    for name, value in given.items():
        if value is None:
            continue
        if name == "id":
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise UserError(
                    f"hopbus.join(): id must be a whole number, not {type(value).__name__}"
                )
        elif name in ("curve", "tensorboard"):
            if not isinstance(value, str | os.PathLike):
                raise UserError(
                    f"hopbus.join(): {name} must be a folder's path, not {type(value).__name__}"
                )
        elif not isinstance(value, str):
            raise UserError(f"hopbus.join(): {name} must be a string, not {type(value).__name__}")
        elif name == "redis" and not value:  # it meant the default broker, someone else's
            raise UserError("hopbus.join(): redis is empty (leave it out for the default)")


_joined: list[tuple[str, str, Context]] = []
"""The run, Redis and context of this process's join() (one at most), while it is open: a
second join() of the same run gets the same worker (two would each take an id, and the
second start() find its own heartbeat and take itself for a twin)."""


def join(
    run: str | None = None,
    redis: str | None = None,
    id: int | None = None,
    *,
    bind: str | None = None,
    advertise: str | None = None,
    timeout: float | None = None,
    curve: str | Path | None = None,
    device: str | None = None,
    tensorboard: str | Path | None = None,
) -> Context:
    """Join run ``run`` as worker ``id``: by default the run, Redis and id that ``hopbus
    launch`` or ``hopbus worker -- COMMAND`` put in the environment (HOPBUS_RUN, HOPBUS_REDIS,
    HOPBUS_ID; hopbus/runtime/env.py); without an id, the run's next free one. Connects and
    reads the run's settings; ``Context.start`` then enters it. ``tensorboard``: the folder of
    the run's TensorBoard scalars (hopbus launch sets it to the results folder's). Raises
    ``NotLaunchedError`` outside a run, and a ``UserError`` (one line) for anything the run
    refuses."""
    from hopbus.config import check_setting
    from hopbus.coord.client import DEFAULT_URL, check_url
    from hopbus.runtime.address import DEFAULT_BIND, resolve_advertise
    from hopbus.runtime.join import worker_for
    from hopbus.runtime.node import redis_failures

    _show_user_errors()
    _check_join_args(
        run=run, redis=redis, id=id, bind=bind, advertise=advertise, curve=curve,
        device=device, tensorboard=tensorboard,
    )  # fmt: skip
    run = run if run is not None else os.environ.get(env.RUN)
    if not run:
        raise NotLaunchedError(
            f"hopbus.join(): this process is not a worker of a hopbus run; {LAUNCH_HINT}"
        )
    url = redis or os.environ.get(env.REDIS) or DEFAULT_URL
    check_url(url)
    worker = _env_number(env.ID, int, None if id is None else int(id))
    if _joined and not _joined[0][2]._closed:  # one process, one worker
        _, was_url, ctx = _joined[0]
        if run == ctx.run and url == was_url and worker in (None, ctx.worker):
            return ctx  # the same run again (a HopCallback() after join()): the same worker
        raise UserError(
            f"hopbus.join(): this process is worker {ctx.worker} of run {ctx.run} already "
            "(one process is one worker): use the context the first join() returned, or "
            "close() it first"
        )
    if os.environ.get(env.RESUME_FROM) or os.environ.get(env.CHECKPOINT_DIR):
        raise UserError(
            "hopbus.join(): checkpoints and --resume belong to hopbus's own models; a script "
            "saves its own state (for Keras: keras.callbacks.BackupAndRestore)"
        )
    kw = {
        "bind": bind or os.environ.get(env.BIND) or DEFAULT_BIND,
        "advertise": resolve_advertise(advertise or os.environ.get(env.ADVERTISE), url),
        "timeout": None
        if (t := _env_number(env.TIMEOUT, float, timeout)) is None
        else check_setting("timeout", t, env.TIMEOUT if timeout is None else "join(timeout)"),
        "curve": Path(curve)
        if curve
        else (Path(os.environ[env.CURVE]) if os.environ.get(env.CURVE) else None),
        "device": device or os.environ.get(env.DEVICE) or None,
        "rejoin": env.flag(os.environ.get(env.REJOIN)),
    }
    node = worker_for(run, worker, url, script=True, **kw)
    with redis_failures(node.who, run, url):
        node._connect()
    board = tensorboard or os.environ.get(env.TENSORBOARD)
    ctx = Context(node, tensorboard=Path(board) if board else None)
    atexit.register(ctx._at_exit)
    _joined[:] = [(run, url, ctx)]
    return ctx


def fit_epochs(samples: int, batch_size: int, validation_split: float, left: int) -> int:
    """``ctx.epochs``: epochs of ``batch_size`` batches over what ``validation_split`` leaves
    of ``samples`` rows that cover ``left`` iterations (at least 1)."""
    for name, value in (("samples", samples), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise UserError(
                f"ctx.epochs(): {name} must be a whole number of at least 1, not {value!r:.40}"
            )
    if not isinstance(validation_split, numbers.Real) or not 0.0 <= validation_split < 1.0:
        raise UserError(
            f"ctx.epochs(): validation_split {validation_split!r:.40} is not a number in [0, 1)"
        )
    rows = math.floor(int(samples) * (1.0 - validation_split))
    per_epoch = max(1, math.ceil(rows / int(batch_size)))
    return max(1, math.ceil(left / per_epoch))


def _not_rows(a: Any, why: str) -> UserError:
    """``ctx.shard``'s refusal of ``a``: ``why``, or for a tf.data dataset (which has no rows to
    take by position, and may have no length) how a dataset is split."""
    kind = type(a)
    if kind.__module__.startswith("tensorflow") and "Dataset" in kind.__name__:
        return UserError(
            f"ctx.shard(): a tf.data {kind.__name__} is split by the dataset itself: "
            "dataset.shard(ctx.workers, ctx.worker), before its shuffle and batch (or "
            "ctx.shard() the arrays it is made from)"
        )
    return UserError(f"ctx.shard(): {why}")


def _free_before_shutdown() -> None:
    """Free now, while other threads still run, what only a collection would: a tf.data
    iterator over a Python generator that fit left mid-epoch (the run ended fit, or fit
    failed) lives on in a cycle with Keras's epoch iterator. Freed at interpreter shutdown, it
    waits for its prefetch thread, which can no longer take the GIL to leave the generator:
    the script hung at exit. The exception that ended a failed script holds fit's frame, and
    so the iterator, through its traceback (sys.last_traceback), and so does every exception it
    was raised from or while handling (a script that wraps fit's error in its own): the locals
    of each traceback's innermost frame and of every caller of it go first (the callers: fit's
    frame among them even where Keras cut its own frames from the traceback)."""
    exc = getattr(sys, "last_value", None)
    tracebacks = [getattr(sys, "last_traceback", None)]
    chained, seen = [exc], set()
    while chained:  # and those it was raised from or while handling (fit's error, wrapped)
        exc = chained.pop()
        if isinstance(exc, BaseException) and id(exc) not in seen:
            seen.add(id(exc))
            tracebacks.append(exc.__traceback__)
            chained += [exc.__cause__, exc.__context__]
    for outer in tracebacks:
        tb = outer
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        frame: FrameType | None = None if tb is None else tb.tb_frame
        while frame is not None:
            with contextlib.suppress(RuntimeError):  # a frame still running keeps its locals
                frame.clear()
            frame = frame.f_back
    gc.collect()


def _rows_in(a: Any) -> int:
    """How many rows ``a`` has, for ``ctx.shard``; one line for what has none (a scalar, a
    generator) or whose length is no count of rows (a dict: its keys)."""
    if isinstance(a, Mapping):
        raise UserError(
            "ctx.shard(): a dict has keys, not rows: give its arrays, ctx.shard(*d.values())"
        )
    try:
        return len(a)
    except TypeError:
        raise _not_rows(
            a,
            f"a {type(a).__name__} has no rows to split: give arrays of one length (numpy "
            "arrays, lists, pandas objects)",
        ) from None


def _rows_of(a: Any, rows: Any) -> Any:
    """``a``'s rows ``rows``, in its own kind: numpy arrays (and whatever indexes as they do:
    PyTorch tensors), lists and tuples as lists, pandas objects by position."""
    if isinstance(a, list | tuple):
        return [a[i] for i in rows]
    if hasattr(a, "iloc"):  # pandas: a[rows] would pick columns
        return a.iloc[rows]
    try:
        return a[rows]
    except (TypeError, IndexError, KeyError, ValueError):
        raise _not_rows(
            a,
            f"cannot take rows of a {type(a).__name__} by position; give numpy arrays "
            "(np.asarray(x)), lists or pandas objects",
        ) from None


class Context:
    """This process's place in a run: who it is, the run's settings, and the calls around each
    local step (see the module docstring). Made by ``hopbus.join()``."""

    def __init__(self, node: Any, *, tensorboard: Path | None = None, report: bool = True) -> None:
        """``report``: tell the run (its events stream) about this worker's failure; off when
        a caller does (``hopbus worker``)."""
        from hopbus.runtime.session import Session

        self.node = node
        self._tensorboard = tensorboard
        self._report = report
        self._session_cls = Session
        self.session: Any = None
        self._as_list = False
        self._reported = False
        self._closed = False
        self._short_why: str | None = None  # the loop ended before the run (Context._ended_short)
        self._failed = False  # an error left one of its calls (_Guard)

    # -- who and what ---------------------------------------------------------------------------
    @property
    def run(self) -> str:
        """The run id."""
        return str(self.node.keys.run)

    @property
    def worker(self) -> int:
        """This worker's id, 0..workers-1."""
        return int(self.node.worker)

    @property
    def workers(self) -> int:
        """How many workers the run has."""
        return int(self.node.topo.n)

    @property
    def iterations(self) -> int:
        """Iterations per worker: the run ends when every worker has done them."""
        return int(self.node.cfg.iterations)

    @property
    def config(self) -> Any:
        """The run's settings (hopbus.config.TrainConfig: mode, backup, staleness, max_ig,
        seed, iter_time, ...), as recorded by hopbus launch / hopbus create."""
        return self.node.cfg

    @property
    def seed(self) -> int:
        return int(self.node.cfg.seed)

    @property
    def iteration(self) -> int:
        """The iteration of the step begun last (the one started in, before any)."""
        return self.session.iteration if self.session is not None else int(self.node.start_at)

    @property
    def done(self) -> bool:
        """Every iteration is done: stop training, then ``finish``."""
        return self.session is not None and self.session.done

    def shard(self, *arrays: Any) -> Any:
        """This worker's rows of ``arrays`` (all of one length): the rule hopbus's own loaders
        use (one permutation from the run's seed, cut into near-equal disjoint parts). One
        array in, one out; several in, a tuple out."""
        from hopbus.data import shard_rows

        if not arrays:
            raise UserError("ctx.shard(): give it the arrays to split")
        lengths = [_rows_in(a) for a in arrays]
        if len(set(lengths)) != 1:
            raise UserError(
                f"ctx.shard(): the arrays have different lengths, {', '.join(map(str, lengths))}"
                " in the order given"
            )
        rows = shard_rows(lengths[0], self.worker, self.workers, self.seed)
        parts = tuple(_rows_of(a, rows) for a in arrays)
        return parts[0] if len(parts) == 1 else parts

    def epochs(self, samples: int, batch_size: int, validation_split: float = 0.0) -> int:
        """Epochs over ``samples`` rows that cover the run's iterations, for ``model.fit``
        (one batch per iteration; the callback stops fit once the run is done). Give fit's
        ``validation_split`` too, if you use one: fit trains on the rows it leaves."""
        return fit_epochs(samples, batch_size, validation_split, self.iterations - self.iteration)

    # -- around each step -----------------------------------------------------------------------
    def start(
        self,
        params: Mapping[str, Any] | Sequence[Any],
        *,
        device: str = "cpu",
        evaluate: Callable[[Any], tuple[float, float]] | None = None,
        overlap: bool | None = None,
    ) -> Any:
        """Enter the run with a model of these parameters (a dict of named arrays, or a list);
        returns the parameters to start from, in the same form: worker 0's, so that every
        worker starts alike. ``device`` is reported in progress entries; ``evaluate(params)``
        -> (test loss, accuracy), if given, runs at every --eval-every boundary. ``overlap``:
        receive and reduce in a thread while you compute (default: for models of 1 MiB or
        more, where it pays for the thread's hand-off)."""
        with self._guard():
            if self.session is not None:
                raise UserError("ctx.start() was already called")
            self._as_list = not isinstance(params, Mapping)
            named = self._named(params)
            self.session = self._session_cls(
                self.node,
                device=device,
                evaluate=None if evaluate is None else lambda x: evaluate(self._out(x)),
                board=None
                if self._tensorboard is None
                else self._tensorboard / f"worker-{self.worker}",
                overlap=overlap,
            )
            return self._out(self.session.start(named))

    def begin(self) -> Any:
        """Begin the next step: the parameters to compute from (read-only: make new arrays),
        or None once the run's iterations are done."""
        with self._guard():
            return self._out(self._started().begin())

    def end(
        self,
        params: Mapping[str, Any] | Sequence[Any] | None = None,
        *,
        loss: float | None = None,
        owned: bool = False,
        apply: Callable[[Any], Any] | None = None,
    ) -> Any:
        """End the step with the parameters your step arrived at (and its training loss);
        returns the parameters to continue from. ``owned=True`` hands hopbus the arrays (fresh
        ones you will not use again): it then builds the result in them, saving a copy.
        ``apply`` instead of ``params``: for parameters that live in a framework's memory
        (hopbus.keras does this); see Session.end."""
        with self._guard():
            named = None if params is None else self._named(params)
            fn = None if apply is None else lambda part: self._named(apply(self._out(part)))
            return self._out(self._started().end(named, loss=loss, owned=owned, apply=fn))

    def log(self, **metrics: float | None) -> None:
        """Metrics for the next progress entry: ``eval_loss`` and ``eval_accuracy`` (test-set
        loss and accuracy: the run's --target-loss and final accuracy read them),
        ``accuracy`` (training accuracy)."""
        self._started().log(**metrics)

    def finish(self, *, loss: float | None = None, accuracy: float | None = None) -> dict[str, Any]:
        """Report this worker's final test loss and accuracy (default: the last logged) once
        the run is done; its part of the run then ends."""
        with self._guard():
            return self._started().finish(loss, accuracy)

    def close(self) -> None:
        """Leave: sockets closed, heartbeat stopped. A worker whose run is done reports first,
        if it has not (the last logged test loss and accuracy), so a loop that simply ends,
        without ``finish()``, has done its part; one that leaves before the run is done is,
        to the run, a worker that died. Safe to call twice; ``with hopbus.join() as ctx``
        calls it, and so does the script's end."""
        self._leave(report=True)

    def _leave(self, *, report: bool) -> None:
        if self._closed:
            return
        try:
            s = self.session
            if report and s is not None and s.done and not s.finished and not self._failed:
                self.finish()
        finally:
            self._closed = True
            if self.session is not None:
                self.session.close()
            self.node.close()

    def _at_exit(self) -> None:
        """The script's end: ``close()``, unless an exception is on its way out already (the
        script failed: no report). A report that fails here is one line and status 1, not a
        traceback from an exit handler."""
        # an exception that ended the script: seen by our hook, or by the interpreter, which
        # keeps it as sys.last_value whatever hook a library put in place of ours
        failing = bool(_ESCAPED) or getattr(sys, "last_value", None) is not None
        try:
            self._leave(report=not failing)
        except Exception as exc:  # leaving: say it, as the excepthook would have
            import logging

            from hopbus.coord.client import scrub

            with contextlib.suppress(OSError, ValueError):
                print(f"hopbus: error: {scrub(str(exc))}", file=sys.stderr, flush=True)
                sys.stdout.flush()
            with contextlib.suppress(Exception):
                logging.shutdown()  # what the exit handlers skipped by _exit would flush
            os._exit(1)
        _free_before_shutdown()

    def __enter__(self) -> Context:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc is None and self.session is not None and not self.session.finished:
                if not self.session.done:
                    with self._guard():
                        raise self._short()
                self.finish()
        finally:
            self._leave(report=False)  # an exception on its way out: no report

    # -- a loop that ends before the run ---------------------------------------------------------
    def _ended_short(self, why: str) -> None:
        """The training loop stopped before the run was done (``model.fit`` ran out of
        epochs), and may go on (a loop that calls fit once per epoch). If the script leaves
        without going on, the worker fails then, saying ``why``."""
        if self._short_why is None:
            atexit.register(self._left_short)  # runs before close (registered at join)
        self._short_why = why

    def _short(self) -> RunFailure:
        return RunFailure(
            self._short_why
            or f"worker {self.worker} left the run after iteration {self.iteration} of "
            f"{self.iterations}: its training loop ended before the run's iterations were done"
        )

    def _left_short(self) -> None:
        """At exit, after a loop ended short: unless it went on to the run's end (or an
        error was raised already), the worker fails with the line that says why:
        told to the run, printed, and status 1, not a clean exit without a result."""
        s = self.session
        if self._closed or _ESCAPED or self._failed or s is None or s.finished or s.done:
            return
        exc = self._short()
        with contextlib.suppress(Exception):  # leaving: say it as far as we can
            self._guard()._tell(exc)
        with contextlib.suppress(OSError, ValueError):
            print(f"hopbus: error: {exc}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            self._leave(report=False)
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        os._exit(1)

    # -- internals ------------------------------------------------------------------------------
    def _started(self) -> Any:
        if self.session is None:
            raise UserError("call ctx.start(params) first")
        return self.session

    def _named(self, params: Mapping[str, Any] | Sequence[Any]) -> dict[str, np.ndarray]:
        if isinstance(params, Mapping):
            return {str(k): _array(str(k), v) for k, v in params.items()}
        if isinstance(params, np.ndarray) or not isinstance(params, Sequence):
            raise UserError(
                f"parameters must be a dict of named arrays or a list of arrays, not a "
                f"{type(params).__name__}"
            )
        return {str(i): _array(str(i), v) for i, v in enumerate(params)}

    def _out(self, x: dict[str, np.ndarray] | None) -> Any:
        if x is None or not self._as_list:
            return x
        return [x[str(i)] for i in range(len(x))]

    def _guard(self) -> _Guard:
        """Redis errors as one line; a failure of this worker told to the run once (not one
        caused by the run stopping, nor a replacement's or a dead worker's own)."""
        return _Guard(self)


def _array(name: str, value: Any) -> np.ndarray:
    """One named parameter as a numpy array, or one line saying why it is not one (a
    PyTorch tensor that requires grad, a ragged list)."""
    try:
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"parameter {name!r} is not an array: {first}") from None


class _Guard:
    """``Context._guard``: a class, not a generator, as it is entered around every step;
    what it needs to explain a failure is worked out only when one comes."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            return
        self.ctx._failed = True  # said already, by whoever catches it: not again at exit
        from hopbus.runtime.node import redis_failures

        try:  # a Redis error: raises its one line instead
            node = self.ctx.node
            redis_failures(node.who, self.ctx.run, node.redis_url).__exit__(kind, exc, tb)
        except UserError as line:
            self._tell(line)
            raise
        if isinstance(exc, UserError):
            self._tell(exc)

    def _tell(self, exc: UserError) -> None:
        ctx = self.ctx
        quiet = isinstance(exc, RunStopped | RejoinFailed | DeclaredDead)
        quiet = quiet or not ctx.node.admitted  # refused: it writes nothing into the run
        if ctx._report and not ctx._reported and not quiet:
            from hopbus.runtime.worker import report_failure

            ctx._reported = True
            report_failure(ctx.node.redis_url, ctx.run, ctx.worker, str(exc))


__all__ = ["LAUNCH_HINT", "Context", "NotLaunchedError", "join", "launched"]
