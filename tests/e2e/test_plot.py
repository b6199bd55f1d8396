"""``hopbus plot`` as a user types it: a real run folder (``hopbus train --out``) and an
experiment folder around it drawn as one valid PNG; folders cut short or missing a run's
metrics still plot; bad input is one line and status 2."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from test_cli import hopbus

from hopbus.experiments.curves import gap_timeline, iteration_time_per_worker, read_metrics

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_folder(redis_url, tmp_path_factory) -> Path:
    """A small real run: 3 workers, 24 iterations of 0.01 s, one 6x slow worker at random."""
    out = tmp_path_factory.mktemp("plot") / "run"
    p = hopbus(
        "train", "--redis", redis_url, "--run", f"plot-{time.time_ns()}", "-n", "3", "-k", "24",
        "--iter-time", "0.01", "--model", "softmax", "--data", "digits", "--eval-every", "8",
        "--slowdown", "random:6", "--out", str(out), "--json",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    return out


def _copy(run: Path, to: Path) -> None:
    shutil.copytree(run, to, ignore=shutil.ignore_patterns("*.png"))  # not another test's plot


def _experiment(tmp_path: Path, run_folder: Path) -> Path:
    """A results folder by hand: the run under two groups and labels, and a failed run that
    left no folder."""
    exp = tmp_path / "exp"
    runs = []
    for group, label in [("g1", "a"), ("g1", "b"), ("g2", "a")]:
        _copy(run_folder, exp / group / label)
        runs.append({"group": group, "label": label, "folder": f"{group}/{label}"})
    runs.append({"group": "g2", "label": "b", "folder": "g2/b", "failure": "boom"})
    (exp / "results.json").write_text(json.dumps({"scenario": "hand", "runs": runs}))
    return exp


def _png_shape(path: Path) -> tuple[int, ...]:
    from matplotlib.image import imread

    assert path.is_file() and path.read_bytes()[:8] == PNG, path
    return imread(path).shape


def _wrote(p, path: Path) -> None:
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert f"hopbus: wrote {path}" in p.stderr
    height, width, channels = _png_shape(path)
    assert channels in (3, 4) and width > height > 500


def _one_line_error(p, code: int = 2) -> str:
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hopbus: error: "), p.stderr
    assert "Traceback" not in p.stderr
    return lines[0]


def test_a_run_folder_is_one_png_next_to_it(run_folder):
    p = hopbus("plot", str(run_folder))
    _wrote(p, run_folder / "plot.png")
    assert p.stderr.count("\n") == 1  # nothing else to say


def test_the_figure_is_of_the_format_its_name_says(run_folder, tmp_path):
    """Fault ``pdf_of_png_bytes``: --out x.pdf (or x.txt) got PNG bytes."""
    for name, magic in (("p.pdf", b"%PDF"), ("p.svg", b"<?xml"), ("p", b"\x89PNG")):
        p = hopbus("plot", str(run_folder), "--out", str(tmp_path / name))
        assert p.returncode == 0, p.stderr
        assert (tmp_path / name).read_bytes().startswith(magic), name
    p = hopbus("plot", str(run_folder), "--out", str(tmp_path / "p.txt"))
    assert p.returncode == 2 and "a plot is a .png, .pdf or .svg file" in p.stderr
    assert not (tmp_path / "p.txt").exists()


def test_the_replayed_curves_agree_with_the_runs_summary(run_folder):
    summary = json.loads((run_folder / "summary.json").read_text())
    entries = read_metrics(run_folder / "metrics.jsonl")
    per = iteration_time_per_worker(entries)
    assert list(per) == [0, 1, 2]
    assert list(per.values()) == pytest.approx(summary["iter_time_s"]["per_worker"], rel=1e-3)
    gaps = gap_timeline(entries)
    assert len(gaps.x) == 3 * 24 and gaps.x == sorted(gaps.x)
    assert max(gaps.y) <= summary["max_gap"]["any_pair"]  # which also counts workers not started


def test_a_metrics_file_cut_mid_line_still_plots(run_folder, tmp_path):
    cut = tmp_path / "cut"
    _copy(run_folder, cut)
    text = (cut / "metrics.jsonl").read_text()
    (cut / "metrics.jsonl").write_text(text[: len(text) // 2 + 7])  # half a line at the end
    (cut / "summary.json").unlink()  # as a run stopped before its summary
    p = hopbus("plot", str(cut), "--out", str(tmp_path / "cut.png"))
    _wrote(p, tmp_path / "cut.png")


def test_an_experiment_folder_one_line_per_run_and_the_run_without_metrics_named(
    run_folder, tmp_path
):
    exp = _experiment(tmp_path, run_folder)
    p = hopbus("plot", str(exp))
    _wrote(p, exp / "plot.png")
    warnings = [x for x in p.stderr.splitlines() if x.startswith("hopbus: warning: ")]
    assert len(warnings) == 1 and "g2/b: no iterations in" in warnings[0], p.stderr
    assert "the run failed: boom" in warnings[0]
    p = hopbus("plot", str(exp), "--group", "g1", "-o", str(tmp_path / "g1.png"))
    _wrote(p, tmp_path / "g1.png")
    assert "warning" not in p.stderr


def test_help_says_what_the_panels_show():
    p = hopbus("plot", "--help")
    assert p.returncode == 0
    text = " ".join(p.stdout.split())
    panels = ("test loss vs wall-clock time", "training loss vs iterations")
    panels += ("mean iteration time per worker", "iteration gap", "docs/experiments.md")
    for needle in panels:
        assert needle in text, needle


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("missing", "does not exist"),
        ("empty", "is neither a run folder"),
        ("bad-results", "results.json is not valid JSON"),
        ("results-without-runs", "is not an experiment's results"),
        ("bad-summary", "summary.json is not valid JSON"),
        ("deep-summary", "summary.json is not a run's JSON (nested too deep)"),
        ("bad-summary-in-experiment", "g1/a/summary.json is not valid JSON"),
        ("unknown-group", "--group 'g3' is not a group of"),
        ("group-of-a-run", "--group is for an experiment folder"),
        ("out-in-no-folder", "does not exist"),
        ("a-file", "is a file: give the folder that holds it"),
        ("metrics-of-zeros", "metrics.jsonl': is not a regular file"),
        ("metrics-fifo", "metrics.jsonl': is not a regular file"),
        ("metrics-folder", "metrics.jsonl': is a directory"),
        # faults ``summary_of_zeros`` (read whole: the machine ran out of memory) and
        # ``summary_fifo`` (read forever)
        ("summary-of-zeros", "summary.json': is not a regular file"),
        ("summary-fifo", "summary.json': is not a regular file"),
        ("name-too-long", "File name too long"),  # was "cannot write output", status 1
        ("linked-plot", "plot.png' is a link or not a regular file"),  # written through
        # fault ``plot_over_its_input``: a PNG replaced the run's metrics (a name of another
        # suffix than a figure's is refused; a link to them of a figure's name, below)
        ("out-is-metrics", "metrics.jsonl': a plot is a .png, .pdf or .svg file"),
        ("out-links-metrics", "is a file this command reads ("),
    ],
)
def test_bad_input_is_one_line_and_status_2(run_folder, tmp_path, case, needle):
    path = tmp_path / "x"
    args: list[str] = []
    if case == "empty":
        path.mkdir()
    elif case in ("bad-results", "results-without-runs"):
        path.mkdir()
        text = '{"runs": [' if case == "bad-results" else '{"runs": [{"group": "g"}]}'
        (path / "results.json").write_text(text)
    elif case in ("bad-summary", "deep-summary", "group-of-a-run", "out-in-no-folder",
                  "out-is-metrics", "out-links-metrics"):  # fmt: skip
        _copy(run_folder, path)
        if case == "bad-summary":
            (path / "summary.json").write_text('{"wall_s": ')
        elif case == "deep-summary":  # json's RecursionError was a traceback
            (path / "summary.json").write_text("[" * 100_000)
        args = {
            "group-of-a-run": ["--group", "g1"],
            "out-in-no-folder": ["-o", "/no/such/x.png"],
            "out-is-metrics": ["-o", str(path / "metrics.jsonl")],
            "out-links-metrics": ["-o", str(path / "m.png")],
        }.get(case, [])
        if case == "out-links-metrics":  # a hard link: the same file by another name
            os.link(path / "metrics.jsonl", path / "m.png")
    elif case.startswith(("metrics-", "summary-")):  # ``endless_metrics``, ``metrics_fifo``
        _copy(run_folder, path)
        bad = path / ("metrics.jsonl" if case.startswith("metrics-") else "summary.json")
        bad.unlink()
        if case.endswith("-of-zeros"):
            bad.symlink_to("/dev/zero")
        elif case.endswith("-fifo"):
            os.mkfifo(bad)
        else:
            bad.mkdir()
    elif case == "name-too-long":
        path = tmp_path / ("A" * 300)
    elif case == "linked-plot":
        _copy(run_folder, path)
        (tmp_path / "victim.txt").write_text("not a plot")
        (path / "plot.png").symlink_to(tmp_path / "victim.txt")
    elif case == "a-file":
        _copy(run_folder, tmp_path / "r")
        path = tmp_path / "r" / "summary.json"
    elif case in ("bad-summary-in-experiment", "unknown-group"):
        path = _experiment(tmp_path, run_folder)
        if case == "bad-summary-in-experiment":
            (path / "g1" / "a" / "summary.json").write_text("not json")
        else:
            args = ["--group", "g3"]
    p = hopbus("plot", str(path), *args)
    line = _one_line_error(p)
    assert needle in line, line
    if case == "unknown-group":
        assert line.endswith("its groups: g1, g2")
    if case == "linked-plot":
        assert (tmp_path / "victim.txt").read_text() == "not a plot"
    elif case in ("out-is-metrics", "out-links-metrics"):
        assert (path / "metrics.jsonl").read_text() == (run_folder / "metrics.jsonl").read_text()
    elif case != "name-too-long":  # where no file can be
        assert not (path / "plot.png").exists()
