"""What ``hopbus train`` shows while it runs: a live table on a terminal, a line every few
seconds otherwise (logs, CI). Reads only the launcher's replay of the progress stream."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from hopbus.coord.client import redact

if TYPE_CHECKING:
    from hopbus.runtime.launcher import Launcher

ROWS_SHOWN = 32
PLAIN_EVERY_S = 5.0  # a progress line at most this often without a terminal (logs, CI)
PLAIN_SAME_S = 60.0  # and the same line again only after this long (a run that waits)


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def head_line(launcher: Launcher) -> str:
    """The run in one line, with the command that looks at it from another terminal (the
    private Redis's address included): the live view's first line, and a log's first."""
    cfg = launcher.cfg
    private = getattr(launcher, "broker", None) is not None  # hopbus train's own redis-server
    inspect = f"hopbus inspect --run {launcher.keys.run} --redis {redact(launcher.url)}"
    if private:
        inspect = f"while it runs (its private Redis goes with it): {inspect}"
    return (
        f"run {launcher.keys.run}: {launcher.topo.n} workers, {cfg.topology}, {cfg.mode}, "
        f"slowdown {cfg.slowdown}; {inspect}"
    )


def view(launcher: Launcher) -> Group:
    cfg = launcher.cfg
    rep = launcher.replay
    head = Text(head_line(launcher))
    head.stylize("bold", 0, len(f"run {launcher.keys.run}"))
    table = Table(box=None, pad_edge=False)
    for col in ("worker", "iteration", "it/s", "loss", "test acc", "waits on", "wait s"):
        table.add_column(col, justify="left" if col == "waits on" else "right")
    if rep is None:
        return Group(head, Text("starting workers..."))
    now = time.time() - rep.t0
    for i, v in enumerate(rep.views[:ROWS_SHOWN]):
        rate = v.iteration / now if now > 0 else 0.0
        waits = " ".join(map(str, v.blocked_on)) if v.blocked_on else ""
        if i in rep.monitor.gone:
            waits, rate = "dead", 0.0
        elif v.iteration >= cfg.iterations:  # its last wait is over: nothing to wait on
            waits = "done"
        table.add_row(
            str(i),
            f"{v.iteration}/{cfg.iterations}",
            f"{rate:.1f}",
            _fmt(v.loss),
            _fmt(v.eval_accuracy, ".3f"),
            waits,
            f"{v.wait_s:.3f}",
        )
    m = rep.monitor
    bound = m.table1["adjacent"]
    foot = Text.from_markup(
        f"elapsed {now:.1f} s; largest gap: adjacent {m.max_adjacent} (bound "
        f"{'∞' if bound is None else bound}), any pair {m.max_any}; violations {m.violations}"
    )
    notes = [Text(f"hopbus: {note}", style="yellow") for note in launcher.notes]
    return Group(head, table, foot, *notes)


class Display:
    """Call ``update(launcher)`` often; it redraws at most a few times a second."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None
        self._last = 0.0
        self._said = ("", 0.0, 0.0)  # the last plain progress line, since, last printed
        self._noted = 0  # launcher.notes already printed
        self._headed = False  # head_line printed (plain output)
        self._launcher: Launcher | None = None
        self._began = time.monotonic()

    def __enter__(self) -> Display:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            if self._launcher is not None and exc[0] is None:  # the last frame, every note in it
                self.live.update(view(self._launcher))
                self._noted = len(self._launcher.notes)
            self.live.__exit__(None, None, None)
        elif self._launcher is not None and exc[0] is None and self._launcher.replay is not None:
            line = self._progress_line(self._launcher)  # where it ended (a run shorter than
            if line != self._said[0]:  # PLAIN_EVERY_S showed only where it began)
                self.console.print(line, highlight=False, soft_wrap=True, markup=False)

    @staticmethod
    def _progress_line(launcher: Launcher) -> str:
        rep = launcher.replay
        if rep is None:  # a watch of a run whose workers have not started (yet)
            return f"hopbus: run {launcher.keys.run}: no worker has finished an iteration yet"
        its = [v.iteration for v in rep.views]
        losses = [v.loss for v in rep.views if v.loss is not None]
        loss = f", mean loss {sum(losses) / len(losses):.4f}" if losses else ""
        return (
            f"hopbus: run {launcher.keys.run}: iterations {min(its)}..{max(its)} of "
            f"{launcher.cfg.iterations}{loss}"
        )

    @property
    def launcher(self) -> Launcher | None:
        """The launcher last drawn, if any."""
        return self._launcher

    @property
    def shown(self) -> int:
        """How many of the launcher's notes the display has shown (the report adds the rest)."""
        return self._noted

    def update(self, launcher: Launcher) -> None:
        self._launcher = launcher
        now = time.monotonic()
        if self.live is not None:
            if now - self._last >= 0.25:
                self._last = now
                self.live.update(view(launcher))
            return
        if not self._headed:
            self._headed = True
            self.console.print(
                f"hopbus: {head_line(launcher)}", highlight=False, soft_wrap=True, markup=False
            )
        for note in launcher.notes[self._noted :]:  # as they happen, in logs too
            self.console.print(f"hopbus: {note}", highlight=False, soft_wrap=True, markup=False)
        self._noted = len(launcher.notes)
        rep = launcher.replay
        if now - self._last < PLAIN_EVERY_S or (rep is None and now - self._began < PLAIN_EVERY_S):
            return
        self._last = now
        line = self._progress_line(launcher)
        said, since, printed = self._said
        if line == said and now - printed < PLAIN_SAME_S:
            return  # nothing moved: a log gets one line a minute, not twelve
        if line != said:
            since = now
        quiet = f" (no progress for {now - since:.0f} s)" if line == said else ""
        if rep is None:
            quiet = f" ({now - self._began:.0f} s)"
        self._said = (line, since, now)
        self.console.print(line + quiet, highlight=False, soft_wrap=True, markup=False)
