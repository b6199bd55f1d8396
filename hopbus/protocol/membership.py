"""Who is still in the run: the rules for going on without a dead worker (Sec. 3.4).

A worker is *dead* once its heartbeat is gone without a final result (it crashed, was killed, or
lost its network). These rules decide, from the settings and the graph alone, whether the live
workers can keep training without the dead ones, and what then binds them:

* Recv: with backup workers (``backup``, ``hybrid``) worker i waits for |N_in(i)| - N_buw(i)
  updates, so it can lose up to N_buw(i) in-neighbours for good (the paper's claim: tolerate up
  to the number of backups). ``standard``, ``notify-ack`` and ``staleness`` wait for every
  in-neighbour, so any dead in-neighbour ends the run.
* Tokens: a dead worker's token queues stop binding the others. Its out-neighbours no longer put
  tokens for it, and its in-neighbours no longer take tokens from it (or they would stop
  max_ig iterations after it died). Every edge between live workers keeps its token queue and
  its invariant, so Table 1 still holds between live workers, with distances measured in the
  graph without the dead ones (``bounds_without``): a pair with no live path left is no longer
  bounded.

* Rejoining (``rejoin_iteration``): a replacement for a dead worker enters at an iteration k
  taken from an update one of its in-neighbours sent it, chosen so that every token queue it
  rebuilds (``max_ig + Iter(owner) - Iter(taker)``) is non-negative and enough in-neighbours
  will send it an update of k. Non-negative queues on its edges mean Table 1 of the *whole*
  graph holds again from the moment it is back: no pair is suddenly over its bound.

Pure: no I/O. The runtime (and ``hopbus train``'s launcher) call these with the dead set kept in
Redis.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import numpy as np

from hopbus.protocol.spec import ProtocolSettings
from hopbus.topology import GapSetting, Topology
from hopbus.topology.bounds import bound_matrix


def survivable(settings: ProtocolSettings, topo: Topology, dead: Collection[int]) -> str | None:
    """None if the live workers can go on without ``dead``; otherwise why they cannot (one
    clause, to follow "worker J died: ")."""
    dead = set(dead)
    if not dead:
        return None
    if len(dead) >= topo.n:
        return "no worker is left"
    if not settings.mode.uses_backup:
        return (
            f"--mode {settings.mode} cannot go on without a worker (backup and hybrid can, "
            "up to --backup dead in-neighbours per worker)"
        )
    for i in range(topo.n):
        if i in dead:
            continue
        lost = sorted(dead.intersection(topo.in_peers[i]))
        if len(lost) > settings.backup_of(i):
            return (
                f"worker {i} lost {len(lost)} in-neighbours ({', '.join(map(str, lost))}) but "
                f"has --backup {settings.backup_of(i)}"
            )
    return None


def live(peers: Iterable[int], dead: Collection[int]) -> tuple[int, ...]:
    """``peers`` without the dead ones, in order."""
    return tuple(p for p in peers if p not in dead)


BOUNDS_WITHOUT_LIMIT = 2000
"""``bounds_without`` is an n x n matrix (16 MB, well under a second at 2,000 workers): above
this many workers a reader holds the live workers to the whole graph's bounds instead (the
run's own check needs no matrix: ``gaps.GapMonitor.remove``)."""


def bounds_without(topo: Topology, setting: GapSetting, dead: Collection[int]) -> np.ndarray:
    """Table 1's per-pair bounds between the live workers, in the graph without ``dead``
    (``inf`` for pairs with a dead worker or with no live path left). An n x n matrix: for
    graphs of ``BOUNDS_WITHOUT_LIMIT`` workers at most."""
    if not dead:
        return topo.bounds(setting)
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import shortest_path

    n = topo.n
    edges = [(u, v) for u, v in topo.graph.edges if u != v and u not in dead and v not in dead]
    src, dst = np.array(edges, dtype=np.int64).reshape(-1, 2).T  # (0, 2) when none is left
    adjacency = csr_array((np.ones(len(src), np.int8), (src, dst)), shape=(n, n))
    dist = shortest_path(adjacency, unweighted=True)  # inf: no live path (or a dead end)
    b = bound_matrix(setting, dist)
    for w in dead:
        b[w, :] = np.inf
        b[:, w] = np.inf
        b[w, w] = 0.0
    return b


def rejoin_iteration(
    held: Mapping[int, Collection[int]],
    ins: Mapping[int, int],
    outs: Mapping[int, int],
    *,
    need: int,
    max_ig: int,
) -> tuple[int | None, str]:
    """The iteration a replacement rejoins in, or None and why none will do yet.

    ``held``: each live in-neighbour's iterations of the updates it sent the replacement (they
    send to it from the moment they see it joining). ``ins`` and ``outs``: the live in- and
    out-neighbours' iteration counters now. ``need``: updates of one iteration its Recv waits
    for (|N_in| - N_buw).

    The answer is the newest held iteration k such that
    (a) no token queue it rebuilds is negative: Iter(j) - max_ig <= k for every in-neighbour j
        (TokenQ(self->j)) and k <= Iter(m) + max_ig for every out-neighbour m (TokenQ(m->self));
    (b) at least ``need`` in-neighbours will deliver an update of k: one is held, or the
        neighbour is still below k (it sends k when it enters it, as it now sends to the
        replacement). A neighbour at or past k without a held update of k never sends one.
    """
    lo = max(ins.values(), default=0) - max_ig
    hi = min(outs.values()) + max_ig if outs else None
    seen = sorted({k for its in held.values() for k in its}, reverse=True)
    if not seen:
        return None, "no update from its in-neighbours yet"
    why = ""
    for k in seen:
        if hi is not None and k > hi:
            behind = min(outs, key=lambda m: outs[m])
            why = why or (
                f"out-neighbour {behind} is in iteration {outs[behind]}, more than max_ig "
                f"{max_ig} behind the update held ({k})"
            )
            continue  # an older update may fit
        if k < lo:
            ahead = max(ins, key=lambda j: ins[j])
            why = why or (
                f"in-neighbour {ahead} is in iteration {ins[ahead]}, more than max_ig {max_ig} "
                f"ahead of the update held ({k})"
            )
            break  # older ones are further behind still
        coming = sum(1 for j, it in ins.items() if k in held.get(j, ()) or it < k)
        if coming >= need:
            return k, ""
        why = why or f"fewer than {need} in-neighbours will send an update of iteration {k}"
    return None, why
