"""Reading a run's progress stream back: records, gaps, timings, the summary object.

The stream ``hop:{R}:progress`` holds one entry per iteration change, appended in the same
atomic step as the counter change, so reading it in order replays every worker's iteration at
every instant. ``Replay`` feeds it to the same ``GapMonitor`` and ``RunStats`` the simulator
uses, which is why a real run's summary has the simulator's fields and meanings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from hopbus.baselines.allreduce import scheme_counters as allreduce_counters
from hopbus.coord import read
from hopbus.coord.keys import RunKeys
from hopbus.coord.tokens import queue_sizes, token_edges
from hopbus.gaps import GapMonitor
from hopbus.modes import Family, Mode
from hopbus.summary import MAX_RUN_S, RunStats, mean, progress_summary
from hopbus.topology import GapSetting, Topology

_INTS = ("worker", "iter", "jump", "dead", "rejoin", "restore")
# entries that mark membership or a restart rather than a worker's step
MARKERS = ("dead", "rejoin", "restore")
_FLOATS = ("t", "loss", "compute_s", "wait_s", "eval_loss", "eval_accuracy", "accuracy")
_EVENT_INTS = ("worker", "iter", "iteration", "incarnation", "by")
CLOCK_SKEW_S = 3600.0
"""How far before the run's first start an entry's time may lie (a worker on a machine whose
clock is behind): beyond that, or beyond MAX_RUN_S after it, no worker of the run wrote it."""


def parse_entry(fields: dict[bytes, bytes]) -> dict[str, Any] | None:
    """A progress entry's fields as typed values (the same keys as ``hopbus sim --trace``), or
    None if it is not one: ``worker`` and ``iter`` missing or not integers, a number field
    that is not a number, a ``blocked_on`` that is not a list of ids (coord/read.py)."""
    rec: dict[str, Any] = {}
    for k, v in fields.items():
        name = read.text(k, 64)
        if name is None:
            return None
        if name in _INTS:
            rec[name] = read.integer(v)
        elif name in _FLOATS:
            rec[name] = read.number(v)
        elif name == "blocked_on":
            rec[name] = read.int_list(v, read.MAX_INT)
        else:
            rec[name] = read.text(v, 200)
        if rec[name] is None or not _plausible(name, rec[name]):
            return None
    return rec if "worker" in rec and "iter" in rec else None


def _plausible(name: str, value: Any) -> bool:
    """A value a worker could have written under ``name``: accuracies are fractions, times
    spent are finite and not negative (a loss may be anything: divergence is a fact)."""
    if name in ("eval_accuracy", "accuracy"):
        return read.accuracy(value)
    if name in ("compute_s", "wait_s"):
        return math.isfinite(value) and value >= 0.0
    return True


def parse_event(fields: dict[bytes, bytes]) -> dict[str, Any]:
    """An event's fields, leniently: text (shortened), with the known integer and time fields
    as numbers where they parse (None where they do not). An event is only ever shown or
    searched, so a malformed one is never a reason to fail."""
    rec: dict[str, Any] = {}
    for k, v in fields.items():
        name = read.text(k, 64) or "?"
        if name in _EVENT_INTS:
            rec[name] = read.integer(v, lo=-1)
        elif name == "t":
            rec[name] = read.finite_number(v)
        else:
            rec[name] = read.text(v, 2000)
    return rec


Entry = tuple[str, dict[str, Any] | None]
"""A stream entry's id and its fields, None for a progress entry that does not parse."""


def read_entries(
    client: redis.Redis,
    key: str,
    after: str,
    *,
    block_ms: int | None = None,
    count: int = 1000,
    events: bool = False,
) -> list[Entry]:
    """Entries of stream ``key`` after id ``after``, oldest first (blocking up to block_ms):
    progress entries (``parse_entry``: None for one that does not parse, for the caller to
    count and step over) or, with ``events``, events (``parse_event``)."""
    got = client.xread({key: after}, count=count, block=block_ms)
    if not got:
        return []
    parse = parse_event if events else parse_entry
    return [(raw_id.decode(), parse(fields)) for raw_id, fields in got[0][1]]


def read_all(client: redis.Redis, key: str, *, events: bool = False) -> list[Entry]:
    """Every entry of a stream (events: at most about EVENTS_MAXLEN), oldest first."""
    out: list[Entry] = []
    cursor = "0-0"
    while batch := read_entries(client, key, cursor, count=10_000, events=events):
        out.extend(batch)
        cursor = batch[-1][0]
    return out


