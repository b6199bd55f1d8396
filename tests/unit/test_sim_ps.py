"""The parameter-server schemes in virtual time: the same cores as ``hopbus ps``, exact figures."""

from __future__ import annotations

import pytest

from hopbus.config import RunConfig, make_config
from hopbus.errors import ConfigError
from hopbus.sim import simulate


def run(mode: str, slowdown: str = "none", **kw):
    cfg = make_config(
        {"mode": mode, "workers": 8, "iterations": 100, "slowdown": slowdown, **kw}, cls=RunConfig
    )
    _, result, s = simulate(cfg)
    assert result.finished and s["violations"] == 0
    return s


def test_bsp_runs_at_the_stragglers_pace():
    s = run("ps-bsp", "fixed:4@0")
    # compute 4.0 for the straggler, then its push and the reply: 2 x latency 0.05
    assert s["iter_time_s"]["mean"] == pytest.approx(4.1)
    assert s["max_gap"]["any_pair"] == 1
    assert s["scheme"]["counters"]["barriers"] == 100


def test_backup_workers_leave_a_deterministic_straggler_behind():
    s = run("ps-backup", "fixed:4@0", backup=1)
    c = s["scheme"]["counters"]
    assert s["iter_time_s"]["p50"] == pytest.approx(1.1)  # the other 7 set the pace
    assert c["dropped_gradients"] >= 20 and c["applied_gradients"] == 7 * 100
    assert s["jumps"] >= 20  # the straggler catches up by jumping to the current version


def test_elastic_waits_less_per_barrier_than_bsp_with_a_straggler():
    bsp = run("ps-bsp", "fixed:4@0")["scheme"]["counters"]
    elastic = run("ps-elastic", "fixed:4@0")["scheme"]["counters"]
    assert elastic["barriers"] >= 1
    assert elastic["mean_barrier_wait_s"] < bsp["mean_barrier_wait_s"] / 10


def test_ssp_keeps_its_bound_and_asp_holds_nobody():
    ssp = run("ps-ssp", "random:6", staleness=2)
    assert ssp["max_gap"]["any_pair"] <= 3 and ssp["gap_bound"]["any_pair"] == 3
    asp = run("ps-asp", "random:6")
    assert asp["scheme"]["counters"]["held"] == 0
    assert asp["iter_time_s"]["mean"] < ssp["iter_time_s"]["mean"]


def test_sim_refuses_wagma_and_link_delays_for_a_parameter_server():
    with pytest.raises(ConfigError, match="cluster only"):
        simulate(make_config({"mode": "wagma", "workers": 8}, cls=RunConfig))
    with pytest.raises(ConfigError, match="no meaning"):
        simulate(make_config({"mode": "ps-bsp", "slowdown": "link:5@0-1"}, cls=RunConfig))
