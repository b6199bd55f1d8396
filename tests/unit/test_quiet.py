"""TensorFlow's start-up notices are kept off the terminal, and nothing else is."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from hopbus.models.quiet import native_notices_hidden

ABSL = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
ONEDNN = (
    b"I0000 00:00:1795530645.428569   13043 port.cc:153] oneDNN custom operations are on. "
    b"You may see slightly different numerical results.\n"
)


SCRIPT = f"""
import os, sys
from hopbus.models.quiet import native_notices_hidden
with native_notices_hidden():
    os.write(2, {ABSL!r})
    os.write(2, b"a user's own native line\\n")
    print("a user's Python warning", file=sys.stderr, flush=True)
    os.write(2, {ONEDNN!r})
    os.write(2, b"a line quoting it: oneDNN custom operations are on\\n")
    os.write(2, b"no newline at the end")
os.write(2, b" / after")
"""


def test_native_notices_are_dropped_and_everything_else_kept_in_order():
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, check=True)
    assert p.stderr.decode() == (
        "a user's own native line\n"
        "a user's Python warning\n"
        "a line quoting it: oneDNN custom operations are on\n"
        "no newline at the end / after"
    )


def test_a_handler_made_inside_still_writes_where_stderr_goes_after(capfd):
    """Fault ``handler_inside``: a module's logging.basicConfig at import, inside the block.
    Its handler must not be left on a descriptor that is closed and reused later."""
    log = logging.getLogger("hopbus-test-inside")
    with native_notices_hidden():
        handler = logging.StreamHandler()
        log.addHandler(handler)
    try:
        for _ in range(3):  # other descriptors come and go meanwhile
            r, w = os.pipe()
            os.close(r)
            os.close(w)
        log.warning("step%03d", 7)
        assert capfd.readouterr().err == "step007\n"
    finally:
        log.removeHandler(handler)
