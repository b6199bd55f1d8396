"""The slowdown grammar and its deterministic draws."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopbus.errors import ConfigError, SlowdownSpecError
from hopbus.heterogeneity import (
    BANDWIDTH_UNITS,
    FixedSlowdown,
    Heterogeneity,
    LinkDelay,
    MachineLinks,
    RandomSlowdown,
    SlowdownScope,
    links_graph,
    message_delay,
    parse,
    parse_size,
    ring_allreduce_s,
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
    assert rb.uplink_messages() == [6, 4, 4] and rb.downlink_messages() == [6, 4, 4]
    # a message takes the busier end's share: machine 0's uplink out, its downlink in
    assert rb.link_delay(0, 4) == pytest.approx(0.12) and rb.link_delay(4, 0) == pytest.approx(0.12)
    assert rb.link_delay(4, 6) == pytest.approx(0.08)
    assert h.link_delay(8, 0) == 0.0  # no node 8 until bound to a parameter server's links
    assert h.has_link_delays and not Heterogeneity.from_spec("random:6", n=8).has_link_delays
    assert Heterogeneity.from_spec("fixed:2@1", n=4).machine_of(1) is None


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("machines:4,0,4@10", "no worker"),
        ("machines:4,4@10+machines:8@1", "only one machines"),
        ("machines:4,4", "needs its @ part"),
        ("machines:4,4@20ms", "milliseconds are a bare number"),
        ("link:5ms@0-1", "milliseconds are a bare number"),
        ("link:5", "link:50@0-1, 50 ms between workers 0 and 1"),
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


@pytest.mark.parametrize("mode", ["ps-bsp", "ps-asp"])
def test_link_delays_are_refused_where_hopbus_cannot_apply_them(mode):
    topo = Topology.named("complete", 8)
    het = Heterogeneity.from_spec("link:50@0-1", 8).bind(topo.graph, topo.name)
    with pytest.raises(ConfigError, match=f"no meaning with --mode {mode}"):
        het.check_mode(Mode(mode))
    for ok in ("standard", "allreduce", mode):  # the server is on a machine of its own
        Heterogeneity.from_spec("machines:4,4@10", 8).bind(
            *links_graph(Mode(ok), topo.graph, topo.name)
        ).check_mode(Mode(ok))
    for spec in ("machines:4,4@10", "link:5@0-1"):  # wagma's groups change every iteration
        with pytest.raises(ConfigError, match="not emulated for --mode wagma"):
            Heterogeneity.from_spec(spec, 8).check_mode(Mode("wagma"))
    Heterogeneity.from_spec("random:6", 8).check_mode(Mode("wagma"))
    Heterogeneity.from_spec("fixed:4@0", 8).check_mode(Mode(mode))  # compute slowdowns apply


def test_a_parameter_servers_link_carries_every_worker_both_ways():
    """Fig. 13's bottleneck: the server (node n) on a machine of its own, whose link every
    worker's push and every reply share; it is never slowed, even with iteration scope."""
    topo = Topology.named("ring-based", 8)
    graph, name = links_graph(Mode("ps-bsp"), topo.graph, topo.name)
    assert sorted(graph.successors(8)) == list(range(8)) and name == "the parameter server's links"
    het = Heterogeneity.from_spec("random:6:1+machines:4,4@0/8Mbit", 8).bind(graph, name)
    assert het.machine_of(8) == 2
    assert het.uplink_messages() == [4, 4, 8] and het.downlink_messages() == [4, 4, 8]
    mb = 1_000_000  # one second on the link alone
    assert het.link_delay(3, 8, mb) == pytest.approx(8.0) == het.link_delay(8, 3, mb)
    assert het.link_delay(0, 1, mb) == 0.0  # same machine (and no edge of the star)
    assert het.factor(8, 5) == 1.0 and het.factor(3, 5) == 6.0
    it = SlowdownScope.ITERATION
    assert message_delay(het, 8, 3, 5, mb, scope=it) == pytest.approx(8.0)
    assert message_delay(het, 3, 8, 5, mb, scope=it) == pytest.approx(48.0)


# -- bandwidths, message sizes and the slowdown scope (issue 18) ---------------------------------


def test_links_take_a_bandwidth_and_charge_by_the_byte():
    assert parse("link:5/1Gbit@0-1") == (LinkDelay(0.005, 0, 1, 8e-9),)
    assert parse("link:0/125MB@0-1") == (LinkDelay(0.0, 0, 1, 8e-9),)  # 1 Gbit/s in bytes
    assert parse("link:0/1Gbps@0-1") == (LinkDelay(0.0, 0, 1, 8e-9),)  # as people write it
    assert parse("machines:2,2@1/100Mbit") == (MachineLinks((2, 2), 0.001, 8e-8),)
    h = Heterogeneity.from_spec("link:2/1Mbit@0-1+link:1/1MB@0-1", n=3)  # two links add up
    assert h.charges_bytes and h.has_link_delays
    assert h.link_delay(1, 0, 1000) == pytest.approx(0.003 + 1000 * (8e-6 + 1e-6))
    assert h.link_delay(0, 2, 1000) == 0.0
    assert not Heterogeneity.from_spec("link:5@0-1", n=2).charges_bytes


