"""The paper's heterogeneity experiments (Sec. 7.3.1, 7.3.3-7.3.5) in the simulator.

16 workers, as in the paper. Random slowdown: each worker is 6x slower in an iteration with
probability 1/16; deterministic: worker 0 is 4x slower every iteration. Then the random slowdown
again under both --slowdown-scope values, with short messages and with messages as long as a
Compute, in both approaches. Every ratio is between
runs of this one invocation (virtual time, so it is also exactly repeatable). Prints JSON.

    python benchmarks/paper_sim.py [--iterations 1000] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics

from hopbus.config import make_config
from hopbus.sim import simulate


def mean_iter(seeds: int, **kw) -> float:
    times = []
    for seed in range(seeds):
        _, result, s = simulate(make_config({"workers": 16, "seed": seed, **kw}))
        assert result.finished and s["violations"] == 0, s
        times.append(s["iter_time_s"]["mean"])
    return statistics.fmean(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    common = {"iterations": a.iterations}
    out: dict = {
        "workers": 16,
        "iterations": a.iterations,
        "seeds": a.seeds,
        "unit": "mean virtual seconds per iteration (compute 1.0, latency 0.05)",
    }

    random_rows = {}
    for topo in ("ring", "ring-based", "double-ring"):
        r = {"no slowdown": mean_iter(1, topology=topo, slowdown="none", **common)}
        for name, kw in [
            ("standard", {"mode": "standard"}),
            ("backup (1)", {"mode": "backup", "backup": 1}),
            ("staleness (s=5)", {"mode": "staleness", "staleness": 5}),
            ("hybrid", {"mode": "hybrid", "backup": 1, "staleness": 5}),
        ]:
            r[name] = mean_iter(a.seeds, topology=topo, slowdown="random:6", **kw, **common)
        r["speedup vs standard"] = {
            k: round(r["standard"] / v, 3)
            for k, v in r.items()
            if k not in ("standard", "no slowdown")
        }
        random_rows[topo] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
    out["random_slowdown_6x_p1_16"] = random_rows

    det = {"no slowdown": mean_iter(1, slowdown="none", **common)}
    for name, kw in [
        ("standard", {"mode": "standard"}),
        ("backup (1)", {"mode": "backup"}),
        ("skip <=2", {"mode": "backup", "skip_max": 2, "max_ig": 10}),
        ("skip <=10", {"mode": "backup", "skip_max": 10, "max_ig": 10}),
    ]:
        det[name] = mean_iter(1, slowdown="fixed:4@0", **kw, **common)
    det["slowdown vs no slowdown"] = {
        k: round(v / det["no slowdown"], 3) for k, v in det.items() if k != "no slowdown"
    }
    out["deterministic_slowdown_4x_worker_0_ring_based"] = {
        k: (round(v, 4) if isinstance(v, float) else v) for k, v in det.items()
    }
    out["random_slowdown_6x_by_scope_ring_based"] = by_scope(a.seeds, common)
    print(json.dumps(out, indent=2))


def by_scope(seeds: int, common: dict) -> dict:
    """Random 6x slowdown on the ring-based graph with max_ig 10, --slowdown-scope compute
    (only a slowed worker's Compute) and iteration (its messages too), with messages of the
    default 0.05 s and of 1.0 s (as long as a Compute, like VGG-11's 37 MB on 1 Gbit/s), in
    both approaches. The goal beside each: the paper's 1.81x for backup workers."""
    rows = {}
    for latency in (0.05, 1.0):
        for approach in ("parallel", "serial"):
            for scope in ("compute", "iteration"):
                kw = {"latency": latency, "approach": approach, "max_ig": 10, **common}
                none = mean_iter(1, slowdown="none", **kw)
                r = {"no slowdown": none}
                for name, mode in [
                    ("standard", {"mode": "standard"}),
                    ("backup (1)", {"mode": "backup", "backup": 1}),
                    ("staleness (s=5)", {"mode": "staleness", "staleness": 5}),
                ]:
                    r[name] = mean_iter(
                        seeds, slowdown="random:6", slowdown_scope=scope, **mode, **kw
                    )
                rows[f"latency {latency}, {approach}, {scope}"] = {
                    **{k: round(v, 4) for k, v in r.items()},
                    "standard vs no slowdown": round(r["standard"] / none, 3),
                    "speedup vs standard": {
                        k: round(r["standard"] / r[k], 3) for k in ("backup (1)", "staleness (s=5)")
                    },
                    "paper's backup speedup": 1.81,
                }
    return rows


if __name__ == "__main__":
    main()
