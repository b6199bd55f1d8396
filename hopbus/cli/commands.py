"""``hopbus topology`` and ``hopbus sim``: parse, build the config, call the library, print."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from hopbus.cli import options as o
from hopbus.cli import render
from hopbus.errors import ConfigError
from hopbus.jsonout import dumps
from hopbus.userfiles import check_output


def _no_type_for_flags() -> None:
    """typer shows a flag's type in --help (``--json <bool>``), as if it took a value; a flag
    takes none, so none is shown (the one place hopbus adjusts typer's help)."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: typer.Context) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_no_type_for_flags()

app = typer.Typer(
    name="hopbus",
    help="Heterogeneity-aware decentralized training (Hop, ASPLOS'19): train on a local "
    "cluster of worker processes, simulate it, inspect runs and communication graphs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from hopbus import __version__

        print(f"hopbus {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Heterogeneity-aware decentralized training (Hop, ASPLOS'19): train on a local cluster
    of worker processes, simulate it, inspect runs and communication graphs."""


def _emit_json(obj: Any) -> None:
    sys.stdout.write(dumps(obj) + "\n")
    sys.stdout.flush()


@app.command("topology")
def topology_cmd(
    name: Annotated[
        str,
        typer.Argument(
            help="ring, ring-based, double-ring, complete, hierarchical:4,2,2 (machine sizes) or "
            "file:PATH. An edge file has one 'src dst' per line (workers 0..n-1, # comments); "
            "with weights, 'src dst weight' on every edge and a 'v v weight' self-loop for every "
            "worker, each worker's incoming weights summing to 1.",
            metavar="TOPOLOGY",
            show_default=False,
        ),
    ],
    workers: o.Workers = None,
    staleness: Annotated[
        int, typer.Option("--staleness", "-s", help="Staleness bound s used in the Table 1 rows.")
    ] = 5,
    max_ig: Annotated[
        int,
        typer.Option(
            "--max-ig", help="Token queue bound of the Table 1 rows with tokens (0: none)."
        ),
    ] = 5,
    as_json: o.Json = False,
) -> None:
    """Show a communication graph: neighbours, W (eq. 1), spectral gap, Table 1 bounds."""
    from hopbus.config import topology_for
    from hopbus.topology.report import topology_report

    if staleness < 0:
        raise ConfigError(f"--staleness must be 0 or more (got {staleness})")
    if max_ig < 0:
        raise ConfigError(f"--max-ig must be 0 or more (got {max_ig})")
    rep = topology_report(topology_for(name, workers), staleness, max_ig)
    if as_json:
        _emit_json(rep)
    else:
        render.topology(Console(), rep)


def _read_by(cfg: Any, config: Path | None) -> list[Path]:
    """The files a simulation reads: its --config, a topology file, its data's files."""
    from hopbus.data.spec import files_of
    from hopbus.topology.graphs import edge_file

    read = [config] if config is not None else []
    if (edges := edge_file(cfg.topology)) is not None:
        read.append(Path(edges))
    return read + files_of(cfg.data)


@app.command("sim")
def sim_cmd(
    workers: o.Workers = None,
    topology: o.TopologyName = None,
    mode: o.SimModeOpt = None,
    backup: o.Backup = None,
    staleness: o.Staleness = None,
    max_ig: o.MaxIg = None,
    skip_max: o.SkipMax = None,
    skip_trigger: o.SkipTrigger = None,
    iterations: o.Iterations = None,
    slowdown: o.Slowdown = None,
    slowdown_scope: o.SlowdownScopeOpt = None,
    message_bytes: o.MessageBytes = None,
    seed: o.Seed = None,
    approach: o.ApproachOpt = None,
    compute_time: o.ComputeTime = None,
    latency: o.Latency = None,
    jitter: o.Jitter = None,
    lookahead: o.Lookahead = None,
    model: o.SimModel = None,
    data: o.SimData = None,
    data_dir: o.SimDataDir = None,
    hidden: o.SimHidden = None,
    config: o.ConfigFile = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            help="Write every iteration change as a JSON line (the progress stream a real "
            "run keeps in Redis, in virtual seconds).",
            rich_help_panel=o.PANEL_SIM,
        ),
    ] = None,
    as_json: o.Json = False,
) -> None:
    """Simulate a run in virtual time: the real protocol code, any number of workers.

    Prints how long iterations took, the largest iteration gaps seen against their Table 1
    bounds, and what the update queues held. Exit status 3 if the run deadlocked or a bound
    was broken (either would be a bug in hopbus); 2 for bad input.
    """
    given = o.run_flags(locals())
    from hopbus.sim import prepare, summarize

    cfg = o.resolve(config, given)
    o.warn_unused(cfg, given)
    cfg, sim = prepare(cfg)  # every input checked before anything is written
    err = Console(stderr=True)
    with ExitStack() as stack:
        if trace is not None:
            if str(trace) == "-":
                raise ConfigError(
                    "--trace needs a file path ('-' for standard output is not "
                    "supported: the summary goes there)"
                )
            check_output(trace, "--trace", _read_by(cfg, config))
            try:
                out = stack.enter_context(trace.open("w"))
            except OSError as exc:
                raise ConfigError(f"cannot write --trace {str(trace)!r}: {exc.strerror}") from None

            def write_trace(record: dict[str, Any], out=out) -> None:
                out.write(dumps(record) + "\n")

            sim.on_progress = write_trace
        progress_cb = None
        if err.is_terminal:
            bar = stack.enter_context(
                Progress(
                    TextColumn("simulating"),
                    BarColumn(),
                    TextColumn("{task.percentage:>3.0f}%"),
                    TimeElapsedColumn(),
                    console=err,
                    transient=True,
                )
            )
            task = bar.add_task("sim", total=1.0)

            def progress_cb(fraction: float) -> None:
                bar.update(task, completed=fraction)

        result = sim.run(progress=progress_cb)
    s = summarize(cfg, sim.topology, result)
    if as_json:
        _emit_json(s)
    else:
        render.summary(Console(), s)
    problems = []
    if result.deadlocked:
        stuck = "; ".join(
            f"worker {b.worker} in iteration {b.iteration} waits for {b.waiting_for}"
            f" from {list(b.on)}"
            for b in result.blocked[:3]
        )
        problems.append(f"simulation deadlocked: {stuck}")
    if s["violations"]:
        v = s["first_violation"]
        problems.append(
            f"Table 1 bound broken {s['violations']} times, first: worker {v['ahead']} "
            f"{v['gap']} ahead of worker {v['behind']} (bound {v['bound']})"
        )
    for p in problems:
        err.print(f"hopbus: error: {p}", highlight=False, soft_wrap=True, markup=False)
    if problems:
        raise typer.Exit(3)
