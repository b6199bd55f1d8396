"""Values read from Redis, validated where they are read.

Anything that can write a run's keys (a bug, a second process started by mistake, a stale
snapshot, a person with redis-cli) can put anything there. Every reader of the run's keys
(``hopbus train``'s follower, ``watch``, ``top``, ``inspect``, the workers) goes through these
parsers: a value that does not parse, or is out of range, comes back as None (or is left out)
and is counted by the caller, never a traceback. A worker's final report counts only if it agrees
with the worker's own counter and incarnation (``result``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

import redis

from hopbus.coord.keys import FINISHED

MAX_INT = 2**62  # larger is not an iteration, an id or a count of hopbus's
INCARNATION_DIGITS = 15  # a replacement's number, as the Lua scripts read it too (exact there)


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
"""Control characters, and the Unicode ones that break or reorder a line (line and paragraph
separators, bidirectional marks, embeddings, overrides and isolates): a value that reaches a
terminal must not move its cursor, clear it, retitle it, start a line of its own or show its
text in another order than it has."""

_INTEGER = re.compile(r"-?[0-9]+")
"""A base-10 integer in ASCII digits, as Redis's INCR and the Lua scripts' tonumber read one
(Python's int() also takes other scripts' digits, '²' (and raises) or '１' (1): a value one
side reads and the other does not)."""


def text(value: Any, limit: int = 2000) -> str | None:
    """bytes or str as str (undecodable bytes replaced, control characters as spaces), at
    most ``limit`` characters."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if not isinstance(value, str):
        return None
    if _CONTROL.search(value):
        value = _CONTROL.sub(" ", value)
    return value if len(value) <= limit else value[:limit] + "..."


# Redis 7.0 wraps a Lua script's error in the first, 6.2 also repeats its place (the second)
_IN_SCRIPT = re.compile(
    r"^Error running script \(call to [^)]*\): @user_script:\d+: (user_script:\d+: )?"
)


def refusal(exc: BaseException) -> str:
    """A Redis refusal in one short line: its reason (``WRONGTYPE ...``, ``NOPERM ...``),
    without the pipeline's command or the Lua source redis-py wraps it in."""
    said = str(exc)
    if "caused error: " in said:
        said = said.split("caused error: ", 1)[1]
    said = _IN_SCRIPT.sub("", said).split(" script: ", 1)[0]  # Redis 7.0's wrapper, 7.2's
    return (text(said, 200) or type(exc).__name__).strip()


def refused_because(exc: BaseException, otherwise: str) -> str:
    """Why Redis refused, for the end of a line: a user without the right (NOPERM) and a
    Redis out of memory (OOM, maxmemory with no eviction) have causes of their own, which
    ``otherwise`` (the run's keys written by something else) would hide."""
    said = refusal(exc)
    if isinstance(exc, redis.exceptions.NoPermissionError) or said.startswith("NOPERM"):
        return (
            "the user in the URL may not touch this run's keys (a per-run user of another "
            "run? docs/security.md)"
        )
    if isinstance(exc, redis.exceptions.OutOfMemoryError) or "OOM" in said or "maxmemory" in said:
        return (
            "Redis is out of memory (its maxmemory reached, and it evicts nothing): free some, "
            "or raise maxmemory"
        )
    return otherwise


def in_script(exc: BaseException) -> bool:
    """Whether a Redis refusal came from inside one of hopbus's Lua scripts (a value of the
    run's keys that the script could not use), not from a command of its own."""
    return "user_script" in str(exc)  # Redis 6.2's, 7.0's and 7.2's wrappers all name it


def stop_reason(value: Any) -> str:
    """A run's stop key (``hop:{R}:stop``, present) as the reason to show: its text, or a word
    for a value without any. An empty or unreadable one stops the run all the same."""
    return (text(value, 500) or "").strip() or "stopped (no readable reason given)"


def integer(value: Any, lo: int = 0, hi: int = MAX_INT) -> int | None:
    """A base-10 integer in [lo, hi], or None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if lo <= value <= hi else None
    s = text(value, 40)
    if s is None:
        return None
    s = s.strip()
    if not _INTEGER.fullmatch(s):
        return None
    n = int(s)
    return n if lo <= n <= hi else None


def stream_id(value: Any) -> tuple[int, int]:
    """A stream entry id (``ms-seq``) as a pair to compare, (0, 0) for anything else."""
    ms, _, seq = (text(value, 60) or "").partition("-")
    a, b = integer(ms), integer(seq or "0")
    return (a, b) if a is not None and b is not None else (0, 0)


def incarnation_of(value: Any) -> int:
    """A worker's entry in the incarnation hash: the replacement's number, or 0 (the process
    that started with the run) for none, or for one no replacement wrote (forged, garbled):
    the rule coord/control.py's scripts follow (``_INCARNATION``)."""
    return integer(value, 0, 10**INCARNATION_DIGITS - 1) or 0


