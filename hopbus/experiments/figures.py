"""The figures of an experiment, drawn from its results.json and the runs' metrics.jsonl.

Three PNGs: mean iteration time per run as bars grouped by the runs' group (the slowdown),
each bar labelled with its ratio to the group's reference run; mean test loss against
wall-clock time, as a step line (the mean of every worker's latest evaluation holds until the
next evaluation; a marker at each); training loss against iterations. The last two have one
panel per group and a log loss axis; their curves are defined in ``curves``. A run keeps its
colour in every figure. matplotlib is imported here only, inside the functions, and draws with
its Agg canvas (no display needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hopbus.experiments.curves import (
    SMOOTHING,
    Curve,
    mean_test_loss_over_time,
    mean_train_loss_by_iteration,
    read_metrics,
)

ITERATION_TIME = "iteration_time.png"
TEST_LOSS_VS_TIME = "test_loss_vs_time.png"
TRAIN_LOSS_VS_ITERATIONS = "train_loss_vs_iterations.png"
FIGURES = (ITERATION_TIME, TEST_LOSS_VS_TIME, TRAIN_LOSS_VS_ITERATIONS)
DPI = 120


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


def _group_title(group: str, members: list[dict[str, Any]]) -> str:
    slowdown = (members[0].get("config") or {}).get("slowdown")
    return f"{group}\n(slowdown {slowdown})" if slowdown and slowdown != group else group


def _new_figure(width: float, height: float, panels: int = 1) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, sharey=True, squeeze=False)[0]
    return fig, axes


def iteration_time_figure(results: dict[str, Any], path: Path) -> Path:
    """Bars of mean iteration time; same slot and colour for a label in every group."""
    runs = results["runs"]
    groups = _groups(runs)
    labels = _labels(runs)
    colours = _colours(labels)
    ratios = results.get("ratios", {})
    fig, (ax,) = _new_figure(max(6.0, 1.5 + 0.5 * len(runs)), 4.8)
    width = 0.8 / max(1, len(labels))
    for gi, (group, members) in enumerate(groups.items()):
        rat = ratios.get(group, {})
        for r in members:
            x = gi - 0.4 + width * (labels.index(r["label"]) + 0.5)
            mean = (r.get("iter_time_s") or {}).get("mean")
            if r.get("failure") is not None or mean is None:
                ax.text(x, 0, "failed", rotation=90, ha="center", va="bottom", fontsize=7)
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
    ax.set_xticks(range(len(groups)), [_group_title(g, m) for g, m in groups.items()])
    ax.set_xlabel("group (the number over a bar: its time / the group's reference run's)")
    ax.set_ylabel("mean iteration time (s)")
    ax.margins(y=0.2)
    ax.set_title(f"{results.get('scenario', 'experiment')}: mean iteration time per run")
    handles = [
        _patch(colours[label], label)
        for label in labels
        if any(r["label"] == label and r.get("failure") is None for r in runs)
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


def _curve_figure(
    results: dict[str, Any],
    curves: dict[tuple[str, str], Curve],
    path: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    steps: bool = False,
    integer_x: bool = False,
) -> Path:
    """One panel per group, a line per run; ``steps`` draws values that hold until the next
    point (a latest-evaluation mean), with a marker at each."""
    from matplotlib.ticker import MaxNLocator

    runs = results["runs"]
    groups = _groups(runs)
    colours = _colours(_labels(runs))
    fig, axes = _new_figure(1.0 + 4.6 * len(groups), 4.4, panels=max(1, len(groups)))
    seen: dict[str, Any] = {}
    for ax, (group, members) in zip(axes, groups.items(), strict=False):
        drawn = 0
        for r in members:
            c = curves.get((group, r["label"]))
            if c is None or not c.x:
                continue
            (line,) = ax.plot(
                c.x,
                c.y,
                color=colours[r["label"]],
                drawstyle="steps-post" if steps else "default",
                marker="o" if steps else None,
                markersize=2.5,
                linewidth=1.2,
            )
            seen.setdefault(r["label"], line)
            drawn += 1
        if not drawn:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
        ax.set_title(_group_title(group, members).replace("\n", " "), fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if integer_x:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel(ylabel)
    _plain_log_axis(axes[0])  # losses span decades; the ends of the curves differ most
    if seen:
        fig.legend(list(seen.values()), list(seen), title="run", loc="outside right upper")
    fig.suptitle(title)
    fig.savefig(path, dpi=DPI)
    return path


def _metrics(folder: Path, run: dict[str, Any]) -> list[dict[str, Any]]:
    return read_metrics(folder / run["folder"] / "metrics.jsonl")


def loss_vs_time_figure(results: dict[str, Any], folder: Path, path: Path) -> Path:
    curves = {
        (r["group"], r["label"]): mean_test_loss_over_time(
            _metrics(folder, r), end=(r.get("wall_s"), r.get("final_loss"))
        )
        for r in results["runs"]
    }
    return _curve_figure(
        results,
        curves,
        path,
        title=f"{results.get('scenario', 'experiment')}: test loss vs wall-clock time "
        "(mean of every worker's latest evaluation)",
        xlabel="wall-clock time since the first worker started (s)",
        ylabel="mean test loss",
        steps=True,
    )


def loss_vs_iterations_figure(results: dict[str, Any], folder: Path, path: Path) -> Path:
    curves = {
        (r["group"], r["label"]): mean_train_loss_by_iteration(_metrics(folder, r))
        for r in results["runs"]
    }
    return _curve_figure(
        results,
        curves,
        path,
        title=f"{results.get('scenario', 'experiment')}: training loss vs iterations "
        f"(mean over workers, {SMOOTHING}-iteration moving average)",
        xlabel="iteration",
        ylabel="training loss (minibatch)",
        integer_x=True,
    )


def write_figures(results: dict[str, Any], folder: Path) -> list[Path]:
    """Every figure of ``results`` (a results.json object) into ``folder``, where its runs'
    folders are; returns their paths."""
    return [
        iteration_time_figure(results, folder / ITERATION_TIME),
        loss_vs_time_figure(results, folder, folder / TEST_LOSS_VS_TIME),
        loss_vs_iterations_figure(results, folder, folder / TRAIN_LOSS_VS_ITERATIONS),
    ]


__all__ = [
    "FIGURES",
    "iteration_time_figure",
    "loss_vs_iterations_figure",
    "loss_vs_time_figure",
    "write_figures",
]
