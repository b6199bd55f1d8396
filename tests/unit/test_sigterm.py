"""hopbus.join()'s SIGTERM rule (hopbus/runtime/sigterm.py), in a real process each: a script
unwinds and then dies of the signal; a child it forked dies as by Python's default; a
script's own handler stays its own."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

PRELUDE = "import os, signal, sys, time\nfrom hopbus.runtime import sigterm\n"


def _run(body: str, timeout: float = 60) -> subprocess.CompletedProcess:
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def test_a_sigterm_unwinds_the_script_then_kills_it_as_sigterm():
    p = _run(
        """
        sigterm.install()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        except KeyboardInterrupt:
            print("unwound", sigterm.asked(), flush=True)
        sigterm.leaving()
        os.kill(os.getpid(), signal.SIGTERM)  # while the worker leaves: it waits
        print("left", flush=True)
        if sigterm.asked():
            sigterm.die_of_it()
        print("never here")
        """
    )
    assert p.stdout.split() == ["unwound", "True", "left"], (p.stdout, p.stderr)
    assert p.returncode == -signal.SIGTERM, p.stderr


def test_a_child_the_script_forked_dies_as_by_default():
    """multiprocessing's terminate() sends a fork child SIGTERM: one that inherited the
    handler printed a KeyboardInterrupt traceback and exited 1."""
    p = _run(
        """
        import multiprocessing as mp
        sigterm.install()
        fork = mp.get_context("fork")
        ready = fork.Event()

        def work():
            ready.set()  # running Python: a SIGTERM right after a fork can be lost to any
            time.sleep(30)  # handler of Python's (it clears what came before its reset)

        child = fork.Process(target=work)
        child.start()  # with the handler, inherited at the fork
        assert ready.wait(30)
        child.terminate()
        child.join()
        print(child.exitcode, flush=True)
        """
    )
    assert p.returncode == 0 and p.stdout.split() == [str(-signal.SIGTERM)], (p.stdout, p.stderr)
    assert "KeyboardInterrupt" not in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_scripts_own_handler_stays_and_restore_gives_the_default_back():
    p = _run(
        """
        signal.signal(signal.SIGTERM, lambda *a: print("mine", flush=True))
        sigterm.install()
        os.kill(os.getpid(), signal.SIGTERM)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sigterm.install()
        sigterm.restore()
        print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
        """
    )
    assert p.returncode == 0 and p.stdout.split() == ["mine", "True"], p.stderr