def test_a_machines_links_are_shared_by_the_bytes_of_its_edges():
    # ring-based on 8 over 4,2,2: machine 0 has 6 edges out and in, machine 1 four (test above)
    rb = Heterogeneity.from_spec("machines:4,2,2@1/8Mbit", n=8).bind(ring_based(8), "ring-based")
    one_mb = 1_000_000
    assert rb.link_delay(0, 4, one_mb) == pytest.approx(6 * (0.001 + 1.0))
    assert rb.link_delay(4, 0, one_mb) == pytest.approx(6 * (0.001 + 1.0))  # 0's downlink
    assert rb.link_delay(4, 6, one_mb) == pytest.approx(4 * (0.001 + 1.0))
    assert rb.link_delay(0, 1, one_mb) == 0.0  # inside a machine
    bandwidth_only = Heterogeneity.from_spec("machines:4,4@0/1Gbit", n=8)
    assert bandwidth_only.has_link_delays and bandwidth_only.charges_bytes


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("link:5/1gbit@0-1", "bandwidth '1gbit'"),
        ("link:5/@0-1", "bandwidth ''"),
        ("link:5/0Gbit@0-1", "must be above 0"),
        ("link:5/1e400Gbit@0-1", "is not finite: leave out /BW"),
        ("link:5/1e-300Gbit@0-1", "below 1 bit per second"),
        ("link:5/Gbit@0-1", "bandwidth 'Gbit'"),
        ("link:5/1GBps@0-1", "bandwidth '1GBps'"),
        ("machines:4,4@1/10kb", "bandwidth '10kb'"),
        ("machines:4,4@1/", "bandwidth ''"),
        ("link:/1Gbit@0-1", "cannot read"),
    ],
)
def test_bad_bandwidths_are_one_line(bad, why):
    with pytest.raises(SlowdownSpecError, match="bad --slowdown") as err:
        parse(bad)
    assert why in str(err.value) and "\n" not in str(err.value)


@given(
    st.floats(1.0, 1e6, allow_nan=False),
    st.sampled_from(sorted(BANDWIDTH_UNITS)),
    st.integers(0, 10**9),
)
def test_bytes_over_bandwidth_in_any_unit(rate, unit, nbytes):
    (link,) = parse(f"link:0/{rate!r}{unit}@0-1")
    h = Heterogeneity((link,), n=2)
    assert h.link_delay(0, 1, nbytes) == pytest.approx(nbytes / (rate * BANDWIDTH_UNITS[unit]))


@pytest.mark.parametrize(
    ("text", "size"),
    [(0, 0), (2600, 2600), ("2600", 2600), ("36.9MB", 36_900_000), ("1KiB", 1024),
     ("2GB", 2 * 10**9), (1.5e3, 1500), ("1.5kB", 1500)],
)  # fmt: skip
def test_message_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "3q", "1mb", "-1", "1e99", "nan", True, "1e400", "1e300GB"])
def test_bad_message_sizes(bad):
    with pytest.raises(ValueError, match="expected"):
        parse_size(bad)


@pytest.mark.parametrize("bad", ["1.5", "1.5B", 2.5, "1e-400", "1e-7MB", "0.4B"])
def test_a_fraction_of_a_byte_is_refused_not_rounded(bad):
    with pytest.raises(ValueError, match="a unit left out"):
        parse_size(bad)


def test_iteration_scope_stretches_a_slowed_senders_messages():
    h = Heterogeneity.from_spec("fixed:6@0+link:10/1MB@0-1+link:10@1-2", n=3)
    # compute scope: the message takes its link's time whoever sends it
    assert message_delay(h, 0, 1, 5, 1000, base=0.05) == pytest.approx(0.05 + 0.01 + 0.001)
    # iteration scope: all of it (the simulator's latency included) times the sender's factor
    wide = message_delay(h, 0, 1, 5, 1000, scope=SlowdownScope.ITERATION, base=0.05)
    assert wide == pytest.approx(6 * (0.05 + 0.01 + 0.001))
    assert message_delay(h, 1, 0, 5, 1000, scope=SlowdownScope.ITERATION) == pytest.approx(0.011)
    assert message_delay(h, 1, 2, 5, 1000, scope=SlowdownScope.ITERATION) == pytest.approx(0.01)
    assert message_delay(h, 0, 2, 5, scope=SlowdownScope.ITERATION) == 0.0  # no link, no base
    r = Heterogeneity.from_spec("random:4:0.5+link:0/1MB@0-1", n=2, seed=1)
    for k in range(50):  # the factor of the message's own iteration, drawn as for its Compute
        d = message_delay(r, 0, 1, k, 10**6, scope=SlowdownScope.ITERATION)
        assert d == pytest.approx(r.factor(0, k))


def test_a_ring_all_reduce_pays_2_n_minus_1_steps_of_its_slowest_link():
    # 4 workers on 2 machines; the ring 0->1->2->3->0 crosses at 1->2 and 3->0, one message
    # per step on each uplink: a step moves a quarter of 4 MB at 1 Gbit/s, 8 ms
    topo = Topology.named("ring-based", 4)  # the all-reduce ring, whatever --topology says
    ring, name = links_graph(Mode("allreduce"), topo.graph, topo.name)
    assert sorted(ring.edges) == [(0, 1), (1, 2), (2, 3), (3, 0)] and name == "the all-reduce ring"
    assert links_graph(Mode("standard"), topo.graph, topo.name)[0] is topo.graph
    h = Heterogeneity.from_spec("fixed:6@1+machines:2,2@0/1Gbit", 4).bind(ring, name)
    compute = SlowdownScope.COMPUTE
    assert ring_allreduce_s(h, 4, 0, 4_000_000, compute) == pytest.approx(6 * 0.008)
    # iteration scope: worker 1 sends across the boundary 6x slower, and every step waits
    assert ring_allreduce_s(h, 4, 0, 4_000_000, SlowdownScope.ITERATION) == pytest.approx(
        6 * 6 * 0.008
    )
    assert ring_allreduce_s(Heterogeneity.from_spec("fixed:6@1", 4), 4, 0, 10**6, compute) == 0
