"""Runs the typer app and turns every user error into one line.

Bad input of any kind (an unknown flag, a value of the wrong type, a setting the protocol
cannot honour, an unreadable file) prints ``hopbus: error: <what and why>`` on stderr and exits
with status 2; warnings print ``hopbus: warning: ...``. Output that cannot be written (a full
disk, a closed pipe) and Ctrl-C end with one line too. Tracebacks are for bugs only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import warnings
from collections.abc import Sequence

import typer
from redis import RedisError

import hopbus.cli.experiment  # noqa: F401 (registers hopbus experiment)
from hopbus.cli import cluster  # noqa: F401 (registers the cluster commands)
from hopbus.cli import compose as _compose  # noqa: F401 (registers hopbus compose)
from hopbus.cli import keys as _keys  # noqa: F401 (registers hopbus keys)
from hopbus.cli import plot as _plot  # noqa: F401 (registers hopbus plot)
from hopbus.cli import top as _top  # noqa: F401 (registers hopbus top)
from hopbus.cli.commands import app
from hopbus.cli.entry import INTERRUPTED, exit_interrupted
from hopbus.coord import read
from hopbus.errors import UserError


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"hopbus: warning: {message}", file=sys.stderr)


def _usage_error(exc: BaseException) -> bool:
    # typer's (vendored) click reports parse errors as exceptions carrying an exit code and a
    # one-line message; recognised by shape so that no private module is imported.
    return isinstance(getattr(exc, "exit_code", None), int) and hasattr(exc, "format_message")


_NOT_FOR_SCRIPTS = {
    "--checkpoint-every": "a script saves its own state (for Keras: "
    "keras.callbacks.BackupAndRestore)",
    "--group-size": "it belongs to wagma, which hopbus train runs",
    "--sync-period": "it belongs to wagma, which hopbus train runs",
    "--lookahead": "it belongs to ps-elastic, which hopbus train runs",
    "--compute-time": "it is hopbus sim's",
    "--jitter": "it is hopbus sim's",
    "--latency": "it is hopbus sim's",
}


def _model_flag_to_launch(exc: BaseException) -> str | None:
    """``hopbus launch --lr 0.1 -- ...``: a run flag a script's run has no use for, said so
    (click would only suggest the closest option names)."""
    name = getattr(exc, "option_name", None)
    ctx = getattr(exc, "ctx", None)
    if not isinstance(name, str) or getattr(getattr(ctx, "command", None), "name", "") != "launch":
        return None
    from hopbus.config import TrainConfig, flag_of

    if name not in {flag_of(field) for field in TrainConfig.model_fields}:
        return None
    why = _NOT_FOR_SCRIPTS.get(name) or (
        "it is a setting of hopbus's own models (hopbus train); your script sets its own, from "
        "its arguments after --"
    )
    return f"hopbus launch takes no {name}: {why}"


def _script_to_train(exc: BaseException, message: str) -> str:
    """``hopbus train -- python train.py``: a script goes to hopbus launch, said so (click
    would only say that the arguments were not expected)."""
    ctx = getattr(exc, "ctx", None)
    if getattr(getattr(ctx, "command", None), "name", "") == "train" and (
        "unexpected extra argument" in message
    ):
        return (
            f"{message}: hopbus train runs hopbus's own models (--model); your own script runs "
            "with hopbus launch [flags] -- COMMAND ARGS..."
        )
    return message


def _modes_of_the_command(exc: BaseException, message: str) -> str:
    """A mistyped --mode: the modes this command runs (its help's metavar), not every mode
    hopbus knows (launch and sim refuse some of them)."""
    param = getattr(exc, "param", None)
    metavar = getattr(param, "metavar", None)
    at = message.find(" is not one of ")
    if getattr(param, "name", None) != "mode" or at < 0 or not isinstance(metavar, str):
        return message
    modes = metavar.strip("<>").split("|")
    return f"{message[:at]} is not one of {', '.join(map(repr, modes))}."


def _silence_stdout() -> None:
    """After stdout failed, point it at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


LINE_CHARS = 2000
"""An error line quotes a bad value at most this long (a config's 20 MB string made a 20 MB
line): one line a terminal shows whole."""

OUTPUT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EPIPE}
)
"""What only a write meets: the output failing. Any other OSError that reaches main names a
path the user gave that the system refused (a name too long, a folder it may not enter)."""


def _fail(message: str, code: int) -> None:
    from hopbus.coord.client import scrub

    message = scrub(message)
    if len(message) > LINE_CHARS:
        message = f"{message[:LINE_CHARS]}... ({len(message) - LINE_CHARS} more characters)"
    with contextlib.suppress(OSError):
        print(f"hopbus: error: {message}", file=sys.stderr)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> None:
    warnings.showwarning = _show_warning
    command = typer.main.get_command(app)
    try:
        code = command.main(
            args=list(argv) if argv is not None else None, prog_name="hopbus", standalone_mode=False
        )
        if sys.stdout is not None:
            sys.stdout.flush()
    except UserError as exc:
        if exc.said:
            sys.exit(exc.exit_code)
        _fail(str(exc), exc.exit_code)
    except RedisError as exc:  # a reply the command did not expect (a key of another type...)
        why = read.refused_because(exc, "")  # a per-run user of another run, an OOM
        _fail(f"Redis answered with an error: {read.refusal(exc)}{f': {why}' if why else ''}", 1)
    except KeyboardInterrupt:
        code = INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()  # the reader went away (e.g. `| head`): nothing left to say
        sys.exit(1)
    except OSError as exc:
        _silence_stdout()
        where = f" ({exc.filename})" if exc.filename else ""
        if exc.errno in OUTPUT_ERRNOS or not exc.filename:
            _fail(f"cannot write output{where}: {exc.strerror or exc}", 1)
        _fail(f"cannot use {exc.filename}: {exc.strerror or exc}", 2)
    except Exception as exc:
        if not _usage_error(exc):
            raise
        # an enum flag's value is checked by pydantic, whose words lead the line
        said = exc.format_message().replace(": Value error, ", ": ", 1)
        message = _model_flag_to_launch(exc) or _script_to_train(
            exc, _modes_of_the_command(exc, said)
        )
        if message:  # empty when the help text was shown instead (``hopbus`` with no command)
            print(f"hopbus: error: {message}", file=sys.stderr)
        sys.exit(exc.exit_code)
    if code == INTERRUPTED:  # typer turns Ctrl-C into this exit code
        exit_interrupted()
    sys.exit(code if isinstance(code, int) else 0)
