"""Token queues as Redis lists: TokenQ(I->J) is the list ``hop:{R}:tok:I:J``.

The owner RPUSHes one token per iteration it enters (the value is that iteration, Fig. 7 line
10); the taker pops them. Each list has exactly one taker, so a worker may take its tokens one
queue at a time with blocking pops and can never starve anybody (see protocol/tokens.py).

``RedisTokenQueues`` has the same put/size/can_take/take/short semantics as the in-memory
``TokenLedger`` (tests/contract runs one suite against both); it adds ``pop_one``, a blocking
pop with a timeout, which a worker calls in short slices so that it can notice a dead neighbour
or a deadline. (The worker takes its tokens in the same Lua call that enters the iteration, see
coord/control.py; it only pops on its own while a queue is short.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import redis

from hopbus.coord.client import Lua
from hopbus.coord.keys import RunKeys
from hopbus.topology import Topology

# Take `count` tokens from every listed queue, or none at all (ARGV[1] = count).
_TAKE_ALL = """
local n = tonumber(ARGV[1])
for i = 1, #KEYS do
  if redis.call('LLEN', KEYS[i]) < n then return i end
end
if n > 0 then
  for i = 1, #KEYS do redis.call('LPOP', KEYS[i], n) end
end
return 0
"""


class RedisTokenQueues:
    def __init__(self, client: redis.Redis, keys: RunKeys) -> None:
        self.r = client
        self.keys = keys
        self._take_all = Lua(client, _TAKE_ALL)

    def put(self, owner: int, taker: int, count: int = 1, first: int = 0) -> None:
        """``owner`` puts ``count`` tokens (values first, first+1, ...) in TokenQ(owner->taker)."""
        if count > 0:
            self.r.rpush(self.keys.tok(owner, taker), *range(first, first + count))

    def size(self, owner: int, taker: int) -> int:
        return int(self.r.llen(self.keys.tok(owner, taker)))

    def sizes(self, owners: Sequence[int], taker: int) -> dict[int, int]:
        """Sizes of TokenQ(o->taker) for every o, in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for o in owners:
            pipe.llen(self.keys.tok(o, taker))
        return {o: int(n) for o, n in zip(owners, pipe.execute(), strict=True)}

    def can_take(self, owners: Iterable[int], taker: int, count: int = 1) -> bool:
        owners = list(owners)
        return all(n >= count for n in self.sizes(owners, taker).values())

    def short(self, owners: Iterable[int], taker: int, count: int = 1) -> tuple[int, ...]:
        owners = list(owners)
        return tuple(o for o, n in self.sizes(owners, taker).items() if n < count)

    def take(self, owners: Iterable[int], taker: int, count: int = 1) -> None:
        """Take ``count`` tokens from every TokenQ(o->taker), all or nothing (atomic)."""
        owners = list(owners)
        if not owners:
            return
        short = self._take_all(keys=[self.keys.tok(o, taker) for o in owners], args=[count])
        if short:
            o = owners[int(short) - 1]
            have = self.size(o, taker)
            raise ValueError(f"TokenQ({o}->{taker}) holds {have} tokens, {count} needed")

    def pop_one(self, owner: int, taker: int, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for one token of TokenQ(owner->taker) and take it."""
        return self.r.blpop([self.keys.tok(owner, taker)], timeout=timeout) is not None


def token_edges(topo: Topology) -> list[tuple[int, int]]:
    """Every (owner, taker) pair with a token queue: TokenQ(j->i) for each out-neighbour j of
    each worker i."""
    return [(j, i) for i in range(topo.n) for j in topo.out_peers[i]]


def queue_sizes(
    client: redis.Redis, keys: RunKeys, edges: Sequence[tuple[int, int]]
) -> list[int | None]:
    """Lengths of TokenQ(j->i) for every (j, i) in ``edges``, in one round trip; None for a
    key that is not a list (something else wrote it)."""
    pipe = client.pipeline(transaction=False)
    for j, i in edges:
        pipe.llen(keys.tok(j, i))
    return [n if isinstance(n, int) else None for n in pipe.execute(raise_on_error=False)]
