"""``hopbus experiment``: a scenario's runs end to end (real workers, the command's own private
Redis), failures and Ctrl-C kept in results.json, bad input as one line; and the pure parts
(records, ratios, table rows, curves, figures) on synthetic summaries."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli import hopbus

from hopbus.coord.keys import check_run_id
from hopbus.errors import ConfigError
from hopbus.experiments import SCENARIOS, RunPlan
from hopbus.experiments.curves import (
    mean_test_loss_over_time,
    mean_train_loss_by_iteration,
    read_metrics,
)
from hopbus.experiments.figures import FIGURES, write_figures
from hopbus.experiments.overrides import parse_overrides
from hopbus.experiments.results import counters, ratios, run_record, table, wait_per_iteration
from hopbus.experiments.runner import run_id_for

PNG = b"\x89PNG\r\n\x1a\n"
SMALL = ["--set", "workers=4", "--set", "iterations=20", "--set", "iter_time=0.01"]

# A test-only scenario, registered in the subprocess before the CLI runs.
WITH_SCENARIO = """
import sys
from hopbus.experiments import SCENARIOS, RunPlan, Scenario
common = {{"workers": 3, "topology": "ring", "eval_every": 5, {extra}}}
SCENARIOS["test"] = Scenario("test", "runs for the tests", lambda quick: [
    RunPlan("g", "bad", {{**common, "mode": "no-such-mode"}}),
    RunPlan("g", "ok", {{**common, "skip_max": 10}}),  # warns: skipping never triggers
    RunPlan("g", "last", common),
][{runs}], reference="bad")
from hopbus.cli.main import main
main(sys.argv[1:])
"""


def _script(extra: str, runs: str = ":") -> list[str]:
    return [sys.executable, "-c", WITH_SCENARIO.format(extra=extra, runs=runs)]


def _one_line_error(p: subprocess.CompletedProcess, code: int) -> str:
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = [x for x in p.stderr.strip().splitlines() if x.startswith("hopbus: ")]
    errors = [x for x in lines if x.startswith("hopbus: error: ")]
    assert len(errors) == 1, p.stderr
    assert "Traceback" not in p.stderr
    return errors[0]


def _is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG


# -- end to end ---------------------------------------------------------------------------------


def test_schemes_quick_end_to_end(tmp_path):
    out = tmp_path / "exp"
    p = hopbus(
        "experiment", "schemes", "--quick", "--only", "standard,backup", *SMALL,
        "--out", str(out), "--json",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    res = json.loads((out / "results.json").read_text())
    assert json.loads(p.stdout) == res
    assert res["scenario"] == "schemes" and res["quick"] is True
    assert res["command"][:3] == ["hopbus", "experiment", "schemes"]
    assert set(res["machine"]) == {"platform", "python", "cpu_count"}
    assert res["started"] <= res["finished"] and not res["interrupted"]
    assert [(r["group"], r["label"]) for r in res["runs"]] == [
        ("random-6x", "standard"),
        ("random-6x", "backup"),
        ("straggler-4x", "standard"),
        ("straggler-4x", "backup"),
    ]
    for r in res["runs"]:
        assert r["failure"] is None and r["finished"] and r["violations"] == 0
        assert r["config"]["workers"] == 4 and r["config"]["iterations"] == 20
        assert r["config"]["slowdown"] in ("random:6", "fixed:4@0")
        assert r["iter_time_s"]["mean"] > 0 and 0 < r["final_accuracy"] <= 1
        folder = out / r["folder"]
        assert json.loads((folder / "summary.json").read_text())["finished"]
        assert read_metrics(folder / "metrics.jsonl")
    assert len({r["run_id"] for r in res["runs"]}) == 4
    for group, rat in res["ratios"].items():
        assert rat["reference"] == "standard", group  # ps-bsp is not among them
        assert all(isinstance(x, float) and x > 0 for x in rat["mean_iter_time"].values())
        assert rat["mean_iter_time"]["standard"] == 1.0
    assert len(res["table"]["rows"]) == 4
    assert all(len(row) == len(res["table"]["columns"]) for row in res["table"]["rows"])
    for name in FIGURES:
        assert _is_png(out / name), name
    # not a terminal: each run's line comes in two halves, the result on a line of its own
    assert "[1/4] random-6x standard ...\n" in p.stderr
    assert "[4/4] straggler-4x backup: " in p.stderr and "acc 0." in p.stderr


def test_a_failing_run_is_recorded_the_others_run_and_the_status_is_1(tmp_path):
    out = tmp_path / "exp"
    p = subprocess.run(
        [*_script('"iterations": 10'), "experiment", "test", "--out", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    line = _one_line_error(p, 1)
    assert line.startswith("hopbus: error: 1 of 3 runs failed; first, g/bad: --mode")
    assert p.stderr.count("skipping will never trigger") == 1  # shown once, for its run
    assert "hopbus: warning: g/ok: skipping will never trigger" in p.stderr
    assert "failed" in p.stdout and "last" in p.stdout  # the table
    res = json.loads((out / "results.json").read_text())
    bad, ok, last = res["runs"]
    assert "no-such-mode" in bad["failure"] and bad["config"]["mode"] == "no-such-mode"
    assert ok["failure"] is None and last["failure"] is None
    assert any("skipping will never trigger" in w for w in ok["warnings"])
    assert res["ratios"]["g"]["reference"] == "ok"  # the wanted one failed
    assert res["ratios"]["g"]["mean_iter_time"]["bad"] is None
    assert all(_is_png(out / name) for name in FIGURES)


def test_ctrl_c_stops_the_run_and_keeps_what_was_done(tmp_path):
    out = tmp_path / "exp"
    proc = subprocess.Popen(
        [*_script('"iterations": 2000, "iter_time": 0.01', runs="1:"), "experiment", "test",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    metrics = out / "g" / "ok" / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while not (metrics.exists() and metrics.stat().st_size > 0):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "hopbus: interrupted" in err and "Traceback" not in err
    res = json.loads((out / "results.json").read_text())
    assert res["interrupted"] is True
    assert [(r["label"], r["failure"]) for r in res["runs"]] == [("ok", "interrupted")]


def test_list_and_no_name_show_the_scenarios():
    for args in (["--list"], []):
        p = hopbus("experiment", *args)
        assert p.returncode == 0, p.stderr
        assert "schemes" in p.stdout and "straggler" in p.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nope"], "unknown scenario 'nope'; known: random-slowdown, deterministic-slowdown"),
        (["schemes", "--only", "standard,nope"], "its runs: standard, backup, ps-bsp"),
        (["schemes", "--set", "colour=red"], "--set colour: not a setting"),
        (["schemes", "--set", "iterations=many"], "--set: iterations"),
        (["schemes", "--set", "iterations"], "expected KEY=VALUE"),
        (["schemes", "--set", "latency=1"], "not a setting of a real run"),
        (
            ["topology", "--quick", "--set", "workers=4"],
            "no run of topology can take these settings; first, machines-4,2,2/ring-based: "
            "bad --slowdown: machines of 4+2+2 = 8 workers, but the run has 4",
        ),
    ],
)
def test_bad_input_is_one_line_and_starts_nothing(tmp_path, args, needle):
    p = hopbus("experiment", *args, "--out", str(tmp_path / "exp"))
    assert needle in _one_line_error(p, 2)
    assert not (tmp_path / "exp").exists()


def test_an_out_folder_in_use_is_refused(tmp_path):
    (tmp_path / "old.txt").write_text("x")
    p = hopbus("experiment", "schemes", "--out", str(tmp_path))
    assert "already exists and is not empty" in _one_line_error(p, 2)


# -- scenarios and settings ---------------------------------------------------------------------


def test_schemes_compares_every_mode_under_two_slowdowns_with_the_same_workers():
    for quick in (False, True):
        plans = SCENARIOS["schemes"].runs(quick)
        assert [p.group for p in plans] == ["random-6x"] * 8 + ["straggler-4x"] * 8
        assert [p.label for p in plans[:8]] == [
            "standard", "backup", "ps-bsp", "ps-ssp", "ps-asp", "ps-backup", "ps-elastic", "wagma",
        ]  # fmt: skip
        assert all(p.values["mode"] == p.label for p in plans)
        assert {(p.values["workers"], p.values["iterations"]) for p in plans} == {
            (8, 60 if quick else 200)
        }
        assert {p.values["slowdown"] for p in plans} == {"random:6", "fixed:4@0"}
    assert SCENARIOS["schemes"].reference == "ps-bsp"
    only = SCENARIOS["schemes"].runs(True, ["wagma", "standard"])
    assert [(p.group, p.label) for p in only] == [
        ("random-6x", "standard"), ("random-6x", "wagma"),
        ("straggler-4x", "standard"), ("straggler-4x", "wagma"),
    ]  # fmt: skip


def test_overrides_take_flag_or_field_names_and_come_back_typed():
    assert parse_overrides(["max-ig=3", "iter_time=0.5", "mode=backup"]) == {
        "max_ig": 3,
        "iter_time": 0.5,
        "mode": "backup",
    }
    with pytest.raises(ConfigError, match="not a setting"):
        parse_overrides(["compute_time=2"])


def test_run_ids_are_valid_readable_and_unique():
    plans = SCENARIOS["schemes"].runs(False)
    ids = [run_id_for("schemes", p, i, 4242) for i, p in enumerate(plans)]
    assert ids[2] == "schemes-ps-bsp-random-6x-4242"
    assert len(set(ids)) == len(ids) and all(check_run_id(x) for x in ids)
    long = RunPlan("g" * 80, "a label/with spaces", {})
    assert check_run_id(run_id_for("s", long, 6, 1)) == "s-7-1"


# -- records, ratios, table ---------------------------------------------------------------------


def _summary(mean: float, **extra) -> dict:
    return {
        "iter_time_s": {"mean": mean, "p50": mean / 2, "per_worker": [mean]},
        "final_loss": 0.3,
        "final_accuracy": 0.9,
        "time_to_target": None,
        "wall_s": mean * 100,
        "violations": 0,
        "finished": True,
        **extra,
    }


def _record(group: str, label: str, mean: float | None, failure: str | None = None, **extra):
    return run_record(
        RunPlan(group, label, {"mode": label}),
        run_id=f"{group}-{label}",
        folder=f"{group}/{label}",
        config=None,
        summary=_summary(mean, **extra) if mean is not None else None,
        failure=failure,
        warnings=[],
        elapsed_s=1.0,
    )


def test_a_record_keeps_key_figures_and_the_schemes_counters_as_json():
    rec = _record(
        "g", "ps-ssp", 0.1,
        scheme={
            "mode": "ps-ssp",
            "counters": {"dropped_gradients": 3, "held": 0, "mean_held_s": float("nan")},
            "extra": {"flag": True, "n": 2},
        },
        waiting={"per_iteration_s": 0.02},
    )  # fmt: skip
    assert rec["mode"] == "ps-ssp" and rec["config"] == {"mode": "ps-ssp"}
    assert rec["iter_time_s"] == {"mean": 0.1, "p50": 0.05, "per_worker": [0.1]}
    assert rec["scheme"]["counters"]["mean_held_s"] is None  # NaN is not JSON
    json.dumps(rec, allow_nan=False)
    assert counters(rec) == "dropped_gradients=3 extra.n=2"  # zeros, None and flags left out
    assert wait_per_iteration(rec) == 0.02
    assert counters(_record("g", "standard", 0.1)) == "-"


def test_ratios_divide_by_the_reference_or_the_first_run_that_succeeded():
    runs = [
        _record("a", "standard", 0.2),
        _record("a", "ps-bsp", 0.4),
        _record("b", "standard", 0.3),
        _record("b", "ps-bsp", 0.5, failure="boom"),
        _record("b", "backup", 0.15),
        _record("c", "ps-bsp", None, failure="no such mode"),
        _record("d", "ps-bsp", 0.4),  # alone (--only ps-bsp): compared with nothing
    ]
    rat = ratios(runs, "ps-bsp")
    assert rat["a"] == {"reference": "ps-bsp", "mean_iter_time": {"standard": 0.5, "ps-bsp": 1.0}}
    assert rat["b"]["reference"] == "standard"
    assert rat["b"]["mean_iter_time"] == {"standard": 1.0, "ps-bsp": None, "backup": 0.5}
    assert rat["c"] == {"reference": None, "mean_iter_time": {"ps-bsp": None}}
    assert rat["d"] == {"reference": None, "mean_iter_time": {"ps-bsp": None}}
    tab = table(runs, rat)
    rows = {(r[0], r[1]): dict(zip(tab["columns"], r, strict=True)) for r in tab["rows"]}
    assert rows["a", "ps-bsp"]["vs ref"] == "1.00x (ref)"
    assert rows["a", "standard"]["vs ref"] == "0.50x" and rows["a", "standard"]["status"] == "ok"
    assert rows["b", "ps-bsp"]["status"] == "failed" and rows["b", "ps-bsp"]["vs ref"] == "-"
    assert rows["c", "ps-bsp"]["iter s"] == "-" and rows["c", "ps-bsp"]["loss"] == "-"
    assert rows["d", "ps-bsp"]["vs ref"] == "-" and rows["d", "ps-bsp"]["iter s"] == "0.4000"
    assert rows["a", "standard"]["iter s"] == "0.2000" and rows["a", "standard"]["wait s/it"] == "-"


# -- curves and figures -------------------------------------------------------------------------


def _entries() -> list[dict]:
    out = []
    for it in range(1, 41):
        for w in range(2):
            e = {"t": it * 0.1 + w * 0.01, "worker": w, "iter": it, "loss": 2.0 - it / 40 - w}
            if it % 20 == 0:
                e["eval_loss"] = 1.0 / it + w
                e["eval_accuracy"] = 0.9
            out.append(e)
    return out


def test_test_loss_over_time_is_the_mean_of_every_workers_latest_evaluation():
    c = mean_test_loss_over_time(_entries(), end=(5.0, 0.01))
    # worker 0 evaluates first at 20 (alone: no point yet), then worker 1 completes the set
    assert c.x == [2.01, 4.0, 4.01, 5.0]
    assert c.y == pytest.approx([0.55, (1 / 40 + 1 / 20 + 1) / 2, 0.525, 0.01])
    assert mean_test_loss_over_time([]).x == []
    assert mean_test_loss_over_time([], end=(1.0, float("nan"))).x == []


def test_train_loss_by_iteration_averages_workers_then_smooths():
    c = mean_train_loss_by_iteration(_entries(), smoothing=1)
    assert c.x[:2] == [1.0, 2.0] and c.y[0] == pytest.approx(2.0 - 1 / 40 - 0.5)
    smooth = mean_train_loss_by_iteration(_entries(), smoothing=4)
    assert smooth.y[3] == pytest.approx(sum(c.y[:4]) / 4) and len(smooth.x) == 40


def test_figures_are_png_even_with_a_failed_run_and_a_broken_metrics_line(tmp_path):
    runs = [_record("random-6x", "standard", 0.2), _record("random-6x", "ps-bsp", 0.4)]
    runs += [_record("straggler-4x", "standard", 0.3), _record("straggler-4x", "wagma", None, "x")]
    for r in runs:
        folder = tmp_path / r["folder"]
        folder.mkdir(parents=True)
        lines = [json.dumps(e) for e in _entries()] + ['{"t": 1.0, "work']
        (folder / "metrics.jsonl").write_text("\n".join(lines))
    assert len(read_metrics(tmp_path / "random-6x/standard/metrics.jsonl")) == 80
    results = {"scenario": "t", "runs": runs, "ratios": ratios(runs, "ps-bsp")}
    paths = write_figures(results, tmp_path)
    assert [p.name for p in paths] == list(FIGURES) and len(paths) == 5
    assert {"iteration_time_per_worker.png", "gap_timeline.png"} <= set(FIGURES)
    assert all(_is_png(p) and p.stat().st_size > 10_000 for p in paths)
