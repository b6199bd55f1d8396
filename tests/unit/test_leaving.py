"""A SIGTERM that reaches a hopbus process while its interpreter shuts down (the launcher
stopping a worker that is already leaving on its own) prints no traceback and keeps the exit
status the command decided."""

from __future__ import annotations

import signal
import subprocess
import sys

# the command (``hopbus --version``) returns at once; a non-daemon thread, standing for the
# threads a worker leaves to the interpreter to join, says when the shutdown has begun and
# lingers there for ``LINGER_S``
SCRIPT = """
import sys, threading, time
LINGER_S = {linger}

def lingering():
    while threading.main_thread().is_alive():
        time.sleep(0.01)
    print("shutting down", flush=True)
    time.sleep(LINGER_S)

threading.Thread(target=lingering).start()
sys.argv = ["hopbus", "--version"]
from hopbus.cli.entry import main
main()
"""


def _leaving(linger: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(linger=linger)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    while (line := proc.stdout.readline()) and line != "shutting down\n":
        pass
    assert line == "shutting down\n"
    return proc


def test_one_sigterm_while_shutting_down_is_let_pass():
    proc = _leaving(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "Traceback" not in err and "Exception ignored" not in err, err
