"""The paper's scenarios (Sec. 7.3) as ``hopbus experiment`` runs them: random-slowdown end to
end with ``--quick`` (files exist and parse; the speedups are benchmarks, not asserted), every
scenario's runs valid settings, the claims judged from records, a run whose optional package is
missing skipped rather than failed."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import warnings

import pytest
from test_cli import hopbus

from hopbus import heterogeneity
from hopbus.config import TrainConfig, make_config
from hopbus.experiments import SCENARIOS
from hopbus.experiments.figures import FIGURES
from hopbus.experiments.results import claim_cells, claims, judge
from hopbus.experiments.scenarios import Claim
from hopbus.heterogeneity import MachineLinks
from hopbus.runtime.launcher import check_inputs

PNG = b"\x89PNG\r\n\x1a\n"
PAPER = (
    "random-slowdown", "deterministic-slowdown", "topology", "vs-allreduce", "vs-ps", "paper-cnn",
)  # fmt: skip


def test_random_slowdown_quick_end_to_end(tmp_path):
    out = tmp_path / "exp"
    p = hopbus("experiment", "random-slowdown", "--quick", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "What it must show" in p.stdout and "Traceback" not in p.stderr
    # no terminal: each run's line in two halves, its own progress lines between them
    lines = p.stderr.splitlines()
    first = lines.index("[1/5] ring-based-6x standard ...")
    assert lines[first + 1].startswith("hopbus: run random-slowdown-standard-ring-based-6x-")
    assert any(x.startswith("[1/5] ring-based-6x standard: ") for x in lines[first + 1 :])
    res = json.loads((out / "results.json").read_text())
    plans = SCENARIOS["random-slowdown"].runs(True)
    assert [(r["group"], r["label"]) for r in res["runs"]] == [(q.group, q.label) for q in plans]
    for run in res["runs"]:
        folder = out / run["folder"]
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["finished"] and summary["config"]["workers"] == 8
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        assert lines and all(isinstance(json.loads(x), dict) for x in lines)
        assert run["spectral_gap"] == pytest.approx(0.5)  # ring-based on 8 workers
    assert len(res["table"]["rows"]) == len(plans)
    judged = {c["claim"]: c for c in res["claims"]}
    assert len(judged) == len(SCENARIOS["random-slowdown"].claims) + 1
    for c in judged.values():  # every claim could be judged from this run's records
        assert c["value"] is not None or c["note"], c
    assert set(res["figures"]) == set(FIGURES)
    for name in FIGURES:
        assert (out / name).read_bytes()[:8] == PNG


@pytest.mark.parametrize("name", PAPER)
def test_every_run_of_every_paper_scenario_is_a_valid_run(name):
    """What a run would refuse (settings, topology, slowdown, data), refused here without
    running: quick and full."""
    scenario = SCENARIOS[name]
    for quick in (True, False):
        for plan in scenario.runs(quick):
            if plan.needs is not None and importlib.util.find_spec(plan.needs[0]) is None:
                continue  # vs-allreduce's all-reduce without torch: skipped when run
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. "skipping never triggers" is a run's own
                cfg, topo, _ = check_inputs(make_config(plan.values, cls=TrainConfig))
            assert cfg.mode == plan.values["mode"] and topo.n == cfg.workers


@pytest.mark.parametrize("name", PAPER)
def test_every_claim_names_runs_of_its_scenario(name):
    scenario = SCENARIOS[name]
    runs = {(p.group, p.label) for p in scenario.runs(False)}
    for c in scenario.claims:
        assert c.num in runs and c.den in runs, c.text
        assert c.measure in ("iter", "target")


def test_the_paper_settings_are_the_papers():
    full = {n: SCENARIOS[n].runs(False) for n in PAPER}
    rs = full["random-slowdown"]
    assert {p.values["workers"] for p in rs} == {16}
    assert {p.values["topology"] for p in rs} == {"ring-based", "double-ring"}
    assert {p.values["slowdown"] for p in rs} == {"random:6", "none"}  # p = 1/n by default
    assert {(p.label, p.values.get("backup"), p.values.get("staleness")) for p in rs} == {
        ("standard", None, None), ("backup", 1, None), ("staleness", None, 5), ("hybrid", 1, 5),
    }  # fmt: skip
    ds = {p.label: p.values for p in full["deterministic-slowdown"] if p.group == "one-4x"}
    assert {v["slowdown"] for v in ds.values()} == {"fixed:4@0"}
    assert (ds["skip-2"]["skip_max"], ds["skip-10"]["skip_max"]) == (2, 10)
    topo = full["topology"]
    assert {p.values["topology"] for p in topo} == {"ring-based", "hierarchical:4,2,2"}
    assert all(p.values["slowdown"].startswith("machines:4,2,2@") for p in topo)
    assert {p.values["mode"] for p in full["vs-allreduce"]} == {"allreduce", "standard", "backup"}
    assert {p.values["mode"] for p in full["vs-ps"]} == {"standard", "ps-bsp"}


def test_paper_cnn_is_the_papers_cnn_setting_and_quick_only_scales_time():
    full, quick = SCENARIOS["paper-cnn"].runs(False), SCENARIOS["paper-cnn"].runs(True)
    for plans, scale in ((full, 1), (quick, 5)):
        slowed = [p for p in plans if p.group != "links-only"]
        assert {p.values["workers"] for p in plans} == {16}
        assert {p.values["message_bytes"] for p in plans} == {36_902_440}  # VGG-11, float32
        assert {p.values["max_ig"] for p in plans} == {10}
        links = f"machines:4,4,4,4@0/{scale}Gbit"
        assert {p.values["slowdown"] for p in slowed} == {f"random:6+{links}"}
        assert {p.values["slowdown_scope"] for p in slowed} == {"iteration", "compute"}
        assert {p.values["iter_time"] for p in plans} == {1.0 / scale}  # compute : link kept
        assert {p.label for p in slowed} == {
            "standard",
            "backup",
            "staleness",
            "hybrid",
            "allreduce",
        }
        # Fig. 13: a BSP parameter server on the same links, without slowdown
        assert {(p.label, p.values["mode"], p.values["slowdown"]) for p in plans} >= {
            ("ps-bsp", "ps-bsp", links),
            ("standard", "standard", links),
        }
        (machines,) = [x for x in heterogeneity.parse(links) if isinstance(x, MachineLinks)]
        assert machines.sizes == (4, 4, 4, 4)
        assert machines.s_per_byte == pytest.approx(8 / (scale * 1e9))  # 1 Gbit/s, scaled


def _record(group, label, *, mean=None, target=None, failure=None, skipped=None, violations=0):
    return {
        "group": group,
        "label": label,
        "iter_time_s": {"mean": mean},
        "time_to_target": target,
        "failure": failure,
        "skipped": skipped,
        "violations": violations,
        "finished": failure is None and skipped is None,
    }


def test_claims_are_ratios_of_two_runs_judged_against_their_threshold():
    runs = [
        _record("g", "standard", mean=3.0, target=None),
        _record("g", "backup", mean=2.0, target=4.0),
        _record("h", "standard", mean=1.0, target=2.0),
        _record("h", "x", failure="boom"),
    ]
    faster = Claim("b 1.5x", "iter", ("g", "standard"), ("g", "backup"), ">=", 1.5)
    got = judge(faster, runs)
    assert got["value"] == 1.5 and got["holds"] is True
    assert judge(faster._replace(threshold=1.6), runs)["holds"] is False
    within = Claim("w", "iter", ("g", "backup"), ("h", "standard"), "<=", 1.3)
    assert judge(within, runs)["value"] == pytest.approx(2.0)
    assert judge(within, runs)["holds"] is False
    report = Claim("r", "iter", ("g", "standard"), ("h", "standard"))
    assert judge(report, runs)["holds"] is None and judge(report, runs)["value"] == 3.0
    # standard never reached the target: backup is faster to it by any ratio
    never = judge(Claim("t", "target", ("g", "standard"), ("g", "backup"), ">", 1.0), runs)
    assert never["value"] == math.inf and never["holds"] is True and "never" in never["note"]
    nothing = judge(Claim("t", "target", ("g", "backup"), ("g", "standard"), ">", 1.0), runs)
    assert nothing["holds"] is None and nothing["value"] is None
    failed = judge(Claim("f", "iter", ("h", "x"), ("h", "standard"), ">", 1.0), runs)
    assert failed["holds"] is None and failed["note"] == "h/x failed"
    absent = judge(Claim("a", "iter", ("h", "nope"), ("h", "standard"), ">", 1.0), runs)
    assert absent["note"] == "h/nope did not run"


def test_the_violations_claim_names_the_runs_that_broke_a_bound():
    ok = [_record("g", "a", mean=1.0), _record("g", "s", skipped="no torch")]
    assert claims((), ok)[-1]["holds"] is True
    bad = [*ok, _record("g", "b", mean=1.0, violations=2)]
    last = claims((), bad)[-1]
    assert (last["holds"], last["value"], last["note"]) == (False, 1, "g/b")
    assert claims((), [_record("g", "s", skipped="no torch")])[-1]["holds"] is None


WITH_NEEDS = """
import sys
from hopbus.experiments import SCENARIOS, RunPlan, Scenario
common = {"workers": 3, "topology": "ring", "eval_every": 5, "iterations": 10,
          "iter_time": 0.01}
