"""Progress without a terminal (a log file, CI): a line every few seconds while the run moves,
and the same line again only once a minute, saying for how long nothing moved."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from hopbus.cli import live

CFG = SimpleNamespace(iterations=100, topology="ring", mode="standard", slowdown="none")
HEAD = (
    "hopbus: run r1: 2 workers, ring, standard, slowdown none; hopbus inspect --run r1 "
    "--redis redis://127.0.0.1:6390/0"
)  # the first line: where to look at the run from another terminal


def _launcher(iteration: int | None) -> SimpleNamespace:
    views = [SimpleNamespace(iteration=iteration, loss=0.5) for _ in range(2)]
    return SimpleNamespace(
        notes=[],
        replay=None if iteration is None else SimpleNamespace(views=views),
        keys=SimpleNamespace(run="r1"),
        cfg=CFG,
        topo=SimpleNamespace(n=2),
        url="redis://127.0.0.1:6390/0",
    )


def test_a_run_that_does_not_move_gets_one_line_a_minute(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(live.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with live.Display(Console(file=out, force_terminal=False, width=200)) as display:
        for second in range(0, 181):  # 3 minutes, stuck at iteration 7 after the first 10 s
            clock[0] = 1000.0 + second
            display.update(_launcher(min(second, 7)))
    head, *lines = out.getvalue().splitlines()
    assert head == HEAD
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
    waiting = _launcher(None)
    with live.Display(Console(file=out, force_terminal=False, width=200)) as display:
        for second in range(0, 131):
            clock[0] = 1000.0 + second
            display.update(waiting)
    assert out.getvalue().splitlines() == [HEAD] + [
        f"hopbus: run r1: no worker has finished an iteration yet ({s} s)" for s in (5, 65, 125)
    ]


def test_a_run_shorter_than_the_period_ends_with_where_it_ended(monkeypatch):
    """A run over within PLAIN_EVERY_S showed only its first line (iteration 0) before the
    summary: the display's end prints where it ended."""
    clock = [1000.0]
    monkeypatch.setattr(live.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with live.Display(Console(file=out, force_terminal=False, width=200)) as display:
        for tenth, iteration in enumerate([0, 40, 100]):
            clock[0] = 1000.0 + tenth / 10
            display.update(_launcher(iteration))
    assert out.getvalue().splitlines()[1:] == [
        "hopbus: run r1: iterations 0..0 of 100, mean loss 0.5000",
        "hopbus: run r1: iterations 100..100 of 100, mean loss 0.5000",
    ]
