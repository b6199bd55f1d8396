"""A user's own model and data on the command line: ``--model MODULE:FUNCTION`` and
``--data MODULE:FUNCTION``, so CLI and compose users train their own network without a script.

``MODULE`` is a module name importable from the current folder or PYTHONPATH (``models:build``,
``mypkg.nets:vgg``) or a path to a ``.py`` file (``code/models.py:build``). The model function
returns a compiled Keras model (trained by ``model.fit`` with ``hopbus.keras.HopCallback``) or an
object of hopbus's numpy model interface (``init_params(seed)``, ``loss_and_grad(params, x, y)``,
``evaluate(params, x, y)``: hopbus.models.base.Model); it may take ``n_features``,
``n_classes`` and ``input_shape`` keyword arguments and is given those it names. The data
function takes no arguments and returns ``(x_train, y_train, x_test, y_test)``.

Everything that can go wrong (no such module, an import that raises, no such function, the
wrong kind of result) is one ConfigError line naming the flag; a user's exception is shown by
its type and first line, never with a traceback.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import inspect
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hopbus.errors import ConfigError, UserError
from hopbus.models.quiet import native_notices_hidden
from hopbus.runtime.reported import scored

SCRIPT = "script"
"""The model (and data) of a run whose workers run a user's script (``hopbus launch``): the
script builds both, and ``hopbus worker`` without a command refuses to join it."""

SPEC = re.compile(r"(?P<module>[A-Za-z_][A-Za-z0-9_.]*|[^:]+\.py):(?P<func>[A-Za-z_][A-Za-z0-9_]*)")


NUMPY_METHODS = ("init_params", "loss_and_grad", "evaluate")
"""What a numpy model offers (hopbus.models.base.Model)."""


TELL_AFTER_S = 15.0
"""When a user's module or function has run this long (a download, a big file, or a hang),
hopbus says so on stderr, then once a minute: a silent terminal is never all a user sees."""


@contextlib.contextmanager
def told_while_long(what: str) -> Iterator[None]:
    """Lines on stderr while ``what`` (the user's code) runs past TELL_AFTER_S: how long so
    far, and that Ctrl-C stops it. No deadline: a load may rightly take minutes."""
    done = threading.Event()
    t0 = time.monotonic()

    def tell() -> None:
        wait = TELL_AFTER_S
        while not done.wait(wait):
            print(
                f"hopbus: {what} still running after {time.monotonic() - t0:.0f} s "
                "(Ctrl-C stops it)",
                file=sys.stderr,
                flush=True,
            )
            wait = 60.0

    teller = threading.Thread(target=tell, name="hopbus-told-while-long", daemon=True)
    teller.start()
    try:
        yield
    finally:
        done.set()


def kind_of(obj: Any) -> str:
    """What a user's function returned, for a line: ``None``, ``an int``, ``a dict``."""
    if obj is None:
        return "None"
    name = type(obj).__name__
    if name == "ndarray":
        return f"{_article(str(obj.dtype))} {obj.dtype} numpy array"
    return f"{_article(name)} {name}"


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def is_callable_spec(spec: str) -> bool:
    """Whether ``spec`` names a user's function (MODULE:FUNCTION or FILE.py:FUNCTION)."""
    return SPEC.fullmatch(spec.strip()) is not None


def user_file(spec: str) -> Path | None:
    """The file a FILE.py:FUNCTION spec imports (a MODULE is Python's to find: None)."""
    m = SPEC.fullmatch(spec.strip())
    return Path(m["module"]) if m is not None and m["module"].endswith(".py") else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    if len(line) > 200:
        line = line[:200] + "..."
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def load_callable(spec: str, flag: str) -> Callable[..., Any]:
    """The function ``spec`` names, imported; one line for anything that goes wrong."""
    m = SPEC.fullmatch(spec.strip())
    if m is None:
        raise ConfigError(f"{flag} {spec!r}: expected MODULE:FUNCTION or FILE.py:FUNCTION")
    module_name, func = m["module"], m["func"]
    try:
        with (
            native_notices_hidden(),
            told_while_long(f"importing {module_name} ({flag})"),
            _argv_as_alone(module_name),
            _prints_aside(),  # stdout is the command's (--json)
        ):
            module = _import(module_name, flag, spec)  # a Keras module imports TensorFlow
    except ConfigError:
        raise
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        top = missing.split(".")[0]
        if module_name.endswith(".py") or top != module_name.split(".")[0]:
            # the user's module was found: something it imports is not installed here
            tf = top in ("keras", "tensorflow")
            extra = " (TensorFlow is hopbus's tf extra: pip install -e '.[tf]')" if tf else ""
            why = f"not installed in this Python ({sys.executable}){extra}"
            if top != missing and importlib.util.find_spec(top) is not None:
                why = f"{top} is installed, with no such part: is the name right?"
            raise ConfigError(
                f"{flag} {spec!r}: importing {module_name} failed: no module named {missing!r}, "
                f"which it imports: {why}"
            ) from None
        where = os.environ.get("PYTHONPATH")
        looked = f" (looked in {os.getcwd()}" + (f" and PYTHONPATH {where}" if where else "")
        raise ConfigError(
            f"{flag} {spec!r}: no module named {missing!r}{looked}: run from the folder that "
            "holds it, or add that folder to PYTHONPATH; in compose, put it in CODE_DIR)"
        ) from None
    except BaseException as exc:  # the user's module raised while importing
        if isinstance(exc, KeyboardInterrupt):
            raise
        if isinstance(exc, SystemExit):  # e.g. an argparse at module level, given no flags
            raise ConfigError(
                f"{flag} {spec!r}: importing {module_name} ended the program (sys.exit"
                f"({exc.code!r})): keep what a script does when run, command-line parsing "
                'included, under `if __name__ == "__main__":`'
            ) from None
        raise ConfigError(
            f"{flag} {spec!r}: importing {module_name} failed: {_first_line(exc)}"
        ) from None
    fn = getattr(module, func, None)
    if fn is None:
        raise ConfigError(f"{flag} {spec!r}: module {module_name!r} has no {func!r}")
    if not callable(fn):
        kind = type(fn).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        raise ConfigError(f"{flag} {spec!r}: {func!r} is {article} {kind}, not a function")
    return fn


@contextlib.contextmanager
def _argv_as_alone(module_name: str) -> Iterator[None]:
    """sys.argv while the user's module is imported: as if it ran alone with no flags (an
    argparse at module level parsed hopbus's own command line, and said so as "hopbus:
    error: unrecognized arguments")."""
    saved = sys.argv
    sys.argv = [module_name]
    try:
        yield
    finally:
        sys.argv = saved


USER_MODULE = "hopbus_user_"
"""The prefix of the module name a user's file is loaded under when its own name is taken."""


def _import(module_name: str, flag: str, spec: str) -> Any:
    """The module (a name, or a path to a .py file, imported under its stem)."""
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            where = "" if path.is_absolute() else f" in {os.getcwd()} (each worker's own folder)"
            raise ConfigError(f"{flag} {spec!r}: no such file {module_name!r}{where}")
        for name in (path.stem, USER_MODULE + path.stem):
            loaded = sys.modules.get(name)
            if loaded is not None and Path(getattr(loaded, "__file__", "") or "") == path.resolve():
                return loaded  # --model and --data in one file: imported once
        sys.path.insert(0, str(path.resolve().parent))  # its sibling imports work
        # under its stem, unless another module has that name (a json.py of the user's took
        # the place of the standard library's json, which hopbus uses): then a name of its own
        name = path.stem if path.stem not in sys.modules else USER_MODULE + path.stem
        loader_spec = importlib.util.spec_from_file_location(name, path.resolve())
        assert loader_spec is not None and loader_spec.loader is not None
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        loader_spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the current folder
    return importlib.import_module(module_name)


@contextlib.contextmanager
def _prints_aside() -> Iterator[None]:
    """What the user's code prints, on stderr instead of stdout (the command's: one JSON
    object under --json): Python's prints, and what is written to descriptor 1 itself (a
    child of os.system, C code's printf), which reached stdout before the summary."""
    with contextlib.redirect_stdout(sys.stderr):
        try:
            sys.__stdout__.flush()  # type: ignore[union-attr]
            saved = os.dup(1)
        except (OSError, ValueError, AttributeError):  # no descriptor 1: nothing to move
            yield
            return
        os.dup2(2, 1)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, AttributeError):  # C's buffered stdout, now
                ctypes.CDLL(None).fflush(None)
            os.dup2(saved, 1)
            os.close(saved)


