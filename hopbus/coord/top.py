"""What ``hopbus top`` shows, gathered from Redis alone: one row per worker, one header.

Builds on ``snapshot`` (the reader behind ``hopbus inspect``) for iterations, heartbeats, token
queue lengths and the Table 1 bound, and adds what only the progress stream tells: rates,
latest losses, jumps. ``TopReader`` reads that stream incrementally (from the last entry it
saw), so refreshing every second costs only the new entries, not the whole stream again.
Times come from Redis (stream ids and TIME), so a viewer on another host sees no clock skew.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import redis

from hopbus.config import TrainConfig, make_config
from hopbus.coord import read
from hopbus.coord.keys import RunKeys
from hopbus.coord.runs import RunStateError, list_runs
from hopbus.coord.snapshot import snapshot
from hopbus.runtime.progress import MARKERS, read_entries
from hopbus.topology import GapSetting, Topology, token_queue_capacity

RATE_WINDOW_S = 5.0
STREAM_CHUNK = 10_000  # entries per XREAD while catching up on a long stream


@dataclass(frozen=True)
class WorkerRow:
    """One worker as ``hopbus top`` shows it (None: not known yet)."""

    worker: int
    iteration: int | None
    rate: float | None  # iterations per second over the last RATE_WINDOW_S
    loss: float | None
    device: str | None
    waits_on: tuple[int, ...]  # neighbours it cannot pass until they advance (from the keys)
    waits_s: float | None  # time in its current iteration, when it waits on someone
    tokens_min: int | None
    tokens_max: int | None
    tokens_cap: int | None
    jumps: int
    heartbeat: str  # alive, finished, gone, not started


@dataclass(frozen=True)
class TopView:
    """One frame: the run's header and every worker's row."""

    run: str
    status: str | None
    mode: str
    topology: str
    workers: int
    iterations: int
    elapsed_s: float | None
    max_gap: int | None  # largest Iter(a) - Iter(b) over neighbours a, b (either direction)
    gap_bound: float | None  # Table 1's adjacent bound for the run's setting; None = unbounded
    over_bound: int  # neighbour pairs whose gap is above their own per-pair bound right now
    max_ig: int
    rows: list[WorkerRow]


def pick_run(client: redis.Redis, run: str | None) -> str:
    """``run``, or the only run this Redis holds; otherwise a one-line error naming them."""
    if run is not None:
        return run
    runs = list_runs(client)
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise RunStateError("no runs in this Redis; give --run RUN (or --redis URL)")
    raise RunStateError(f"{len(runs)} runs in this Redis, give --run with one of: {' '.join(runs)}")


@dataclass
class _Seen:
    """What the stream said about one worker so far."""

    jumps: int = 0
    latest: dict[str, Any] = field(default_factory=dict)
    latest_ms: int | None = None
    recent: deque[tuple[int, int, int]] = field(default_factory=deque)  # (ms, start, to)


class TopReader:
    """Gathers ``TopView`` frames of one run; keep one per run and call ``frame()`` often."""

    def __init__(
        self,
        client: redis.Redis,
        keys: RunKeys,
        *,
        window_s: float = RATE_WINDOW_S,
        url: str | None = None,
    ) -> None:
        self.r = client
        self.keys = keys
        self.url = url  # the Redis named, for the command an unknown run's refusal suggests
        self.window_ms = int(window_s * 1000)
        self._after = "0-0"
        self._seen: dict[int, _Seen] = {}
        self._first_ms: int | None = None  # the run's first step, as the stream has it
        self._last_ms: int | None = None
        self._topo: tuple[TrainConfig, Topology] | None = None
        self.malformed = 0  # progress entries that did not parse

    def _topology(self, cfg_public: dict[str, Any]) -> tuple[TrainConfig, Topology]:
        if self._topo is None:
            cfg = make_config(cfg_public, cls=TrainConfig)
            assert isinstance(cfg, TrainConfig)
            self._topo = cfg, cfg.build_topology()[1]
        return self._topo

    def _catch_up(self) -> None:
        """Read every progress entry after the last one seen."""
        while True:
            got = read_entries(self.r, self.keys.progress, self._after, count=STREAM_CHUNK)
            for entry_id, rec in got:
                ms = read.stream_id(entry_id)[0]
                if rec is None:  # malformed (coord/read.py): not shown
                    self.malformed += 1
                    continue
                w, to = rec["worker"], rec["iter"]
                if any(rec.get(m) for m in MARKERS):
                    continue  # a death, a rejoin or a restore is not a step
                s = self._seen.setdefault(w, _Seen())
                jump = rec.get("jump", 0)
                s.jumps += int(jump > 0)
                s.latest, s.latest_ms = rec, ms
                s.recent.append((ms, to - (jump or 1), to))
                if self._first_ms is None:
                    self._first_ms = ms
                self._last_ms = ms
            if got:
                self._after = got[-1][0]
            if len(got) < STREAM_CHUNK:
                return

    def frame(self) -> TopView:
        snap = snapshot(
            self.r, self.keys, last=0, types=False, url=self.url
        )  # raises RunStateError for an unknown run
        cfg, topo = self._topology(snap["config"])
        self._catch_up()
        sec, usec = self.r.time()
        now_ms = int(sec) * 1000 + int(usec) // 1000
        created_ms = int(snap["created"] * 1000) if snap["created"] else None
        running = snap["status"] in ("starting", "running")
        end_ms = now_ms if running or self._last_ms is None else self._last_ms
        elapsed = (end_ms - created_ms) / 1000 if created_ms is not None else None
        setting: GapSetting = cfg.gap_setting()
        iters = [w["iteration"] for w in snap["workers"]]
        sizes: dict[tuple[int, int], int] = {
            (q["from"], q["to"]): q["size"] for q in snap["token_queues"] if q["size"] is not None
        }
        results = snap["results"]
        rows = [
            self._row(
                i,
                iters,
                snap["workers"][i]["state"],
                sizes,
                results,
                topo,
                setting,
                now_ms,
                end_ms,
                cfg.iterations,
                snap["gaps"]["dead"],
            )
            for i in range(topo.n)
        ]
        gaps = snap["gaps"]
        return TopView(
            run=self.keys.run,
            status=snap["status"],
            mode=str(cfg.mode),
            topology=str(cfg.topology) if cfg.mode.is_hop else "complete",
            workers=topo.n,
            iterations=cfg.iterations,
            elapsed_s=elapsed,
            max_gap=gaps["max_adjacent"],
            gap_bound=gaps["bound"]["adjacent"],
            over_bound=gaps["over_bound"],
            max_ig=setting.max_ig,
            rows=rows,
        )

    def _row(
        self,
        i: int,
        iters: list[int | None],
        state: str,
        sizes: dict[tuple[int, int], int],
        results: dict[str, Any],
        topo: Topology,
        setting: GapSetting,
        now_ms: int,
        end_ms: int,
        target: int,
        dead: Collection[int],
    ) -> WorkerRow:
        s = self._seen.get(i, _Seen())
        # the rate over the run's last window_ms up to its end (now, while it runs), or over
        # all of it when shorter: a run of 0.3 s showed a fifth of its speed
        since = end_ms - self.window_ms
        while s.recent and s.recent[0][0] < since:
            s.recent.popleft()
        span_s = (end_ms - max(since, self._first_ms or since)) / 1000
        it = iters[i]
        rate = None
        if it is not None and span_s > 0:
            advanced = sum(to - start for _, start, to in s.recent)
            rate = advanced / span_s
        done = it is not None and it >= target
        quiet = done or it is None or i in dead  # waits on nobody
        waits = () if quiet else _waits_on(i, iters, sizes, topo, setting, dead)
        waits_s = (now_ms - s.latest_ms) / 1000 if waits and s.latest_ms is not None else None
        own = [sizes[(j, i)] for j in topo.out_peers[i] if (j, i) in sizes]
        caps = [
            token_queue_capacity(setting.max_ig, topo.return_distance(i, j))  # Path j->i
            for j in topo.out_peers[i]
        ]
        tokens = own and setting.max_ig > 0
        device = s.latest.get("device") or _result_field(results, i, "device")
        return WorkerRow(
            worker=i,
            iteration=it,
            rate=rate,
            loss=s.latest.get("loss"),
            device=None if device is None else str(device),
            waits_on=waits,
            waits_s=waits_s,
            tokens_min=min(own) if tokens else None,
            tokens_max=max(own) if tokens else None,
            tokens_cap=max(caps) if tokens else None,
            jumps=s.jumps,
            heartbeat="alive" if state.startswith("alive") else state,
        )


def _result_field(results: dict[str, Any], worker: int, name: str) -> Any:
    res = results.get(str(worker))
    return res.get(name) if isinstance(res, dict) else None


def _waits_on(
    i: int,
    iters: list[int | None],
    sizes: dict[tuple[int, int], int],
    topo: Topology,
    setting: GapSetting,
    dead: Collection[int],
) -> tuple[int, ...]:
    """Neighbours worker i cannot pass until they advance, as the keys show it now: an
    in-neighbour already ``setting.forward`` behind (i needs its updates), or an out-neighbour
    whose token queue to i is empty (i needs its token); not one declared dead (the run
    goes on without it)."""
    it = iters[i]
    assert it is not None
    on = {
        j
        for j in topo.in_peers[i]
        if iters[j] is None or it - iters[j] >= setting.forward  # type: ignore[operator]
    }
    if setting.max_ig > 0:
        on |= {j for j in topo.out_peers[i] if sizes.get((j, i), 1) == 0}
    return tuple(sorted(on - set(dead)))
