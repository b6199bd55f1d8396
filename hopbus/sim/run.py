"""Run a RunConfig in the simulator and report the summary object."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hopbus.config import RunConfig
from hopbus.errors import ConfigError
from hopbus.heterogeneity import Heterogeneity
from hopbus.modes import HOP_MODES, Family
from hopbus.sim.engine import SimResult, Simulation
from hopbus.sim.ps import PSSimulation
from hopbus.sim.size import snapshot_bytes
from hopbus.summary import progress_summary
from hopbus.topology import Topology

CLUSTER_ONLY = (Family.WAGMA, Family.ALLREDUCE)  # schemes without a virtual-time driver here


def prepare(
    cfg: RunConfig,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[RunConfig, Simulation]:
    """Build and validate everything a simulation needs; raises UserError on bad input."""
    if cfg.mode.family in CLUSTER_ONLY:
        raise ConfigError(
            f"--mode {cfg.mode} runs on the cluster only (hopbus train); hopbus sim simulates "
            f"Hop's modes ({', '.join(HOP_MODES)}) and the parameter server's (ps-*)"
        )
    cfg, topo = cfg.build_topology()
    het = Heterogeneity.for_run(cfg.slowdown, cfg.mode, topo.graph, topo.name, cfg.seed)
    if cfg.mode.family is Family.PS:
        ps = PSSimulation(
            topo,
            cfg.scheme_settings(),
            cfg.gap_setting(),
            het,
            compute_time=cfg.compute_time,
            latency=cfg.latency,
            scope=cfg.slowdown_scope,
            message_bytes=charged_bytes(cfg, het),
            on_progress=on_progress,
        )
        return cfg, ps  # type: ignore[return-value]
    sim = Simulation(
        topo,
        cfg.protocol_settings(),
        het,
        compute_time=cfg.compute_time,
        latency=cfg.latency,
        jitter=cfg.jitter,
        seed=cfg.seed,
        scope=cfg.slowdown_scope,
        message_bytes=charged_bytes(cfg, het),
        on_progress=on_progress,
    )
    return cfg, sim


def charged_bytes(cfg: RunConfig, het: Heterogeneity) -> int:
    """What an update is charged on the run's links: its snapshot's bytes, when some link has
    a bandwidth; 0 otherwise (its size then changes nothing, and is not worked out)."""
    return snapshot_bytes(cfg) if het.charges_bytes else 0


def summarize(cfg: RunConfig, topo: Topology, result: SimResult) -> dict[str, Any]:
    """The summary object of ``hopbus sim --json`` (see docs/summary.md)."""
    c = result.counters
    bounds = [b for b in result.store_bound if b is not None]
    return {
        "config": cfg.public(),
        "workers": result.workers,
        "virtual": True,
        "wall_s": result.virtual_s,
        "finished": result.finished,
        "deadlocked": result.deadlocked,
        **progress_summary(result.stats, result.monitor),
        "stale_dropped": c["stale_dropped"],
        "max_update_queue": max(result.store_peak),
        "update_queue_bound": max(bounds) if bounds else None,
        "messages": c["messages"],
        "message_bytes": result.message_bytes,
        "sends_skipped": c["sends_skipped"],
        "acks": c["acks"],
        "checks": {
            "token_invariant_violations": c["token_invariant_violations"],
            "store_overflow": c["store_overflow"],
            "store_bound_exceeded": c["store_bound_exceeded"],
            "duplicates": c["duplicates"],
        },
        "blocked": [
            {
                "worker": b.worker,
                "iteration": b.iteration,
                "waiting_for": b.waiting_for,
                "on": list(b.on),
            }
            for b in result.blocked
        ],
        "topology": topo.brief,
        "runtime_s": result.runtime_s,
        "scheme": result.scheme
        or {
            "mode": str(cfg.mode),
            "family": "hop",
            "counters": {"stale_dropped": c["stale_dropped"], "sends_skipped": c["sends_skipped"]},
        },
    }


def simulate(
    cfg: RunConfig,
    until: float | None = None,
    progress: Callable[[float], None] | None = None,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[RunConfig, SimResult, dict[str, Any]]:
    """Prepare, run and summarise; returns the resolved config, raw result and summary."""
    cfg, sim = prepare(cfg, on_progress)
    result = sim.run(until=until, progress=progress)
    return cfg, result, summarize(cfg, sim.topology, result)
