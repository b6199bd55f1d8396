"""Native libraries' start-up notices kept off the terminal.

TensorFlow 2.21 writes "All log messages before absl::InitializeLog() is called are written to
STDERR" and "oneDNN custom operations are on ..." from C++ straight to file descriptor 2 when it
is imported, whatever TF_CPP_MIN_LOG_LEVEL says, so ``hopbus train --model MODULE:FUNCTION``
and ``hopbus launch`` printed them above their own output. ``native_notices_hidden`` points
descriptor 2 at a pipe around such an import, and a thread passes on every line that arrives
but the known notices, as it arrives: nothing a user's code writes is lost or reordered, and
what was written before a crash inside the block is already out.

``sys.stderr`` itself is left alone: a logging handler made inside the block (absl's, a user
module's ``logging.basicConfig``) holds the stream every other one holds, and descriptor 2 is
put back before the block ends, so no handler is left writing to a descriptor that was closed
(and may be reused: ZeroMQ's event descriptors were, once, and its sockets aborted).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

NOTICE = re.compile(
    rb"(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|[IWE]\d{4} [0-9:. ]+ *\d+ \S+:\d+\] (?:oneDNN custom operations are on"
    rb"|This TensorFlow binary is optimized to use available CPU instructions"
    rb"|Unable to register cu(?:DNN|FFT|BLAS) factory|computation placer already registered"
    rb"|Could not find cuda drivers on your machine|TF-TRT Warning: Could not find TensorRT).*"
    rb"|To enable the following instructions:.*in other operations, rebuild TensorFlow.*)\r?"
)
"""A whole line of TensorFlow's and absl's start-up chatter (CPU and CUDA builds): the absl
line, or a glog-style line (``I0000 00:00:... port.cc:153] ...``) with one of the messages.
A user's line that merely quotes one does not match."""

_JOIN_S = 5.0  # for the last lines to pass; longer only if a child kept the pipe open


def _forward(source: int, sink: int) -> None:
    """Copy ``source`` to ``sink`` line by line until EOF, leaving out notices."""
    pending = b""
    while True:
        try:
            chunk = os.read(source, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        kept = [line + b"\n" for line in lines if not NOTICE.fullmatch(line)]
        if kept:
            with contextlib.suppress(OSError):
                os.write(sink, b"".join(kept))
    if pending and not NOTICE.fullmatch(pending):
        with contextlib.suppress(OSError):
            os.write(sink, pending)
    os.close(source)


@contextlib.contextmanager
def native_notices_hidden() -> Iterator[None]:
    """Descriptor 2 filtered of ``NOTICE`` lines for the block (see the module docstring)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no descriptor 2 (a daemon): nothing to hide
        yield
        return
    source, drain = os.pipe()
    os.dup2(drain, 2)
    os.close(drain)
    forwarder = threading.Thread(
        target=_forward, args=(source, saved), name="hopbus-stderr-filter", daemon=True
    )
    forwarder.start()
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer gone: the forwarder reads to its end
        forwarder.join(_JOIN_S)
        if not forwarder.is_alive():  # else it still writes there: leave the descriptor be
            os.close(saved)
