"""One worker's view of the control plane: its counter, its floor, streams, registry, heartbeat.

Entering an iteration is one Lua call (``try_advance``): take the tokens, INCRBY the counter,
XADD the progress entry, RPUSH the tokens for every in-neighbour (and, riding along, publish the
store floor and read the out-neighbours' floors). Because the counter change and the
stream entry are one atomic step, the stream's IDs are a total order of iteration changes and
every gap between two workers at any instant can be replayed from the stream alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgpack
import redis

from hopbus.coord import read
from hopbus.coord.client import Lua, PinnedScript
from hopbus.coord.keys import FINISHED, JOIN_FAILED, SAYS_WHY_GONE, RunKeys, named_keys
from hopbus.errors import DeclaredDead
from hopbus.jsonout import dumps
from hopbus.topology import token_queue_capacity

PROGRESS_MAXLEN = 1_000_000  # entries kept (approximately): a 16-worker run of 60k iterations
EVENTS_MAXLEN = 10_000

# The one reading of W's entry in the incarnation hash: its number, or 0 (the process that
# started with the run) where there is none or it is no count a replacement wrote (forged or
# garbled: left out, as coord/read.py's ``incarnation_of`` leaves it out).
_INCARNATION = """
local function incarnation(inckey, w)
  local raw = redis.call('HGET', inckey, w)
  if raw and #raw <= DIGITS and string.match(raw, '^%d+$') then return tonumber(raw) end
  return 0
end
""".replace("DIGITS", str(read.INCARNATION_DIGITS))

# The one rule for "is this process still worker W?", prepended to every script that needs it
# (Advance, a heartbeat, the final result, the token wait's look). It is not if a replacement
# has taken W's id since (the incarnation hash holds a newer number than ``mine``; no entry is
# the process started with the run), or if W is in the dead set, unless it is a replacement
# still joining (``joiner``: in the dead set until its commit, and in the joining set).
_OUTDATED = (
    _INCARNATION
    + """
local function outdated(inckey, deadkey, joinkey, w, mine, joiner)
  if incarnation(inckey, w) > tonumber(mine) then return true end
  if redis.call('SISMEMBER', deadkey, w) == 0 then return false end
  return not (joiner and redis.call('SISMEMBER', joinkey, w) == 1)
end
"""
)

# The one rule for "has worker W finished?", for the scripts that must not act on a forged or
# stale report: its heartbeat holds the finished marker (written with the report, in _FINISH),
# its result parses, says the run's last iteration, which its counter holds, and comes from its
# current incarnation (hopbus/coord/read.py states the same rule for readers).
_FINISHED = (
    _INCARNATION
    + """
local function finished(hbkey, resultkey, inckey, iterkey, w, total)
  if redis.call('GET', hbkey) ~= 'FINISHED_MARK' then return false end
  local raw = redis.call('HGET', resultkey, w)
  if not raw then return false end
  local ok, res = pcall(cjson.decode, raw)
  if not ok or type(res) ~= 'table' then return false end
  local its = tonumber(res['iterations'])
  if its == nil or its ~= tonumber(total) then return false end
  if tonumber(redis.call('GET', iterkey) or '-1') ~= its then return false end
  return tonumber(res['incarnation'] or 0) == incarnation(inckey, w)
end
""".replace("FINISHED_MARK", FINISHED)
)

# Enter an iteration in one round trip, or say which token queue is short.
# KEYS: 1 iter, 2 progress, 3 own floor, then nt queues to take from, np queues to put into,
#       nf floors to read back and their owners' nf counters, and last the incarnation hash, the
#       run's set of joining workers and its set of dead workers
# ARGV: 1 start, 2 to, 3 maxlen, 4 nt, 5 np, 6 nf, 7 floor to publish ('' = none),
#       8..7+nt tokens still needed from each take queue, then the progress entry's fields and
#       values as one msgpack array of strings (one argument instead of dozens: cheaper to send),
#       then the worker ids of the take queues' owners and of the put queues' takers (msgpack),
#       then the run's heartbeat key prefix, then this worker's id and incarnation, and last the
#       neighbours whose incarnations to return (msgpack)
# A queue whose other end is dead is neither waited on nor fed (protocol/membership.py); the
# dead set is read in the same atomic step, so no worker ever acts on a stale view of it. With
# dead workers, it also returns those whose replacement is joining (senders send to them
# again), forgetting a joiner whose heartbeat lapsed (it died while joining); once any id was
# replaced, the incarnation of each neighbour (a worker that never saw a neighbour dead, busy
# through its death and its replacement's commit, learns of the new process so). A worker that is
# itself in the dead set (declared dead, yet still running), or whose id a replacement has taken
# since (another incarnation), is refused: HOPBUSDEAD.
_ADVANCE = (
    _OUTDATED
    + """
