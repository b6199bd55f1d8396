"""``hopbus experiment``: a named scenario's runs back to back, one results folder."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hopbus.cli.commands import _emit_json, app
from hopbus.errors import RunFailure


def _list_scenarios(console: Console) -> None:
    from hopbus.experiments import SCENARIOS

    t = Table(title="Scenarios (hopbus experiment NAME)", title_justify="left")
    t.add_column("name", style="bold")
    t.add_column("runs (quick)", justify="right")
    t.add_column("description")
    for s in SCENARIOS.values():
        t.add_row(s.name, f"{len(s.runs(False))} ({len(s.runs(True))})", s.description)
    console.print(t)


DROPPED_FIRST = ("counters", "p50 s", "wall s", "spectral", "loss", "wait s/it")
"""Columns left out, in this order, of a table wider than the terminal (results.json keeps
them all): a number is never cut short to make room."""


def _shown_columns(columns: list[str], rows: list[list[str]], width: int) -> list[int]:
    """Indexes of the columns that fit ``width`` at their widest cell (counters may fold)."""
    widest = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
    keep = list(range(len(columns)))
    for name in DROPPED_FIRST:
        need = sum(20 if columns[i] == "counters" else widest[i] for i in keep)
        need += 3 * len(keep)  # a column's padding and the space between columns
        if need <= width or name not in columns:
            continue
        keep.remove(columns.index(name))
    return keep


def _show_table(console: Console, results: dict[str, Any]) -> None:
    tab = results["table"]
    if not console.is_terminal:  # a file or a pipe: keep each row on one line
        console.width = max(console.width, 300)
    columns, rows = tab["columns"], tab["rows"]
    keep = _shown_columns(columns, rows, console.width)
    left_out = [columns[i] for i in range(len(columns)) if i not in keep]
    more = f" (not shown, too narrow: {', '.join(left_out)}; see results.json)" if left_out else ""
    n = len(results["runs"])
    t = Table(
        title=f"{results['scenario']}: {n} run{'s' * (n != 1)}; 'vs ref' = mean iteration "
        f"time / the group's reference run's; loss, acc: test set at the end{more}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
    )
    for i in keep:
        col = columns[i]
        left = col in ("group", "run", "status", "counters")
        widest = max([len(col)] + [len(r[i]) for r in rows])
        folds = col == "counters"
        t.add_column(
            col,
            justify="left" if left else "right",
            no_wrap=not folds,
            overflow="fold",
            min_width=None if folds else widest,
        )
    status = columns.index("status")
    styles = {"ok": None, "skipped": "yellow"}
    for row in rows:
        t.add_row(*(row[i] for i in keep), style=styles.get(row[status], "red"))
    console.print(t)
    _show_claims(console, results.get("claims") or [])


def _show_claims(console: Console, claims: list[dict[str, Any]]) -> None:
    """What the scenario must show, each with its measured ratio: held, did not, or could not
    be judged (a run missing)."""
    from hopbus.experiments.results import claim_cells

    if not claims:
        return
    t = Table(
        title="What it must show (benchmarks: measured in this run, nothing fails on them)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for col in ("", "claim", "measured", "needs", "note"):
        t.add_column(col, overflow="fold")
    marks = {True: "[green]held[/]", False: "[red]not held[/]", None: "[yellow]-[/]"}
    for c in claims:
        measured, needs = claim_cells(c)
        t.add_row(marks[c["holds"]], c["claim"], measured, needs, c["note"] or "")
    console.print(t)


def _progress(err: Console) -> tuple[Any, Any, Any]:
    """Callbacks printing ``[3/16] random-6x ps-bsp ... 4.2 s, 0.05 s/iter, acc 0.950``; in a
    log or a pipe (no terminal) that line comes in two halves, and between them the run's own
    progress lines every few seconds, as ``hopbus train`` prints them there."""
    from hopbus.cli.live import Display

    plain = not err.is_terminal
    current: list[Display] = []

    def start(i: int, n: int, plan: Any) -> None:
        err.print(f"[{i + 1}/{n}] {plan.group} {plan.label} ...", end="", highlight=False)
        if plain:
            err.print(highlight=False)
            current[:] = [Display(err)]  # its own notes and pace for each run

    def update(launcher: Any) -> None:
        if current:
            current[0].update(launcher)

    def done(i: int, n: int, run: dict[str, Any]) -> None:
        if plain:
            err.print(f"[{i + 1}/{n}] {run['group']} {run['label']}:", end="", highlight=False)
        if run["failure"] is not None:
            failure = escape(str(run["failure"]))  # a worker's line: text, not markup
            err.print(f" [red]failed[/]: {failure}", highlight=False, soft_wrap=True)
        elif run.get("skipped") is not None:
            skipped = escape(str(run["skipped"]))
            err.print(f" [yellow]skipped[/]: {skipped}", highlight=False, soft_wrap=True)
        else:
            mean = run["iter_time_s"]["mean"]
            acc = run["final_accuracy"]
            err.print(
                f" {run['wall_s']:.1f} s, {mean:.4f} s/iter, "
                f"acc {'-' if acc is None else format(acc, '.3f')}",
                highlight=False,
            )
        for message in run["warnings"]:  # once per run, named after it
            warnings.warn(f"{run['group']}/{run['label']}: {message}", UserWarning, stacklevel=2)
        if run.get("violations"):
            warnings.warn(
                f"{run['group']}/{run['label']}: Table 1 bound broken {run['violations']} times",
                UserWarning,
                stacklevel=2,
            )

    return start, done, update


@app.command("experiment")
def experiment_cmd(
    name: Annotated[
        str | None,
        typer.Argument(
            help="Scenario to run; without one (or with --list), the scenarios are listed.",
            metavar="NAME",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Results folder: results.json, the figures, one folder per run. "
            "[default: runs/NAME-DATE-TIME]",
            show_default=False,
        ),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Fewer iterations and shorter emulated compute.")
    ] = False,
    only: Annotated[
        str | None,
        typer.Option(
            "--only",
            help="Only the runs with these labels, comma-separated (e.g. standard,backup).",
            metavar="LABEL[,LABEL...]",
            show_default=False,
        ),
    ] = None,
    settings: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Change a setting of every run (e.g. --set workers=4); repeatable. Keys as "
            "in config.toml.",
            metavar="KEY=VALUE",
            show_default=False,
        ),
    ] = None,
    list_all: Annotated[bool, typer.Option("--list", help="List the scenarios.")] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print results.json on stdout instead of the table."),
    ] = False,
) -> None:
    """Run a named scenario: several training configurations back to back on this machine
    (`hopbus train` each, one private Redis for all), then compare them.

    Writes results.json (every run's settings and key figures, a table, iteration-time ratios
    per group, and whether what the scenario must show held), PNG figures and one folder per
    run (as `hopbus train --out`). A run that fails is reported and recorded, the others still
    run; the exit status is then 1. A claim that does not hold is reported, not an error: these
    are measurements. Ctrl-C stops the current run and keeps what was done (status 130).
    See docs/experiments.md.
    """
    if list_all or name is None:
        _list_scenarios(Console())
        return
    from hopbus.experiments import get_scenario
    from hopbus.experiments.overrides import parse_overrides
    from hopbus.experiments.runner import Experiment, default_out
    from hopbus.runtime import interrupts

    scenario = get_scenario(name)
    labels = [x.strip() for x in only.split(",")] if only is not None else None
    exp = Experiment(
        scenario,
        out=out if out is not None else default_out(scenario.name),
        quick=quick,
        only=labels,
        overrides=parse_overrides(settings or []),
        command=["hopbus", *sys.argv[1:]],
    )
    interrupts.install()  # stop the current run's workers and the Redis as on Ctrl-C
    err = Console(stderr=True)
    results = exp.run(*_progress(err))
    if as_json:
        _emit_json(results)
    else:
        _show_table(Console(), results)
        err.print(f"hopbus: results in {exp.out}", highlight=False, soft_wrap=True, markup=False)
    failed = [r for r in results["runs"] if r["failure"] is not None]
    if failed:
        first = failed[0]
        raise RunFailure(
            f"{len(failed)} of {len(results['runs'])} runs failed; first, "
            f"{first['group']}/{first['label']}: {first['failure']}"
        )


__all__ = ["experiment_cmd"]