SCENARIOS["needs"] = Scenario("needs", "a run needing a package nobody has", lambda quick: [
    RunPlan("g", "missing", common, ("hopbus_no_such_package", "pip install it")),
    RunPlan("g", "ok", common),
])
from hopbus.cli.main import main
main(sys.argv[1:])
"""


def test_a_run_whose_package_is_missing_is_skipped_and_says_so(tmp_path):
    out = tmp_path / "exp"
    p = subprocess.run(
        [sys.executable, "-c", WITH_NEEDS, "experiment", "needs", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    assert "skipped: hopbus_no_such_package is not installed (pip install it)" in p.stderr
    res = json.loads((out / "results.json").read_text())
    missing, ok = res["runs"]
    assert missing["skipped"] and missing["failure"] is None and missing["finished"] is False
    assert ok["skipped"] is None and ok["finished"]
    assert [row[res["table"]["columns"].index("status")] for row in res["table"]["rows"]] == [
        "skipped",
        "ok",
    ]
    # the group's only run with a time: compared with nothing, not with itself
    assert res["ratios"]["g"] == {
        "reference": None,
        "mean_iter_time": {"missing": None, "ok": None},
    }
    assert not (out / "g" / "missing").exists()  # nothing was started for it


def test_a_claims_printed_ratio_agrees_with_its_verdict():
    def cells(value, op=">=", threshold=1.5, holds=None, note=None):
        return claim_cells(
            {"value": value, "op": op, "threshold": threshold, "holds": holds, "note": note}
        )

    assert cells(1.4999, holds=False) == ("1.4999x", ">= 1.5x")  # not a "1.50x" that failed
    assert cells(1.43, holds=False) == ("1.43x", ">= 1.5x")
    assert cells(2.0, op=None, threshold=None) == ("2.00x", "-")
    inf = cells(math.inf, op=">", threshold=1, holds=True, note="a/b never reached the target loss")
    assert inf == ("never", "> 1x")  # in memory, before results.json turns inf into null
    assert cells(None, op=">", threshold=1, note="a/b never reached the target loss")[0] == "never"
    assert cells(0, op="==", threshold=0, holds=True) == ("0", "== 0")