def call_user(fn: Callable[..., Any], spec: str, flag: str, **offered: Any) -> Any:
    """``fn`` called with those of ``offered`` its signature names; its exception as one line."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in offered.items() if takes_all or k in params}
    loose = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    unmet = [
        n for n, p in params.items()
        if p.default is inspect.Parameter.empty and p.kind not in loose and n not in kwargs
    ]  # fmt: skip
    if unmet:
        gives = f"gives {', '.join(offered)} by name" if offered else "calls it with none"
        raise ConfigError(
            f"{flag} {spec!r} needs the argument {unmet[0]!r}, which hopbus does not give (it "
            f"{gives}; the function takes those it names)"
        )
    try:
        # building a Keras model starts TensorFlow's runtime; what the user's code prints goes
        # to stderr: stdout is the command's (one JSON object under --json)
        with native_notices_hidden(), told_while_long(f"{flag} {spec!r}"), _prints_aside():
            return fn(**kwargs)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | ConfigError):
            raise
        raise ConfigError(f"{flag} {spec!r} raised {_first_line(exc)}") from None


def is_keras_model(obj: Any) -> bool:
    """A Keras model (checked without importing Keras: by its classes' modules)."""
    return any(
        c.__module__.split(".")[0] in ("keras", "tf_keras")
        and c.__name__ in ("Model", "Sequential", "Functional")
        for c in type(obj).__mro__
    )


USE_EMA = (
    "the optimizer has use_ema=True: at the end of fit Keras puts each worker's own moving "
    "average of its weights into the model, which hopbus does not average, so the workers "
    "would end with models unlike each other and unlike the accuracy reported; compile "
    "without use_ema"
)


def not_for_hop(model: Any) -> str | None:
    """Why a compiled Keras model cannot be a Hop worker as compiled (HopCallback refuses it
    at fit's start, --model before any worker starts), or None: an optimizer that keeps a
    moving average (``USE_EMA``), or train steps run several at a time, between two of which
    no callback runs, so no exchange could either (one batch is one Hop iteration)."""
    if getattr(getattr(model, "optimizer", None), "use_ema", False):
        return USE_EMA
    steps = getattr(model, "steps_per_execution", 1)
    if isinstance(steps, int) and steps != 1:
        return (
            f"the model is compiled with steps_per_execution={steps}: Keras then runs {steps} "
            "batches between two callbacks, and hopbus exchanges the parameters after every "
            "batch (one batch is one Hop iteration); compile with steps_per_execution=1, the "
            "default"
        )
    return None


def check_model(obj: Any, spec: str) -> Any:
    """``obj`` if it is a compiled Keras model or a numpy Model; else one line saying what is
    expected."""
    if is_keras_model(obj):
        if not getattr(obj, "compiled", False) or getattr(obj, "optimizer", None) is None:
            raise ConfigError(
                f"--model {spec!r} returned a Keras model that is not compiled: call "
                "model.compile(optimizer=..., loss=..., metrics=['accuracy']) before returning it"
            )
        why = not_for_hop(obj)
        if why is not None:
            raise ConfigError(f"--model {spec!r}: {why}")
        return obj
    if all(callable(getattr(obj, m, None)) for m in NUMPY_METHODS):
        return obj
    raise ConfigError(
        f"--model {spec!r} returned {kind_of(obj)}: expected a compiled Keras model, or "
        "an object with init_params(seed), loss_and_grad(params, x, y) and "
        "evaluate(params, x, y) (hopbus.models.base.Model)"
    )


def _answer(model: Any, method: str, spec: str, *args: Any) -> Any:
    """``model.method(*args)``; its exception as one line naming the method."""
    try:
        long = told_while_long(f"--model {spec!r}: {method}()")
        with native_notices_hidden(), long, _prints_aside():
            return getattr(model, method)(*args)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise ConfigError(f"--model {spec!r}: its {method}() raised {_first_line(exc)}") from None


def _a_number(value: Any, *, finite: bool = True) -> bool:
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return not isinstance(value, bool) and (math.isfinite(x) or not finite)


def check_numpy_model(model: Any, spec: str, seed: int, x: Any, y: Any) -> None:
    """One call of each method of a numpy model of the user's (``hopbus.models.base.Model``)
    on a minibatch ``x``, ``y``, before any process starts: what it returns is what the
    workers' loop takes, or one line saying which method returned what (a worker would
    fail later, with a traceback through hopbus's own files)."""
    import numpy as np

    def refused(call: str, what: str) -> ConfigError:
        return ConfigError(f"--model {spec!r}: {call} returned {what}")

    init, step = "init_params(seed)", "loss_and_grad(params, x, y)"
    expected = "expected a dict of names to float numpy arrays"
    params = _answer(model, "init_params", spec, seed)
    if not isinstance(params, dict) or not params:
        got = "an empty dict" if isinstance(params, dict) else kind_of(params)
        raise refused(init, f"{got}: {expected}")
    for name, a in params.items():
        if not isinstance(name, str) or not isinstance(a, np.ndarray) or a.dtype.kind != "f":
            raise refused(init, f"{kind_of(a)} for {str(name)[:40]!r}: {expected}")
    out = _answer(model, "loss_and_grad", spec, params, x, y)
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise refused(step, f"{kind_of(out)}: expected (loss, gradients), a number and a dict")
    loss, grads = out
    if not _a_number(loss):
        raise refused(step, f"a loss that is not a finite number ({kind_of(loss)})")
    if not isinstance(grads, dict) or grads.keys() != params.keys():
        names = sorted(map(str, grads))[:5] if isinstance(grads, dict) else kind_of(grads)
        raise refused(
            step,
            f"gradients {names} for parameters {sorted(params)[:5]}: expected one array per "
            "parameter, by its name",
        )
    for name, a in params.items():
        if (shape := getattr(grads[name], "shape", None)) != a.shape:
            got = shape if shape is not None else kind_of(grads[name])
            raise refused(step, f"a gradient of {name!r} shaped {got}, its parameter {a.shape}")
        if not isinstance(grads[name], np.ndarray) or grads[name].dtype.kind != "f":
            raise refused(
                step, f"{kind_of(grads[name])} as the gradient of {name!r}: expected float ones"
            )
    evaluate = "evaluate(params, x, y)"
    got = _answer(model, "evaluate", spec, params, x, y)
    try:
        loss, accuracy = got  # any pair, as the workers take it (runtime/reported.scored)
    except (TypeError, ValueError):
        raise refused(evaluate, f"{kind_of(got)}: expected (loss, accuracy), two numbers") from None
    for what, value in (("loss", loss), ("accuracy", accuracy)):
        if value is not None and not _a_number(value, finite=False):
            raise refused(evaluate, f"{kind_of(value)} as its {what}: expected a number")
    try:
        scored((loss, accuracy))
    except UserError as exc:  # an accuracy that is no fraction: the workers' own line
        said = str(exc).removeprefix("evaluate(): ")
        raise ConfigError(f"--model {spec!r}: {evaluate}: {said}") from None


NOT_BUILT = (
    "the model is not built yet: it has no weights (a model without keras.Input gets them on "
    "fit's first batch, after every worker must start from the same weights): begin it with "
    "keras.Input(shape=...), or call it once on a batch before fit, model(x_train[:1]) "
    "(model.build() makes no weights for a subclassed model's layers)"
)
"""Why a Keras model with no weights yet cannot join a run (HopCallback's, and --model's
where building it from the data's shape failed)."""


def unbuilt(model: Any) -> bool:
    """Whether some layer of the Keras ``model`` has no weights yet: the model itself, or one
    inside it (a subclassed model's ``build()`` marks it built and makes none of its layers')."""
    seen: set[int] = set()
    todo = [model]
    while todo:
        layer = todo.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if not getattr(layer, "built", True):
            return True
        inner = getattr(layer, "layers", None)
        if isinstance(inner, list | tuple):  # not a hyperparameter that happens to be called so
            todo.extend(inner)
    return False


def built_keras(model: Any, spec: str, input_shape: tuple[int, ...]) -> Any:
    """``model``, built for samples of ``input_shape`` if it is a Keras model with no weights
    yet (one with no keras.Input, a subclassed one): hopbus knows the data's shape, so the
    user need not. Calling it on a batch of zeros builds every kind (``build()`` does not
    build a subclassed model's layers, and warns that it cannot)."""
    if not is_keras_model(model) or not unbuilt(model):
        return model
    import numpy as np

    try:
        with native_notices_hidden():
            model(np.zeros((1, *input_shape), "float32"), training=False)
    except Exception as exc:
        raise ConfigError(
            f"--model {spec!r}: {NOT_BUILT} (calling it on a batch of shape "
            f"{(1, *input_shape)} raised {_first_line(exc)})"
        ) from None
    return model


def keras_mode_line(what: str, mode: object) -> str:
    """Why a Keras model (a user's --model, or a script's) cannot train in ``mode``."""
    return (
        f"{what} trains with the Hop modes only (standard, notify-ack, backup, staleness, "
        f"hybrid): --mode {mode} moves its bytes with a driver of its own (a parameter "
        "server's pushes, gloo's all-reduce, wagma's group averages) that a training loop "
        "joined through hopbus does not run"
    )


__all__ = [
    "NOT_BUILT",
    "SCRIPT",
    "USE_EMA",
    "built_keras",
    "call_user",
    "check_model",
    "is_callable_spec",
    "is_keras_model",
    "keras_mode_line",
    "kind_of",
    "load_callable",
    "not_for_hop",
    "unbuilt",
]
