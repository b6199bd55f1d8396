"""WAGMA-SGD's groups and rules against the paper (and NOTES.md's correction of Algorithm 1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopbus.baselines.spec import SchemeSettings, check, default_group_size
from hopbus.baselines.wagma import (
    allreduce_partners,
    group_of,
    groups,
    is_global,
    merge_divisor,
    partner,
    reach_iterations,
)
from hopbus.errors import ConfigError
from hopbus.modes import Mode


def test_groups_match_the_papers_example_p8_s4():
    assert groups(0, 8, 4) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert groups(1, 8, 4) == [(0, 1, 4, 5), (2, 3, 6, 7)]
    assert groups(2, 8, 4) == [(0, 2, 4, 6), (1, 3, 5, 7)]
    assert groups(3, 8, 4) == groups(0, 8, 4)  # the bits rotate with period log2 P


def test_partner_is_the_xor_of_the_rotating_bit():
    # p XOR (1 << ((t log2 S + r) mod log2 P)), P = 8, S = 4
    assert [partner(0, 1, r, 8, 4) for r in (0, 1)] == [4, 1]
    assert [partner(5, 2, r, 8, 4) for r in (0, 1)] == [7, 1]


powers = st.sampled_from([1, 2, 4, 8, 16, 32, 64])


@given(p=powers, s=powers, t=st.integers(0, 1000))
def test_groups_partition_the_workers_into_p_over_s_groups_of_s(p, s, t):
    if s > p:
        return
    gs = groups(t, p, s)
    assert len(gs) == p // s and all(len(g) == s for g in gs)
    assert sorted(q for g in gs for q in g) == list(range(p))
    for g in gs:
        assert all(group_of(q, t, p, s) == g for q in g)


@given(p=powers, s=powers, t0=st.integers(0, 1000), src=st.integers(0, 63))
def test_an_update_reaches_every_worker_within_log_s_of_p_iterations(p, s, t0, src):
    if s > p or s == 1 or src >= p:
        return
    rounds = reach_iterations(p, s)
    reached = {src}
    for t in range(t0, t0 + rounds):
        reached = {q for r in reached for q in group_of(r, t, p, s)}
    assert reached == set(range(p))
    if rounds > 1:  # and not sooner, when log_S P is not reached in fewer rounds
        reached = {src}
        for t in range(t0, t0 + rounds - 1):
            reached = {q for r in reached for q in group_of(r, t, p, s)}
        assert reached != set(range(p))


def test_local_sgd_never_mixes_outside_the_global_average():
    assert reach_iterations(8, 1) is None
    assert groups(3, 8, 1) == [(q,) for q in range(8)]


def test_global_averages_every_tau_iterations_and_at_the_end():
    assert [t for t in range(25) if is_global(t, 10, 25)] == [9, 19, 24]
    assert all(is_global(t, 1, 5) for t in range(5))


def test_recursive_doubling_partners_cover_every_bit():
    assert allreduce_partners(5, 8) == (4, 7, 1)
    assert allreduce_partners(0, 1) == ()


def test_merge_rule_of_algorithm_2():
    assert merge_divisor(4, own_was_current=True) == 4
    assert merge_divisor(4, own_was_current=False) == 5


def test_default_group_size_is_the_power_of_two_above_sqrt_p():
    assert [default_group_size(p) for p in (2, 4, 8, 16, 64)] == [2, 2, 4, 4, 8]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"workers": 6}, "power-of-two number of workers"),
        ({"group_size": 3}, "power of two"),
        ({"group_size": 16}, "larger than the 8 workers"),
        ({"sync_period": 0}, "--sync-period"),
    ],
)
def test_bad_wagma_settings_are_refused(kw, message):
    s = {"mode": Mode.WAGMA, "workers": 8, "iterations": 10, "group_size": 4, **kw}
    with pytest.raises(ConfigError, match=message):
        check(SchemeSettings(**s))


def test_bad_ps_settings_are_refused():
    with pytest.raises(ConfigError, match="smaller than --workers 4"):
        check(SchemeSettings(Mode.PS_BACKUP, workers=4, iterations=5, backup=4))
    with pytest.raises(ConfigError, match="--lookahead"):
        check(SchemeSettings(Mode.PS_ELASTIC, workers=4, iterations=5, lookahead=0))
    check(SchemeSettings(Mode.PS_BACKUP, workers=4, iterations=5, backup=3))  # N = 1 is fine
