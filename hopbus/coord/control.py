"""One worker's view of the control plane: its counter, its floor, streams, registry, heartbeat.

Entering an iteration is one Lua call (``try_advance``): take the tokens, INCRBY the counter,
XADD the progress entry, RPUSH the tokens for every in-neighbour (and, riding along, publish the
store floor and read the out-neighbours' floors). Because the counter change and the
stream entry are one atomic step, the stream's IDs are a total order of iteration changes and
every gap between two workers at any instant can be replayed from the stream alone.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack
import redis

from hopbus.coord.keys import RunKeys

PROGRESS_MAXLEN = 1_000_000  # entries kept (approximately): a 16-worker run of 60k iterations
EVENTS_MAXLEN = 10_000

# Enter an iteration in one round trip, or say which token queue is short.
# KEYS: 1 iter, 2 progress, 3 own floor, then nt queues to take from, np queues to put into,
#       nf floors to read back, and last the run's set of dead workers
# ARGV: 1 start, 2 to, 3 maxlen, 4 nt, 5 np, 6 nf, 7 floor to publish ('' = none),
#       8..7+nt tokens still needed from each take queue, then the progress entry's fields and
#       values as one msgpack array of strings (one argument instead of dozens: cheaper to send),
#       then the worker ids of the take queues' owners and of the put queues' takers (msgpack)
# A queue whose other end is dead is neither waited on nor fed (protocol/membership.py); the
# dead set is read in the same atomic step, so no worker ever acts on a stale view of it.
_ADVANCE = """
local start, to = tonumber(ARGV[1]), tonumber(ARGV[2])
local nt, np, nf = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local cur = redis.call('GET', KEYS[1])
if not cur then return redis.error_reply('HOPBUSLOST ' .. KEYS[1]) end
if cur ~= ARGV[1] then
  return redis.error_reply('HOPBUS iteration counter of ' .. KEYS[1] .. ' is ' ..
    tostring(cur) .. ', expected ' .. ARGV[1])
end
local deadkey = KEYS[#KEYS]
local skip, dead = {}, {}
if redis.call('SCARD', deadkey) > 0 then
  local ids = cmsgpack.unpack(ARGV[9 + nt])
  for i = 1, nt + np do skip[i] = redis.call('SISMEMBER', deadkey, ids[i]) == 1 end
  dead = redis.call('SMEMBERS', deadkey)
end
for i = 1, nt do
  if not skip[i] and redis.call('LLEN', KEYS[3 + i]) < tonumber(ARGV[7 + i]) then
    return {0, i, dead}
  end
end
for i = 1, nt do
  local need = tonumber(ARGV[7 + i])
  if need > 0 and not skip[i] then redis.call('LPOP', KEYS[3 + i], need) end
end
if ARGV[7] ~= '' then redis.call('SET', KEYS[3], ARGV[7]) end
redis.call('INCRBY', KEYS[1], to - start)
local fields = cmsgpack.unpack(ARGV[8 + nt])
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', unpack(fields))
if np > 0 then
  local values = {}
  for it = start + 1, to do values[#values + 1] = it end
  for k = 1, np do
    if not skip[nt + k] then redis.call('RPUSH', KEYS[3 + nt + k], unpack(values)) end
  end
end
local floors = {}
for k = 1, nf do floors[k] = redis.call('GET', KEYS[3 + nt + np + k]) or '' end
return {1, id, floors, dead}
"""

# Declare worker ARGV[1] dead, once: unless its heartbeat is there (ARGV[4] = '1': the caller
# knows the process is gone, e.g. the launcher saw it exit) or it published its result, or
# it has no iteration counter (never started, or a restarted Redis lost it: not known dead).
# KEYS: 1 its heartbeat, 2 dead set, 3 events, 4 progress, 5 its iteration, 6 results
# ARGV: 1 worker, 2 who declares, 3 time, 4 force, 5 events maxlen, 6 progress maxlen
# Returns 1 if it is (now or already) dead, 0 if it is alive or finished.
_DECLARE_DEAD = """
if redis.call('EXISTS', KEYS[5]) == 0 then return 0 end
if ARGV[4] ~= '1' and redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('HEXISTS', KEYS[6], ARGV[1]) == 1 then return 0 end
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then
  redis.call('DEL', KEYS[1])
  local it = redis.call('GET', KEYS[5]) or '0'
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'kind', 'crash', 'worker', ARGV[1],
    'by', ARGV[2], 't', ARGV[3], 'iter', it)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'worker', ARGV[1], 'iter', it,
    'dead', '1', 't', ARGV[3])
