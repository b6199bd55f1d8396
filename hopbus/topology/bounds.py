"""Table 1: how far ahead of worker j worker i can ever be, for every protocol setting.

Every row of Table 1 is the combination of two per-hop limits:

* forward (Theorem 1 and its variants): a worker needs its in-neighbours' updates, so along a
  path j -> ... -> i each hop lets i be at most ``b0`` ahead: 1 for standard and notify-ack,
  s+1 for bounded staleness, unlimited for backup workers and hybrid;
* backward (Theorem 2): token queues stop a worker from being more than ``max_ig`` ahead of an
  out-neighbour; notify-ack's ACKs do the same with 2.

So ``Iter(i) - Iter(j) <= min(b0 * length(Path_{j->i}), back * length(Path_{i->j}))``, which is
the last column of Table 1, and the two adjacent-pair columns are the cases with a path of length
1. Skipping iterations (Sec. 5) keeps every bound: a jump takes its tokens and does Recv(k-1)
first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hopbus.modes import HOP_MODES, Mode
from hopbus.topology.analysis import PathFacts, largest_bound

INF = math.inf


@dataclass(frozen=True)
class GapSetting:
    """The protocol settings Table 1 depends on. ``max_ig == 0`` means no token queues.

    The related schemes run on a complete graph (everyone depends on everyone, through the
    parameter server, the global average or the all-reduce), so their bound is ``forward`` for
    every pair: ps-bsp and allreduce 1 (lock-step: nobody enters k + 2 before everyone's
    gradient of k + 1 went into the sum), ps-ssp ``staleness + 1`` (a worker waits at the
    bound *after* its push, still counted in its last iteration), wagma ``period`` (the global
    average every tau iterations); ps-asp, ps-backup and ps-elastic have none.
    """

    mode: Mode
    staleness: int = 0
    max_ig: int = 0
    period: int = 0  # wagma's sync period tau

    @property
    def forward(self) -> float:
        """b0: how far a worker may be ahead of an in-neighbour whose updates it needs."""
        if self.mode in (Mode.STANDARD, Mode.NOTIFY_ACK, Mode.PS_BSP, Mode.ALLREDUCE):
            return 1
        if self.mode in (Mode.STALENESS, Mode.PS_SSP):
            return self.staleness + 1
        if self.mode is Mode.WAGMA:
            return self.period
        return INF  # backup, hybrid: any particular in-neighbour may be left behind for good

    @property
    def backward(self) -> float:
        """How far a worker may be ahead of an out-neighbour (tokens, or notify-ack's ACKs)."""
        limit = 2 if self.mode is Mode.NOTIFY_ACK else INF
        if self.max_ig > 0:
            limit = min(limit, self.max_ig)
        return limit

    @property
    def label(self) -> str:
        base = str(self.mode)
        if self.mode.uses_staleness or self.mode is Mode.PS_SSP:
            base += f"(s={self.staleness})"
        if self.mode is Mode.WAGMA:
            base += f"(tau={self.period})"
        return base + (f"+tokens(max_ig={self.max_ig})" if self.max_ig else "")


def bound_matrix(setting: GapSetting, dist: np.ndarray) -> np.ndarray:
    """``B[i, j]`` = bound on Iter(i) - Iter(j) for every pair; float, ``inf`` where unbounded.

    ``dist[i, j]`` is length(Path_{i->j}) for a strongly connected graph.
    """
    d = dist.astype(np.float32)  # exact for any bound below 2**24; half the memory of float64
    with np.errstate(invalid="ignore"):  # inf * 0 on the diagonal, overwritten below
        b = d.T * np.float32(setting.forward)
        d *= np.float32(setting.backward)
        np.minimum(b, d, out=b)
    np.fill_diagonal(b, 0.0)
    return b


def neighbour_bound(setting: GapSetting, to_j: int, to_i: int) -> float:
    """The bound on Iter(i) - Iter(j) given length(Path i->j) and length(Path j->i): one entry
    of ``bound_matrix``."""
    return min(setting.forward * to_i, setting.backward * to_j)


def _finite(bound: float) -> int | None:
    return None if math.isinf(bound) else int(bound)


def table1(setting: GapSetting, paths: PathFacts) -> dict[str, float | None]:
    """The three columns of Table 1 maximised over the graph; None where the paper says infinity.

    ``in_neighbour``: Iter(i) - Iter(j) for j in N_in(i), at most min(b0, back x the way back
    from i to j), largest for the longest way back; ``out_neighbour``: for j in N_out(i);
    ``adjacent``: either; ``any_pair``: any i != j, the largest ``bound_matrix`` entry.
    ``paths``: the graph's ``analysis.PathFacts`` (no n x n matrix is needed)."""
    f, b, back = setting.forward, setting.backward, paths.max_return
    into = neighbour_bound(setting, back, 1)
    out = neighbour_bound(setting, 1, back)
    return table1_columns(into, out, largest_bound(f, b, paths.pairs))


def table1_columns(into: float, out: float, any_pair: float) -> dict[str, float | None]:
    """Table 1's columns as hopbus reports them, from the largest bound over in-neighbour
    pairs, out-neighbour pairs and any pair: None where it is infinite."""
    return {
        "in_neighbour": _finite(into),
        "out_neighbour": _finite(out),
        "adjacent": _finite(max(into, out)),
        "any_pair": _finite(any_pair),
    }


def token_queue_capacity(max_ig: int, path_i_to_j: int) -> int:
    """Most tokens TokenQ(i->j) can hold: max_ig * (length(Path_{i->j}) + 1) (Table 1 note)."""
    return max_ig * (path_i_to_j + 1)


def report_settings(staleness: int, max_ig: int) -> list[GapSetting]:
    """Every row of Table 1, as the ``hopbus topology`` report lists them."""
    rows = [GapSetting(m, staleness=staleness) for m in HOP_MODES]
    if max_ig > 0:
        rows += [
            GapSetting(m, staleness=staleness, max_ig=max_ig)
            for m in (Mode.STANDARD, Mode.STALENESS, Mode.BACKUP, Mode.HYBRID)
        ]
    return rows