START_SKEW_S = 600.0
"""How far a ``start`` event's own time may lie from the time Redis gave its entry id: a
worker's clock off by minutes is a host's; a start years away (``XADD ... 1-1 ... t 9e9``)
was written by something else, and taken as time zero it made every entry 'before the
start', refused, and the run judged by nothing."""


def first_start(client: redis.Redis, keys: RunKeys) -> float | None:
    """Wall time of the run's first ``start`` event: time zero of its progress (one whose
    time disagrees with its entry's by more than ``START_SKEW_S`` is passed over)."""
    for raw_id, fields in client.xrange(keys.events, count=10_000):
        if fields.get(b"kind") == b"start":
            t = read.finite_number(fields.get(b"t"))
            ms = read.stream_id(raw_id)[0]
            if t is not None and ms and abs(t - ms / 1000) <= START_SKEW_S:
                return t
    return None


@dataclass
class WorkerView:
    iteration: int = 0
    loss: float | None = None
    eval_loss: float | None = None
    eval_accuracy: float | None = None
    blocked_on: list[int] = field(default_factory=list)
    wait_s: float = 0.0
    t: float = 0.0


class Replay:
    """Iteration changes in stream order -> gaps, step times, latest view of every worker."""

    def __init__(
        self,
        topo: Topology,
        setting: GapSetting,
        t0: float,
        target_loss: float | None = None,
        *,
        start: int = 0,
        iterations: int | None = None,
        partial: bool = False,
    ) -> None:
        """``start``: the iteration every worker begins in (a run resumed from a checkpoint
        set; its first entries are of iteration ``start + 1``). ``iterations``: the run's, the
        last an entry may name. ``partial``: the stream was cut (MAXLEN) before this reader
        began, so each worker's first entry is taken as where it is."""
        self.t0 = t0
        self.iterations = iterations
        self.rejected = 0  # entries refused: no step of a worker could have written them
        self._unseen: set[int] | None = set(range(topo.n)) if partial else None
        self.topo, self.setting = topo, setting
        self.monitor = GapMonitor(topo, setting)
        self.lost: list[dict[str, Any]] = []  # workers declared dead: worker, iteration, t
        self.rejoined: list[dict[str, Any]] = []  # replacements that came in: the same fields
        self._assumed: set[int] = set()  # dead by the dead set, before any marker of it
        self.stats = RunStats(topo.n)
        self.views = [WorkerView() for _ in range(topo.n)]
        self.target_loss = target_loss
        self.time_to_target: float | None = None
        self.entries = 0
        self.out_of_order = 0  # entries that moved no live worker forward (must stay 0)
        self.wait_s = 0.0  # summed over every entry: time workers spent blocked
        self._unplaced: set[int] | None = None  # in a resync: workers not yet placed again
        self.missed = 0  # entries placed after lost ones (deleted before they were read)
        self._doubted: set[int] = set()  # workers whose entries may have been lost (doubt)
        if start:
            self.monitor.start_at(start)
            self.stats.start_at(start)
            for view in self.views:
                view.iteration = start

    def credible(self, rec: dict[str, Any], *, lost_before: bool = False) -> bool:
        """Whether ``rec`` could have been written by one of the run's workers: a worker id of
        the run, an iteration of the run, a finite time, and for a step, one that starts where
        that worker is (a jump of J moves it J, any other step 1), or where entries before it
        may have been lost (``lost_before``, ``doubt``), any step forward. What fails is
        counted in ``rejected`` and not replayed: a forged or garbled entry must not fake a
        gap."""
        w, it = rec["worker"], rec["iter"]
        ok = 0 <= w < self.topo.n and (self.iterations is None or it <= self.iterations)
        ok = ok and -CLOCK_SKEW_S <= rec.get("t", self.t0) - self.t0 <= MAX_RUN_S
        if ok and not any(rec.get(m) for m in MARKERS):
            step = rec.get("jump") or 1
            v = self.views[w]
            if self._unseen is not None and w in self._unseen:  # a cut stream: its base
                self._unseen.discard(w)
                v.iteration = it - step
                self.stats.iterations[w] = it - step
            placing = self._unplaced is not None and w in self._unplaced
            ok = it == v.iteration + step or w in self.monitor.gone
            ok = ok or ((placing or lost_before or w in self._doubted) and it > v.iteration)
        if not ok:
            self.rejected += 1
        return ok

    def doubt(self, workers: Iterable[int]) -> None:
        """Entries of ``workers`` may have been deleted from the stream before this reader
        read them (the launcher asks Redis): no gap with them is judged until their next
        step, and the next entry of each, however far ahead of what was read, places it
        there (``GapMonitor.place``; counted in ``missed`` where it skipped steps)."""
        for w in workers:
            if 0 <= w < self.topo.n and w not in self.monitor.gone:
                self._doubted.add(w)
                self.monitor.doubt(w)

    def feed(self, rec: dict[str, Any], *, lost_before: bool = False) -> dict[str, Any] | None:
        """Take one entry; returns it with ``t`` relative to the run's start (None if it is
        not ``credible``). ``lost_before``: entries before it in the stream may have been
        deleted before this reader read them (the launcher asks Redis), so no position read
        so far is sure: it places its worker (``GapMonitor.place``), no gap judged with it
        until its next step, however far ahead of what was read it is (counted in ``missed``
        where it skipped steps)."""
        if not self.credible(rec, lost_before=lost_before):
            return None
        w, it = rec["worker"], rec["iter"]
        t = rec.get("t", self.t0) - self.t0
        rec = {**rec, "t": round(t, 6)}
        v = self.views[w]
        if rec.get("dead") or rec.get("rejoin"):
            self._membership(rec, w, it, t)
            return rec
        if rec.get("restore"):
            if self._unplaced is None:  # Redis restarted empty: the old stream's unread are lost
                self.resync()
            if it <= v.iteration:  # nothing of it was lost with the old stream
                self._placed(w)
                return rec
        if w in self._assumed and it > v.iteration:  # a step it took before the set held it
            self._assumed_step(rec, w, it, t)
            return rec
        if it <= v.iteration or w in self.monitor.gone:  # back, or still there after death
            self.out_of_order += 1
            return rec
        self.entries += 1
        step = rec.get("jump") or 1
        contiguous = it == v.iteration + step
        doubted = w in self._doubted
        self._doubted.discard(w)
        if (lost_before or (doubted and not contiguous)) and self._unplaced is None:
            self.missed += not contiguous
            self.monitor.place(w, it)
            self._doubted.add(w)  # its next entry may follow lost ones too
            (self.stats.enter if contiguous else self.stats.restart)(w, it, t)
        else:
            self.monitor.enter(w, it)
            if self._unplaced is not None and w in self._unplaced and not contiguous:
                self.missed += 1  # its first entry since Redis restarted empty: the steps
                self.stats.restart(w, it, t)  # between were lost with the stream, no jump
            else:
                self.stats.enter(w, it, t)
        v.iteration, v.t = it, t
        v.loss = rec.get("loss", v.loss)
        v.wait_s = rec.get("wait_s", 0.0)
        self.wait_s += v.wait_s
        v.blocked_on = rec.get("blocked_on", [])
        if "eval_loss" in rec:
            v.eval_loss, v.eval_accuracy = rec["eval_loss"], rec.get("eval_accuracy")
            self._check_target(t)
        self._placed(w)
        return rec

    def resync(self) -> None:
        """A restore entry: Redis restarted empty, and entries the old stream held but this
        reader had not read are gone. Until every live worker that has not finished has
        written again, gaps are not judged (a worker whose entries were lost would look
        behind where it is), and each one's next entry, wherever ahead of what was read it
        is, says where it is. A forged restore entry starts one too, and it ends as soon as
        every worker has stepped once more."""
        end = self.iterations
        waiting = {
            i for i, v in enumerate(self.views)
            if i not in self.monitor.gone and (end is None or v.iteration < end)
        }  # fmt: skip
        if waiting:
            self._unplaced = (self._unplaced or set()) | waiting
            self.monitor.resyncing = True

    def _placed(self, w: int) -> None:
        if self._unplaced is None:
            return
        self._unplaced.discard(w)
        if not self._unplaced:
            self._unplaced = None
            self.monitor.end_resync()

    def _membership(self, rec: dict[str, Any], w: int, it: int, t: float) -> None:
        """A worker declared dead (its gaps stop counting; the live workers are held to Table 1
        in the graph without it: the monitor's live edges) or a replacement that rejoined in
        iteration ``it``."""
        self._assumed.discard(w)  # its marker, or its replacement's: no longer assumed
        if rec.get("dead"):
            if w in self.monitor.gone:  # known dead already: its dead set was read first
                return
            self.monitor.remove(w)
            self.lost.append({"worker": w, "iteration": it, "t": round(t, 6)})
            self._placed(w)  # in a resync: it will not write again
            return
        self.monitor.rejoin(w, it)
        self.rejoined.append({"worker": w, "iteration": it, "t": round(t, 6)})
        self.stats.restart(w, it, t)
        self.views[w].iteration, self.views[w].t = it, t

    def declare_dead(self, w: int, it: int, t: float) -> None:
        """Worker ``w`` is in the run's dead set, which the workers and the Lua scripts obey,
        but no death marker of it was replayed (yet): it died in iteration ``it`` at Unix time
        ``t``, as far as this reader can tell. Without it, a death written into the set by
        anything but the declaring script (which writes the marker in the same step) left
        the replay counting gaps against a worker that had left, and the summary without it
        among the lost. Its marker, if one comes, changes nothing more."""
        if w not in self.monitor.gone:
            self._membership({"dead": 1}, w, it, t - self.t0)
            self._assumed.add(w)

    def _assumed_step(self, rec: dict[str, Any], w: int, it: int, t: float) -> None:
        """An entry of worker ``w``, dead by the dead set, read after that set was: a step it
        took before the set held it (the worker cannot advance after), read late. It is where
        ``w`` died, not a step out of order; its gaps were never judged against the others'
        (Table 1 held them while it was alive, and stopped with its death), but its
        iterations and their times count in the summary as any worker's (a follower that
        first read the run after the death had it end in iteration 0)."""
        v = self.views[w]
        contiguous = it == self.stats.iterations[w] + (rec.get("jump") or 1)
        (self.stats.enter if contiguous else self.stats.restart)(w, it, t)  # its iterations
        v.iteration, v.t = it, t
        for lost in reversed(self.lost):
            if lost["worker"] == w:
                lost["iteration"], lost["t"] = it, round(t, 6)
                break

    def _check_target(self, t: float) -> None:
        if self.target_loss is None or self.time_to_target is not None:
            return
        gone = self.monitor.gone
        losses = [v.eval_loss for i, v in enumerate(self.views) if i not in gone]
        if all(x is not None for x in losses) and mean(losses) <= self.target_loss:
            self.time_to_target = t


