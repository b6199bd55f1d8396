"""Progress without a terminal (a log file, CI): a line every few seconds while the run moves,
and the same line again only once a minute, saying for how long nothing moved."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from hopbus.cli import live


def _launcher(iteration: int) -> SimpleNamespace:
    views = [SimpleNamespace(iteration=iteration, loss=0.5) for _ in range(2)]
    return SimpleNamespace(
        notes=[],
        replay=SimpleNamespace(views=views),
        keys=SimpleNamespace(run="r1"),
        cfg=SimpleNamespace(iterations=100),
    )


def test_a_run_that_does_not_move_gets_one_line_a_minute(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(live.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with live.Display(Console(file=out, force_terminal=False, width=200)) as display:
        for second in range(0, 181):  # 3 minutes, stuck at iteration 7 after the first 10 s
            clock[0] = 1000.0 + second
            display.update(_launcher(min(second, 7)))
    lines = out.getvalue().splitlines()
    assert lines[0] == "hopbus: run r1: iterations 0..0 of 100, mean loss 0.5000"
    assert lines[1] == "hopbus: run r1: iterations 5..5 of 100, mean loss 0.5000"
    assert lines[2] == "hopbus: run r1: iterations 7..7 of 100, mean loss 0.5000"
    assert lines[3:] == [
        "hopbus: run r1: iterations 7..7 of 100, mean loss 0.5000 (no progress for 60 s)",
        "hopbus: run r1: iterations 7..7 of 100, mean loss 0.5000 (no progress for 120 s)",
    ]


def test_a_watch_of_workers_that_never_start_says_so(monkeypatch):
    """hopbus watch without a terminal, of a run whose workers do not come: not silence, but
    a line after a few seconds and then once a minute, saying how long it has waited."""
    clock = [1000.0]
    monkeypatch.setattr(live.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    waiting = SimpleNamespace(notes=[], replay=None, keys=SimpleNamespace(run="r1"))
    with live.Display(Console(file=out, force_terminal=False, width=200)) as display:
        for second in range(0, 131):
            clock[0] = 1000.0 + second
            display.update(waiting)
    assert out.getvalue().splitlines() == [
        f"hopbus: run r1: no worker has started yet ({s} s)" for s in (5, 65, 125)
    ]
