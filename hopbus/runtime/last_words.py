"""A failed process's last words in one line: what ``hopbus launch`` and ``hopbus train`` say
when a copy of a user's script, or a worker running a user's model, exits with an error.

A Python traceback is read as a person reads it: the exception line that follows the last
traceback's frames (not the last line of stderr, which may be the tail of a multi-line
message, a Keras argument list or a TensorFlow node name), the first telling line of its
message where the first is only a lead-in (Keras's "Exception encountered when calling ...",
TensorFlow's "Graph execution error:"), and the place: the last frame in the user's own code,
where there is one (library frames are where an error surfaced, not what to fix), else the
last frame.
"""

from __future__ import annotations

import re
from pathlib import Path

from hopbus.coord import read

TAIL_LINES = 3
"""Lines of output that is not a traceback quoted in the line (all of it is in the log)."""
MESSAGE_CHARS = 300  # of a message's telling line, where its first was a lead-in

_WHERE = re.compile(r'\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>\S+))?\s*$')
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # Keras colours its messages
_QUALIFIED = re.compile(r"^(?:[A-Za-z_]\w*\.)+(?P<name>[A-Za-z_]\w*)(?=:|$)")
# a message's lines that are no news: TensorFlow's node and "defined at" lines, Keras's
# "Arguments received by ...:" heading
_NOISE = re.compile(r"^(?:\[\[|Detected at node|Arguments received by|\s)")
_HOPBUS = str(Path(__file__).resolve().parents[1])


def _library(path: str) -> bool:
    """A frame of an installed package, the standard library (a frozen module's too) or
    hopbus itself."""
    return (
        "/lib/python3" in path or "site-packages" in path or path.startswith(("<frozen ", _HOPBUS))
    )


ERROR_PREFIX = "hopbus: error: "
"""How hopbus, and a script through hopbus's API, says why it failed: one line."""


def said(lines: list[str]) -> str | None:
    """The process's own one-line account of its failure (hopbus's ``hopbus: error:``
    line, without the prefix), where it is its last word (hopbus's own notes aside): any
    other output after it (a traceback, the script's own last words) means that line came
    from something else it ran, a ``hopbus inspect`` say, and ``cause`` tells the rest.
    None if there is none."""
    at = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith(ERROR_PREFIX)), None)
    if at is None or any(not line.startswith(_OURS) for line in lines[at + 1 :] if line.strip()):
        return None
    return lines[at][len(ERROR_PREFIX) :]


_OURS = "hopbus: "
_HEADER = "Traceback (most recent call"


def cause(tail: list[str], last: int = TAIL_LINES) -> str:
    """``tail``'s last words (see the module docstring): ``TypeError: ... (train.py, line 33,
    in evaluate)``; a SyntaxError's ``(train.py, line 3)``; output that holds no traceback as
    its ``last`` lines joined."""
    tail = [read.text(_ANSI.sub("", line), 1000) or "" for line in tail]  # no escape goes out
    tail = [line for line in tail if line.strip()]
    if not tail:
        return "it printed nothing on stderr"
    # the exception line: the first line, after the last traceback's header (else after the
    # last frame: a SyntaxError has no header), that is not a frame or a frame's code
    heads = [i for i, line in enumerate(tail) if line.startswith(_HEADER)]
    frames = [i for i, line in enumerate(tail) if _WHERE.match(line)]
    start = heads[-1] if heads else (frames[-1] if frames else len(tail))
    at = next((i for i in range(start + 1, len(tail)) if not tail[i][0].isspace()), None)
    frames = [i for i in frames if start <= i < (at or 0)]
    if not frames or at is None:
        return " | ".join(line.strip() for line in tail[-last:])
    said = _QUALIFIED.sub(lambda m: m["name"], tail[at].strip())[:MESSAGE_CHARS]
    if said.endswith((":", ".")):  # a lead-in: the message's first telling line too
        told = next((x.strip() for x in tail[at + 1 :] if not _NOISE.match(x)), None)
        if told:
            said += " " + (told if len(told) <= MESSAGE_CHARS else told[:MESSAGE_CHARS] + "...")
    places = [m for i in frames if (m := _WHERE.match(tail[i]))]
    own = [m for m in places if not _library(m["file"])]
    m = (own or places)[-1]
    if places[-1]["func"] is None and m is not places[-1]:  # a module the script imported
        bad = places[-1]  # does not compile: that module's line is the error's place
        return (
            f"{said} ({Path(bad['file']).name}, line {bad['line']}, imported from "
            f"{Path(m['file']).name}, line {m['line']})"
        )
    where = f", in {m['func']}" if m["func"] else ""  # a SyntaxError's place names none
    return f"{said} ({Path(m['file']).name}, line {m['line']}{where}){_install(said)}"


_MISSING = re.compile(r"^ModuleNotFoundError: No module named '(?P<module>[\w.]+)'")


def _install(said: str) -> str:
    """For a package one of hopbus's extras installs (a Keras script run without TensorFlow):
    the command that installs it."""
    from hopbus.models.extras import missing_hint

    m = _MISSING.match(said)
    hint = missing_hint(m["module"]) if m else None
    return f"; install it: {hint}" if hint else ""


__all__ = ["ERROR_PREFIX", "cause", "said"]
