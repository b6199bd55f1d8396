"""TensorBoard scalars without TensorFlow: each worker's event file, written by hand.

``tensorboard --logdir runs/RUN`` shows a run: every worker writes its training loss, test loss
and accuracy, iteration time, time blocked and how far it is behind its slowest in-neighbour to
``runs/RUN/tensorboard/worker-I/``. The file format is TensorBoard's own (TFRecord framing of
``Event`` protocol buffers, masked CRC-32C), written here in a few lines so that a numpy
worker never pays TensorFlow's import for it. Writes are buffered and flushed every
``FLUSH_S`` seconds and at the end; a full disk stops the scalars with one line, never the run.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

FLUSH_S = 2.0
"""Seconds between writes to disk: TensorBoard re-reads files about this often."""

EVERY_S = 0.1
"""At most this often a step's scalars are kept (a run of thousands of iterations a second
would spend more on its scalars than on its protocol); a test-set evaluation is always kept."""


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of TFRecord framing."""
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _field(number, 2) + _varint(len(data)) + data


SESSION_START = 1
"""``SessionLog.START``: TensorBoard drops what earlier files hold for this step and later."""


def event(wall_time: float, step: int = 0, *, scalars: dict[str, float] | None = None,
          file_version: str | None = None, session: int | None = None) -> bytes:  # fmt: skip
    """One serialized ``Event``: wall_time (1, double), step (2, int64), file_version (3), a
    summary (5) of ``Summary.Value``s, each a tag (1) and a simple_value (2, float), or a
    session_log (7) whose status (1) is ``session``."""
    out = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(step)
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    if session is not None:
        out += _bytes_field(7, _field(1, 0) + _varint(session))
    if scalars:
        values = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5) + _float32(v))
            for tag, v in scalars.items()
        )
        out += _bytes_field(5, values)
    return out


FLOAT32_MAX = 3.4028234663852886e38


def _float32(v: float) -> bytes:
    """``v`` as TensorBoard's float: one beyond float32's range is infinite, as numpy's
    ``float32(v)`` is (struct refuses it: a float64 loss on its way to inf, 1e39 say,
    stopped the worker before its divergence could be said)."""
    if abs(v) > FLOAT32_MAX:
        v = math.copysign(math.inf, v)
    return struct.pack("<f", v)


def record(data: bytes) -> bytes:
    """TFRecord framing: length, its masked CRC, the data, the data's masked CRC."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked(length)) + data + struct.pack("<I", _masked(data))


def step_scalars(
    loss: float | None, fields: dict[str, Any], step_s: float, behind: int | None = None
) -> dict[str, float | None]:
    """A worker's scalars for one step, from its progress entry's ``fields`` (the tags
    docs/api.md lists; ``behind``: how far its slowest live in-neighbour is behind, Hop modes
    only)."""
    return {
        "train/loss": loss,
        "test/loss": fields.get("eval_loss"),
        "test/accuracy": fields.get("eval_accuracy"),
        "time/iteration_s": step_s,
        "time/blocked_s": fields["wait_s"],
        "behind_slowest_in_neighbour": behind,
    }


class ScalarWriter:
    """One event file in ``folder``; ``add`` buffers, ``flush`` writes. ``start``: the first
    step it will write. A resumed run's worker starts after its checkpoint's iteration, and
    its file says so (a ``SessionLog.START``), so TensorBoard drops the steps from there on
    that the stopped run's file holds: a resumed run is shown as one timeline."""

    def __init__(self, folder: str | Path, start: int = 0) -> None:
        self.folder = Path(folder)
        self._buf: list[bytes] = []
        self._next_flush = time.monotonic() + FLUSH_S
        self._next_keep = 0.0
        self._broken = False
        now = time.time()
        self.path = (
            self.folder / f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.0"
        )
        self._buf.append(record(event(now, file_version="brain.Event:2")))
        self._buf.append(record(event(now, start, session=SESSION_START)))

    def due(self) -> bool:
        """Whether ``add`` would keep a step's scalars now: a caller asks before it works
        them out (most steps' are not kept)."""
        return not self._broken and time.monotonic() >= self._next_keep

    def add(self, step: int, scalars: dict[str, float | None], *, keep: bool = False) -> None:
        """Scalars of ``step`` (None values left out), unless the last were kept less than
        ``EVERY_S`` ago and ``keep`` is False."""
        if self._broken:
            return
        now = time.monotonic()
        if not keep and now < self._next_keep:
            return
        self._next_keep = now + EVERY_S
        values = {k: float(v) for k, v in scalars.items() if v is not None}
        if values:
            self._buf.append(record(event(time.time(), step, scalars=values)))
        if time.monotonic() >= self._next_flush:
            self.flush()

    def flush(self) -> None:
        if self._broken or not self._buf:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as fh:
                fh.write(b"".join(self._buf))
        except OSError as exc:
            self._broken = True
            from hopbus.runtime.node import log  # which imports this module

            log(f"TensorBoard scalars stop: cannot write {self.path}: {exc.strerror or exc}")
        self._buf.clear()
        self._next_flush = time.monotonic() + FLUSH_S


__all__ = ["ScalarWriter", "crc32c", "event", "record"]
