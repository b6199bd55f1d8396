"""The slowdown grammar and its deterministic draws."""

import pytest

from hopbus.errors import ConfigError, SlowdownSpecError
from hopbus.heterogeneity import (
    FixedSlowdown,
    Heterogeneity,
    LinkDelay,
    MachineLinks,
    RandomSlowdown,
    parse,
)
from hopbus.modes import Mode
from hopbus.topology import Topology
from hopbus.topology.graphs import hierarchical, ring, ring_based


def test_parse_every_part():
    assert parse("none") == ()
    assert parse("random:6") == (RandomSlowdown(6.0, None),)
    assert parse("random:6:0.25") == (RandomSlowdown(6.0, 0.25),)
    assert parse("fixed:4@0,3") == (FixedSlowdown(4.0, (0, 3)),)
    assert parse("link:50@0-1") == (LinkDelay(0.05, 0, 1),)
    assert len(parse("random:6 + fixed:2@1 + link:1.5@2-3")) == 3


@pytest.mark.parametrize(
    "bad",
    [
        "random",
        "random:x",
        "random:6:2",
        "fixed:4",
        "fixed:4@",
        "fixed:0@1",
        "link:5@1",
        "link:5@1-",
        "link:5@2-2",
        "slow:3",
        "none+random:6",
        "random:-1",
        "",
    ],
)
def test_malformed_specs_are_one_clear_error(bad):
    if bad == "":
        assert parse(bad) == ()
        return
    with pytest.raises(SlowdownSpecError, match="bad --slowdown"):
        parse(bad)


def test_fixed_and_link_apply_to_named_workers_only():
    h = Heterogeneity.from_spec("fixed:4@1+fixed:2@1+link:30@0-2", n=3)
    assert [h.factor(w, 7) for w in range(3)] == [1.0, 8.0, 1.0]
    assert h.link_delay(0, 2) == h.link_delay(2, 0) == pytest.approx(0.03)
    assert h.link_delay(0, 1) == 0.0


def test_machines_slow_down_the_links_between_them_only():
    assert parse("machines:4,2,2@20") == (MachineLinks((4, 2, 2), 0.02),)
    h = Heterogeneity.from_spec("machines:4,2,2@20+link:5@0-1", n=8)
    assert [h.machine_of(w) for w in range(8)] == [0, 0, 0, 0, 1, 1, 2, 2]
    assert h.link_delay(0, 3) == 0.0 and h.link_delay(4, 5) == 0.0  # same machine
    assert h.link_delay(3, 4) == h.link_delay(7, 0) == pytest.approx(0.02)  # unbound: 1 each
    assert h.link_delay(0, 1) == pytest.approx(0.005)  # an explicit link adds on top
    # bound to a graph, each machine's uplink is shared by its edges to other machines
    # (hierarchical: 2 per machine; ring-based on 8: 6 from the first machine, 4 from the others)
    h.bind(hierarchical([4, 2, 2]), "hierarchical:4,2,2")
    assert h.uplink_messages() == [2, 2, 2]
    assert h.link_delay(3, 4) == pytest.approx(0.04)
    rb = Heterogeneity.from_spec("machines:4,2,2@20", n=8).bind(ring_based(8), "ring-based")
    assert rb.uplink_messages() == [6, 4, 4]
    assert rb.link_delay(0, 4) == pytest.approx(0.12) and rb.link_delay(4, 0) == pytest.approx(0.08)
    assert h.link_delay(8, 0) == 0.0  # a parameter server is on no machine
    assert h.has_link_delays and not Heterogeneity.from_spec("random:6", n=8).has_link_delays
    assert Heterogeneity.from_spec("fixed:2@1", n=4).machine_of(1) is None


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("machines:4,0,4@10", "no worker"),
        ("machines:4,4@10+machines:8@1", "only one machines"),
        ("machines:4,4", "cannot read"),
    ],
)
def test_bad_machines_parts_are_refused(spec, why):
    with pytest.raises(SlowdownSpecError, match=why):
        parse(spec)


def test_machines_must_hold_every_worker():
    with pytest.raises(SlowdownSpecError, match="machines of 4\\+2 = 6 workers, but the run has 8"):
        Heterogeneity.from_spec("machines:4,2@10", n=8)


def test_unknown_workers_and_non_neighbour_links_are_refused():
    with pytest.raises(SlowdownSpecError, match="worker 5 does not exist"):
        Heterogeneity.from_spec("fixed:4@5", n=4)
    h = Heterogeneity.from_spec("link:10@0-2", n=4)
    with pytest.raises(SlowdownSpecError, match="not neighbours"):
        h.bind(ring(4), "ring")


def test_random_slowdown_rate_is_p_and_draws_are_order_independent():
    n, iters = 16, 4000
    h = Heterogeneity.from_spec("random:6", n=n, seed=3)
    slow = sum(h.factor(w, k) == 6.0 for w in range(n) for k in range(iters))
    assert slow / (n * iters) == pytest.approx(1 / n, rel=0.1)  # default p = 1/n
    other = Heterogeneity.from_spec("random:6", n=n, seed=3)
    backwards = [other.factor(5, k) for k in reversed(range(3000))][::-1]
    assert backwards == [h.factor(5, k) for k in range(3000)]
    assert Heterogeneity.from_spec("random:6", n=n, seed=4).factor(5, 0) in (1.0, 6.0)
    differs = any(
        Heterogeneity.from_spec("random:6", n=n, seed=4).factor(w, k) != h.factor(w, k)
        for w in range(n)
        for k in range(200)
    )
    assert differs


@pytest.mark.parametrize("mode", ["ps-bsp", "ps-asp", "allreduce"])
def test_link_delays_are_refused_where_hopbus_cannot_apply_them(mode):
    topo = Topology.named("complete", 8)
    for spec in ("link:50@0-1", "machines:4,4@10"):
        het = Heterogeneity.from_spec(spec, 8).bind(topo.graph, topo.name)
        with pytest.raises(ConfigError, match=f"no meaning with --mode {mode}"):
            het.check_mode(Mode(mode))
    for ok in ("standard", "wagma"):  # their workers' messages go through the inbox
        Heterogeneity.from_spec("machines:4,4@10", 8).bind(topo.graph, topo.name).check_mode(
            Mode(ok)
        )
    Heterogeneity.from_spec("fixed:4@0", 8).check_mode(Mode(mode))  # compute slowdowns apply