end
return 1
"""

# KEYS[1] iter, KEYS[2..] token queues; ARGV[1] count, ARGV[2] the iteration to start in
_START = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('HOPBUS worker already started: ' .. KEYS[1] .. ' exists')
end
redis.call('SET', KEYS[1], ARGV[2])
local n = tonumber(ARGV[1])
if n > 0 then
  local values = {}
  for i = 1, n do values[i] = ARGV[2] end
  for k = 2, #KEYS do redis.call('RPUSH', KEYS[k], unpack(values)) end
end
return 1
"""


# After a restarted Redis lost the run's state: worker ARGV[1] puts back what it holds, in one
# step, so no peer sees its counter without its heartbeat.
# KEYS: 1 its iter, 2 its heartbeat, 3 addr, 4 meta, 5 dead set, 6 events
# ARGV: 1 worker, 2 iteration, 3 heartbeat ttl ms, 4 endpoint, 5 config JSON, 6 time,
#       7 events maxlen, then the workers it knows dead
_RESTORE = """
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[6], 'PX', ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
redis.call('HSETNX', KEYS[4], 'config', ARGV[5])
redis.call('HSETNX', KEYS[4], 'status', 'running')
for i = 8, #ARGV do redis.call('SADD', KEYS[5], ARGV[i]) end
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[7], '*', 'kind', 'restore', 'worker', ARGV[1],
  'iter', ARGV[2], 't', ARGV[6])
return 1
"""

# Rebuild TokenQ(j->i) from the invariant: max_ig + Iter(j) - Iter(i) tokens (none if negative).
# KEYS: 1 iter:j, 2 iter:i, 3 the queue; ARGV: 1 max_ig. Returns 0 while either counter is
# missing (that worker has not put its state back yet).
_REBUILD = """
local j, i = redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])
if not j or not i then return 0 end
redis.call('DEL', KEYS[3])
local n = tonumber(ARGV[1]) + tonumber(j) - tonumber(i)
if n > 0 then
  local values = {}
  for k = 1, n do values[k] = tonumber(i) end
  redis.call('RPUSH', KEYS[3], unpack(values))
end
return 1
"""


class StateLostError(Exception):
    """Redis no longer holds this worker's iteration counter: it restarted without the run's
    state. The worker puts back what it holds (``RunControl.restore``)."""