def number(value: Any) -> float | None:
    """A float (NaN and infinity allowed: a diverged loss is a fact to report), or None."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    s = text(value, 60)
    if s is None or not s.isascii() or "_" in s:  # float() takes '１' and '1_0' too
        return None
    try:
        return float(s)
    except ValueError:
        return None


def finite_number(value: Any) -> float | None:
    """A finite float, or None."""
    x = number(value)
    return x if x is not None and math.isfinite(x) else None


#: Latest Unix time read as one (the year 5138): a later one is forged, and its milliseconds
#: would overflow what the tools compute from it
LATEST_TIME_S = 1e11


def timestamp(value: Any) -> float | None:
    """Unix seconds between 0 and LATEST_TIME_S, or None."""
    x = finite_number(value)
    return x if x is not None and 0 <= x < LATEST_TIME_S else None


def ids(values: Iterable[Any], n: int) -> set[int]:
    """The members that are node ids 0..n-1 (a set's or a hash's keys); others left out."""
    out = set()
    for v in values:
        i = integer(v, 0, n - 1)
        if i is not None:
            out.add(i)
    return out


def json_object(raw: Any, limit: int = 1 << 20) -> dict[str, Any] | None:
    """A JSON object (a dict), or None for anything else, however malformed."""
    s = text(raw, limit)
    if s is None or len(s) >= limit:
        return None
    try:
        obj = json.loads(s)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def int_list(raw: Any, n: int) -> list[int] | None:
    """A JSON list of node ids 0..n-1 (a progress entry's ``blocked_on``), or None."""
    s = text(raw, 10_000)
    if s is None:
        return None
    try:
        got = json.loads(s)
    except (ValueError, RecursionError):
        return None
    if not isinstance(got, list) or not all(integer(x, 0, n - 1) is not None for x in got):
        return None
    return [int(x) for x in got]


def beating(value: Any, pttl: Any) -> bool:
    """Whether a heartbeat key says its node is alive: hopbus writes a live one with a TTL
    (``pttl`` > 0, in ms) and a finished node's marker without one. A value without a TTL
    that is not the marker was written by something else, and keeps nobody alive."""
    return isinstance(pttl, int) and pttl > 0 and text(value, 40) != FINISHED


def lapsing(value: Any, pttl: Any, ttl_ms: float) -> bool:
    """Whether a heartbeat key of a node whose heartbeat lives ``ttl_ms`` is beating but has
    gone unrenewed for half its life (a live node renews it every third): frozen, cut off, or
    its process gone. By its remaining TTL, which no host's clock skews."""
    return beating(value, pttl) and pttl < ttl_ms / 2


def gone(value: Any, pttl: Any) -> bool:
    """Whether a heartbeat key says its node is gone: neither beating nor finished."""
    return not beating(value, pttl) and text(value, 40) != FINISHED


def accuracy(value: float) -> bool:
    """Whether ``value`` is an accuracy a worker may write: a fraction in [0, 1], or NaN (an
    evaluation on nothing, written as null). The writer's check (``Session.log``, a model's
    ``evaluate()``) and the progress reader's are this one rule: an entry the writer lets
    through and the reader refuses made every later step of that worker look forged."""
    return math.isnan(value) or 0.0 <= value <= 1.0


def _finite_json_number(value: Any) -> bool:
    """A JSON number a worker's report holds: a finite float, or an integer of hopbus's
    range (math.isfinite of a 400-digit integer raises OverflowError)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -MAX_INT <= value <= MAX_INT
    return isinstance(value, float) and math.isfinite(value)


#: What only a worker's final report holds, never its counters: a stats hash, read for a
#: worker that did not report, can claim none of them (a forged ``final_accuracy`` there made
#: a failed run finished)
REPORT_FIELDS = frozenset(
    {"worker", "iterations", "final_loss", "final_accuracy", "t", "cpu_s", "compute_s",
     "device", "incarnation", "sketch_exact"}
)  # fmt: skip


def result(
    raw: Any, *, counter: Any, incarnation: Any, iterations: int, beat: Any
) -> dict[str, Any] | None:
    """A worker's final report, if it is one: a JSON object whose ``iterations`` is the run's
    (every worker finishes there), equal to the worker's counter in Redis, from the worker's
    current incarnation (none recorded: the process that started with the run), beside its
    heartbeat ``beat`` set to ``keys.FINISHED`` (the report's own script writes both), every
    field of the type a worker writes. Anything else (forged, left by a replaced process,
    half-written) is None."""
    if text(beat, 40) != FINISHED:
        return None
    obj = json_object(raw)
    if obj is None:
        return None
    done = integer(obj.get("iterations"))
    if done is None or done != iterations or integer(counter) != done:
        return None
    if integer(obj.get("incarnation", 0)) != incarnation_of(incarnation):
        return None
    for key, value in obj.items():  # what a worker writes: numbers, but for two fields
        if key == "device":
            ok = isinstance(value, str) and text(value, 64) == value
        elif key == "sketch_exact":
            ok = isinstance(value, bool)
        else:  # losses (None: not evaluated), counters and times, which the summary adds up;
            # finite (a worker's report is strict JSON: its writer turns NaN and inf into null)
            loss = key in ("final_loss", "final_accuracy")
            ok = (value is None and loss) or _finite_json_number(value)
            ok = ok and (key != "final_accuracy" or value is None or accuracy(value))
        if not ok:
            return None
    return obj


__all__ = [
    "MAX_INT",
    "REPORT_FIELDS",
    "accuracy",
    "beating",
    "finite_number",
    "gone",
    "ids",
    "int_list",
    "integer",
    "json_object",
    "number",
    "refused_because",
    "result",
    "stream_id",
    "text",
    "timestamp",
]
