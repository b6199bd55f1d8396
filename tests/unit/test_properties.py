"""The theorems, checked on the code the cluster runs: random graphs, modes, speeds, delays.

For every generated run the simulator checks at every iteration change that
* no pair of workers is ever further apart than Table 1 allows (standard: Theorem 1, tokens:
  Theorem 2, staleness: (s+1) x path, notify-ack: min(path, 2 x reverse path));
* TokenQ(j->i).size == Iter(j) - Iter(i) + max_ig on every edge (workers enter iterations
  atomically in the simulator, so "between iterations" is every instant);
* no update store overflows its slots, and with token queues none holds more than
  (1 + max_ig) * |N_in| updates;
and at the end that nobody deadlocked: every worker finished every iteration.
"""

import random

import pytest
from helpers import Schedule, topology_of
from hypothesis import given, note
from hypothesis import strategies as st

from hopbus.modes import Approach, Mode
from hopbus.protocol.spec import ProtocolSettings
from hopbus.sim import Simulation

pytestmark = pytest.mark.filterwarnings("ignore::hopbus.protocol.spec.ProtocolWarning")


@st.composite
def graphs(draw):
    """Random strongly connected digraphs: a random Hamiltonian cycle plus random extra edges,
    sometimes made bidirectional (like the paper's graphs), sometimes left directed."""
    n = draw(st.integers(2, 7))
    order = draw(st.permutations(range(n)))
    edges = {(order[k], order[(k + 1) % n]) for k in range(n)}
    pairs = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda e: e[0] != e[1])
    edges |= draw(st.sets(pairs, max_size=2 * n))
    if draw(st.booleans()):
        edges |= {(b, a) for a, b in edges}
    return topology_of(sorted(edges), "random")


@st.composite
def runs(draw):
    topo = draw(graphs())
    mode = draw(st.sampled_from(list(Mode)))
    min_in = min(topo.in_degree(i) for i in range(topo.n))
    max_ig = draw(st.integers(1 if mode.uses_backup else 0, 4))
    if draw(st.booleans()):  # one N_buw per worker (Fig. 8 allows it), each below its in-degree
        backup = tuple(draw(st.integers(0, topo.in_degree(i) - 1)) for i in range(topo.n))
    else:
        backup = draw(st.integers(0, min_in - 1))
    settings = ProtocolSettings(
        mode=mode,
        iterations=draw(st.integers(1, 25)),
        backup=backup,
        staleness=draw(st.integers(0, 4)),
        max_ig=max_ig,
        skip_max=draw(st.sampled_from([0, 2, 3, 6])) if max_ig else 0,
        skip_trigger=draw(st.integers(0, 3)),
        approach=draw(st.sampled_from(list(Approach))),
        send_check=draw(st.booleans()),
    )
    n, seed = topo.n, draw(st.integers(0, 2**32 - 1))
    speed = draw(st.lists(st.floats(0.1, 8.0), min_size=n, max_size=n))
    spike = draw(st.floats(1.0, 20.0))
    chance = draw(st.floats(0.0, 0.5))
    rng = random.Random(seed)
    factors = [
        [speed[w] * (spike if rng.random() < chance else 1.0) for _ in range(30)] for w in range(n)
    ]
    slow_links = draw(
        st.dictionaries(st.sampled_from(sorted(topo.graph.edges)), st.floats(0.0, 5.0), max_size=3)
    )
    schedule = Schedule(
        lambda w, k: factors[w][k], {e: d for e, d in slow_links.items() if e[0] != e[1]}
    )
    sim = Simulation(
        topo,
        settings,
        schedule,
        compute_time=1.0,
        latency=draw(st.floats(0.0, 3.0)),
        jitter=draw(st.floats(0.0, 2.0)),
        seed=seed,
    )
    note(f"edges={sorted(e for e in topo.graph.edges if e[0] != e[1])} settings={settings}")
    return sim


@given(runs())
def test_every_run_finishes_within_every_bound(sim):
    r = sim.run()
    assert r.finished, f"deadlock: {r.blocked}"
    assert r.stats.iterations == [sim.settings.iterations] * sim.topology.n
    assert r.monitor.violations == 0, r.monitor.first_violation
    assert r.counters["token_invariant_violations"] == 0
    assert r.counters["store_overflow"] == 0
    assert r.counters["store_bound_exceeded"] == 0
    for peak, bound in zip(r.store_peak, r.store_bound, strict=True):
        assert bound is None or peak <= bound
    assert r.monitor.max_any <= sim.topology.n * max(sim.settings.iterations, 1)


@given(runs())
def test_gaps_stay_within_the_table1_summary_bounds(sim):
    r = sim.run()
    t1 = r.monitor.table1
    if t1["adjacent"] is not None:
        assert r.monitor.max_adjacent <= t1["adjacent"]
    if t1["any_pair"] is not None:
        assert r.monitor.max_any <= t1["any_pair"]


def test_jump_never_outruns_what_in_neighbours_can_send():
    """A directed graph where the straggler's only out-neighbour can be 3 ahead although
    max_ig = 1: 0 -> 1 -> 2 -> 3 -> 0 plus 2 -> 1, worker 1 with one backup. Jumping the full
    3 would make worker 0 wait in Recv(k-1) for worker 3, which needs a token from worker 0
    to get there: a deadlock. Jumps are capped at max_ig, so the run finishes."""
    topo = topology_of([(0, 1), (1, 2), (2, 3), (3, 0), (2, 1)])
    settings = ProtocolSettings(
        mode=Mode.BACKUP, backup=(0, 1, 0, 0), max_ig=1, skip_max=3, skip_trigger=0, iterations=40
    )
    r = Simulation(
        topo, settings, Schedule(lambda w, k: 10.0 if w == 0 else 1.0), latency=0.0
    ).run()
    assert r.finished, r.blocked
    assert r.monitor.violations == 0
