"""The parameter-server schemes in virtual time: the same ``hopbus.baselines.ps`` cores the
``hopbus ps`` process runs, driven by a discrete-event loop.

A worker computes for ``compute_time`` x its slowdown factor, its push reaches the server
``latency`` later plus what the emulated links charge its bytes (``message_bytes``; all of it
times that factor with ``iteration`` scope: ``message_delay``), the server decides at once (it
timestamps the push with the virtual clock, as the real one does with its own), and a reply
reaches the worker as much later by the same rule (the server is never slowed; with
``machines:`` it sits on a machine of its own: ``heterogeneity.links_graph``). Gaps and
iteration times are measured by the same GapMonitor and RunStats as every other run.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any

from hopbus.baselines.ps import make_core
from hopbus.baselines.spec import SchemeSettings
from hopbus.gaps import GapMonitor
from hopbus.heterogeneity import SlowdownModel, SlowdownScope, message_delay
from hopbus.sim.engine import Blocked, SimResult
from hopbus.summary import RunStats
from hopbus.topology import GapSetting, Topology

_PUSH, _REPLY = 0, 1


class PSSimulation:
    """One ps-* run in virtual time; the same interface as ``Simulation``."""

    def __init__(
        self,
        topology: Topology,
        settings: SchemeSettings,
        gap_setting: GapSetting,
        heterogeneity: SlowdownModel,
        *,
        compute_time: float = 1.0,
        latency: float = 0.05,
        scope: SlowdownScope = SlowdownScope.COMPUTE,
        message_bytes: int = 0,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.topology = topology
        self.scope = scope
        self.settings = settings
        self.het = heterogeneity
        self.compute_time = compute_time
        self.latency = latency
        self.message_bytes = message_bytes
        self.on_progress = on_progress
        self.core = make_core(settings)
        self.monitor = GapMonitor(topology, gap_setting)
        self.stats = RunStats(topology.n)

    def _delay(self, src: int, dst: int, iteration: int) -> float:
        return message_delay(
            self.het, src, dst, iteration, self.message_bytes, scope=self.scope, base=self.latency
        )

    def run(
        self, until: float | None = None, progress: Callable[[float], None] | None = None
    ) -> SimResult:
        started = time.perf_counter()
        n, total = self.topology.n, self.settings.iterations
        it, tag = [0] * n, [0] * n
        version = 0
        pushed_at = [0.0] * n  # when each worker's current wait began (its push left)
        computed = [0.0] * n
        heap: list[tuple[float, int, int, int, int, int]] = []
        seq = 0

        def compute(w: int, now: float) -> None:
            nonlocal seq
            dur = self.compute_time * self.het.factor(w, it[w])
            computed[w] = dur
            pushed_at[w] = now + dur
            seq += 1
            push = self._delay(w, n, it[w])
            heapq.heappush(heap, (now + dur + push, seq, _PUSH, w, 0, 0))

        for w in range(n):
            compute(w, 0.0)
        now, stopped_at, finished_at = 0.0, None, [None] * n
        while heap:
            if until is not None and heap[0][0] > until:
                stopped_at = now = until
                break
            now, _, kind, w, nxt, ver = heapq.heappop(heap)
            if kind == _PUSH:
                d = self.core.push(w, it[w], tag[w], now)
                if d.apply:
                    version += 1
                for v, to in d.release:
                    seq += 1
                    at = now + self._delay(n, v, to)
                    heapq.heappush(heap, (at, seq, _REPLY, v, to, version))
                continue
            moved = nxt - it[w]
            it[w], tag[w] = nxt, ver
            if moved > 0:
                self.monitor.enter(w, nxt)
                self.stats.enter(w, nxt, now)
                if self.on_progress is not None:
                    self.on_progress(
                        {
                            "t": now,
                            "worker": w,
                            "iter": nxt,
                            "jump": moved if moved > 1 else 0,
                            "compute_s": computed[w],
                            "wait_s": now - pushed_at[w],
                            "blocked_on": [n],
                        }
                    )
            if nxt < total:
                compute(w, now)
            else:
                finished_at[w] = now
        if progress is not None:
            progress(sum(it) / (n * total))
        done = all(t is not None for t in finished_at)
        blocked = [
            Blocked(w, it[w], "parameters", (n,)) for w in range(n) if finished_at[w] is None
        ]
        counters = {
            "messages": 0,
            "sends_skipped": 0,
            "acks": 0,
            "token_invariant_violations": 0,
            "stale_dropped": 0,
            "duplicates": 0,
            "store_overflow": 0,
            "store_bound_exceeded": 0,
        }
        return SimResult(
            workers=n,
            virtual_s=max(t for t in finished_at if t is not None) if done else now,
            runtime_s=time.perf_counter() - started,
            finished=done,
            stopped_at=stopped_at,
            stats=self.stats,
            monitor=self.monitor,
            blocked=blocked,
            counters=counters,
            store_peak=[0] * n,
            store_bound=[None] * n,
            message_bytes=self.message_bytes or None,
            scheme={
                "mode": str(self.settings.mode),
                "family": "ps",
                "counters": self.core.counters.report(),
            },
        )