class RunControl:
    """Worker ``worker``'s control-plane operations in run ``keys.run``."""

    def __init__(self, client: redis.Redis, keys: RunKeys, worker: int) -> None:
        self.r = client
        self.keys = keys
        self.worker = worker
        self._advance = client.register_script(_ADVANCE)
        self._start = client.register_script(_START)
        self._declare_dead = client.register_script(_DECLARE_DEAD)
        self._restore = client.register_script(_RESTORE)
        self._rebuild = client.register_script(_REBUILD)
        self.floors: dict[int, int] = {}  # out-neighbours' floors, read by the last advance

    # -- iterations and tokens ------------------------------------------------------------------
    def start(self, put_to: Sequence[int], count: int, at: int = 0) -> None:
        """Iter(self) = ``at`` (0, or a resumed run's checkpoint iteration) and ``count``
        tokens into TokenQ(self->j) for j in ``put_to``."""
        k = self.keys
        self._start(
            keys=[k.iter(self.worker), *(k.tok(self.worker, j) for j in put_to)],
            args=[count, at],
        )

    def try_advance(
        self,
        start: int,
        to: int,
        need: Mapping[int, int],
        put_to: Sequence[int],
        fields: Mapping[str, Any],
        *,
        floor: int | None = None,
        floors_of: Sequence[int] = (),
    ) -> tuple[int | None, frozenset[int]]:
        """Enter iteration ``to`` from ``start`` in one atomic step, if TokenQ(j->self) holds
        ``need[j]`` tokens for every live j: take them, publish ``floor`` (if given), set the
        counter, XADD the progress entry, put ``to - start`` tokens for each live j in
        ``put_to``, and read back the floors of ``floors_of`` (into ``self.floors``).

        Returns (None, dead workers) once entered or, taking nothing, (the first j whose queue
        is short, dead workers)."""
        k = self.keys
        owners = list(need)
        jump = to - start if to - start > 1 else 0
        flat = ["worker", str(self.worker), "iter", str(to), "jump", str(jump)]
        for name, value in fields.items():
            flat += [name, str(_field(value))]
        keys = [
            k.iter(self.worker),
            k.progress,
            k.floor(self.worker),
            *(k.tok(j, self.worker) for j in owners),
            *(k.tok(self.worker, j) for j in put_to),
            *(k.floor(j) for j in floors_of),
            k.dead,
        ]
        args = [start, to, PROGRESS_MAXLEN, len(owners), len(put_to), len(floors_of)]
        args += ["" if floor is None else floor, *(need[j] for j in owners)]
        args += [msgpack.packb(flat), msgpack.packb([*owners, *put_to])]
        try:
            res = self._advance(keys=keys, args=args)
        except redis.ResponseError as exc:
            if str(exc).startswith("HOPBUSLOST"):
                raise StateLostError(str(exc)) from None
            raise
        if res[0] == 0:
            return owners[int(res[1]) - 1], frozenset(int(d) for d in res[2])
        self.floors = {j: int(v) if v else 0 for j, v in zip(floors_of, res[2], strict=True)}
        return None, frozenset(int(d) for d in res[3])

    # -- store floors (Sec. 6.2) ------------------------------------------------------------------
    def publish_floor(self, floor: int) -> None:
        self.r.set(self.keys.floor(self.worker), floor)

    def read_floors(self, of: Sequence[int]) -> dict[int, int]:
        if not of:
            return {}
        values = self.r.mget([self.keys.floor(j) for j in of])
        return {j: 0 if v is None else int(v) for j, v in zip(of, values, strict=True)}

    # -- registry ----------------------------------------------------------------------------
    def register(self, endpoint: str) -> None:
        self.r.hset(self.keys.addr, str(self.worker), endpoint)

    def endpoints(self, of: Sequence[int]) -> dict[int, str | None]:
        if not of:
            return {}
        values = self.r.hmget(self.keys.addr, [str(j) for j in of])
        return {j: None if v is None else v.decode() for j, v in zip(of, values, strict=True)}

    # -- streams and results ----------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> None:
        flat = {"kind": kind, "worker": self.worker, "t": time.time()}
        flat.update(fields)
        self.r.xadd(
            self.keys.events,
            {k: _field(v) for k, v in flat.items()},
            maxlen=EVENTS_MAXLEN,
            approximate=True,
        )

    def publish_result(self, result: Mapping[str, Any]) -> None:
        self.r.hset(self.keys.result, str(self.worker), json.dumps(result))

    def publish_stats(self, stats: Mapping[str, int]) -> None:
        if stats:
            self.r.hset(self.keys.stats(self.worker), mapping=dict(stats))

    # -- liveness and membership (protocol/membership.py) ----------------------------------
    def declare_dead(self, worker: int, *, force: bool = False) -> bool:
        """Put ``worker`` in the run's dead set (once: a crash event and a progress entry
        ``dead=1`` mark the moment), unless its heartbeat is there (``force``: the caller saw
        the process end) or it finished. Returns whether it is dead."""
        k = self.keys
        return bool(
            self._declare_dead(
                keys=[k.hb(worker), k.dead, k.events, k.progress, k.iter(worker), k.result],
                args=[
                    worker,
                    self.worker,
                    time.time(),
                    "1" if force else "0",
                    EVENTS_MAXLEN,
                    PROGRESS_MAXLEN,
                ],
            )
        )

    def restore(
        self,
        iteration: int,
        *,
        heartbeat_ms: int,
        endpoint: str,
        config: str,
        dead: Sequence[int],
    ) -> None:
        """Put back this worker's state after Redis lost it: its counter at ``iteration``, its
        heartbeat, its endpoint, the run's config (if no one did yet) and the dead it knows."""
        k = self.keys
        self._restore(
            keys=[k.iter(self.worker), k.hb(self.worker), k.addr, k.meta, k.dead, k.events],
            args=[
                self.worker,
                iteration,
                heartbeat_ms,
                endpoint,
                config,
                time.time(),
                EVENTS_MAXLEN,
                *dead,
            ],
        )

    def rebuild_tokens(self, owner: int, max_ig: int) -> bool:
        """TokenQ(owner->self) from the invariant; False while a counter is still missing."""
        k = self.keys
        return bool(
            self._rebuild(
                keys=[k.iter(owner), k.iter(self.worker), k.tok(owner, self.worker)], args=[max_ig]
            )
        )

    def dead(self) -> frozenset[int]:
        return frozenset(int(x) for x in self.r.smembers(self.keys.dead))

    def stop_run(self, reason: str) -> str:
        """Stop the run for every node (they see it within a heartbeat period); the first
        reason given is kept and returned."""
        if self.r.set(self.keys.stop, reason, nx=True):
            self.event("stop", message=reason)
            return reason
        return (self.r.get(self.keys.stop) or b"").decode() or reason

    def alive(self, of: Sequence[int]) -> dict[int, bool]:
        pipe = self.r.pipeline(transaction=False)
        for j in of:
            pipe.exists(self.keys.hb(j))
        return {j: bool(x) for j, x in zip(of, pipe.execute(), strict=True)}


