"""The theorems, checked on the code the cluster runs: random graphs, modes, speeds, delays.

For every generated run the simulator checks at every iteration change that
* no pair of workers is ever further apart than Table 1 allows (standard: Theorem 1, tokens:
  Theorem 2, staleness: (s+1) x path, notify-ack: min(path, 2 x reverse path));
* TokenQ(j->i).size == Iter(j) - Iter(i) + max_ig on every edge (workers enter iterations
  atomically in the simulator, so "between iterations" is every instant);
* no update store overflows its slots, and with token queues none holds more than
  (1 + max_ig) * |N_in| updates;
after every event that no waiting worker could in fact go on (no missed wake-up); on every Recv
that it took what the mode's rule allows and on every Reduce that the weights are a convex
combination; and at the end that nobody deadlocked: every worker finished every iteration.
"""

import random
from dataclasses import dataclass

import networkx as nx
import pytest
from helpers import Schedule, topology_of
from hypothesis import given, note, settings
from hypothesis import strategies as st

from hopbus.heterogeneity import Heterogeneity
from hopbus.modes import HOP_MODES, Approach, Mode
from hopbus.protocol.effects import Recv, Reduce
from hopbus.protocol.requirements import Fresh, SameIteration
from hopbus.protocol.spec import ProtocolSettings, WorkerSpec
from hopbus.protocol.worker import Loop, worker_loop
from hopbus.sim import Simulation
from hopbus.topology import Topology

pytestmark = pytest.mark.filterwarnings("ignore::hopbus.protocol.spec.ProtocolWarning")


def _strongly_connect(n: int, edges: set[tuple[int, int]], order: list[int]) -> set:
    """Join the strongly connected components of ``edges`` in a cycle, in ``order``."""
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    comps = sorted(nx.strongly_connected_components(g), key=lambda c: order.index(min(c)))
    reps = [min(c) for c in comps]
    if len(reps) > 1:
        edges |= {(reps[k], reps[(k + 1) % len(reps)]) for k in range(len(reps))}
    return edges


@st.composite
def graphs(draw) -> Topology:
    """Random strongly connected digraphs of three families: a Hamiltonian cycle plus extra
    edges; a two-way random tree (stars, paths) plus extra one-way edges; random edges whose
    components are joined in a cycle. Sometimes every edge is made two-way, like the paper's."""
    n = draw(st.integers(2, 9))
    order = draw(st.permutations(range(n)))
    pairs = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda e: e[0] != e[1])
    family = draw(st.sampled_from(["cycle", "tree", "components"]))
    edges: set[tuple[int, int]] = draw(st.sets(pairs, max_size=2 * n))
    if family == "cycle":
        edges |= {(order[k], order[(k + 1) % n]) for k in range(n)}
    elif family == "tree":
        for k in range(1, n):
            parent = order[draw(st.integers(0, k - 1))]
            edges |= {(parent, order[k]), (order[k], parent)}
    else:
        edges = _strongly_connect(n, edges, list(order))
    if draw(st.booleans()):
        edges |= {(b, a) for a, b in edges}
    return topology_of(sorted(edges), family)


@st.composite
def slowdowns(draw, topo: Topology):
    """Either the real --slowdown models, or arbitrary per-worker speeds with random spikes."""
    n, seed = topo.n, draw(st.integers(0, 2**32 - 1))
    links = sorted((a, b) for a, b in topo.graph.edges if a != b)
    if draw(st.booleans()):
        parts = [f"random:{draw(st.sampled_from([2, 6, 20]))}:{draw(st.floats(0, 0.5)):.3f}"]
        if draw(st.booleans()):
            slow = draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=2))
            parts.append(f"fixed:{draw(st.sampled_from([2, 4, 10]))}@{','.join(map(str, slow))}")
        if draw(st.booleans()):
            a, b = draw(st.sampled_from(links))
            parts.append(f"link:{draw(st.integers(0, 3000))}@{a}-{b}")
        spec = "+".join(parts)
        note(f"slowdown={spec}")
        return Heterogeneity.from_spec(spec, n, seed)
    speed = draw(st.lists(st.floats(0.1, 8.0), min_size=n, max_size=n))
    spike, chance = draw(st.floats(1.0, 100.0)), draw(st.floats(0.0, 0.5))
    rng = random.Random(seed)
    factors = [
        [speed[w] * (spike if rng.random() < chance else 1.0) for _ in range(40)] for w in range(n)
    ]
    delays = draw(st.dictionaries(st.sampled_from(links), st.floats(0.0, 5.0), max_size=3))
    return Schedule(lambda w, k: factors[w][k], delays)


