"""Test helpers: scripted slowdowns, a one-call simulation runner, and the skip of a test file
whose extra (TensorFlow, PyTorch) is not installed."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable

import networkx as nx
import pytest

from hopbus.modes import Mode
from hopbus.protocol.spec import ProtocolSettings
from hopbus.sim import SimResult, Simulation
from hopbus.topology import Topology, from_edge_lines


def needs(module: str, reason: str) -> pytest.MarkDecorator:
    """Skip unless ``module`` is installed, found without importing it: pytest's collection in
    every pytest-xdist process imports each test file, and a file that runs TensorFlow or
    PyTorch in its workers (or imports it in the tests that run) should not make each of them
    import it first."""
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=reason)


class Schedule:
    """A slowdown model from a function: ``factor(worker, iteration)`` compute-time multipliers,
    ``delays[(src, dst)]`` extra seconds per link."""

    def __init__(
        self,
        factor: Callable[[int, int], float] = lambda w, k: 1.0,
        delays: dict[tuple[int, int], float] | None = None,
    ) -> None:
        self._factor = factor
        self._delays = delays or {}

    def factor(self, worker: int, iteration: int) -> float:
        return self._factor(worker, iteration)

    def link_delay(self, src: int, dst: int, nbytes: int = 0) -> float:
        return self._delays.get((src, dst), 0.0)

    @property
    def has_link_delays(self) -> bool:
        return bool(self._delays)


FROZEN = 1e9  # a compute-time factor that never finishes within a test's horizon


def frozen_from(worker: int, iteration: int) -> Callable[[int, int], float]:
    """``worker`` computes normally before ``iteration`` and never finishes it."""
    return lambda w, k: FROZEN if w == worker and k >= iteration else 1.0


def topology_of(edges: Iterable[tuple[int, int]], name: str = "test") -> Topology:
    return Topology(from_edge_lines([f"{a} {b}" for a, b in edges]), name=name)


def graph_topology(g: nx.DiGraph, name: str = "test") -> Topology:
    return topology_of(g.edges, name)


def simulate(
    topo: Topology,
    *,
    mode: Mode | str = Mode.STANDARD,
    schedule: Schedule | None = None,
    until: float | None = None,
    latency: float = 0.0,
    compute_time: float = 1.0,
    jitter: float = 0.0,
    seed: int = 0,
    **settings,
) -> tuple[Simulation, SimResult]:
    s = ProtocolSettings(mode=Mode(mode), **settings)
    sim = Simulation(
        topo,
        s,
        schedule or Schedule(),
        compute_time=compute_time,
        latency=latency,
        jitter=jitter,
        seed=seed,
    )
    return sim, sim.run(until=until)


def complete3() -> Topology:
    """Fig. 3: three workers, each with edges to and from the other two."""
    return topology_of([(a, b) for a in range(3) for b in range(3) if a != b], "complete3")