local start, to = tonumber(ARGV[1]), tonumber(ARGV[2])
local nt, np, nf = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local cur = redis.call('GET', KEYS[1])
if not cur then return redis.error_reply('HOPBUSLOST ' .. KEYS[1]) end
local deadkey, joinkey = KEYS[#KEYS], KEYS[#KEYS - 1]
if outdated(KEYS[#KEYS - 2], deadkey, joinkey, ARGV[11 + nt], ARGV[12 + nt], false) then
  return redis.error_reply('HOPBUSDEAD ' .. KEYS[1])
end
if cur ~= ARGV[1] then  -- a broker restored from an older snapshot: its state is stale
  return redis.error_reply('HOPBUSLOST ' .. KEYS[1] .. ' is ' .. string.sub(tostring(cur), 1, 30))
end
local skip, dead, joining, incs = {}, {}, {}, {}
if redis.call('HLEN', KEYS[#KEYS - 2]) > 0 then  -- some id was replaced: its neighbours' numbers
  for i, w in ipairs(cmsgpack.unpack(ARGV[13 + nt])) do
    incs[i] = redis.call('HGET', KEYS[#KEYS - 2], w) or ''
  end
end
if redis.call('SCARD', deadkey) > 0 then
  local ids = cmsgpack.unpack(ARGV[9 + nt])
  for i = 1, nt + np do skip[i] = redis.call('SISMEMBER', deadkey, ids[i]) == 1 end
  dead = redis.call('SMEMBERS', deadkey)
  for _, w in ipairs(redis.call('SMEMBERS', joinkey)) do
    if redis.call('EXISTS', ARGV[10 + nt] .. w) == 1 then joining[#joining + 1] = w
    else redis.call('SREM', joinkey, w) end
  end
end
for i = 1, nt do
  if not skip[i] and redis.call('LLEN', KEYS[3 + i]) < tonumber(ARGV[7 + i]) then
    return {0, i, dead, joining, incs}
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
for k = 1, 2 * nf do floors[k] = redis.call('GET', KEYS[3 + nt + np + k]) or '' end
return {1, id, floors, dead, joining, incs}
"""
)

# Declare worker ARGV[1] dead, once: unless its heartbeat is there (ARGV[4] = '1': the caller
# knows the process is gone, e.g. the launcher saw it exit) or it has ``finished``, or it has
# no iteration counter (never started, or a restarted Redis lost it: not known dead).
# Without ``force``, a worker whose state is not known to be in this broker (its mark is
# another broker's: Redis restarted, and it has not put its state back yet; or none) is not
# judged: 2.
# KEYS: 1 its heartbeat, 2 dead set, 3 events, 4 progress, 5 its iteration, 6 results,
#       7 incarnation hash, 8 the broker marks
# ARGV: 1 worker, 2 who declares, 3 time, 4 force, 5 events maxlen, 6 progress maxlen,
#       7 the run's iterations, 8 the broker's run id as the caller knows it
# Returns 1 if it is (now or already) dead, 0 if it is alive or finished, 2 if not judged.
_DECLARE_DEAD = (
    _FINISHED
    + """
if redis.call('EXISTS', KEYS[5]) == 0 then return 0 end
if ARGV[4] ~= '1' and redis.call('PTTL', KEYS[1]) > 0 then return 0 end
if ARGV[4] ~= '1' and redis.call('HGET', KEYS[8], ARGV[1]) ~= ARGV[8] then return 2 end
if finished(KEYS[1], KEYS[6], KEYS[7], KEYS[5], ARGV[1], ARGV[7]) then return 0 end
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
)

# KEYS[1] iter, KEYS[2] the broker marks, KEYS[3..] token queues
# ARGV[1] count, ARGV[2] the iteration to start in, ARGV[3] worker, ARGV[4] the broker's run id
_START = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('HOPBUS worker already started: ' .. KEYS[1] .. ' exists')
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
local n = tonumber(ARGV[1])
if n > 0 then
  local values = {}
  for i = 1, n do values[i] = ARGV[2] end
  for k = 3, #KEYS do redis.call('RPUSH', KEYS[k], unpack(values)) end
end
return 1
"""


# After a restarted Redis lost the run's state: worker ARGV[1] puts back what it holds, in one
# step, so no peer sees its counter without its heartbeat; a replacement also puts back its
# incarnation (refused, HOPBUSDEAD, if a newer one is there) and takes itself out of the dead
# set. It puts back the workers it knows dead, but not one whose replacement has put its
# incarnation back already (that one came in after this worker last read the dead set). A
# progress entry restore=1 tells readers of the stream where it is: entries it wrote before the
# restart that they had not read yet are gone with the old stream.
# KEYS: 1 its iter, 2 its heartbeat, 3 addr, 4 meta, 5 dead set, 6 events, 7 incarnation hash,
#       8 progress, 9 the broker marks
# ARGV: 1 worker, 2 iteration, 3 heartbeat ttl ms, 4 endpoint, 5 config JSON, 6 time,
#       7 events maxlen, 8 its incarnation, 9 progress maxlen, 10 the broker's run id, then the
#       workers it knows dead
_RESTORE = (
    _INCARNATION
    + """
if incarnation(KEYS[7], ARGV[1]) > tonumber(ARGV[8]) then
  return redis.error_reply('HOPBUSDEAD ' .. KEYS[1])
end
if ARGV[8] ~= '0' then  -- a replacement: back, and alive whatever a survivor put back
  redis.call('HSET', KEYS[7], ARGV[1], ARGV[8])
  redis.call('SREM', KEYS[5], ARGV[1])
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[6], 'PX', ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
redis.call('HSETNX', KEYS[4], 'config', ARGV[5])
redis.call('HSETNX', KEYS[4], 'status', 'running')
redis.call('HSET', KEYS[9], ARGV[1], ARGV[10])
for i = 11, #ARGV do
  if redis.call('HEXISTS', KEYS[7], ARGV[i]) == 0 then redis.call('SADD', KEYS[5], ARGV[i]) end
end
redis.call('XADD', KEYS[8], 'MAXLEN', '~', ARGV[9], '*', 'worker', ARGV[1], 'iter', ARGV[2],
  'restore', '1', 't', ARGV[6])
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[7], '*', 'kind', 'restore', 'worker', ARGV[1],
  'iter', ARGV[2], 't', ARGV[6])
return 1
"""
)

# Rebuild TokenQ(j->i) from the invariant: max_ig + Iter(j) - Iter(i) tokens (none if negative).
# KEYS: 1 iter:j, 2 iter:i, 3 the queue, 4 the broker marks; ARGV: 1 max_ig, 2 j, 3 i, 4 the
# broker's run id. Returns 0 while either worker has not put its state back in this broker
# (its counter missing, or one a stale snapshot held: its mark is another broker's).
_REBUILD = """
local j, i = redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])
if not j or not i then return 0 end
if redis.call('HGET', KEYS[4], ARGV[2]) ~= ARGV[4] then return 0 end
if redis.call('HGET', KEYS[4], ARGV[3]) ~= ARGV[4] then return 0 end
redis.call('DEL', KEYS[3])
local n = tonumber(ARGV[1]) + tonumber(j) - tonumber(i)
if n > 0 then
  local values = {}
  for k = 1, n do values[k] = tonumber(i) end
  redis.call('RPUSH', KEYS[3], unpack(values))
end
return 1
"""


# A process takes worker ARGV[1]'s place at the start of a run: refused (the reason is
# returned) if another process beats as that worker, it started already (its counter: a dead
# worker comes back only as a replacement, --rejoin) or finished; otherwise its first
# heartbeat and its endpoint, in one step, so a refused process writes nothing into the run.
# KEYS: 1 its iter, 2 hb, 3 results, 4 addr; ARGV: 1 worker, 2 endpoint, 3 time, 4 ttl ms
_TAKEN = """
local function taken()
  if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return 'it finished already' end
  if redis.call('EXISTS', KEYS[2]) == 1 then return 'another process runs as it' end
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return 'it started already (a dead worker comes back as a replacement: --rejoin)'
  end
  return ''
end
"""
_CLAIM = (
    _TAKEN
    + """
local why = taken()
if why ~= '' then return why end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
return ''
"""
)
_VACANT = _TAKEN + "return taken()\n"  # claim's check alone: KEYS 1 iter, 2 hb, 3 result

# A replacement for dead worker ARGV[1] announces itself (hopbus worker --rejoin): its heartbeat,
# its new endpoint, and a place in the joining set, so its in-neighbours send to it again.
# Refused (the reason, a string, is returned) unless the worker is dead, the run goes on, and no
# other process beats for that id; otherwise returns the replacement's incarnation (a number:
# 1 for the first replacement of that id, and so on), which outdates every earlier process.
# KEYS: 1 hb, 2 dead, 3 joining, 4 addr, 5 stop, 6 result, 7 events, 8 incarnation hash,
#       9 its iter
# ARGV: 1 worker, 2 endpoint, 3 heartbeat ttl ms, 4 time, 5 events maxlen, 6 the run's iterations
_BEGIN_REJOIN = (
    _FINISHED
    + """
local stop = redis.call('GET', KEYS[5])
if stop then return 'the run was stopped: ' .. string.sub(stop, 1, 500) end
if finished(KEYS[1], KEYS[6], KEYS[8], KEYS[9], ARGV[1], ARGV[6]) then
  return 'it already finished'
end
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 then
  return 'it is not dead (its heartbeat is live, or the run has not declared it dead yet)'
end
if redis.call('EXISTS', KEYS[1]) == 1 then return 'another replacement is joining as it' end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[3])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[1])
local inc = incarnation(KEYS[8], ARGV[1]) + 1
redis.call('HSET', KEYS[8], ARGV[1], inc)
redis.call('XADD', KEYS[7], 'MAXLEN', '~', ARGV[5], '*', 'kind', 'rejoining', 'worker',
  ARGV[1], 't', ARGV[4], 'endpoint', ARGV[2], 'incarnation', inc)
return inc
"""
)

# A replacement that did not get in leaves the joining set and drops its heartbeat, if it is
# still the newest incarnation. KEYS: 1 incarnation hash, 2 joining, 3 hb; ARGV: 1 worker, 2 its
# incarnation
_ABORT_REJOIN = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3])
return 1
"""

# The replacement enters iteration ARGV[2] (k) and is a live worker again, in one step: its
# counter, every token queue on its edges to live workers rebuilt from the invariant
# (max_ig + Iter(owner) - Iter(taker)), out of the dead and joining sets, a progress entry
# rejoin=1 and an event. Refused (returns {0, reason}) if a queue would be negative: the
# replacement then waits for a later iteration (protocol/membership.rejoin_iteration);
# likewise if a queue would hold more than any can (Table 1's capacity on the longest path, a
# counter far ahead was forged: a script filling it would freeze Redis for every client), or
# a neighbour's counter is no count. Neighbours that are dead are skipped (their own commit
# rebuilds their queues).
# KEYS: 1 its iter, 2 dead, 3 joining, 4 hb, 5 progress, 6 events, then per in-neighbour j:
#       iter:j and TokenQ(self->j), then per out-neighbour m: iter:m and TokenQ(m->self),
#       then the broker marks, last the incarnation hash
# ARGV: 1 worker, 2 k, 3 max_ig, 4 ni, 5 no, 6 time, 7 progress maxlen, 8 events maxlen,
#       then the ni in-neighbours' ids, then the no out-neighbours' ids, the most tokens a
#       queue can hold, the broker's run id, last its incarnation
_COMMIT_REJOIN = """
local k, ig = tonumber(ARGV[2]), tonumber(ARGV[3])
local ni, no = tonumber(ARGV[4]), tonumber(ARGV[5])
local cap = tonumber(ARGV[#ARGV - 2])
if redis.call('HGET', KEYS[#KEYS], ARGV[1]) ~= ARGV[#ARGV] then
  return {0, 'another replacement took its place'}
end
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 0 or redis.call('EXISTS', KEYS[4]) == 0 then
  return {0, 'it left the joining set (its heartbeat lapsed, or Redis restarted)'}
end
local fill = {}
for p = 1, ni + no do
  if redis.call('SISMEMBER', KEYS[2], ARGV[8 + p]) == 0 then
    local other = redis.call('GET', KEYS[5 + 2 * p])
    if not other then return {0, 'worker ' .. ARGV[8 + p] .. ' has no counter in Redis'} end
    local it = tonumber(other)
    if not it or not string.match(other, '^[0-9]+$') then
      return {0, 'worker ' .. ARGV[8 + p] .. "'s counter in Redis is no count"}
    end
    local n = ig + it - k
    if p <= ni then n = ig + k - it end
    if n < 0 or n > cap then
      return {0, 'worker ' .. ARGV[8 + p] .. ' is in iteration ' .. other}
    end
    fill[#fill + 1] = {KEYS[6 + 2 * p], n}
  end
end
redis.call('SET', KEYS[1], k)
for _, q in ipairs(fill) do
  redis.call('DEL', q[1])
  if q[2] > 0 then
    local values = {}
    for t = 1, q[2] do values[t] = k end
    redis.call('RPUSH', q[1], unpack(values))
  end
end
redis.call('SREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[#KEYS - 1], ARGV[1], ARGV[#ARGV - 1])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[7], '*', 'worker', ARGV[1], 'iter', k,
  'rejoin', '1', 't', ARGV[6])
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[8], '*', 'kind', 'rejoin', 'worker', ARGV[1],
  'iter', k, 't', ARGV[6])
return {1}
"""


# One heartbeat: refresh worker ARGV[1]'s key and read the run's stop key; not for a process
# that is ``outdated`` (it is told so instead). Without its counter (a node that has none, or a
# restarted Redis it has not restored yet) nothing is judged: it beats.
# KEYS: 1 heartbeat, 2 dead set, 3 stop, 4 incarnation hash, 5 joining set, 6 its iter
# ARGV: 1 worker, 2 value, 3 TTL in ms, 4 a replacement ('1'), 5 its incarnation
# Returns {1 beating or 0 outdated, 1 if the run was stopped else 0, the stop reason or ''}:
# a stop key holding '' stops the run too.
_BEAT = (
    _OUTDATED
    + """
local stop = redis.call('GET', KEYS[3])
local stopped = stop and 1 or 0
if redis.call('EXISTS', KEYS[6]) == 1 and
    outdated(KEYS[4], KEYS[2], KEYS[5], ARGV[1], ARGV[5], ARGV[4] == '1') then
  return {0, stopped, stop or ''}
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return {1, stopped, stop or ''}
"""
)

# A node's result, and its heartbeat set to ARGV[3] (finished, no TTL), in one step; refused
# (HOPBUSDEAD) for a process that is ``outdated``, as for a heartbeat.
# KEYS: 1 results, 2 heartbeat, 3 dead set, 4 incarnation hash, 5 joining set, 6 its iter
# ARGV: 1 worker, 2 result JSON, 3 the finished marker, 4 its incarnation
_FINISH = (
    _OUTDATED
    + """
if redis.call('EXISTS', KEYS[6]) == 1 and
    outdated(KEYS[4], KEYS[3], KEYS[5], ARGV[1], ARGV[4], false) then
  return redis.error_reply('HOPBUSDEAD ' .. KEYS[6])
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3])
return 1
"""
)

# Whether Redis holds worker ARGV[1]'s counter, and whether this process is still the worker.
# KEYS: 1 its iter, 2 incarnation hash, 3 dead set, 4 joining set; ARGV: 1 worker, 2 incarnation
_STANDING = (
    _OUTDATED
    + """
local current = 1
if outdated(KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], false) then current = 0 end
return {redis.call('EXISTS', KEYS[1]), current}
"""
)


class StateLostError(Exception):
    """Redis no longer holds this worker's iteration counter: it restarted without the run's
    state. The worker puts back what it holds (``RunControl.restore``)."""


class RunControl:
    """Worker ``worker``'s control-plane operations in run ``keys.run``."""

    def __init__(
        self, client: redis.Redis, keys: RunKeys, worker: int, *, iterations: int = 0
    ) -> None:
        """``iterations``: the run's, what a finished worker's report says (declare_dead and
        begin_rejoin tell a real report from a forged or stale one by it)."""
        self.r = client
        self.keys = keys
        self.worker = worker
        self.iterations_total = iterations
        # the broker instance this process's view of the run is of (broker_id): it marks the
        # worker's state with it, and trusts others' only under the same mark
        self.epoch = ""
        self.unjudged = False  # the last declare_dead judged nothing (see there)
        self._advance = PinnedScript(client, Lua(client, _ADVANCE))  # every iteration
        self._start = Lua(client, _START)
        self._declare_dead = Lua(client, _DECLARE_DEAD)
        self._restore = Lua(client, _RESTORE)
        self._rebuild = Lua(client, _REBUILD)
        self._begin_rejoin = Lua(client, _BEGIN_REJOIN)
        self._claim = Lua(client, _CLAIM)
        self._vacant = Lua(client, _VACANT)
        self._commit_rejoin = Lua(client, _COMMIT_REJOIN)
        self._abort_rejoin = Lua(client, _ABORT_REJOIN)
        self._beat = Lua(client, _BEAT)
        self._finish = Lua(client, _FINISH)
        self._standing = Lua(client, _STANDING)
        # 0: the process ``hopbus train`` or compose started; n: the n-th replacement of it
        self.incarnation = 0
        self.floors: dict[int, int] = {}  # out-neighbours' floors, read by the last advance
        self.floors_refused = 0  # floors above their owner's counter (_checked_floors)
        self.joining: frozenset[int] = frozenset()  # dead workers coming back, as last read
        # the neighbours' incarnations as the last Advance read them (none while no id of the
        # run was ever replaced): a changed one is a new process at a new endpoint
        self.incarnations: dict[int, int] = {}
        self._shapes: dict[tuple, tuple[list[str], bytes, bytes]] = {}  # _advance_shape's

    def _call(self, script: Any, keys: list, args: list) -> Any:
        """``script``, with the scripts' refusals as exceptions: HOPBUSLOST (Redis lost this
        worker's counter) as StateLostError, HOPBUSDEAD (this process is no longer the
        worker: ``_OUTDATED``) as DeclaredDead."""
        try:
            return script(keys=keys, args=args)
        except redis.ResponseError as exc:
            if str(exc).startswith("HOPBUSLOST"):
                raise StateLostError(str(exc)) from None
            if str(exc).startswith("HOPBUSDEAD"):
                raise DeclaredDead(self.declared_dead_line()) from None
            raise

    # -- iterations and tokens ------------------------------------------------------------------
    def start(self, put_to: Sequence[int], count: int, at: int = 0) -> None:
        """Iter(self) = ``at`` (0, or a resumed run's checkpoint iteration) and ``count``
        tokens into TokenQ(self->j) for j in ``put_to``; this worker's state marked as in the
        broker ``self.epoch``."""
        k = self.keys
        self._start(
            keys=[k.iter(self.worker), k.marks, *(k.tok(self.worker, j) for j in put_to)],
            args=[count, at, self.worker, self.epoch],
        )

    def broker_id(self) -> str:
        return broker_id(self.r)

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
        neighbours: Sequence[int] = (),
    ) -> tuple[int | None, frozenset[int]]:
        """Enter iteration ``to`` from ``start`` in one atomic step, if TokenQ(j->self) holds
        ``need[j]`` tokens for every live j: take them, publish ``floor`` (if given), set the
        counter, XADD the progress entry, put ``to - start`` tokens for each live j in
        ``put_to``, and read back the floors of ``floors_of`` (into ``self.floors``) and the
        dead workers whose replacement is joining (into ``self.joining``) and, once an id
        was replaced, the incarnations of ``neighbours`` (into ``self.incarnations``).

        Returns (None, dead workers) once entered or, taking nothing, (the first j whose queue
        is short, dead workers)."""
        owners = tuple(need)
        jump = to - start if to - start > 1 else 0
        flat = ["worker", str(self.worker), "iter", str(to), "jump", str(jump)]
        for name, value in fields.items():
            flat += [name, str(_field(value))]
        shape = (owners, tuple(put_to), tuple(floors_of), tuple(neighbours))
        keys, peers, watched = self._advance_shape(*shape)
        args = [start, to, PROGRESS_MAXLEN, len(owners), len(put_to), len(floors_of)]
        args += ["" if floor is None else floor, *(need[j] for j in owners)]
        args += [msgpack.packb(flat), peers, self.keys.hb_prefix, self.worker, self.incarnation]
        res = self._call(self._advance, keys, [*args, watched])
        self.joining = _members(res[-2])
        self.incarnations = {
            j: read.incarnation_of(n) for j, n in zip(neighbours, res[-1] or (), strict=False)
        }
        if res[0] == 0:
            return owners[int(res[1]) - 1], _members(res[2])
        self.floors = self._checked_floors(floors_of, res[2])
        return None, _members(res[3])

    def _advance_shape(
        self,
        owners: tuple[int, ...],
        put_to: tuple[int, ...],
        floors_of: tuple[int, ...],
        neighbours: tuple[int, ...],
    ) -> tuple[list[str], bytes, bytes]:
        """The Advance's keys and packed peer lists for these neighbours: the same every
        iteration until a neighbour dies or comes back, so built once per shape."""
        shape = (owners, put_to, floors_of, neighbours)
        got = self._shapes.get(shape)
        if got is None:
            k, w = self.keys, self.worker
            keys = [
                k.iter(w),
                k.progress,
                k.floor(w),
                *(k.tok(j, w) for j in owners),
                *(k.tok(w, j) for j in put_to),
                *(k.floor(j) for j in floors_of),
                *(k.iter(j) for j in floors_of),
                k.incarnation,
                k.joining,
                k.dead,
            ]
            packed = msgpack.packb([*owners, *put_to])
            got = self._shapes[shape] = (keys, packed, msgpack.packb(list(neighbours)))
        return got

    # -- store floors (Sec. 6.2) ------------------------------------------------------------------
    def publish_floor(self, floor: int) -> None:
        self.r.set(self.keys.floor(self.worker), floor)

    def read_floors(self, of: Sequence[int]) -> dict[int, int]:
        if not of:
            return {}
        k = self.keys
        return self._checked_floors(of, self.r.mget([*map(k.floor, of), *map(k.iter, of)]))

    def _checked_floors(self, of: Sequence[int], values: Sequence[Any]) -> dict[int, int]:
        """The floors of ``of`` from ``values`` (their floor keys, then their counters). A
        worker publishes its floor with the Advance that enters the iteration it is for, so a
        floor never exceeds its owner's counter: one that does (forged, garbled, or left by
        an earlier incarnation of a replaced worker) is not believed, and the update goes out
        anyway (the receiver drops what it cannot use): counted in ``floors_refused``.
        Believing it would leave a receiver waiting for an update nobody sends."""
        n = len(of)
        floors: dict[int, int] = {}
        for j, f, c in zip(of, values[:n], values[n:], strict=True):
            floor, counter = read.integer(f) or 0, read.integer(c)
            if floor > 0 and (counter is None or floor > counter):
                self.floors_refused += 1
                floor = 0
            floors[j] = floor
        return floors

    # -- registry ----------------------------------------------------------------------------
    def register(self, endpoint: str) -> None:
        self.r.hset(self.keys.addr, str(self.worker), endpoint)

    def claim(self, endpoint: str, heartbeat_ms: int) -> str | None:
        """Take this worker's place (its first heartbeat and its endpoint) unless another
        process has it or had it; returns why not, or None."""
        k, w = self.keys, self.worker
        res = self._claim(
            keys=[k.iter(w), k.hb(w), k.result, k.addr],
            args=[w, endpoint, int(time.time() * 1000), heartbeat_ms],
        )
        return _why_taken(self.r, k, w, read.text(res))

    def taken(self) -> str | None:
        """Why this worker's place cannot be claimed (claim's own check, taking nothing), or
        None while it is free."""
        return taken(self.r, self.keys, self.worker, self._vacant)

    def endpoints(self, of: Sequence[int]) -> dict[int, str | None]:
        if not of:
            return {}
        values = self.r.hmget(self.keys.addr, [str(j) for j in of])
        return {j: read.text(v, 300) for j, v in zip(of, values, strict=True)}

    # -- streams and results ----------------------------------------------------------------------
    def last_words(self, of: Sequence[int], look: int = 500) -> list[str]:
        """The message of each of ``of``'s newest failure among the run's last ``look``
        events (``error``, ``interrupted``, ``join_failed``: a script that exited before it
        joined, say), as one line that names the worker: what a worker waiting for it in
        vain can quote."""
        found: dict[int, str] = {}
        for _, fields in self.r.xrevrange(self.keys.events, count=look):
            if read.text(fields.get(b"kind")) not in (*SAYS_WHY_GONE, JOIN_FAILED):
                continue
            who = read.integer(fields.get(b"worker"))
            message = read.text(fields.get(b"message"), 300)
            if who in of and who not in found and message:
                named = message.startswith(f"worker {who}")
                found[who] = message if named else f"worker {who}: {message}"
        return [found[j] for j in of if j in found]

    def event(self, kind: str, **fields: Any) -> None:
        flat = {"kind": kind, "worker": self.worker, "t": time.time()}
        flat.update(fields)
        self.r.xadd(
            self.keys.events,
            {k: _field(v) for k, v in flat.items()},
            maxlen=EVENTS_MAXLEN,
            approximate=True,
        )

    def publish_result(self, result: Mapping[str, Any], finished: str) -> None:
        """The node's result, and its heartbeat set to ``finished`` (no TTL), in one step;
        DeclaredDead for a process declared dead or replaced meanwhile (it had frozen)."""
        k, w = self.keys, self.worker
        keys = [k.result, k.hb(w), k.dead, k.incarnation, k.joining, k.iter(w)]
        report = {**result, "incarnation": self.incarnation}  # whose it is: read.result
        self._call(self._finish, keys, [w, dumps(report), finished, self.incarnation])

    def publish_stats(self, stats: Mapping[str, int], client: redis.Redis | None = None) -> None:
        """This node's counters (``client``: another than its own, e.g. a quick one)."""
        if stats:
            (client or self.r).hset(self.keys.stats(self.worker), mapping=dict(stats))

    # -- liveness and membership (protocol/membership.py) ----------------------------------
    def declare_dead(self, worker: int, *, force: bool = False) -> bool:
        """Put ``worker`` in the run's dead set (once: a crash event and a progress entry
        ``dead=1`` mark the moment), unless its heartbeat is there (``force``: the caller saw
        the process end) or it finished. Returns whether it is dead; ``unjudged`` then says
        whether it was not judged at all, its state not known to be in this broker (its mark
        in ``keys.marks`` another's, or none)."""
        k = self.keys
        said = int(
            self._declare_dead(
                keys=[
                    k.hb(worker), k.dead, k.events, k.progress, k.iter(worker), k.result,
                    k.incarnation, k.marks,
                ],
                args=[
                    worker, self.worker, time.time(), "1" if force else "0", EVENTS_MAXLEN,
                    PROGRESS_MAXLEN, self.iterations_total, self.epoch,
                ],
            )
        )  # fmt: skip
        self.unjudged = said == 2
        return said == 1

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
        keys = [k.iter(self.worker), k.hb(self.worker), k.addr, k.meta, k.dead, k.events]
        keys += [k.incarnation, k.progress, k.marks]
        args = [self.worker, iteration, heartbeat_ms, endpoint, config, time.time()]
        args += [EVENTS_MAXLEN, self.incarnation, PROGRESS_MAXLEN, self.epoch, *dead]
        self._call(self._restore, keys, args)

    def rebuild_tokens(self, owner: int, max_ig: int) -> bool:
        """TokenQ(owner->self) from the invariant; False while either end has not put its
        state back in this broker (``self.epoch``)."""
        k = self.keys
        return bool(
            self._rebuild(
                keys=[k.iter(owner), k.iter(self.worker), k.tok(owner, self.worker), k.marks],
                args=[max_ig, owner, self.worker, self.epoch],
            )
        )

    # -- a replacement rejoining (hopbus worker --rejoin) -------------------------------------
    def begin_rejoin(self, endpoint: str, heartbeat_ms: int) -> str | None:
        """Announce this process as the replacement of dead worker ``self.worker``: heartbeat,
        endpoint, and the joining set (its in-neighbours send to it again); this process takes
        the next incarnation of the id. Returns why it is refused, or None."""
        k = self.keys
        w = self.worker
        res = self._begin_rejoin(
            keys=[
                k.hb(w), k.dead, k.joining, k.addr, k.stop, k.result, k.events, k.incarnation,
                k.iter(w),
            ],
            args=[w, endpoint, heartbeat_ms, time.time(), EVENTS_MAXLEN, self.iterations_total],
        )  # fmt: skip
        if isinstance(res, int):
            self.incarnation = res
            return None
        return res.decode() if isinstance(res, bytes) else str(res)

    def commit_rejoin(
        self, iteration: int, ins: Sequence[int], outs: Sequence[int], max_ig: int, workers: int
    ) -> str | None:
        """Enter ``iteration`` as a live worker again: counter, the token queues to and from
        those of ``ins`` and ``outs`` that are alive as Redis sees it now, rebuilt from the
        invariant, out of the dead set, a progress entry ``rejoin=1``. Returns why not (a queue
        would be negative, or this process is no longer the newest incarnation), or None."""
        k = self.keys
        w = self.worker
        keys = [k.iter(w), k.dead, k.joining, k.hb(w), k.progress, k.events]
        for j in ins:
            keys += [k.iter(j), k.tok(w, j)]
        for m in outs:
            keys += [k.iter(m), k.tok(m, w)]
        args = [w, iteration, max_ig, len(ins), len(outs), time.time()]
        keys += [k.marks, k.incarnation]
        cap = token_queue_capacity(max_ig, workers - 1)  # the longest path: n - 1 edges
        args += [PROGRESS_MAXLEN, EVENTS_MAXLEN, *ins, *outs, cap, self.epoch, self.incarnation]
        res = self._commit_rejoin(keys=keys, args=args)
        if int(res[0]) == 1:
            return None
        return res[1].decode() if isinstance(res[1], bytes) else str(res[1])

    def abort_rejoin(self) -> None:
        """A replacement that did not get in: out of the joining set, its heartbeat gone;
        unless a newer replacement has taken the id since (that one's are left alone)."""
        k = self.keys
        self._abort_rejoin(
            keys=[k.incarnation, k.joining, k.hb(self.worker)], args=[self.worker, self.incarnation]
        )

    def incarnations_of(self, of: Sequence[int]) -> dict[int, int]:
        """Workers ``of``'s incarnations now (0: the process that started with the run)."""
        if not of:
            return {}
        found = self.r.hmget(self.keys.incarnation, [str(j) for j in of])
        return {j: read.incarnation_of(n) for j, n in zip(of, found, strict=True)}

    def iterations(self, of: Sequence[int]) -> dict[int, int | None]:
        """Workers ``of``'s iteration counters (None where Redis has none)."""
        if not of:
            return {}
        values = self.r.mget([self.keys.iter(j) for j in of])
        return {j: read.integer(v) for j, v in zip(of, values, strict=True)}

    def dead(self) -> frozenset[int]:
        return _members(self.r.smembers(self.keys.dead))

    def standing(self) -> tuple[bool, bool]:
        """(Redis holds this worker's counter, this process is still the worker: neither in
        the dead set nor outdated by a replacement's incarnation), in one round trip."""
        k, w = self.keys, self.worker
        res = self._standing(
            keys=[k.iter(w), k.incarnation, k.dead, k.joining], args=[w, self.incarnation]
        )
        return bool(res[0]), bool(res[1])

    def declared_dead_line(self) -> str:
        """What a worker that finds itself dead, or replaced, says as it leaves."""
        w, run = self.worker, self.keys.run
        return (
            f"worker {w} of run {run} was declared dead (its heartbeat lapsed: the process was "
            "stopped, starved of CPU or cut off from Redis for longer than --heartbeat); the run "
            "went on without it or with a replacement, so it leaves (in a backup or hybrid run "
            f"`hopbus worker --run {run} --id {w} --rejoin` brings a replacement in)"
        )

    def stop_run(self, reason: str) -> str:
        """Stop the run for every node (they see it within a heartbeat period); the first
        reason given is kept and returned."""
        if self.r.set(self.keys.stop, reason, nx=True):
            self.event("stop", message=reason)
            return reason
        first = self.r.get(self.keys.stop)
        return reason if first is None else read.stop_reason(first)

    def alive(self, of: Sequence[int]) -> dict[int, bool]:
        """Per node: beating (a heartbeat with its TTL), or finished (its marker)."""
        return {j: not read.gone(*beat) for j, beat in heartbeats(self.r, self.keys, of).items()}


def taken(client: Any, keys: RunKeys, worker: int, script: Any = None) -> str | None:
    """``RunControl.taken`` for a caller with no RunControl of that worker: why its place
    cannot be claimed, or None while it is free (``script``: a ``Lua`` of ``_VACANT``)."""
    check = script if script is not None else Lua(client, _VACANT)
    said = read.text(check(keys=[keys.iter(worker), keys.hb(worker), keys.result], args=[worker]))
    return _why_taken(client, keys, worker, said)


def _why_taken(client: Any, keys: RunKeys, worker: int, said: str | None) -> str | None:
    """The claim's refusal, unless the keys it looked at are of another type than hopbus
    keeps (its counter made a hash: no process had the place, something else wrote them)."""
    if not said:
        return None
    from hopbus.coord.runs import of_another_type

    found = of_another_type(client, keys, [keys.iter(worker), keys.hb(worker), keys.result])
    return named_keys(found) if found else said


def broker_id(client: Any) -> str:
    """The broker instance's identity (Redis's run id, new at every start, also after a
    restore from a snapshot); '' where INFO is not allowed (no restart is then noticed this
    way, only by what it lost)."""
    try:
        return str(client.info("server").get("run_id", ""))
    except redis.ResponseError:  # NOPERM: an ACL without INFO
        return ""


def heartbeats(client: Any, keys: RunKeys, nodes: Sequence[int]) -> dict[int, tuple[Any, Any]]:
    """Each node's heartbeat key as (value, PTTL in ms), in one round trip: ``read.beating``
    and ``read.gone`` judge them."""
    pipe = client.pipeline(transaction=False)
    for j in nodes:
        pipe.get(keys.hb(j)).pttl(keys.hb(j))
    got = pipe.execute() if nodes else []
    return dict(zip(nodes, zip(got[::2], got[1::2], strict=True), strict=True))


def _members(values: Any) -> frozenset[int]:
    """Node ids among a set's members (anything else, forged or garbled, left out)."""
    return frozenset(i for i in (read.integer(v) for v in values or ()) if i is not None)


def _field(value: Any) -> str | int | float:
    kind = type(value)
    if kind is float or kind is int or kind is str:  # most of a progress entry, every step
        return value
    if kind is list and all(type(v) is int for v in value):
        return str(value)  # what dumps writes for a list of ints ("[1, 2]"), for less
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float | str):
        return value
    return dumps(value)


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
        self.ttl_ms = self.ttl_ms_for(ttl_s)
        self.patience_s = patience_s  # how long Redis may fail before ``error`` is set
        self.stats = stats
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hopbus-heartbeat", daemon=True)
        self.error: BaseException | None = None
        self.stopped: str | None = None  # the run's stop reason, once some node stopped it
        # A replacement beats while still in the dead set (and the joining set), until
        # commit_rejoin takes it out; any other node that finds itself there, or outdated by a
        # newer replacement, stops beating and is told (``declared_dead``).
        self.may_be_dead = False
        self.declared_dead = False
        self.restarted = False  # the broker is another instance than the one the state is in

    @staticmethod
    def ttl_ms_for(ttl_s: float) -> int:
        """The heartbeat key's TTL in ms (at least 1 s)."""
        return max(1000, int(ttl_s * 1000))

    def beat(self) -> None:
        c = self.control
        k = c.keys
        pipe = c.r.pipeline(transaction=False)
        args = [c.worker, int(time.time() * 1000), self.ttl_ms, int(self.may_be_dead)]
        args.append(c.incarnation)
        keys = [k.hb(c.worker), k.dead, k.stop, k.incarnation, k.joining, k.iter(c.worker)]
        c._beat(keys=keys, args=args, client=pipe)
        stats = self.stats() if self.stats is not None else None
        if stats:
            pipe.hset(k.stats(c.worker), mapping=dict(stats))
        if c.epoch:  # the broker's identity, to notice a restart the main thread has not
            pipe.info("server")
        replies = pipe.execute()
        beating, stopped, stop = replies[0]
        if not beating:
            self.declared_dead = True
        if stopped:
            self.stopped = read.stop_reason(stop)
        if c.epoch and isinstance(replies[-1], dict):
            now = str(replies[-1].get("run_id", ""))
            self.restarted = now != c.epoch  # the worker puts its state back (Worker._restore)

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
            except redis.ResponseError as exc:  # a refusal (a key of another type): no outage
                self.error = exc
                return
            except redis.RedisError as exc:  # Redis may be restarting: give it ``patience_s``
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= self.patience_s:
                    self.error = exc  # the worker notices at its next look
            except Exception as exc:  # a bug (in stats(), say): not a silent end of the beats,
                self.error = exc  # after which the neighbours would declare a live worker dead
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
