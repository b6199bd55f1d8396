"""``hopbus top``: a live view of a running cluster, read from Redis alone.

Works for any run whose keys are in that Redis (started by ``hopbus train``, by compose, or
already ended). Gathering is ``coord/top.py``; this module only draws.
"""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from hopbus.cli import options as o
from hopbus.cli.commands import app
from hopbus.coord.client import DEFAULT_URL
from hopbus.coord.top import TopView

INF = "∞"
ENDED = ("finished", "failed", "stopped")
PLAIN_WIDTH = 200  # a non-terminal gets one line per worker, not a folded table


def _num(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _tokens(r) -> str:
    if r.tokens_min is None:
        return "-"
    fill = str(r.tokens_min) if r.tokens_min == r.tokens_max else f"{r.tokens_min}-{r.tokens_max}"
    return f"{fill}/{r.tokens_cap}"


def view(v: TopView) -> Group:
    """One frame: header line, worker table, gap line."""
    elapsed = _num(v.elapsed_s, ".1f")
    head = Text(
        f"run {v.run} ({v.status}): mode {v.mode}, topology {v.topology}, {v.workers} workers, "
        f"{v.iterations} iterations, elapsed {elapsed} s"
    )
    bound = INF if v.gap_bound is None else str(v.gap_bound)
    over = f"; {v.over_bound} neighbour pairs ABOVE their bound" if v.over_bound else ""
    gap = Text(
        f"largest gap between neighbours {_num(v.max_gap, 'd')} (Table 1 bound {bound}){over}"
    )
    table = Table(box=None, pad_edge=False)
    cols = (
        "worker",
        "iter",
        "it/s",
        "loss",
        "device",
        "waits on",
        "for s",
        "tokens",
        "jumps",
        "hb",
    )
    for c in cols:
        table.add_column(c, justify="left" if c in ("device", "waits on", "hb") else "right")
    for r in v.rows:
        table.add_row(
            str(r.worker),
            _num(r.iteration, "d"),
            _num(r.rate, ".1f"),
            _num(r.loss, ".4f"),
            Text(r.device or "-"),  # Redis's text: shown as it is, never read as markup
            ",".join(map(str, r.waits_on)) or "-",
            _num(r.waits_s, ".1f"),
            _tokens(r),
            str(r.jumps),
            Text(r.heartbeat),
        )
    return Group(head, gap, table)


@app.command("top")
def top_cmd(
    run: o.RunId = None,
    redis: o.RedisUrl = None,
    once: Annotated[
        bool, typer.Option("--once", help="Print one frame as plain text and exit.")
    ] = False,
    interval: Annotated[
        float,
        typer.Option(
            "--interval", help="Seconds between refreshes (up to an hour).", min=0.05, max=3600
        ),
    ] = 1.0,
) -> None:
    """Watch a run live, from Redis alone (a run of hopbus train, of compose, or one that ended).

    Without --run, the only run in that Redis; with several, they are listed and the exit
    status is 2. Ctrl-C quits (exit status 130, as every hopbus command). On a non-terminal
    without --once a frame is printed every --interval until the run ends.

    Header: run id (status), mode, topology, workers, iterations per worker, elapsed time,
    and the largest iteration gap between neighbours now against its Table 1 bound.

    Columns:

    * **worker**: the worker's id;
    * **iter**: its iteration now (hop:{RUN}:iter:I);
    * **it/s**: iterations per second over the last 5 s of its progress entries (up to the
      run's end; over all of them in a run shorter than that);
    * **loss**: its latest minibatch loss;
    * **device**: the device it trains on, if the run records one (else -);
    * **waits on**: neighbours it cannot pass until they advance: in-neighbours at the
      Table 1 forward limit (it needs their updates), out-neighbours whose token queue to it
      is empty (it needs their tokens);
    * **for s**: seconds since it entered its current iteration, while it waits on someone;
    * **tokens**: its token queues TokenQ(J->I), min-max fill / largest capacity (Hop runs
      with --max-ig above 0; else -);
    * **jumps**: iteration jumps so far (--skip-max);
    * **hb**: heartbeat: alive, finished, gone (expired), not started.
    """
    from redis import ResponseError

    from hopbus.cli.cluster import refused_read
    from hopbus.coord.client import connect
    from hopbus.coord.keys import RunKeys
    from hopbus.coord.top import TopReader, pick_run
    from hopbus.runtime.node import redis_failures

    client = connect(redis or DEFAULT_URL, timeout=5)
    with redis_failures("hopbus top", run or "?", redis or DEFAULT_URL):
        keys = RunKeys(pick_run(client, run))
        try:
            reader = TopReader(client, keys, url=redis)
            frame = reader.frame()  # unknown run: one line before anything is drawn
            _show(reader, frame, once=once, interval=interval)
        except ResponseError as exc:  # a key of another type, an ACL's refusal: as inspect
            raise refused_read(client, keys, exc) from None


def _show(reader: Any, frame: Any, *, once: bool, interval: float) -> None:
    """Print frames until --once, the run's end (plain output) or Ctrl-C (live view: its
    KeyboardInterrupt ends the command as interrupted, 130)."""
    console = Console()
    if once or not console.is_terminal:
        plain = Console(width=max(console.width, PLAIN_WIDTH), no_color=True, highlight=False)
        while True:
            plain.print(view(frame))
            sys.stdout.flush()
            if once or frame.status in ENDED:
                return
            time.sleep(interval)  # the refresh period
            frame = reader.frame()
    with Live(view(frame), console=console, auto_refresh=False) as live:
        while True:
            time.sleep(interval)  # the refresh period
            live.update(view(reader.frame()), refresh=True)
