"""``hopbus plot``: a run folder or an experiment folder as one four-panel PNG.

Reading and checking the folder is done here; every panel is drawn by
``hopbus.experiments.figures`` (the same drawing functions as the experiment figures).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from hopbus.cli.commands import app
from hopbus.coord.read import text
from hopbus.errors import ConfigError
from hopbus.experiments.runner import RESULTS
from hopbus.userfiles import check_output, read_text

SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
DEFAULT_NAME = "plot.png"
FORMATS = ("", ".png", ".pdf", ".svg")  # by --out's suffix (none: PNG)


def _read_json(path: Path) -> Any:
    """The JSON in ``path``; a file that cannot be read or parsed is bad input (a FIFO, a
    device such as /dev/zero: not read at all)."""
    text = read_text(path, path.name, ConfigError)
    try:
        return json.loads(text)
    except RecursionError:  # arrays nested deeper than any summary's
        raise ConfigError(f"{path} is not a run's JSON (nested too deep)") from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        where = f" (line {exc.lineno}: {exc.msg})" if isinstance(exc, json.JSONDecodeError) else ""
        raise ConfigError(f"{path} is not valid JSON{where}") from None


def _summary(path: Path) -> dict[str, Any]:
    """A run's summary.json: {} when the run has none (killed before its end wrote one, or
    still going), bad input when it is there but does not parse."""
    try:
        there = path.exists() or path.is_symlink()  # a dangling link is there, and bad
    except OSError as exc:  # a name too long, a folder it may not enter
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not there:
        return {}
    obj = _read_json(path)
    if not isinstance(obj, dict):
        raise ConfigError(f"{path} is not a run summary (not a JSON object)")
    return obj


def _experiment_runs(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """results.json and its runs, each checked to name its group, label and folder."""
    results = _read_json(path / RESULTS)
    runs = results.get("runs") if isinstance(results, dict) else None
    ok = isinstance(runs, list) and all(
        isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("group", "label", "folder"))
        for r in runs
    )
    if not ok:
        raise ConfigError(
            f"{path / RESULTS} is not an experiment's results (a 'runs' list whose entries "
            "name their group, label and folder)"
        )
    if not runs:
        raise ConfigError(f"{path / RESULTS} lists no runs: nothing to plot")
    for r in runs:  # names drawn and printed: control characters reached the terminal raw
        for k in ("group", "label"):
            r[k] = text(r[k], 200)
    return results, runs


def _no_metrics(name: str, folder: Path, run: dict[str, Any] | None = None) -> None:
    """Say once which run has nothing to draw, and why when results.json knows."""
    r = run or {}
    why = ""
    if r.get("failure"):
        why = f" (the run failed: {r['failure']})"
    elif r.get("skipped"):
        why = f" (the run was skipped: {r['skipped']})"
    warnings.warn(
        f"{name}: no iterations in {folder / METRICS}{why}; its panels say 'no data'",
        UserWarning,
        stacklevel=2,
    )


def _describe(config: dict[str, Any]) -> str:
    parts = [
        str(config["mode"]) if config.get("mode") else "",
        f"{config['workers']} workers" if config.get("workers") else "",
        f"slowdown {config['slowdown']}" if config.get("slowdown") else "",
    ]
    return ", ".join(p for p in parts if p)


def _experiment(path: Path, group: str | None) -> tuple[list[Any], str]:
    from hopbus.experiments.figures import experiment_series

    results, runs = _experiment_runs(path)
    groups = list(dict.fromkeys(r["group"] for r in runs))
    if group is not None:
        if group not in groups:
            raise ConfigError(
                f"--group {group!r} is not a group of {path / RESULTS}; its groups: "
                + ", ".join(groups)
            )
        runs = [r for r in runs if r["group"] == group]
    several = len({r["group"] for r in runs}) > 1
    # _summary: a summary.json that does not parse is bad input, found before anything is drawn
    series = experiment_series(results, path, runs, qualified=several, summary=_summary)
    for r, s in zip(runs, series, strict=True):
        if not s.entries:
            _no_metrics(s.name, path / r["folder"], r)
    scenario = results.get("scenario") or path.name
    shown = "every group (line style: group)" if several else f"group {runs[0]['group']}"
    return series, f"{scenario}: {shown}, {len(runs)} run{'s' * (len(runs) != 1)}"


def _run(path: Path, group: str | None) -> tuple[list[Any], str]:
    from hopbus.experiments.figures import run_series

    if group is not None:
        raise ConfigError(f"--group is for an experiment folder; {path} is a run folder")
    summary = _summary(path / SUMMARY)
    name = path.resolve().name
    s = run_series(path, name, None, summary)
    if not s.entries:
        _no_metrics(name, path)
    config = summary.get("config") if isinstance(summary.get("config"), dict) else {}
    about = _describe(config)
    return [s], f"{name}: {about}" if about else name


def _output(out: Path | None, path: Path) -> Path:
    out = out if out is not None else path / DEFAULT_NAME
    if out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a folder; give a file name (e.g. plot.png)")
    if out.suffix.lower() not in FORMATS:  # a .pdf got PNG bytes, a .txt too
        raise ConfigError(f"--out {str(out)!r}: a plot is a .png, .pdf or .svg file")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {str(out)!r}: folder {str(out.parent)!r} does not exist")
    if out.is_symlink() or (out.exists() and not out.is_file()):  # a folder's plot.png linked
        raise ConfigError(  # to a file elsewhere was written through, whatever it was
            f"{str(out)!r} is a link or not a regular file: the plot replaces it; move it away "
            "or give --out another file"
        )
    # by another name (a hard link): a name with the suffix of what it reads is refused above
    read = ("metrics.jsonl", "summary.json", "results.json", "config.toml")
    check_output(out, "--out", [path / name for name in read])
    return out


@app.command("plot")
def plot_cmd(
    path: Annotated[
        Path,
        typer.Argument(
            help="A run folder (hopbus train --out: summary.json, metrics.jsonl) or an "
            "experiment folder (hopbus experiment --out: results.json).",
            metavar="PATH",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="The figure to write: PNG, or PDF or SVG by the name's suffix. "
            "[default: PATH/plot.png]",
            metavar="FILE.png",
            show_default=False,
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            "-g",
            help="Only this group's runs (an experiment folder).",
            metavar="G",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Draw a run, or every run of an experiment, as one PNG of four panels.

    One line per run in each panel, named by its label (`group/label`, and a line style per
    group, when runs of several groups are drawn); a run keeps its label's colour of the
    experiment's figures.

    * **top left, test loss vs wall-clock time**: the mean of every worker's latest test loss,
    a step at each evaluation (a marker each), ending at the final loss at the run's end.

    * **top right, training loss vs iterations**: the workers' minibatch losses averaged per
    iteration, then over a trailing window of 5 iterations.

    * **bottom left, mean iteration time per worker**: a worker's time of its last iteration
    change / the iterations it advanced, jumped-over ones included (the summary's
    iter_time_s.per_worker; of a resumed run, over the whole run, where the summary counts
    from the iteration it resumed from).

    * **bottom right, iteration gap over time**: after each iteration change, the largest
    iteration minus the smallest over the workers started so far (a step line); dashed, the
    Table 1 any-pair bound where it is finite.

    Loss axes are logarithmic; time is seconds since the first worker started. A run without
    metrics is named in its panels as 'no data'; a metrics file cut short still plots.
    Definitions: docs/experiments.md, section "hopbus plot". Exit status 2 for bad input.
    """
    from hopbus.experiments.figures import overview_figure

    if not path.exists():
        raise ConfigError(f"{str(path)!r} does not exist")
    if not path.is_dir():
        raise ConfigError(
            f"{str(path)!r} is a file: give the folder that holds it (a run's --out, or an "
            "experiment's)"
        )
    target = _output(out, path)
    if path.is_dir() and (path / RESULTS).is_file():
        series, title = _experiment(path, group)
    elif path.is_dir() and ((path / SUMMARY).is_file() or (path / METRICS).is_file()):
        series, title = _run(path, group)
    else:
        raise ConfigError(
            f"{str(path)!r} is neither a run folder (summary.json, metrics.jsonl: hopbus train "
            "--out) nor an experiment folder (results.json: hopbus experiment --out)"
        )
    written = overview_figure(series, target, title=title)
    Console(stderr=True).print(
        f"hopbus: wrote {written}", highlight=False, soft_wrap=True, markup=False
    )


__all__ = ["plot_cmd"]
