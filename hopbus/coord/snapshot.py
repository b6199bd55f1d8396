"""Everything Redis knows about a run, read at one moment: what ``hopbus inspect`` shows.

Reads keys only (no process state), so it works on a run started by ``hopbus train``, by
containers, or one that has ended but whose keys are still there.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

import numpy as np
import redis

from hopbus.config import TrainConfig
from hopbus.coord import read
from hopbus.coord.client import redis_flag
from hopbus.coord.control import Heartbeat
from hopbus.coord.keys import FINISHED, RunKeys
from hopbus.coord.runs import (
    RunStateError,
    misplaced,
    recorded_config,
    run_status,
    said_why,
)
from hopbus.coord.tokens import queue_sizes, token_edges
from hopbus.topology import GapSetting, Topology
from hopbus.topology.bounds import table1_columns


def _decode(d: dict[bytes, bytes], limit: int = 1 << 20) -> dict[str, str]:
    """A hash's or an entry's fields as text, control characters blanked (``read.text``):
    what inspect prints must not drive the terminal, whoever wrote it."""
    return {read.text(k, 200) or "": read.text(v, limit) or "" for k, v in d.items()}


def _entries(raw: list) -> list[dict[str, Any]]:
    """Stream entries as inspect shows them: each field at most 2,000 characters."""
    out = []
    for entry_id, fields in raw:
        rec: dict[str, Any] = {"id": read.text(entry_id, 40)}
        rec.update(_decode(fields, 2000))
        out.append(rec)
    return out


def live_gaps(
    iters: list[int | None], topo: Topology, setting: GapSetting, dead: Collection[int]
) -> dict[str, Any]:
    """The gaps between the workers' counters as Redis holds them now, with Table 1's bounds
    on them, for ``inspect`` and ``top`` alike. Among the live workers only: one declared
    dead stopped where it was and the run goes on without it (docs/faults.md), so no gap
    with it counts, and the bounds are those of the graph without it (``bounds_without``,
    an n x n matrix then; per edge otherwise), as the run's own check holds them.
    ``over_bound``: neighbour pairs above their bound. Above ``BOUNDS_WITHOUT_LIMIT``
    workers the live workers are held to the whole graph's bounds, which are never looser
    (``bound_of_whole_graph``: a dead worker only lengthens paths)."""
    from hopbus.protocol.membership import BOUNDS_WITHOUT_LIMIT, bounds_without

    n = topo.n
    live = [None if i in dead else it for i, it in enumerate(iters)]
    whole = bool(dead) and n > BOUNDS_WITHOUT_LIMIT
    matrix = bounds_without(topo, setting, dead) if dead and not whole else None

    def limit(a: int, j: int) -> float:
        return matrix[a, j] if matrix is not None else topo.neighbour_bound(a, j, setting)

    largest: int | None = None
    over = 0
    into = out = 0.0  # the largest bound over live in- and out-neighbour pairs
    for a in range(n):
        if a in dead:
            continue
        ins, outs = set(topo.in_peers[a]) - {a}, set(topo.out_peers[a]) - {a}
        for j in ins | outs:
            if j in dead:
                continue
            bound = limit(a, j)
            into = max(into, bound) if j in ins else into
            out = max(out, bound) if j in outs else out
            ia, ij = live[a], live[j]
            if ia is not None and ij is not None:
                largest = ia - ij if largest is None else max(largest, ia - ij)
                over += int(ia - ij > bound)
    known = [it for it in live if it is not None]
    if matrix is not None:
        alive = [i for i in range(n) if i not in dead]
        pairs = float(matrix[np.ix_(alive, alive)].max()) if len(alive) > 1 else 0.0
        bound_of = table1_columns(into, out, pairs)
    else:
        bound_of = topo.table1(setting)
    return {
        "matrix": [[None if x is None or y is None else x - y for y in live] for x in live]
        if n <= 32
        else None,
        "max_adjacent": largest,
        "max_any_pair": max(known) - min(known) if known else None,
        "over_bound": over,
        "bound": bound_of,
        "dead": sorted(dead),
        "bound_of_whole_graph": whole,
    }


def snapshot(
    client: redis.Redis,
    keys: RunKeys,
    *,
    last: int = 10,
    url: str | None = None,
    types: bool = True,
) -> dict[str, Any]:
    """What ``hopbus inspect`` shows of a run (``url``: the Redis named, for the command an
    unknown run's refusal suggests). ``types``: look for keys of another type than hopbus
    keeps (a SCAN of the keyspace: once for inspect, not on every refresh of hopbus top)."""
    meta = _decode(client.hgetall(keys.meta))
    if not meta:
        raise RunStateError(
            f"no run {keys.run!r} in this Redis ({keys.meta} does not exist); "
            f"hopbus inspect --list{redis_flag(url)} shows the runs there"
        )
    raw_cfg = read.json_object(meta.get("config"))
    if raw_cfg is None:
        raise RunStateError(f"run {keys.run!r}: {keys.meta} holds no readable config")
    cfg, topo = recorded_config(raw_cfg, keys).build_topology()
    n = topo.n
    iters_raw = client.mget([keys.iter(i) for i in range(n)])
    iters = [read.integer(v) for v in iters_raw]
    edges = token_edges(topo)
    sizes = queue_sizes(client, keys, edges)
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.get(keys.hb(i))
        pipe.pttl(keys.hb(i))
        pipe.hgetall(keys.stats(i))
    pipe.smembers(keys.dead)
    pipe.smembers(keys.joining)
    rest = pipe.execute()
    dead, joining = (read.ids(members, n) for members in rest[3 * n :])
    beats = [rest[3 * i] for i in range(n)]
    ttl_ms = Heartbeat.ttl_ms_for(min(cfg.heartbeat, cfg.timeout))
    lapsing = [read.lapsing(rest[3 * i], rest[3 * i + 1], ttl_ms) for i in range(n)]
    # why gone, or going, as each said (never proof): read only when one is (a stream of up
    # to EVENTS_MAXLEN, which hopbus top would read on every refresh)
    said = said_why(client, keys, n) if any(hb is None for hb in beats) or any(lapsing) else {}
    workers = []
    now_ms = time.time() * 1000
    for i in range(n):
        hb, ttl, stats = rest[3 * i : 3 * i + 3]
        ms = read.number(hb)  # when it last beat, if its value is a time (1e306 is not)
        beat = read.timestamp(ms / 1000) if ms is not None else None
        if hb is None:
            state = "gone" if iters[i] is not None else "not started"
            if i in said:  # why, as it said: failed, or interrupted
                state = "failed" if said[i][0] == "error" else said[i][0]
        elif read.text(hb, 40) == FINISHED:
            state = "finished"
        elif beat is not None and ttl and ttl > 0:
            state = f"alive ({now_ms / 1000 - beat:.1f} s ago)"
            if lapsing[i] and i in said:  # its process gone? the heartbeat lives out its TTL
                left = "failed" if said[i][0] == "error" else said[i][0]
                state = f"{state[:-1]}; it says it left: {left})"
        else:
            state = "?"
        if i in dead:  # docs/faults.md: declared dead; a replacement may be joining
            state = "dead, a replacement joining" if i in joining else "dead"
        workers.append(
            {
                "worker": i,
                "iteration": iters[i],
                "state": state,
                "stats": {
                    k: v
                    for k, v in ((read.text(k, 64), read.integer(v)) for k, v in stats.items())
                    if k is not None and v is not None
                },
            }
        )
    gaps = live_gaps(iters, topo, cfg.gap_setting(), dead)
    return {
        "run": keys.run,
        "status": run_status(client, keys, n, cfg.iterations),
        "recorded_status": meta.get("status"),
        "created": read.timestamp(meta.get("created")),
        "config": cfg.public(),
        "workers": workers,
        "token_queues": [
            {"from": j, "to": i, "size": sz} for (j, i), sz in zip(edges, sizes, strict=True)
        ],
        "gaps": gaps,
        "progress": _entries(client.xrevrange(keys.progress, count=last)) if last else [],
        "progress_entries": client.xlen(keys.progress),
        "events": _entries(client.xrevrange(keys.events, count=last)) if last else [],
        "results": _results(client, keys, cfg, n, iters, beats),
        "misplaced": misplaced(client, keys) if types else [],
    }


def _results(
    client: redis.Redis,
    keys: RunKeys,
    cfg: TrainConfig,
    n: int,
    iters: list[int | None],
    beats: list[Any],
) -> dict[str, Any]:
    """The final reports that count (coord/read.py), by node id as a string."""
    raw = client.hgetall(keys.result)
    incarnations = client.hgetall(keys.incarnation)
    out: dict[str, Any] = {}
    for k, v in raw.items():
        i = read.integer(k, 0, n)
        if i is None:
            continue
        got = (
            read.json_object(v)
            if i == n
            else read.result(
                v,
                counter=iters[i],
                incarnation=incarnations.get(k),
                iterations=cfg.iterations,
                beat=beats[i],
            )
        )
        if got is not None:
            out[str(i)] = got
    return out
