"""Everything ``hopbus topology`` reports about a graph, as one JSON-ready dict."""

from __future__ import annotations

from typing import Any

from hopbus.topology.bounds import report_settings
from hopbus.topology.core import Topology


def topology_report(topo: Topology, staleness: int, max_ig: int) -> dict[str, Any]:
    """Neighbours, W (its non-zero entries ``[i, j, W_ij]``: the share of i in j's average),
    spectral gap (None for very large graphs), diameter and the Table 1 bounds of every setting
    (None where the paper says infinity; rows with tokens only if ``max_ig`` >= 1)."""
    return {
        "name": topo.name,
        "workers": topo.n,
        "edges": sum(len(o) for o in topo.out_peers),
        "neighbours": [
            {"worker": i, "in": list(topo.in_peers[i]), "out": list(topo.out_peers[i])}
            for i in range(topo.n)
        ],
        "W": [[i, j, round(float(topo.weight(i, j)), 12)] for i, j in sorted(topo.graph.edges)],
        "doubly_stochastic": topo.doubly_stochastic,
        "spectral_gap": topo.spectral_gap,
        "diameter": topo.diameter,
        "bounds": [
            {
                "setting": s.label,
                "mode": str(s.mode),
                "staleness": s.staleness if s.mode.uses_staleness else None,
                "max_ig": s.max_ig or None,
                **topo.table1(s),
            }
            for s in report_settings(staleness, max_ig)
        ],
    }
