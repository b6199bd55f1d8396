"""The figures of an experiment, drawn from its results.json and the runs' metrics.jsonl, and
the four-panel overview of ``hopbus plot``.

Five PNGs: mean iteration time per run as bars grouped by the runs' group (the slowdown),
each bar labelled with its ratio to the group's reference run; then one panel per group of
each of four curves: mean test loss against wall-clock time, as a step line (the mean of every
worker's latest evaluation holds until the next evaluation; a marker at each); training loss
against iterations; each worker's mean iteration time; the largest iteration gap between any
two workers over time, with the Table 1 any-pair bound dashed. The loss axes are logarithmic;
the curves are defined in ``curves``.

Each of the four curves is a ``Panel``, drawn into a given Axes by ``draw_panel`` for a list of
``Series`` (one per run): the experiment figures draw one group per Axes, ``overview_figure``
(``hopbus plot``) draws every run in each of four Axes, so a rule lives in one place. A run
keeps its label's colour in every figure. matplotlib is imported here only, inside the
functions, and draws with its Agg canvas (no display needed).
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hopbus.experiments.curves import (
    SMOOTHING,
    Curve,
    gap_timeline,
    iteration_time_per_worker,
    mean_test_loss_over_time,
    mean_train_loss_by_iteration,
    read_metrics,
)
from hopbus.experiments.results import ran

ITERATION_TIME = "iteration_time.png"
TEST_LOSS_VS_TIME = "test_loss_vs_time.png"
TRAIN_LOSS_VS_ITERATIONS = "train_loss_vs_iterations.png"
ITERATION_TIME_PER_WORKER = "iteration_time_per_worker.png"
GAP_TIMELINE = "gap_timeline.png"
FIGURES = (
    ITERATION_TIME,
    TEST_LOSS_VS_TIME,
    TRAIN_LOSS_VS_ITERATIONS,
    ITERATION_TIME_PER_WORKER,
    GAP_TIMELINE,
)
DPI = 120
TICK_POINTS = 8  # the iteration-time bars' group labels
LEGEND_INCHES = 1.8  # what the legend beside the bars takes of the figure's width
#: Line styles that tell groups apart when runs of several groups share a panel (colour is
#: the run's label).
GROUP_STYLES = ("-", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))
BOUND_STYLE = (0, (4, 2))


@dataclass(frozen=True)
class Series:
    """One run as a panel draws it: its legend name and look, its metrics entries, and the
    summary figures a curve needs (None where the run has none)."""

    name: str
    colour: Any
    entries: list[dict[str, Any]]
    wall_s: float | None = None
    final_loss: float | None = None
    gap_bound: float | None = None  # Table 1's any-pair bound; None: unbounded or unknown
    linestyle: Any = "-"


@dataclass(frozen=True)
class Panel:
    """How one curve is drawn: ``title`` heads its panel (``detail`` is added where there is
    room, the experiment figure's title), ``steps`` for values that hold until the next point,
    ``bound`` for a dashed horizontal reference per run."""

    title: str
    xlabel: str
    ylabel: str
    curve: Callable[[Series], Curve]
    detail: str = ""
    steps: bool = False
    markers: bool = False
    log_y: bool = False
    integer_x: bool = False
    integer_y: bool = False
    y_from_zero: bool = False
    bound: Callable[[Series], float | None] | None = None
    bound_label: str = ""


def _per_worker_curve(s: Series) -> Curve:
    per = iteration_time_per_worker(s.entries)
    return Curve([float(w) for w in per], list(per.values()))


TEST_LOSS_PANEL = Panel(
    title="test loss vs wall-clock time",
    detail="mean of every worker's latest evaluation",
    xlabel="wall-clock time since the first worker started (s)",
    ylabel="mean test loss",
    curve=lambda s: mean_test_loss_over_time(s.entries, end=(s.wall_s, s.final_loss)),
    steps=True,
    markers=True,
    log_y=True,  # losses span decades; the ends of the curves differ most
)
TRAIN_LOSS_PANEL = Panel(
    title="training loss vs iterations",
    detail=f"mean over workers, {SMOOTHING}-iteration moving average",
    xlabel="iteration",
    ylabel="training loss (minibatch)",
    curve=lambda s: mean_train_loss_by_iteration(s.entries),
    log_y=True,
    integer_x=True,
)
ITERATION_TIME_PER_WORKER_PANEL = Panel(
    title="mean iteration time per worker",
    detail="time / iterations advanced",
    xlabel="worker",
    ylabel="mean iteration time (s)",
    curve=_per_worker_curve,
    markers=True,
    integer_x=True,
    y_from_zero=True,  # the spread between workers at its true scale
)
GAP_PANEL = Panel(
    title="largest iteration gap between any two workers",
    xlabel="wall-clock time since the first worker started (s)",
    ylabel="iteration gap (max - min)",
    curve=lambda s: gap_timeline(s.entries),
    steps=True,
    integer_y=True,
    bound=lambda s: s.gap_bound,
    bound_label="any-pair bound (Table 1)",
)
#: The four panels of ``hopbus plot``, row by row.
OVERVIEW = (TEST_LOSS_PANEL, TRAIN_LOSS_PANEL, ITERATION_TIME_PER_WORKER_PANEL, GAP_PANEL)


def _groups(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        out.setdefault(r["group"], []).append(r)
    return out


def _labels(runs: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["label"] for r in runs))


def _colours(labels: list[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {label: cmap(i % cmap.N) for i, label in enumerate(labels)}


def _fit(text: str, inches: float, fontsize: float) -> str:
    """``text`` wrapped to lines that fit ``inches`` at ``fontsize`` points (about 0.55 of a
    point's width per character): a title never runs off its panel or figure."""
    width = max(16, int(inches * 72 / (fontsize * 0.55)))
    return "\n".join(textwrap.fill(line, width) for line in text.split("\n"))


def _group_title(group: str, members: list[dict[str, Any]], inches: float, points: float) -> str:
    """The group's name, and its slowdown where that is not the name, wrapped (at its '+'
    first) to ``inches`` at ``points``, so that neighbouring labels never overlap."""
    slowdown = (members[0].get("config") or {}).get("slowdown")
    text = group
    if slowdown and slowdown != group:
        text += "\n(slowdown " + str(slowdown).replace("+", " + ") + ")"
    return _fit(text, inches, points)


def _finite(x: Any) -> float | None:
    ok = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
    return float(x) if ok else None


def read_summary(path: Path) -> dict[str, Any]:
    """A run's summary.json, or {} when it is missing or does not parse (a run killed before
    its end wrote one): the figures then draw what the metrics alone give."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return obj if isinstance(obj, dict) else {}


def any_pair_bound(summary: dict[str, Any]) -> float | None:
    """The Table 1 any-pair bound a summary reports; None where it is infinite (null)."""
    bound = summary.get("gap_bound")
    return _finite(bound.get("any_pair")) if isinstance(bound, dict) else None


def run_series(
    folder: Path,
    name: str,
    colour: Any,
    summary: dict[str, Any],
    *,
    wall_s: Any = None,
    final_loss: Any = None,
    linestyle: Any = "-",
) -> Series:
    """A run folder's series: its metrics.jsonl, the end of its test-loss curve (``wall_s``,
    ``final_loss``, from the summary unless given; a resumed run's wall_s counts from the
    resume, which metrics.jsonl's time reaches at ``resumed_at_s``) and its gap bound.
    ``colour`` None: the palette's first, as a lone run gets in an experiment."""
    if wall_s is None:
        wall_s = summary.get("wall_s")
        offset = summary.get("resumed_at_s")
        if _finite(wall_s) is not None and _finite(offset) is not None:
            wall_s = wall_s + offset
    return Series(
        name=name,
        colour=colour if colour is not None else _colours([name])[name],
        entries=read_metrics(folder / "metrics.jsonl", summary.get("workers")),
        wall_s=_finite(wall_s),
        final_loss=_finite(final_loss if final_loss is not None else summary.get("final_loss")),
        gap_bound=any_pair_bound(summary),
        linestyle=linestyle,
    )


def experiment_series(
    results: dict[str, Any],
    folder: Path,
    runs: list[dict[str, Any]] | None = None,
    *,
    qualified: bool = False,
    summary: Callable[[Path], dict[str, Any]] = read_summary,
) -> list[Series]:
    """A series per run of ``runs`` (default: all of ``results``), coloured by label over all
    of ``results`` so a label keeps its colour whatever is drawn. ``qualified`` names them
    ``group/label`` and gives each group its line style (runs of several groups in a panel)."""
    every = results["runs"]
    colours = _colours(_labels(every))
    styles = {g: GROUP_STYLES[i % len(GROUP_STYLES)] for i, g in enumerate(_groups(every))}
    out = []
    for r in every if runs is None else runs:
        run_folder = folder / r["folder"]
        out.append(
            run_series(
                run_folder,
                f"{r['group']}/{r['label']}" if qualified else r["label"],
                colours[r["label"]],
                summary(run_folder / "summary.json"),
                wall_s=r.get("wall_s"),
                final_loss=r.get("final_loss"),
                linestyle=styles[r["group"]] if qualified else "-",
            )
        )
    return out


def _new_figure(
    width: float, height: float, panels: int = 1, rows: int = 1, sharey: bool = True
) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, panels, sharey=sharey, squeeze=False).ravel()
    return fig, axes


def iteration_time_figure(results: dict[str, Any], path: Path) -> Path:
    """Bars of mean iteration time; same slot and colour for a label in every group."""
    runs = results["runs"]
    groups = _groups(runs)
    labels = _labels(runs)
    colours = _colours(labels)
    ratios = results.get("ratios", {})
    fig_width = max(6.0, 1.5 + 0.5 * len(runs))
    fig, (ax,) = _new_figure(fig_width, 4.8)
    width = 0.8 / max(1, len(labels))
    for gi, (group, members) in enumerate(groups.items()):
        rat = ratios.get(group, {})
        for r in members:
            x = gi - 0.4 + width * (labels.index(r["label"]) + 0.5)
            mean = (r.get("iter_time_s") or {}).get("mean")
            if not ran(r) or mean is None:
                word = "skipped" if r.get("skipped") is not None else "failed"
                ax.text(x, 0, word, rotation=90, ha="center", va="bottom", fontsize=7)
                continue
            ax.bar(x, mean, width, color=colours[r["label"]], edgecolor="black", linewidth=0.4)
            ratio = rat.get("mean_iter_time", {}).get(r["label"])
            if ratio is not None:
                mark = " ref" if rat.get("reference") == r["label"] else ""
                ax.annotate(
                    f"{ratio:.2f}x{mark}",
                    (x, mean),
                    xytext=(0, 2),
                    textcoords="offset points",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
    per_group = (fig_width - LEGEND_INCHES) / max(1, len(groups))
    ticks = [_group_title(g, m, per_group, TICK_POINTS) for g, m in groups.items()]
    ax.set_xticks(range(len(groups)), ticks)
    ax.tick_params(axis="x", labelsize=TICK_POINTS)
    ax.set_xlabel("group (the number over a bar: its time / the group's reference run's)")
    ax.set_ylabel("mean iteration time (s)")
    ax.margins(y=0.2)
    ax.set_title(
        _fit(f"{results.get('scenario', 'experiment')}: mean iteration time per run", fig_width, 12)
    )
    handles = [
        _patch(colours[label], label)
        for label in labels
        if any(r["label"] == label and ran(r) for r in runs)
    ]
    if handles:
        fig.legend(handles=handles, title="run", loc="outside right upper")
    fig.savefig(path, dpi=DPI)
    return path


def _patch(colour: Any, label: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(facecolor=colour, edgecolor="black", linewidth=0.4, label=label)


def _plain_log_axis(ax: Any) -> None:
    """A log y axis labelled 0.3, 0.4, ... (not 3 x 10^-1); between the powers of ten only
    when it spans little more than one."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    lo, hi = ax.get_ylim()
    ax.yaxis.set_minor_formatter(plain if hi / lo < 20 else NullFormatter())


def _draw_bounds(ax: Any, panel: Panel, drawn: list[Series]) -> Any:
    """``panel.bound`` of the drawn runs, dashed: one black line when every run has the same
    finite bound, else a line per run in its colour; each value written once. Returns a
    legend handle, or None when no run has a finite bound."""
    from matplotlib.lines import Line2D

    if panel.bound is None:
        return None
    bounds = [(s, b) for s in drawn if (b := panel.bound(s)) is not None]
    if not bounds:
        return None
    common = len(bounds) == len(drawn) and len({b for _, b in bounds}) == 1
    for s, b in bounds[:1] if common else bounds:
        ax.axhline(b, color="black" if common else s.colour, linestyle=BOUND_STYLE, linewidth=1.0)
    for b in sorted({b for _, b in bounds}):
        ax.annotate(
            f"{b:g}",
            (0, b),
            xycoords=("axes fraction", "data"),
            xytext=(2, 1),
            textcoords="offset points",
            va="bottom",
            fontsize=7,
        )
    ax.margins(y=0.1)
    colour = "black" if common else "grey"
    return Line2D([], [], color=colour, linestyle=BOUND_STYLE, linewidth=1.0)


def draw_panel(ax: Any, panel: Panel, series: list[Series], *, title: str | None = None) -> dict:
    """Draw ``panel``'s curve of every series into ``ax`` (the one drawing rule of each curve,
    used by the experiment figures and ``hopbus plot``); the runs without data are named in
    the panel. Returns legend handles by name. A log y axis is set by ``finish_panel``, once
    every panel sharing the axis is drawn."""
    from matplotlib.ticker import MaxNLocator

    handles: dict[str, Any] = {}
    drawn: list[Series] = []
    missing: list[str] = []
    for s in series:
        c = panel.curve(s)
        if not c.x:
            missing.append(s.name)
            continue
        (line,) = ax.plot(
            c.x,
            c.y,
            color=s.colour,
            linestyle=s.linestyle,
            drawstyle="steps-post" if panel.steps else "default",
            marker="o" if panel.markers else None,
            markersize=2.5 if panel.steps else 4,
            linewidth=1.2,
        )
        if panel.y_from_zero:  # 0 in the data limits, and no margin below it
            ax.update_datalim([(c.x[0], 0.0)])
            line.sticky_edges.y.append(0.0)
        handles.setdefault(s.name, line)
        drawn.append(s)
    bound = _draw_bounds(ax, panel, drawn)
    if bound is not None:
        handles[panel.bound_label] = bound
    if not drawn:
        text = "no data" + (f": {', '.join(missing)}" if missing else "")
        ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", wrap=True)
    elif missing:
        ax.text(
            0.98, 0.98, f"no data: {', '.join(missing)}", transform=ax.transAxes,
            ha="right", va="top", fontsize=7,
            bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0},
        )  # fmt: skip
    ax.set_title(panel.title if title is None else title, fontsize=10)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    if panel.integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.integer_y:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return handles


def finish_panel(axes: list[Any], panel: Panel) -> None:
    """What needs every curve on the axes (those sharing one y axis) drawn first: the plain
    log scale of loss axes."""
    if panel.log_y and any(ax.has_data() for ax in axes):
        _plain_log_axis(axes[0])


def _legend(fig: Any, handles: list[dict[str, Any]]) -> None:
    """One legend for the figure: every run once, in the order drawn; reference lines last."""
    runs: dict[str, Any] = {}
    refs: dict[str, Any] = {}
    references = {p.bound_label for p in OVERVIEW if p.bound is not None}
    for got in handles:
        for name, h in got.items():
            (refs if name in references else runs).setdefault(name, h)
    merged = {**runs, **refs}
    if merged:
        fig.legend(list(merged.values()), list(merged), title="run", loc="outside right upper")


def _group_figure(results: dict[str, Any], series: list[Series], panel: Panel, path: Path) -> Path:
    """One panel per group (``series[i]`` is ``results["runs"][i]``), a shared y axis, one
    legend."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(results["runs"]):
        groups.setdefault(r["group"], []).append(i)
    fig, axes = _new_figure(1.0 + 4.6 * len(groups), 4.4, panels=max(1, len(groups)))
    handles = []
    for ax, (group, members) in zip(axes, groups.items(), strict=False):
        title = _group_title(group, [results["runs"][i] for i in members], 4.4, 10)
        handles.append(draw_panel(ax, panel, [series[i] for i in members], title=title))
    for ax in axes[1:]:
        ax.set_ylabel("")
    finish_panel(list(axes), panel)
    _legend(fig, handles)
    detail = f" ({panel.detail})" if panel.detail else ""
    heading = f"{results.get('scenario', 'experiment')}: {panel.title}{detail}"
    fig.suptitle(_fit(heading, 4.6 * len(groups) - 1.4, 12))  # beside the legend
    fig.savefig(path, dpi=DPI)
    return path


def overview_figure(series: list[Series], path: Path, *, title: str) -> Path:
    """``hopbus plot``: the four ``OVERVIEW`` panels, 2 x 2, every series in each."""
    fig, axes = _new_figure(13.0, 8.8, panels=2, rows=2, sharey=False)
    handles = []
    for ax, panel in zip(axes, OVERVIEW, strict=True):
        handles.append(draw_panel(ax, panel, series))
        finish_panel([ax], panel)
    _legend(fig, handles)
    fig.suptitle(_fit(title, 11.0, 12))  # beside the legend
    fig.savefig(path, dpi=DPI, format=path.suffix[1:].lower() or "png")  # (plot.FORMATS)
    return path


def loss_vs_time_figure(results: dict[str, Any], folder: Path, path: Path) -> Path:
    return _group_figure(results, experiment_series(results, folder), TEST_LOSS_PANEL, path)


def loss_vs_iterations_figure(results: dict[str, Any], folder: Path, path: Path) -> Path:
    return _group_figure(results, experiment_series(results, folder), TRAIN_LOSS_PANEL, path)


def write_figures(results: dict[str, Any], folder: Path) -> list[Path]:
    """Every figure of ``results`` (a results.json object) into ``folder``, where its runs'
    folders are; returns their paths."""
    series = experiment_series(results, folder)
    panels = {
        TEST_LOSS_VS_TIME: TEST_LOSS_PANEL,
        TRAIN_LOSS_VS_ITERATIONS: TRAIN_LOSS_PANEL,
        ITERATION_TIME_PER_WORKER: ITERATION_TIME_PER_WORKER_PANEL,
        GAP_TIMELINE: GAP_PANEL,
    }
    return [iteration_time_figure(results, folder / ITERATION_TIME)] + [
        _group_figure(results, series, panels[name], folder / name) for name in FIGURES[1:]
    ]


__all__ = [
    "FIGURES",
    "OVERVIEW",
    "Panel",
    "Series",
    "draw_panel",
    "experiment_series",
    "finish_panel",
    "iteration_time_figure",
    "loss_vs_iterations_figure",
    "loss_vs_time_figure",
    "overview_figure",
    "read_summary",
    "run_series",
    "write_figures",
]