def _field(value: Any) -> str | int | float:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float | str):
        return value
    return json.dumps(value)


class Heartbeat:
    """Keeps ``hop:{R}:hb:I`` alive (a key with a TTL) from a background thread, and writes the
    worker's counters (``stats()``) at the same pace, so neighbours can tell a dead worker from
    a slow one and ``hopbus inspect`` sees drops while the run goes on. It also reads the run's
    stop key, so every node learns within a period that the run was stopped."""

    def __init__(
        self,
        control: RunControl,
        ttl_s: float,
        stats: Callable[[], Mapping[str, int]] | None = None,
        patience_s: float = 0.0,
    ) -> None:
        self.control = control
        self.ttl_ms = max(1000, int(ttl_s * 1000))
        self.patience_s = patience_s  # how long Redis may fail before ``error`` is set
        self.stats = stats
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hopbus-heartbeat", daemon=True)
        self.error: BaseException | None = None
        self.stopped: str | None = None  # the run's stop reason, once some node stopped it

    def beat(self) -> None:
        c = self.control
        pipe = c.r.pipeline(transaction=False)
        pipe.set(c.keys.hb(c.worker), int(time.time() * 1000), px=self.ttl_ms)
        pipe.get(c.keys.stop)
        stats = self.stats() if self.stats is not None else None
        if stats:
            pipe.hset(c.keys.stats(c.worker), mapping=dict(stats))
        stop = pipe.execute()[1]
        if stop is not None:
            self.stopped = stop.decode(errors="replace")

    def start(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def _run(self) -> None:
        period = self.ttl_ms / 3000
        failing_since: float | None = None
        while not self._stop.wait(period):
            try:
                self.beat()
                failing_since = None
            except redis.RedisError as exc:  # Redis may be restarting: give it ``patience_s``
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= self.patience_s:
                    self.error = exc  # the worker notices at its next look

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
