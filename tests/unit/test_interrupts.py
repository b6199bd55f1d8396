"""A stop that lands inside a step that must not be cut in two is raised as the step ends.

In a child interpreter: the handler records the stop for the whole process, and the tests that
share this one must not inherit it."""

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, signal
    from hopbus.runtime import interrupts

    interrupts.install()
    done = []
    try:
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIG{name})  # the handler runs here, at once
            done.append("after the signal")
            with interrupts.deferred():  # nested: only the outermost end raises
                done.append("inner")
            done.append("after the inner block")
    except KeyboardInterrupt:
        done.append("raised at the end")
    print(",".join(done), interrupts.requested())
    try:
        os.kill(os.getpid(), signal.SIGINT)  # outside a deferred block: at once
    except KeyboardInterrupt:
        print("raised at once")
    """
)


def _child(name: str) -> str:
    p = subprocess.run(
        [sys.executable, "-c", CHILD.replace("{name}", name)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return p.stdout


def test_a_stop_inside_a_deferred_step_is_raised_as_it_ends():
    for name in ("INT", "TERM"):
        lines = _child(name).splitlines()
        assert lines == [
            "after the signal,inner,after the inner block,raised at the end True",
            "raised at once",
        ], lines
