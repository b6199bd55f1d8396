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
#       nf floors to read back
# ARGV: 1 start, 2 to, 3 maxlen, 4 nt, 5 np, 6 nf, 7 floor to publish ('' = none),
#       8..7+nt tokens still needed from each take queue, then the progress entry's fields and
#       values as one msgpack array of strings (one argument instead of dozens: cheaper to send)
_ADVANCE = """
local start, to = tonumber(ARGV[1]), tonumber(ARGV[2])
local nt, np, nf = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local cur = redis.call('GET', KEYS[1])
if cur ~= ARGV[1] then
  return redis.error_reply('HOPBUS iteration counter of ' .. KEYS[1] .. ' is ' ..
    tostring(cur) .. ', expected ' .. ARGV[1])
end
for i = 1, nt do
  if redis.call('LLEN', KEYS[3 + i]) < tonumber(ARGV[7 + i]) then return {0, i} end
end
for i = 1, nt do
  local need = tonumber(ARGV[7 + i])
  if need > 0 then redis.call('LPOP', KEYS[3 + i], need) end
end
if ARGV[7] ~= '' then redis.call('SET', KEYS[3], ARGV[7]) end
redis.call('INCRBY', KEYS[1], to - start)
local fields = cmsgpack.unpack(ARGV[8 + nt])
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', unpack(fields))
if np > 0 then
  local values = {}
  for it = start + 1, to do values[#values + 1] = it end
  for k = 1, np do redis.call('RPUSH', KEYS[3 + nt + k], unpack(values)) end
end
local floors = {}
for k = 1, nf do floors[k] = redis.call('GET', KEYS[3 + nt + np + k]) or '' end
return {1, id, floors}
"""

# KEYS[1] iter, KEYS[2..] token queues; ARGV[1] count
_START = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('HOPBUS worker already started: ' .. KEYS[1] .. ' exists')
end
redis.call('SET', KEYS[1], 0)
local n = tonumber(ARGV[1])
if n > 0 then
  local values = {}
  for i = 1, n do values[i] = 0 end
  for k = 2, #KEYS do redis.call('RPUSH', KEYS[k], unpack(values)) end
end
return 1
"""


class RunControl:
    """Worker ``worker``'s control-plane operations in run ``keys.run``."""

    def __init__(self, client: redis.Redis, keys: RunKeys, worker: int) -> None:
        self.r = client
        self.keys = keys
        self.worker = worker
        self._advance = client.register_script(_ADVANCE)
        self._start = client.register_script(_START)

    # -- iterations and tokens ------------------------------------------------------------------
    def start(self, put_to: Sequence[int], count: int) -> None:
        """Iter(self) = 0 and ``count`` tokens into TokenQ(self->j) for j in ``put_to``."""
        k = self.keys
        self._start(
            keys=[k.iter(self.worker), *(k.tok(self.worker, j) for j in put_to)], args=[count]
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
    ) -> int | tuple[bytes, dict[int, int]]:
        """Enter iteration ``to`` from ``start`` in one atomic step, if TokenQ(j->self) holds
        ``need[j]`` tokens for every j: take them, publish ``floor`` (if given), set the
        counter, XADD the progress entry, put ``to - start`` tokens for each j in ``put_to``,
        and read back the floors of ``floors_of``. Returns (entry id, floors) or, taking
        nothing, the first j whose queue is short."""
        k = self.keys
        owners = list(need)
        jump = to - start if to - start > 1 else 0
        flat = ["worker", str(self.worker), "iter", str(to), "jump", str(jump)]
        for name, value in fields.items():
            flat += [name, str(_field(value))]
        res = self._advance(
            keys=[
                k.iter(self.worker),
                k.progress,
                k.floor(self.worker),
                *(k.tok(j, self.worker) for j in owners),
                *(k.tok(self.worker, j) for j in put_to),
                *(k.floor(j) for j in floors_of),
            ],
            args=[
                start,
                to,
                PROGRESS_MAXLEN,
                len(owners),
                len(put_to),
                len(floors_of),
                "" if floor is None else floor,
                *(need[j] for j in owners),
                msgpack.packb(flat),
            ],
        )
        if res[0] == 0:
            return owners[int(res[1]) - 1]
        floors = {j: int(v) if v else 0 for j, v in zip(floors_of, res[2], strict=True)}
        return res[1], floors

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

    # -- liveness ----------------------------------------------------------------------------
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
    a slow one and ``hopbus inspect`` sees drops while the run goes on."""

    def __init__(
        self,
        control: RunControl,
        ttl_s: float,
        stats: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self.control = control
        self.ttl_ms = max(1000, int(ttl_s * 1000))
        self.stats = stats
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hopbus-heartbeat", daemon=True)
        self.error: BaseException | None = None

    def beat(self) -> None:
        c = self.control
        c.r.set(c.keys.hb(c.worker), int(time.time() * 1000), px=self.ttl_ms)
        if self.stats is not None:
            c.publish_stats(self.stats())

    def start(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def _run(self) -> None:
        period = self.ttl_ms / 3000
        while not self._stop.wait(period):
            try:
                self.beat()
            except redis.RedisError as exc:  # the worker notices on its own next call
                self.error = exc

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
