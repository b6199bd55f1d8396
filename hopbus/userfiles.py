"""Reading files a user names (topologies, configs): one place that says, in one line, why not.

Only regular files are read (not directories, devices such as /dev/zero, or FIFOs that would
block forever), at most ``MAX_BYTES``, and only as UTF-8 text.
"""

from __future__ import annotations

from pathlib import Path

from hopbus.errors import UserError

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
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"cannot read {what} {shown!r}: not UTF-8 text") from None