def _mean(values: list[float]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return mean(finite) if finite else None


def summarize_run(
    cfg_public: dict[str, Any],
    topo: Topology,
    replay: Replay,
    results: dict[int, dict[str, Any]],
    *,
    wall_s: float,
    finished: bool,
    runtime_s: float,
    token_check: int | None,
    update_queue_bound: int | None,
    failure: str | None = None,
) -> dict[str, Any]:
    """The summary object (docs/summary.md) of a real run, from its replayed progress stream
    and every worker's final report."""
    # one entry per worker, in worker order, named even when it never reported (a failed run)
    res = [{"worker": i, **results.get(i, {})} for i in range(topo.n)]

    # no report at all (Redis went with them): the counts are unknown, not 0
    reported = any(len(r) > 1 for r in res)

    def total(name: str) -> int | None:
        return sum(int(r.get(name, 0)) for r in res) if reported else None

    drops: dict[str, int] = {}
    for r in res:
        for k, v in r.items():
            if k.startswith("dropped_"):
                drops[k[len("dropped_") :]] = drops.get(k[len("dropped_") :], 0) + int(v)
    blocked = [
        {"worker": i, "iteration": v.iteration, "waiting_for": "updates", "on": v.blocked_on}
        for i, v in enumerate(replay.views)
        if not finished and v.iteration < cfg_public["iterations"] and i not in replay.monitor.gone
    ]
    return {
        "config": cfg_public,
        "workers": topo.n,
        "virtual": False,
        "wall_s": wall_s,
        "finished": finished,
        "deadlocked": False,
        "failure": failure,
        **progress_summary(replay.stats, replay.monitor),
        "stale_dropped": total("stale_dropped"),
        "max_update_queue": max((int(r.get("max_update_queue", 0)) for r in res), default=0)
        if reported
        else None,
        "update_queue_bound": update_queue_bound,
        "messages": total("messages"),
        "sends_skipped": total("sends_skipped"),
        "acks": total("acks"),
        "dropped_frames": drops,
        "checks": {
            "token_invariant_violations": token_check,
            "store_overflow": total("store_overflow"),
            "store_bound_exceeded": int(
                update_queue_bound is not None
                and any(int(r.get("max_update_queue", 0)) > update_queue_bound for r in res)
            )
            if reported
            else None,
            "duplicates": total("duplicates"),
            "progress_out_of_order": replay.out_of_order,
        },
        "blocked": blocked,
        "lost_workers": replay.lost,
        "rejoined_workers": replay.rejoined,
        "topology": topo.brief,
        "runtime_s": runtime_s,
        "final_loss": _mean([r.get("final_loss") for r in res]),
        "final_accuracy": _mean([r.get("final_accuracy") for r in res]),
        "per_worker": res,
        "time_to_target": time_to_target(replay, res, wall_s if finished else None),
        "waiting": {
            "total_s": replay.wait_s,
            "per_iteration_s": replay.wait_s / advanced
            if (advanced := sum(replay.stats.iterations))
            else None,
        },
    }


def time_to_target(
    replay: Replay, reports: list[dict[str, Any]], end_s: float | None
) -> float | None:
    """When the workers' mean test loss first reached --target-loss: at a periodic
    evaluation, or else at the end (``end_s``, a finished run), if the final evaluations'
    mean reaches it (a run whose last periodic evaluation came before it got there)."""
    if replay.time_to_target is not None or replay.target_loss is None or end_s is None:
        return replay.time_to_target
    final = _mean([r.get("final_loss") for r in reports])
    return end_s if final is not None and final <= replay.target_loss else None


SCHEME_COUNTERS = {
    Family.HOP: ("stale_dropped", "sends_skipped"),
    Family.WAGMA: (
        "group_rounds",
        "activations",
        "passive_contributions",
        "stale_merges",
        "global_averages",
    ),
}


def scheme_summary(
    mode: Mode, results: dict[int, dict[str, Any]], server: dict[str, Any] | None
) -> dict[str, Any]:
    """The summary's ``scheme`` object: the mode, its family, and the scheme's own counters
    (a parameter server's from its report; the all-reduce's as baselines.allreduce adds them
    up; the workers' summed otherwise)."""
    family = mode.family
    if family is Family.PS:
        counters = {k: v for k, v in (server or {}).items() if k not in _PS_NOT_COUNTERS}
    elif family is Family.ALLREDUCE:
        counters = allreduce_counters(results.values())
    else:
        counters = {
            k: sum(int(r.get(k, 0)) for r in results.values()) for k in SCHEME_COUNTERS[family]
        }
    return {"mode": str(mode), "family": str(family), "counters": counters}


_PS_NOT_COUNTERS = ("role", "t", "final_loss", "final_accuracy", "cpu_s", "incarnation")


def server_model(server: dict[str, Any] | None) -> dict[str, Any]:
    """A parameter server's run is judged by the server's model, the one the scheme trains:
    its ``final_loss`` and ``final_accuracy`` for the summary's, where it reported them. The
    workers hold the version each last pulled (in ps-asp and ps-ssp, up to a staleness of
    versions apart, and a step oscillates between them), which stay in ``per_worker``."""
    if server is None:
        return {}
    got = {k: server.get(k) for k in ("final_loss", "final_accuracy")}
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in got.values()):
        return {}
    return got


def token_invariant_violations(
    client: redis.Redis, keys: RunKeys, topo: Topology, max_ig: int, *, dead: set[int] = frozenset()
) -> list[dict[str, int | None]]:
    """Edges where TokenQ(j->i).size != Iter(j) - Iter(i) + max_ig (Theorem 2), read when no
    worker is half-way through entering an iteration (e.g. after every worker finished), each
    as ``from``, ``to``, ``size`` (None: not a list, something else wrote it) and the
    ``expected`` size: which queue, so that the failure can say it. Edges with a dead end
    are left out: their queues stopped binding when it died."""
    if max_ig <= 0:
        return []
    iters = [read.integer(v) or 0 for v in client.mget([keys.iter(i) for i in range(topo.n)])]
    edges = [(j, i) for j, i in token_edges(topo) if j not in dead and i not in dead]
    sizes = queue_sizes(client, keys, edges)
    return [
        {"from": j, "to": i, "size": size, "expected": iters[j] - iters[i] + max_ig}
        for (j, i), size in zip(edges, sizes, strict=True)
        if size != iters[j] - iters[i] + max_ig
    ]