@dataclass
class Scenario:
    topo: Topology
    settings: ProtocolSettings
    slowdown: object
    latency: float
    jitter: float
    seed: int

    def simulation(self, **kw) -> Simulation:
        return Simulation(
            self.topo,
            self.settings,
            self.slowdown,
            compute_time=1.0,
            latency=self.latency,
            jitter=self.jitter,
            seed=self.seed,
            **kw,
        )


@st.composite
def scenarios(draw) -> Scenario:
    topo = draw(graphs())
    mode = draw(st.sampled_from(HOP_MODES))
    if draw(st.booleans()):  # one N_buw per worker (Fig. 8 allows it), each below its in-degree
        backup = tuple(draw(st.integers(0, topo.in_degree(i) - 1)) for i in range(topo.n))
    else:
        backup = draw(st.integers(0, min(topo.in_degree(i) for i in range(topo.n)) - 1))
    max_ig = draw(st.integers(1 if mode.uses_backup else 0, 6))
    settings = ProtocolSettings(
        mode=mode,
        iterations=draw(st.integers(1, 30)),
        backup=backup,
        staleness=draw(st.integers(0, 6)),
        max_ig=max_ig,
        skip_max=draw(st.sampled_from([0, 2, 3, 6, 12])) if max_ig else 0,
        skip_trigger=draw(st.integers(0, 3)),
        approach=draw(st.sampled_from(list(Approach))),
        send_check=draw(st.booleans()),
    )
    note(f"edges={sorted(e for e in topo.graph.edges if e[0] != e[1])} settings={settings}")
    return Scenario(
        topo,
        settings,
        draw(slowdowns(topo)),
        latency=draw(st.floats(0.0, 3.0)),
        jitter=draw(st.sampled_from([0.0, 0.5, 2.0])),
        seed=draw(st.integers(0, 99)),
    )


def checked_loop(spec: WorkerSpec) -> Loop:
    """``worker_loop``, with what every Recv took and every Reduce's weights checked."""
    gen, value = worker_loop(spec), None
    all_of_them = spec.settings.mode in (Mode.STANDARD, Mode.NOTIFY_ACK)
    while True:
        try:
            eff = gen.send(value)
        except StopIteration:
            return
        value = yield eff
        if isinstance(eff, Recv) and isinstance(eff.requirement, SameIteration | Fresh):
            req, srcs = eff.requirement, [u.src for u in value]
            assert len(set(srcs)) == len(srcs) and set(srcs) <= set(req.sources)
            if isinstance(req, SameIteration):
                assert all(u.iteration == req.iteration for u in value)
                assert len(value) >= req.need
                assert not all_of_them or set(srcs) == set(req.sources)
            else:
                assert all(u.iteration >= req.oldest for u in value)
        elif isinstance(eff, Reduce):
            weights = [eff.self_weight] + [w for _, w in eff.terms]
            assert min(weights) >= 0 and sum(weights) == pytest.approx(1.0)


@settings(max_examples=400)
@given(scenarios())
def test_every_run_finishes_within_every_bound(sc):
    sim = sc.simulation(loop=checked_loop, audit=True)
    r = sim.run()
    assert r.finished, f"deadlock: {r.blocked}"
    assert r.stats.iterations == [sc.settings.iterations] * sc.topo.n
    assert r.monitor.violations == 0, r.monitor.first_violation
    assert r.counters["token_invariant_violations"] == 0
    assert r.counters["store_overflow"] == 0
    assert r.counters["store_bound_exceeded"] == 0
    for peak, bound in zip(r.store_peak, r.store_bound, strict=True):
        assert bound is None or peak <= bound
    t1 = r.monitor.table1
    assert t1["adjacent"] is None or r.monitor.max_adjacent <= t1["adjacent"]
    assert t1["any_pair"] is None or r.monitor.max_any <= t1["any_pair"]


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
