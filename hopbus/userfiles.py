"""Reading files a user names (topologies, configs): one place that says, in one line, why not.

Only regular files are read (not directories, devices such as /dev/zero, or FIFOs that would
block forever), at most ``MAX_BYTES``, and only as UTF-8 text.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from hopbus.errors import ConfigError, UserError

MAX_BYTES = 64 * 1024 * 1024  # far beyond any real edge list or config


def not_regular(p: Path) -> str | None:
    """Why ``p`` is not a regular file to read (a directory, a device or FIFO, missing), or
    None if it is one."""
    if p.is_file():
        return None
    return (
        "is a directory"
        if p.is_dir()
        else ("is not a regular file" if p.exists() else "no such file")
    )


def read_text(path: str | Path, what: str, error: type[UserError] = UserError) -> str:
    """The text of the user's ``what`` file at ``path``, or ``error`` with the reason."""
    shown = str(path)
    if not shown.strip():
        raise error(f"{what}: no path given")
    p = Path(path)
    try:
        if (why := not_regular(p)) is not None:
            raise error(f"cannot read {what} {shown!r}: {why}")
        if p.stat().st_size > MAX_BYTES:
            raise error(f"cannot read {what} {shown!r}: larger than {MAX_BYTES // 2**20} MiB")
        data = p.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {shown!r}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8-sig")  # a byte-order mark some editors write: not text
    except UnicodeDecodeError:
        raise error(f"cannot read {what} {shown!r}: not UTF-8 text") from None


def check_output(out: Path, flag: str, inputs: Iterable[Path]) -> None:
    """One line if the file a command is to write at ``out`` is one of the files it reads
    (``inputs``, through any path or link): plot --out a hard link to the run's metrics.jsonl,
    sim --trace its --config, both replaced by what was read from them. Or a pipe no process
    reads (its open would wait for one forever)."""
    try:
        mode = out.stat().st_mode
    except OSError:
        return  # a new file (or one the write will say it cannot make)
    if stat.S_ISFIFO(mode):  # a pipe with a reader (>(wc -l), a piped /dev/stderr) is fine
        try:
            os.close(os.open(out, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: no process reads it
            raise ConfigError(
                f"{flag} {str(out)!r} is a pipe no process reads: give a file"
            ) from None
    for p in inputs:
        if _same(out, p):
            also = "" if p == out else f" ({str(p)!r})"
            raise ConfigError(
                f"{flag} {str(out)!r} is a file this command reads{also}: write elsewhere"
            )


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one that is not there
        return False
